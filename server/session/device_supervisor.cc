#include "session/device_supervisor.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <vector>

namespace ferry::session {

Result<std::unique_ptr<DeviceSupervisor>> DeviceSupervisor::Create(Factory factory,
                                                                   ContextReset reset) {
  std::unique_ptr<DeviceSupervisor> s(new DeviceSupervisor(std::move(factory), std::move(reset)));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<backend::Device> device, s->factory_());
  {
    MutexLock lock(&s->mu_);  // not shared yet: for the analysis
    s->device_ = std::move(device);
  }
  return s;
}

DeviceSupervisor::~DeviceSupervisor() { JoinRebuild(); }

void DeviceSupervisor::JoinRebuild() {
  std::thread rebuilder;
  {
    MutexLock lock(&mu_);
    hooks_stopped_ = true;
    rebuilder = std::move(rebuilder_);
  }
  if (rebuilder.joinable()) rebuilder.join();
}

Result<DeviceSupervisor::Lease> DeviceSupervisor::Join(uint64_t session_id,
                                                       std::weak_ptr<DeviceLostListener> listener,
                                                       std::chrono::milliseconds wait) {
  MutexLock lock(&mu_);
  // The wait blocks the caller's executor thread, so it is short: an in-process rebuild
  // takes milliseconds, and one that cannot happen fails at once.
  if (!cv_.WaitFor(&mu_, wait,
                   [&] {
                     mu_.AssertHeld();
                     return (!lost_ && device_) || unrecoverable_now_;
                   }) ||
      unrecoverable_now_) {
    return Status(ErrorKind::kUnavailable, unrecoverable_now_
                                               ? "the daemon is restarting after a device fault"
                                               : "the device is being rebuilt after a fault");
  }
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<backend::Stream> stream, device_->CreateStream());
  ++streams_;
  listeners_[session_id] = std::move(listener);
  return Lease{std::move(stream), generation_};
}

bool DeviceSupervisor::serving() const {
  MutexLock lock(&mu_);
  return device_ && !lost_ && !unrecoverable_now_;
}

backend::Device* DeviceSupervisor::device() {
  MutexLock lock(&mu_);
  return device_.get();
}

void DeviceSupervisor::ReleaseStream(uint64_t generation) {
  MutexLock lock(&mu_);
  if (generation != generation_) return;
  --streams_;
  if (lost_ && streams_ == 0) RebuildLocked();
}

void DeviceSupervisor::Leave(uint64_t session_id) {
  MutexLock lock(&mu_);
  listeners_.erase(session_id);
}

void DeviceSupervisor::ReportFault(uint64_t generation, uint64_t session_id, const Status& fault) {
  std::vector<std::shared_ptr<DeviceLostListener>> notify;
  DeviceLoss loss;
  {
    MutexLock lock(&mu_);
    if (generation != generation_ || lost_) return;  // already being handled
    lost_ = true;
    lost_at_ = std::chrono::steady_clock::now();
    last_fault_ = fault.ToString();
    loss.generation = generation;
    loss.fault = fault;
    loss.reporter = session_id;
    loss.raw_kernels_in_flight = raw_in_flight_ > 0;
    for (auto& [id, weak] : listeners_) {
      if (auto l = weak.lock()) notify.push_back(std::move(l));
    }
    spdlog::error(
        "device fault reported by session {}: {}; rebuilding the device for {} "
        "session(s)",
        session_id, fault.ToString(), notify.size());
    // Before any rebuild can start, so that "back" always follows "lost". The hook does
    // not call back into the supervisor, so it may run under mu_.
    if (serving_hook_ && !hooks_stopped_) serving_hook_(false);
    if (streams_ == 0) RebuildLocked();
  }
  for (auto& l : notify) l->NotifyDeviceLost(loss);
}

// Every stream of the lost generation is gone: rebuild on a thread of its own, so that no
// session executor blocks on it.
void DeviceSupervisor::RebuildLocked() {
  std::unique_ptr<backend::Device> old = std::move(device_);
  // The previous rebuild has made its device, but its thread may still be running the hooks
  // (after it let go of mu_): this one joins it first, so that JoinRebuild, joining the last,
  // leaves none running (a detached one could call the hooks after the daemon is gone).
  std::thread previous = std::move(rebuilder_);
  rebuilder_ = std::thread([this, old = std::move(old), previous = std::move(previous)]() mutable {
    pthread_setname_np(pthread_self(), "ferry-rebuild");
    if (previous.joinable()) previous.join();
    spdlog::warn("rebuilding the device: destroying the old one");
    old.reset();
    spdlog::warn("rebuilding the device: resetting the context");
    Status reset = reset_ ? reset_() : Status::Ok();
    if (!reset.ok()) spdlog::error("device context reset failed: {}", reset.ToString());
    spdlog::warn("rebuilding the device: creating the new one");
    auto fresh = factory_();
    MutexLock lock(&mu_);
    if (!fresh.ok()) {
      spdlog::critical("cannot rebuild the device in this process: {}", fresh.status().ToString());
      unrecoverable_now_ = true;
      cv_.NotifyAll();
      std::function<void(const Status&)> handler;
      if (!hooks_stopped_) handler = unrecoverable_;
      lock.Unlock();
      if (handler) handler(fresh.status());
      return;  // stays lost: new sessions get UNAVAILABLE until the owner restarts us
    }
    device_ = std::move(*fresh);
    ++generation_;
    streams_ = 0;
    lost_ = false;
    ++resets_;
    last_recovery_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - lost_at_)
                            .count();
    spdlog::warn("device rebuilt after the fault in {} ms (generation {})",
                 last_recovery_ms_.load(), generation_);
    cv_.NotifyAll();
    const uint64_t rebuilt = generation_;
    // Once JoinRebuild has run, what the hooks reach may be gone; a JoinRebuild that comes
    // after this look joins this thread, so the hook ends before it returns.
    const bool hooks = !hooks_stopped_;
    lock.Unlock();  // the rebuilt hook calls back into device()
    if (hooks && rebuilt_hook_) rebuilt_hook_();
    // "Back" only while this generation still serves: a fault reported during the hook has
    // said "lost" already, and the rebuild it started says "back" in turn. Under mu_, as
    // ReportFault says "lost", so that the two never cross.
    lock.Lock();
    if (serving_hook_ && !hooks_stopped_ && !lost_ && generation_ == rebuilt) serving_hook_(true);
  });
}

backend::DeviceInfo DeviceSupervisor::info() const {
  MutexLock lock(&mu_);
  if (!device_) return backend::DeviceInfo{};
  return device_->info();
}

uint64_t DeviceSupervisor::bytes_in_use() const {
  MutexLock lock(&mu_);
  return device_ ? device_->bytes_in_use() : 0;
}

uint64_t DeviceSupervisor::free_memory() const {
  MutexLock lock(&mu_);
  return device_ ? device_->free_memory() : 0;
}

std::string DeviceSupervisor::last_fault() const {
  MutexLock lock(&mu_);
  return last_fault_;
}

}  // namespace ferry::session
