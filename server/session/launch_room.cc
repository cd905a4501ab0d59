#include "session/launch_room.h"

#include <utility>
#include <vector>

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
  if (has_waiters_.load()) WakeThoseThatFit();
}

void LaunchRoom::Await(uint64_t n, std::function<void()> wake) {
  {
    MutexLock lock(&mu_);
    waiters_.push_back(Waiter{n, std::move(wake)});
    has_waiters_.store(true);
  }
  // Room may have come between the caller's TryTake and the registration (a Give that saw
  // no waiter): look again, so that no waiter is left with nobody to wake it.
  if (Fits(queued_.load(), n)) WakeThoseThatFit();
}

void LaunchRoom::WakeThoseThatFit() {
  std::vector<std::function<void()>> wake;
  {
    MutexLock lock(&mu_);
    uint64_t promised = queued_.load();
    while (!waiters_.empty() && Fits(promised, waiters_.front().n)) {
      promised += waiters_.front().n;
      wake.push_back(std::move(waiters_.front().wake));
      waiters_.pop_front();
    }
    has_waiters_.store(!waiters_.empty());
  }
  for (auto& w : wake) w();
}

}  // namespace ferry::session
