// CudaStream's completions and the measurement of its usage (cuda_stream.h, stream_usage.h).

#include <utility>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_stream.h"

namespace ferry::backend {

using cuda_internal::InvalidArgument;
using stream_usage::kCopySampleInterval;
using stream_usage::kMaxTimedCopies;
using stream_usage::kMinTimedCopyBytes;
using stream_usage::Span;
using stream_usage::TimedCopyEvents;

void CudaStream::OnComplete(CompletionFn done) {
  if (!capturing_ && span_.open()) {
    if (WatchSpan(done)) return;  // else `done` is untouched: complete it as usual
  }
  if (capturing_) {
    watcher().WatchResolved(
        queue_,
        InvalidArgument("OnComplete during graph capture is not recorded; call it after "
                        "EndCapture"),
        std::move(done));
    return;
  }
  Status fault = watcher().fault();
  if (!fault.ok()) {
    DropSpan();
    watcher().WatchResolved(queue_, std::move(fault), std::move(done));
    return;
  }
  Status current = device_->MakeCurrent();
  if (!current.ok()) {
    watcher().WatchResolved(queue_, device_->CheckStatus(std::move(current)), std::move(done));
    return;
  }
  Result<cudaEvent_t> event = watcher().AcquireEvent();
  if (!event.ok()) {
    watcher().WatchResolved(queue_, device_->CheckStatus(event.status()), std::move(done));
    return;
  }
  Status recorded = device_->Check(cudaEventRecord(*event, stream_), "cudaEventRecord");
  if (!recorded.ok()) {
    watcher().ReleaseEvent(*event);
    watcher().WatchResolved(queue_, std::move(recorded), std::move(done));
    return;
  }
  watcher().Watch(queue_, *event, std::move(done));
}

void CudaStream::StartSpan() {
  if (capturing_ || span_.start != nullptr) return;
  Result<cudaEvent_t> event = watcher().AcquireTimingEvent();
  if (!event.ok()) return;
  if (cudaEventRecord(*event, stream_) != cudaSuccess) {
    (void)cudaGetLastError();
    watcher().ReleaseTimingEvent(*event);
    return;
  }
  span_.start = *event;
}

void CudaStream::DropSpan() {
  stream_usage::ReleaseSpan(&watcher(), span_);
  span_ = Span();
}

Status CudaStream::Copy(bool to_device, void* dst, const void* src, uint64_t bytes) {
  if (to_device) {
    return device_->Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                          "cudaMemcpyAsync (host to device)");
  }
  return device_->Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                        "cudaMemcpyAsync (device to host)");
}

Status CudaStream::TimedCopy(bool to_device, void* dst, const void* src, uint64_t bytes) {
  auto copy = [&] { return Copy(to_device, dst, src, bytes); };
  if (capturing_) return copy();  // inside a graph: counted in busy_ns only
  size_t& timed_so_far = to_device ? span_.timed_h2d : span_.timed_d2h;
  const int size_class = stream_usage::SizeClass(bytes);
  std::chrono::steady_clock::time_point& next_sample = next_sample_[to_device][size_class];
  const auto now = std::chrono::steady_clock::now();
  std::atomic<bool>& resample = rates_->resample[to_device][size_class];
  const bool sample = timed_so_far < kMaxTimedCopies && bytes >= kMinTimedCopyBytes &&
                      (now >= next_sample || resample.load(std::memory_order_relaxed));
  if (!sample && span_.start == nullptr && bytes >= kMinTimedCopyBytes &&
      rates_->Get(to_device, size_class) > 0) {
    if (!span_.open()) span_.first_estimated = now;
    Status status = copy();
    if (status.ok()) span_.estimated[to_device][size_class] += bytes;
    return status;
  }
  StartSpan();
  TimedCopyEvents timed;
  timed.to_device = to_device;
  timed.bytes = bytes;
  if (span_.start != nullptr && sample) {
    Result<cudaEvent_t> start = watcher().AcquireTimingEvent();
    Result<cudaEvent_t> end = watcher().AcquireTimingEvent();
    if (start.ok()) timed.start = *start;
    if (end.ok()) timed.end = *end;
  }
  const bool have_events = timed.start != nullptr && timed.end != nullptr;
  if (!have_events || cudaEventRecord(timed.start, stream_) != cudaSuccess) {
    if (have_events) (void)cudaGetLastError();  // the failed record's error, not a copy's
    if (timed.start != nullptr) watcher().ReleaseTimingEvent(timed.start);
    if (timed.end != nullptr) watcher().ReleaseTimingEvent(timed.end);
    Status status = copy();
    if (status.ok() && span_.start != nullptr) span_.untimed[to_device][size_class] += bytes;
    return status;
  }
  Status status = copy();
  if (status.ok() && cudaEventRecord(timed.end, stream_) == cudaSuccess) {
    span_.copies.push_back(timed);
    ++timed_so_far;
    next_sample = now + kCopySampleInterval;
    resample.store(false, std::memory_order_relaxed);
    return status;
  }
  (void)cudaGetLastError();
  // The start event may already be recorded: it completes with the stream, harmlessly.
  watcher().ReleaseTimingEvent(timed.start);
  watcher().ReleaseTimingEvent(timed.end);
  if (status.ok()) span_.untimed[to_device][size_class] += bytes;
  return status;
}

bool CudaStream::WatchSpan(CompletionFn& done) {
  if (!watcher().fault().ok() || !device_->MakeCurrent().ok()) {
    DropSpan();
    return false;
  }
  const bool timing = span_.start != nullptr;
  Result<cudaEvent_t> end = timing ? watcher().AcquireTimingEvent() : watcher().AcquireEvent();
  if (!end.ok()) {
    DropSpan();
    return false;
  }
  if (!device_->Check(cudaEventRecord(*end, stream_), "cudaEventRecord").ok()) {
    if (timing) {
      watcher().ReleaseTimingEvent(*end);
    } else {
      watcher().ReleaseEvent(*end);
    }
    DropSpan();
    return false;
  }
  Span span = std::move(span_);
  span_ = Span();
  watcher().Watch(
      queue_, *end,
      [span = std::move(span), end = *end, usage = usage_, rates = rates_, device = device_,
       watcher = &watcher(), done = std::move(done)](Status status) mutable {
        // Every event of the span precedes `end` on the stream: all have completed.
        if (status.ok()) {
          const Usage used =
              stream_usage::MeasureSpan(span, end, std::chrono::steady_clock::now(), rates.get());
          usage->Add(used);
          device->AddUsage(used);
        }
        stream_usage::ReleaseSpan(watcher, span);
        done(std::move(status));
      },
      timing);
  return true;
}

}  // namespace ferry::backend
