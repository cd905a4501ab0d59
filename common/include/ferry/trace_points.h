// Timeline trace points: a developer's profiling aid, compiled in only with the CMake option
// FERRY_TRACE_POINTS=ON (off by default: FERRY_TRACE below then expands to nothing).
//
// A trace point records (steady-clock ns, two ids, thread id, point) into a buffer of the
// process, when the environment variable FERRY_TRACE_FILE is set; the buffer (kMaxEvents
// events, 32 bytes each, allocated at the first point) is written to FERRY_TRACE_FILE.<pid> at
// exit (ferryd writes it before its _Exit). bench/trace_timeline.py reads a client's and a
// daemon's files and prints where a submit's time goes, stage by stage (bench/README.md,
// "Timelines"). The points and their ids:
//   client:  kIssue (submit id) when a submit is handed to the transport; kWait0/kWait1 (the
//            last submit id) around PendingTransfer::wait.
//   ferryd:  kTake (submit id) when the ring poller has parsed a record; kRun0/kRun1/kRunFail
//            around the poller's attempts to run a session's messages itself; kSubmit0/kSubmit1
//            (submit id, session id) around Session::Submit; kSeq (submit id, its sequence
//            number); kWatch (the sequence number a completion covers, session id) when a
//            completion is asked for; kSeen (the same) when the backend reports it, on its
//            completion thread; kComplete0/kComplete1 (the same) around its handling; kPost
//            (submit id) when a success is posted on the completion board.
//   either:  kStep (a step number, 0): a split of a stage, placed where one is wanted; the tool
//            prints the time from the previous point on the same thread, per step.
// Thread-safe; events past kMaxEvents are dropped.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ferry::trace {

enum Point : uint32_t {
  kIssue = 1,
  kWait0,
  kWait1,
  kTake,
  kSubmit0,
  kSubmit1,
  kSeq,
  kWatch,
  kSeen,
  kComplete0,
  kComplete1,
  kPost,
  kRun0,
  kRun1,
  kRunFail,
  kStep
};

/// One recorded point, as written to the file (little-endian, 32 bytes).
struct Event {
  uint64_t ns = 0;  // std::chrono::steady_clock (CLOCK_MONOTONIC: comparable across processes)
  uint64_t a = 0, b = 0;
  uint32_t tid = 0;
  uint32_t point = 0;
};
static_assert(sizeof(Event) == 32);

inline constexpr uint64_t kMaxEvents = uint64_t{1} << 21;

namespace internal {
inline std::atomic<Event*> buffer{nullptr};
inline std::atomic<uint64_t> count{0};
inline std::once_flag made;
}  // namespace internal

/// Write the events recorded so far to FERRY_TRACE_FILE.<pid>; nothing when none was.
inline void Dump() {
  Event* events = internal::buffer.load();
  const char* path = std::getenv("FERRY_TRACE_FILE");
  if (events == nullptr || path == nullptr) return;
  char name[4096];
  std::snprintf(name, sizeof(name), "%s.%d", path, static_cast<int>(::getpid()));
  FILE* f = std::fopen(name, "wb");
  if (f == nullptr) return;
  uint64_t n = internal::count.load();
  if (n > kMaxEvents) n = kMaxEvents;
  (void)std::fwrite(events, sizeof(Event), n, f);
  (void)std::fclose(f);
}

/// Record `point` with ids `a` and `b` (only while FERRY_TRACE_FILE is set).
inline void Mark(Point point, uint64_t a, uint64_t b = 0) {
  std::call_once(internal::made, [] {
    if (std::getenv("FERRY_TRACE_FILE") == nullptr) return;
    internal::buffer.store(static_cast<Event*>(std::calloc(kMaxEvents, sizeof(Event))));
    std::atexit(Dump);
  });
  Event* events = internal::buffer.load(std::memory_order_relaxed);
  if (events == nullptr) return;
  thread_local const uint32_t tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  const uint64_t i = internal::count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMaxEvents) return;
  events[i] = Event{static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now().time_since_epoch())
                                              .count()),
                    a, b, tid, point};
}

}  // namespace ferry::trace

#if defined(FERRY_TRACE_POINTS) && FERRY_TRACE_POINTS
#define FERRY_TRACE(...) ::ferry::trace::Mark(__VA_ARGS__)
#else
#define FERRY_TRACE(...) \
  do {                   \
  } while (0)
#endif
