#include "session/launch_room.h"

#include <utility>

namespace ferry::session {

bool LaunchRoom::TryTake(uint64_t n) {
  uint64_t now = queued_.load(std::memory_order_relaxed);
  do {
    if (!Fits(now, n)) return false;
  } while (!queued_.compare_exchange_weak(now, now + n, std::memory_order_relaxed));
  return true;
}

void LaunchRoom::Give(uint64_t n) {
  // Sequentially consistent with Await's store and load: one of the two sees the other.
  queued_.fetch_sub(n);
  if (has_waiters_.load()) WakeAll();
}

void LaunchRoom::Await(uint64_t n, std::function<void()> wake) {
  {
    MutexLock lock(&mu_);
    waiters_.push_back(std::move(wake));
    has_waiters_.store(true);
  }
  // Room may have come between the caller's TryTake and the registration (a Give that saw
  // no waiter): look again, so that no waiter is left with nobody to wake it.
  if (Fits(queued_.load(), n)) WakeAll();
}

void LaunchRoom::WakeAll() {
  std::vector<std::function<void()>> wake;
  {
    MutexLock lock(&mu_);
    wake.swap(waiters_);
    has_waiters_.store(false);
  }
  for (auto& w : wake) w();
}

}  // namespace ferry::session
