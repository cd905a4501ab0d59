#include "backend/cuda/completion_watcher.h"

#include <pthread.h>
#include <sys/prctl.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_internal.h"

namespace ferry::backend {

using cuda_internal::CudaStatus;

CompletionWatcher::CompletionWatcher(int ordinal) : ordinal_(ordinal) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ferry-watcher");
    Loop();
  });
}

CompletionWatcher::~CompletionWatcher() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_cv_.NotifyAll();
  thread_.join();
  for (cudaEvent_t event : free_events_) (void)cudaEventDestroy(event);
  for (cudaEvent_t event : free_timing_events_) (void)cudaEventDestroy(event);
  (void)cudaGetLastError();
}

Result<cudaEvent_t> CompletionWatcher::Acquire(bool timing) {
  {
    MutexLock lock(&pool_mu_);
    std::vector<cudaEvent_t>& pool = timing ? free_timing_events_ : free_events_;
    if (!pool.empty()) {
      cudaEvent_t event = pool.back();
      pool.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  FERRY_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

void CompletionWatcher::Release(cudaEvent_t event, bool timing) {
  MutexLock lock(&pool_mu_);
  (timing ? free_timing_events_ : free_events_).push_back(event);
}

void CompletionWatcher::Watch(const std::shared_ptr<Queue>& queue, cudaEvent_t event,
                              CompletionFn done, bool timing) {
  Entry entry;
  entry.event = event;
  entry.timing = timing;
  entry.done = std::move(done);
  Push(queue, std::move(entry));
}

void CompletionWatcher::WatchResolved(const std::shared_ptr<Queue>& queue, Status status,
                                      CompletionFn done) {
  Entry entry;
  entry.status = std::move(status);
  entry.done = std::move(done);
  Push(queue, std::move(entry));
}

void CompletionWatcher::Push(const std::shared_ptr<Queue>& queue, Entry entry) {
  {
    MutexLock lock(&mu_);
    ++queue->pending_;
    incoming_.emplace_back(queue, std::move(entry));
    has_incoming_.store(true, std::memory_order_release);
  }
  wake_cv_.NotifyOne();
}

void CompletionWatcher::WaitForQueue(const std::shared_ptr<Queue>& queue) {
  MutexLock lock(&mu_);
  ++queue_waiters_;
  delivered_cv_.Wait(&mu_, [&queue] { return queue->pending_ == 0; });
  --queue_waiters_;
}

bool CompletionWatcher::OnWatcherThread() const {
  return std::this_thread::get_id() == thread_.get_id();
}

Status CompletionWatcher::fault() const {
  if (!faulted_.load(std::memory_order_acquire)) return Status::Ok();
  MutexLock lock(&mu_);
  return fault_;
}

void CompletionWatcher::ReportFault(const Status& fault) {
  if (fault.ok()) return;
  MutexLock lock(&mu_);
  if (fault_.ok()) fault_ = fault;
  faulted_.store(true, std::memory_order_release);
}

void CompletionWatcher::Loop() {
  // Events belong to the device's primary context; make it current on this thread.
  (void)cudaSetDevice(ordinal_);
  ::prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 µs: the back-off sleeps are tens of µs
  (void)cudaGetLastError();
  using Clock = std::chrono::steady_clock;
  Clock::time_point idle_since = Clock::now();
  std::vector<std::pair<std::shared_ptr<Queue>, Entry>> batch;
  for (;;) {
    const bool incoming = has_incoming_.load(std::memory_order_acquire);
    if (streams_pending_ == 0 && !incoming && Clock::now() - idle_since < kIdleSpin) {
      // Idle. Spin a little before blocking: an owner that submits again right after its
      // completion then finds the watcher awake, saving a thread wake-up (several µs).
      std::this_thread::yield();
      continue;
    }
    // Work pending and nothing new watched: straight to polling, without the lock.
    if (streams_pending_ == 0 || incoming) {
      MutexLock lock(&mu_);
      if (streams_pending_ == 0 && incoming_.empty()) {
        wake_cv_.Wait(&mu_, [this] {
          mu_.AssertHeld();
          return stop_ || !incoming_.empty();
        });
        if (incoming_.empty()) return;  // stopping, and every callback has run
      }
      if (!incoming_.empty()) {
        batch.swap(incoming_);
        has_incoming_.store(false, std::memory_order_relaxed);
        idle_since = Clock::now();  // new work: spin again, it may finish within µs
      }
    }
    for (auto& [queue, entry] : batch) {
      StreamQueue& stream = streams_[queue.get()];
      if (!stream.queue) stream.queue = queue;
      stream.entries.push_back(std::move(entry));
      ++streams_pending_;
    }
    batch.clear();

    if (PollOnce() > 0) {
      idle_since = Clock::now();
      continue;
    }
    if (streams_pending_ == 0) continue;  // block on the condition variable
    const auto idle = Clock::now() - idle_since;
    if (idle < kBusySpin) {
      std::this_thread::yield();
      continue;
    }
    // Back off: sleep a quarter of the time already waited, between 10 µs and kMaxSleep,
    // and wake at once for newly watched work.
    const auto sleep = std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(idle / 4),
                                  std::chrono::microseconds(10), kMaxSleep);
    MutexLock lock(&mu_);
    wake_cv_.WaitFor(&mu_, sleep, [this] {
      mu_.AssertHeld();
      return !incoming_.empty();
    });
  }
}

size_t CompletionWatcher::PollOnce() {
  size_t ran = 0;
  Status fault = this->fault();
  for (auto it = streams_.begin(); it != streams_.end();) {
    StreamQueue& stream = it->second;
    while (!stream.entries.empty()) {
      Entry& head = stream.entries.front();
      Status status;
      if (head.event == nullptr) {
        status = head.status.value_or(Status::Ok());
      } else if (!fault.ok()) {
        status = fault;  // the context is broken: report the first fault, query nothing
      } else {
        const cudaError_t error = cudaEventQuery(head.event);
        if (error == cudaErrorNotReady) break;
        if (error != cudaSuccess) {
          status = CudaStatus(error, "stream work");
          if (status.kind() == ErrorKind::kDeviceFault) {
            ReportFault(status);
            fault = this->fault();
            status = fault;
          }
        }
      }
      Entry entry = std::move(head);
      stream.entries.pop_front();
      Deliver(stream, std::move(entry), std::move(status));
      ++ran;
    }
    if (stream.entries.empty()) {
      it = streams_.erase(it);
    } else {
      ++it;
    }
  }
  return ran;
}

void CompletionWatcher::Deliver(StreamQueue& stream, Entry entry, Status status) {
  if (entry.done) entry.done(std::move(status));
  entry.done = nullptr;  // destroy the callback's state before counting it delivered
  if (entry.event != nullptr) {
    if (entry.timing) {
      ReleaseTimingEvent(entry.event);
    } else {
      ReleaseEvent(entry.event);
    }
  }
  --streams_pending_;
  // A waiter checks pending_ under mu_: taking mu_ before the notification means it either
  // sees the new count or is already waiting.
  if (--stream.queue->pending_ == 0 && queue_waiters_.load() > 0) {
    { MutexLock lock(&mu_); }
    delivered_cv_.NotifyAll();
  }
}

}  // namespace ferry::backend
