// The host backend: a CPU emulation of one device with the semantics of backend.h.
//
// Device memory is host memory (256-byte aligned); a DevicePtr is its address. Each stream
// owns one worker thread that runs its work in FIFO order; one completion thread per device
// delivers every OnComplete callback, in the order the workers reach them. Built-in ops run
// as plain loops on the worker (f32/f64 arithmetic, Fill also for i32/u8); raw kernels and
// modules are UNSUPPORTED.
//
// Beyond backend.h, every enqueue checks that each device range the op touches lies inside
// one live allocation of this device (OUT_OF_RANGE otherwise, INVALID_ARGUMENT for a null
// pointer), so misuse is a typed error instead of a wild access to the daemon's heap. A
// graph's ranges are checked again at every LaunchGraph. An allocation whose Free has been
// enqueued is no longer live for new work.
//
// Graph capture on a host stream: Allocate during capture fails with INVALID_ARGUMENT; Free
// during capture is not recorded (it is enqueued for release as usual, so nothing leaks) and
// invalidates the capture, so EndCapture fails; OnComplete during capture is not recorded
// either and its callback gets INVALID_ARGUMENT.
//
// Lifetime: a HostDevice must outlive its streams and graphs. Destroying a stream waits for
// its queue to drain and its pending completions to be delivered (when the stream is
// destroyed on the completion thread itself, i.e. inside a callback, it cannot wait for its
// own later callbacks; they are still delivered, after the stream is gone).
//
// Launch queue (backend.h): a stream holds at most kHostLaunchQueueCommands commands not
// yet run (each op enqueued on its own, each completion, each graph replay whatever its
// size; not Free); an enqueue beyond them blocks until one has run, as on CUDA.
//
// Usage (backend.h): each op is timed on its worker with the steady clock (an injected op
// delay counts, as device time would); copies enqueued on their own count by direction.
//
// Thread-safety: as backend.h says. The ForTest hooks may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "backend/allocation_table.h"
#include "backend/backend.h"
#include "backend/registered_ranges.h"
#include "ferry/mutex.h"

namespace ferry::backend {

class HostStream;

/// The commands a host stream holds before an enqueue waits (CUDA's launch queue took about
/// 1024 per hardware work queue on the H200: docs/performance.md, "Known bounds").
inline constexpr uint64_t kHostLaunchQueueCommands = 1024;

/// The CPU emulation of one device. Create with Create() or CreateHostDevice().
class HostDevice final : public Device {
 public:
  /// Create a device emulating `options.memory_bytes` (> 0) of device memory.
  static Result<std::unique_ptr<HostDevice>> Create(const HostDeviceOptions& options);

  /// Deliver the completions still queued, stop the completion thread and release the
  /// memory still allocated. All streams of this device must already be destroyed.
  ~HostDevice() override;

  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;

  const DeviceInfo& info() const override { return info_; }
  Result<std::unique_ptr<Stream>> CreateStream() override;
  Status RegisterHostMemory(void* ptr, uint64_t bytes) override;
  Status UnregisterHostMemory(void* ptr) override;
  Result<std::shared_ptr<Module>> LoadModule(ModuleFormat format, std::string_view image) override;
  uint64_t bytes_in_use() const override;
  uint64_t free_memory() const override;
  Usage usage() const override { return usage_.Get(); }

  /// Make the op executed after `after_ops` more ops (counted across all streams of this
  /// device; skipped work, Free and completions do not count) fail at run time with
  /// `fault`, as a device fault would: it becomes its stream's sticky error. Replaces a
  /// fault armed earlier and not yet fired.
  void InjectFaultForTest(uint64_t after_ops, Status fault);
  /// Make the next Allocate on any stream of this device fail with OUT_OF_DEVICE_MEMORY.
  void FailNextAllocationForTest();
  /// Make every op (not Free or completions) sleep `delay` before it runs, so tests can
  /// observe asynchrony. Zero turns it off.
  void SetOpDelayForTest(std::chrono::microseconds delay);
  /// Return the number of host ranges registered and not unregistered.
  size_t registered_host_ranges_for_test() const;
  /// Return the number of allocations, of every HostDevice in the process, that are not yet
  /// released (by a Free that ran, or by their device's destructor).
  static uint64_t live_allocations_for_test();

 private:
  friend class HostStream;

  /// Counts one stream's completions posted and not yet delivered (guarded by
  /// completion_mu_), so the stream's destructor can wait for them.
  struct CompletionTracker {
    uint64_t pending = 0;
  };
  struct PendingCompletion {
    CompletionFn fn;
    Status status;
    std::shared_ptr<CompletionTracker> tracker;
  };

  explicit HostDevice(const HostDeviceOptions& options);

  /// Reserve and allocate `bytes` (> 0) of emulated device memory.
  Result<DevicePtr> AllocateMemory(uint64_t bytes);
  /// Mark `ptr` as freed for new work; return false when it is not a live allocation.
  bool MarkFreePending(DevicePtr ptr);
  /// Release the memory of an allocation marked by MarkFreePending.
  void ReleaseMemory(DevicePtr ptr);
  /// Return OK when [ptr, ptr+bytes) lies inside one live allocation (or bytes is 0 and
  /// ptr is not null).
  Status CheckRange(DevicePtr ptr, uint64_t bytes, std::string_view what) const;
  /// Return true when [ptr, ptr+bytes) lies inside one range RegisterHostMemory registered.
  bool IsRegisteredHost(const void* ptr, uint64_t bytes) const;
  /// Count one executed op against an injected fault; return the fault when it fires.
  std::optional<Status> TakeInjectedFault();
  std::chrono::microseconds op_delay() const {
    return std::chrono::microseconds(op_delay_us_.load(std::memory_order_relaxed));
  }

  /// Queue `fn(status)` for the completion thread; `tracker->pending` was already counted.
  void PostCompletion(PendingCompletion completion);
  /// Count one completion of the stream owning `tracker` as pending delivery.
  void AddPendingCompletion(const std::shared_ptr<CompletionTracker>& tracker);
  /// Block until every completion counted on `tracker` has been delivered.
  void WaitForCompletions(const std::shared_ptr<CompletionTracker>& tracker);
  bool OnCompletionThread() const;
  void CompletionLoop();

  const HostDeviceOptions options_;
  DeviceInfo info_;

  // mu_ guards the memory accounting, the host registrations and the fault-injection state.
  mutable Mutex mu_;
  uint64_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  // Live allocations; an entry's free is pending from Free's enqueue to its run.
  AllocationTable allocations_ ABSL_GUARDED_BY(mu_);
  RegisteredRanges registered_ ABSL_GUARDED_BY(mu_);
  bool fail_next_allocation_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Status> injected_fault_ ABSL_GUARDED_BY(mu_);
  uint64_t fault_countdown_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> fault_armed_{false};  // fast-path hint for injected_fault_
  std::atomic<int64_t> op_delay_us_{0};
  UsageCounter usage_;  // every stream's, added by their workers

  // completion_mu_ guards completions_, completion_stop_ and every CompletionTracker.
  mutable Mutex completion_mu_;
  CondVar completion_cv_;  // completions_ grew or completion_stop_ set
  CondVar delivered_cv_;   // some CompletionTracker::pending dropped
  std::deque<PendingCompletion> completions_ ABSL_GUARDED_BY(completion_mu_);
  bool completion_stop_ ABSL_GUARDED_BY(completion_mu_) = false;
  std::thread completion_thread_;  // started last in the constructor, joined first
};

}  // namespace ferry::backend
