// How a CudaStream's usage (backend.h, Usage) is measured: the spans of work between
// completions and the samples of its copies, and the arithmetic that turns their events and
// byte counts into device time and copy traffic.
//
// One pair of timing events per span of work between completions: the first work enqueued
// after a completion (outside a capture) records a start event, and the next OnComplete
// watches a timing event instead of a plain one, which is the span's end. Copies are
// sampled: a host<->device copy of kMinTimedCopyBytes or more enqueued outside a capture gets
// its own pair of events, from the same pool, when its direction and size class (a power of
// two of bytes) was last timed kCopySampleInterval ago or never, or at its next copy after a
// class's first sample or one kResampleSlowdown times slower than the last (and at most
// kMaxTimedCopies per direction and span). Every other copy's bytes are counted and its time
// is estimated at the rate last measured for its direction and class (or the nearest class
// measured), never past the span's busy time. Timing every copy cost a streamed 64 KiB
// transfer about 4 us of its 14 and kept the copy engine from running back-to-back copies as
// one stream (docs/performance.md). A copy of kMinTimedCopyBytes or more, not sampled, whose
// class has been measured, opens no span: enqueued while none is open, its estimate is its
// whole account (busy time included; never more than the wall clock from its enqueue to its
// completion seen), and a completion after only such copies watches a plain event; so pending
// transfers streamed back to back record no timing event but a sample's. Elapsed times are
// read on the watcher thread, before the completion's callback runs. Cost: one extra
// cudaEventRecord per submit with other work, two per sampled copy, and a
// cudaEventElapsedTime each.
//
// Thread-safety: a Span is built by the stream's owner and handed whole to the completion
// that ends it (then read on the watcher thread only). CopyRates is shared by the two: its
// rates and resample flags are atomics, written on the watcher thread; last_span_seen is the
// watcher thread's alone.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/completion_watcher.h"

namespace ferry::backend::stream_usage {

/// Copies are timed by size class: [0, 128 KiB), [128 KiB, 256 KiB), ..., [128 MiB, inf).
inline constexpr int kSizeClasses = 12;
inline int SizeClass(uint64_t bytes) {
  int c = 0;
  for (uint64_t b = bytes >> 17; b != 0 && c < kSizeClasses - 1; b >>= 1) ++c;
  return c;
}
using PerClass = std::array<std::array<uint64_t, kSizeClasses>, 2>;  // [to_device][class]

// Per direction. Few: a span's events are held until its completion, and a session may
// have 64 submits in flight; most submits copy once or twice.
inline constexpr size_t kMaxTimedCopies = 4;
// Copies below this are not timed with their own events (see the file comment).
inline constexpr uint64_t kMinTimedCopyBytes = 64u << 10;
// A direction and size class is timed with events again once this long has passed since
// it last was: two timing events around every copy cost a small copy more than the copy
// (and keep the copy engine from running back-to-back copies as one stream).
inline constexpr std::chrono::milliseconds kCopySampleInterval{10};
inline constexpr double kResampleSlowdown = 2.0;

/// A host<->device copy timed with its own pair of events.
struct TimedCopyEvents {
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  bool to_device = false;
  uint64_t bytes = 0;
};

/// The time per byte last measured for each direction and size class (0: not yet), for the
/// copies not timed with their own events. Written on the watcher thread; read there and,
/// to know whether a class has been measured, by the stream's owner.
struct CopyRates {
  std::array<std::array<std::atomic<double>, kSizeClasses>, 2> ns_per_byte{};
  double Get(bool to_device, int size_class) const {
    return ns_per_byte[to_device][size_class].load(std::memory_order_relaxed);
  }
  // Set where the last sample was a class's first, or more than kResampleSlowdown times
  // slower than the one before: the class is timed again at its next copy, not
  // kCopySampleInterval later, so that one outlier (a first copy, a burst of contention)
  // does not set the estimates for long. Written on the watcher thread, cleared by the owner.
  std::array<std::array<std::atomic<bool>, kSizeClasses>, 2> resample{};
  // Watcher thread only: when the stream's last span was seen complete, where the next
  // span's estimates may begin (MeasureSpan).
  std::chrono::steady_clock::time_point last_span_seen{};
};

/// What one span hands to its completion.
struct Span {
  cudaEvent_t start = nullptr;
  std::vector<TimedCopyEvents> copies;
  PerClass untimed{};    // bytes of copies not timed with events, after start
  PerClass estimated{};  // bytes of copies enqueued while no start was open
  // When the first of `estimated` was enqueued: none of it ran on the device before.
  std::chrono::steady_clock::time_point first_estimated{};
  size_t timed_h2d = 0, timed_d2h = 0;  // copies timed, per direction
  /// Work to account for at the next completion: a start event, or estimated copies.
  bool open() const {
    if (start != nullptr) return true;
    for (const auto& per_class : estimated) {
      for (uint64_t bytes : per_class) {
        if (bytes != 0) return true;
      }
    }
    return false;
  }
};

/// Give `span`'s events back to `watcher`'s timing pool.
void ReleaseSpan(CompletionWatcher* watcher, const Span& span);

/// The usage of `span`, whose end event completed and was seen at `seen`; updates `rates`
/// from its samples. Estimates never take a span past what was measured of it with events,
/// nor past the wall-clock time its estimated copies could have run in: from the first one's
/// enqueue (or the stream's last span seen complete, if later) until `seen`. A rate is one
/// sample, and one sample can be far off (a first copy on the H200 took 1 ms for 256 KiB): a
/// tenant is never charged more device time than has passed. Watcher thread.
Usage MeasureSpan(const Span& span, cudaEvent_t end, std::chrono::steady_clock::time_point seen,
                  CopyRates* rates);

}  // namespace ferry::backend::stream_usage
