#include "backend/cuda/stream_usage.h"

#include <algorithm>

namespace ferry::backend::stream_usage {
namespace {

uint64_t ElapsedNs(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess || !(ms > 0)) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
}

/// The time of `bytes` of copies of a direction and size class, at the rate last measured
/// for it or the nearest class measured (0 where none is).
uint64_t EstimateNs(const CopyRates& rates, bool to_device, int size_class, uint64_t bytes) {
  double rate = 0;
  for (int d = 0; d < kSizeClasses && rate == 0; ++d) {
    if (size_class - d >= 0) rate = rates.Get(to_device, size_class - d);
    if (rate == 0 && size_class + d < kSizeClasses) rate = rates.Get(to_device, size_class + d);
  }
  return static_cast<uint64_t>(static_cast<double>(bytes) * rate);
}

/// Count the bytes of copies not timed with events, `bytes` by direction and size class, in
/// `used`, and add their estimated time to `ns` (per direction: [0] to host, [1] to device).
void EstimateCopies(const PerClass& bytes, const CopyRates& rates, Usage* used, uint64_t (&ns)[2]) {
  for (int to_device = 0; to_device < 2; ++to_device) {
    for (int c = 0; c < kSizeClasses; ++c) {
      if (bytes[to_device][c] == 0) continue;
      ns[to_device] += EstimateNs(rates, to_device, c, bytes[to_device][c]);
      (to_device ? used->h2d_bytes : used->d2h_bytes) += bytes[to_device][c];
    }
  }
}

/// Scale `estimated` (ns per direction) down so that together they fit in `room`.
void FitEstimates(uint64_t (&estimated)[2], uint64_t room) {
  const uint64_t wanted = estimated[0] + estimated[1];
  if (wanted <= room) return;
  const double scale = static_cast<double>(room) / static_cast<double>(wanted);
  estimated[0] = static_cast<uint64_t>(static_cast<double>(estimated[0]) * scale);
  estimated[1] = static_cast<uint64_t>(static_cast<double>(estimated[1]) * scale);
}

}  // namespace

void ReleaseSpan(CompletionWatcher* watcher, const Span& span) {
  if (span.start != nullptr) watcher->ReleaseTimingEvent(span.start);
  for (const TimedCopyEvents& c : span.copies) {
    watcher->ReleaseTimingEvent(c.start);
    watcher->ReleaseTimingEvent(c.end);
  }
}

Usage MeasureSpan(const Span& span, cudaEvent_t end, std::chrono::steady_clock::time_point seen,
                  CopyRates* rates) {
  Usage used;
  if (span.start != nullptr) used.busy_ns = ElapsedNs(span.start, end);
  for (const TimedCopyEvents& c : span.copies) {
    const uint64_t ns = ElapsedNs(c.start, c.end);
    if (c.to_device) {
      used.h2d_bytes += c.bytes;
      used.h2d_ns += ns;
    } else {
      used.d2h_bytes += c.bytes;
      used.d2h_ns += ns;
    }
    if (c.bytes > 0 && ns > 0) {
      const int size_class = SizeClass(c.bytes);
      const double rate = static_cast<double>(ns) / static_cast<double>(c.bytes);
      const double last = rates->Get(c.to_device, size_class);
      rates->ns_per_byte[c.to_device][size_class].store(rate, std::memory_order_relaxed);
      if (last == 0 || rate > kResampleSlowdown * last) {
        rates->resample[c.to_device][size_class].store(true, std::memory_order_relaxed);
      }
    }
  }
  // Copies not timed (small ones, those between samples, those past kMaxTimedCopies): their
  // time at the rate last measured for their direction and size class, or the nearest class
  // measured (none measured yet: in busy_ns only). Estimates never take the copies' time
  // past the span's.
  uint64_t estimated[2] = {0, 0};
  EstimateCopies(span.untimed, *rates, &used, estimated);
  const uint64_t timed_ns = used.h2d_ns + used.d2h_ns;
  FitEstimates(estimated, used.busy_ns > timed_ns ? used.busy_ns - timed_ns : 0);
  used.d2h_ns += estimated[0];
  used.h2d_ns += estimated[1];
  // Copies enqueued while no start was open ran before the span's start (or the span has
  // none): outside its measured time, their estimate adds to it, within the wall clock.
  uint64_t before_start[2] = {0, 0};
  EstimateCopies(span.estimated, *rates, &used, before_start);
  // (No such copy: both estimates are 0, and so is what this adds.)
  const auto from = std::max(span.first_estimated, rates->last_span_seen);
  const uint64_t wall =
      seen > from ? static_cast<uint64_t>(std::chrono::nanoseconds(seen - from).count()) : 0;
  FitEstimates(before_start, wall > used.busy_ns ? wall - used.busy_ns : 0);
  used.busy_ns += before_start[0] + before_start[1];
  used.d2h_ns += before_start[0];
  used.h2d_ns += before_start[1];
  rates->last_span_seen = seen;
  return used;
}

}  // namespace ferry::backend::stream_usage
