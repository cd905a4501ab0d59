// CompletionWatcher: the one thread per CUDA device that turns recorded events into
// completion callbacks.
//
// Why polling: design.md measured event polling 3x faster than cudaLaunchHostFunc. The
// watcher queries the event at the head of each stream's queue with cudaEventQuery; while
// anything is pending it spins for kBusySpin since the last completion (an 8 MiB copy takes
// ~160 µs: a sleeping watcher would add its oversleep to every such transfer), then sleeps
// in growing steps up to kMaxSleep; with nothing pending it spins for kIdleSpin more (an
// owner often submits again right after its completion: a client's round trip is ~100 µs),
// then blocks on a condition variable. New work wakes it and restarts the spin. The cost is
// one core while the device has work whose completion is due soon; an idle daemon sleeps.
// Sleeps use a 1 µs timer slack (Linux's default of 50 µs would dominate them).
//
// Ordering and errors: callbacks of one stream run in the order they were watched, each
// exactly once. A stream's event that reports a CUDA error (a sticky fault: the context is
// broken) completes with DEVICE_FAULT naming the error; from then on the watcher stops
// querying and completes every pending and later callback, of every stream of the device,
// with that first fault (a dead context never makes it hang or spin). A callback may be
// watched with a fixed status instead of an event (e.g. OnComplete during graph capture):
// it runs when it reaches the head of its stream's queue.
//
// Events come from a per-device pool (created with cudaEventDisableTiming) and go back to
// it after their callback ran. A second pool holds timing events, for the streams' usage
// measurement (stream_usage.h): a completion may be watched on a timing event, which goes
// back to that pool.
//
// Thread-safety: all public methods are safe from any thread. Callbacks run on the watcher
// thread, outside the watcher's lock, so a callback may call Watch again (and may destroy a
// stream: the stream does not then wait for its own later callbacks). The spinning watcher
// takes no lock while nothing new was watched and no fault was seen (atomic flags say so), and
// the event pools have a lock of their own: the threads that enqueue work and watch it, which
// take these locks on every completion, do not meet a spinning watcher holding them.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "ferry/mutex.h"

namespace ferry::backend {

class CompletionWatcher {
 public:
  static constexpr std::chrono::microseconds kBusySpin{2000};
  static constexpr std::chrono::microseconds kIdleSpin{250};
  static constexpr std::chrono::microseconds kMaxSleep{200};

  /// One watched stream's bookkeeping: its callbacks watched and not yet run.
  class Queue {
   private:
    friend class CompletionWatcher;
    std::atomic<uint64_t> pending_{0};
  };

  /// Start the watcher thread for device `ordinal` (made current on the thread).
  explicit CompletionWatcher(int ordinal);
  /// Run every callback still pending, then stop the thread. Streams should be gone.
  ~CompletionWatcher();

  CompletionWatcher(const CompletionWatcher&) = delete;
  CompletionWatcher& operator=(const CompletionWatcher&) = delete;

  /// Return a new per-stream queue for Watch.
  std::shared_ptr<Queue> NewQueue() { return std::make_shared<Queue>(); }

  /// Take an event from the pool (or create one). The caller records it and passes it to
  /// Watch, or returns it with ReleaseEvent.
  Result<cudaEvent_t> AcquireEvent() { return Acquire(/*timing=*/false); }
  void ReleaseEvent(cudaEvent_t event) { Release(event, /*timing=*/false); }
  /// The same, for events that record a timestamp (cudaEventElapsedTime works on them).
  Result<cudaEvent_t> AcquireTimingEvent() { return Acquire(/*timing=*/true); }
  void ReleaseTimingEvent(cudaEvent_t event) { Release(event, /*timing=*/true); }

  /// Call `done` once `event` (recorded on the stream of `queue`) has completed, after the
  /// callbacks watched on `queue` before it. `timing`: the event came from
  /// AcquireTimingEvent (it goes back to that pool after `done` ran).
  void Watch(const std::shared_ptr<Queue>& queue, cudaEvent_t event, CompletionFn done,
             bool timing = false);
  /// Call `done` with `status` once the callbacks watched on `queue` before it have run.
  void WatchResolved(const std::shared_ptr<Queue>& queue, Status status, CompletionFn done);

  /// Block until every callback watched on `queue` has run. Must not be called on the
  /// watcher thread (see OnWatcherThread).
  void WaitForQueue(const std::shared_ptr<Queue>& queue);
  bool OnWatcherThread() const;

  /// Return the first device fault seen (OK while the context is healthy).
  Status fault() const;
  /// Record a device fault seen elsewhere (e.g. by an enqueue), so pending callbacks
  /// complete with it instead of waiting on a broken context.
  void ReportFault(const Status& fault);

 private:
  // An event of the pool of timing or of non-timing events (created when it is empty), and
  // back.
  Result<cudaEvent_t> Acquire(bool timing);
  void Release(cudaEvent_t event, bool timing);
  struct Entry {
    cudaEvent_t event = nullptr;   // null: already resolved with `status`
    bool timing = false;           // event is from the timing pool
    std::optional<Status> status;  // the fixed status of a resolved entry
    CompletionFn done;
  };
  struct StreamQueue {
    std::shared_ptr<Queue> queue;
    std::deque<Entry> entries;
  };

  void Push(const std::shared_ptr<Queue>& queue, Entry entry);
  void Loop();
  /// Run every entry at the head of a stream queue that is ready; return how many ran.
  /// Watcher thread only.
  size_t PollOnce();
  /// Run one entry's callback with `status` and account for it. Watcher thread only.
  void Deliver(StreamQueue& stream, Entry entry, Status status);

  const int ordinal_;

  mutable Mutex mu_;
  CondVar wake_cv_;       // incoming_ grew or stop_ was set
  CondVar delivered_cv_;  // some Queue::pending_ dropped to 0 while a WaitForQueue waited
  // Entries watched since the watcher last looked, per queue, in watch order.
  std::vector<std::pair<std::shared_ptr<Queue>, Entry>> incoming_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Status fault_ ABSL_GUARDED_BY(mu_);
  // Lock-free hints for the spinning watcher: set (under mu_) when incoming_ gained entries,
  // cleared when the watcher takes them; set once fault_ is.
  std::atomic<bool> has_incoming_{false};
  std::atomic<bool> faulted_{false};
  std::atomic<int> queue_waiters_{0};  // WaitForQueue calls waiting (they hold mu_ to check)

  Mutex pool_mu_;
  std::vector<cudaEvent_t> free_events_ ABSL_GUARDED_BY(pool_mu_);
  std::vector<cudaEvent_t> free_timing_events_ ABSL_GUARDED_BY(pool_mu_);

  // Watcher-thread state: the entries being polled, by queue.
  std::unordered_map<Queue*, StreamQueue> streams_;
  uint64_t streams_pending_ = 0;  // entries in streams_

  std::thread thread_;  // started last in the constructor
};

}  // namespace ferry::backend
