// DeviceSupervisor: owns the daemon's Device and rebuilds it after a device fault.
//
// A sticky device error (an illegal address in a raw kernel, ...) leaves the CUDA context
// unusable for everyone. The first session that sees one reports it; the supervisor then
// tells every session (DeviceLostListener::OnDeviceLost, on the session's own executor),
// waits until each has dropped its stream, destroys the device, resets the context and
// creates a new device. Sessions opened meanwhile wait for the new device.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "ferry/mutex.h"

namespace ferry::session {

/// What a session is told when the device it runs on is lost.
struct DeviceLoss {
  uint64_t generation = 0;
  Status fault;                        // the error the reporting session saw
  uint64_t reporter = 0;               // id of the session that reported it first
  bool raw_kernels_in_flight = false;  // some session had raw kernels in flight then
};

class DeviceLostListener {
 public:
  virtual ~DeviceLostListener() = default;
  /// Called from any thread; implementations post to their own executor.
  virtual void NotifyDeviceLost(const DeviceLoss& loss) = 0;
};

class DeviceSupervisor {
 public:
  using Factory = std::function<Result<std::unique_ptr<backend::Device>>()>;
  /// Reset the device context after the device object is destroyed (cudaDeviceReset); may
  /// be empty where there is nothing to reset (the host backend).
  using ContextReset = std::function<Status()>;

  static Result<std::unique_ptr<DeviceSupervisor>> Create(Factory factory, ContextReset reset);
  ~DeviceSupervisor();
  /// Wait for a rebuild in progress (if any) to finish, and call no hook after it (a later
  /// fault still rebuilds the device, silently). The hooks reach what the owner gave them,
  /// so the owner calls this before any of that goes. Any thread but the rebuild's.
  void JoinRebuild();

  /// A stream on the current device, and the generation it belongs to.
  struct Lease {
    std::unique_ptr<backend::Stream> stream;
    uint64_t generation = 0;
  };
  /// Create a stream for a new session and register `listener` (until Leave). Waits up to
  /// `wait` while the device is being rebuilt; UNAVAILABLE if it is not back by then.
  Result<Lease> Join(uint64_t session_id, std::weak_ptr<DeviceLostListener> listener,
                     std::chrono::milliseconds wait = std::chrono::seconds(5));
  /// True while the device serves: a Join now creates a stream at once, without waiting for a
  /// rebuild (unless a fault comes in between).
  bool serving() const;
  /// Return the current device, for calls a session makes while it holds a stream of
  /// `generation` (the device stays alive until that stream is released).
  backend::Device* device();
  /// The session destroyed its stream of `generation`.
  void ReleaseStream(uint64_t generation);
  /// The session is gone.
  void Leave(uint64_t session_id);

  /// A session saw a sticky device error on a stream of `generation`.
  void ReportFault(uint64_t generation, uint64_t session_id, const Status& fault);

  /// Call `fn` (on the rebuild thread, no lock held) each time a new device replaced a lost
  /// one, e.g. to register host memory with it again. Set before serving.
  void SetRebuiltHook(std::function<void()> fn) { rebuilt_hook_ = std::move(fn); }
  /// Call `fn(false)` when the device is lost and `fn(true)` when it is back (from the
  /// reporting or the rebuild thread, under the supervisor's lock, so calls never cross),
  /// e.g. for the health service. `fn` must not call back into the supervisor.
  void SetServingHook(std::function<void(bool)> fn) {
    MutexLock lock(&mu_);
    serving_hook_ = std::move(fn);
  }

  /// Call `fn` (from the rebuild thread) when the device cannot be rebuilt in this process
  /// after a fault (seen on CUDA: after a sticky fault the driver refuses a new context in
  /// the same process). The owner then restarts the process (main.cc re-executes ferryd).
  void SetUnrecoverableHandler(std::function<void(const Status&)> fn) {
    MutexLock lock(&mu_);
    unrecoverable_ = std::move(fn);
  }
  /// Carry the fault history over a process restart.
  void SetHistory(uint64_t resets, std::string last_fault) {
    MutexLock lock(&mu_);
    resets_ = resets;
    last_fault_ = std::move(last_fault);
  }

  /// Count raw kernel launches in flight, device-wide (to tell the faulting session).
  void RawLaunchesEnqueued(int64_t n) { raw_in_flight_ += n; }

  // For status reporting.
  backend::DeviceInfo info() const;
  uint64_t bytes_in_use() const;
  uint64_t free_memory() const;
  uint64_t resets() const { return resets_; }
  std::string last_fault() const;
  uint64_t last_recovery_ms() const { return last_recovery_ms_; }

 private:
  DeviceSupervisor(Factory factory, ContextReset reset)
      : factory_(std::move(factory)), reset_(std::move(reset)) {}
  void RebuildLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Factory factory_;
  ContextReset reset_;
  std::function<void()> rebuilt_hook_;
  std::function<void(bool)> serving_hook_ ABSL_GUARDED_BY(mu_);
  mutable Mutex mu_;
  CondVar cv_;
  std::unique_ptr<backend::Device> device_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t streams_ ABSL_GUARDED_BY(mu_) = 0;            // of generation_
  bool lost_ ABSL_GUARDED_BY(mu_) = false;               // generation_ is lost
  bool unrecoverable_now_ ABSL_GUARDED_BY(mu_) = false;  // rebuilding failed: only a restart helps
  std::chrono::steady_clock::time_point lost_at_ ABSL_GUARDED_BY(mu_);
  std::string last_fault_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::weak_ptr<DeviceLostListener>> listeners_ ABSL_GUARDED_BY(mu_);
  std::thread rebuilder_ ABSL_GUARDED_BY(mu_);
  bool hooks_stopped_ ABSL_GUARDED_BY(mu_) = false;  // JoinRebuild ran: call no hook
  std::function<void(const Status&)> unrecoverable_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> raw_in_flight_{0};
  std::atomic<uint64_t> resets_{0};
  std::atomic<uint64_t> last_recovery_ms_{0};
};

}  // namespace ferry::session
