#include "session/launch_room.h"

#include <utility>
#include <vector>

namespace ferry::session {
namespace {

// Add `n` to `count` if it then fits `limit` (LaunchRoom::Fits).
template <typename FitsFn>
bool AddIfFits(std::atomic<uint64_t>& count, uint64_t n, FitsFn fits) {
  uint64_t now = count.load(std::memory_order_relaxed);
  do {
    if (!fits(now)) return false;
  } while (!count.compare_exchange_weak(now, now + n, std::memory_order_relaxed));
  return true;
}

}  // namespace

bool LaunchRoom::TryTake(uint64_t n, LaunchShare* share) {
  if (share &&
      !AddIfFits(share->queued, n, [&](uint64_t now) { return Fits(now, n, share->limit); })) {
    return false;
  }
  if (AddIfFits(queued_, n, [&](uint64_t now) { return Fits(now, n, limit_); })) return true;
  if (share) {
    // Not taken after all: a waiter of this identity passed over meanwhile for the share
    // this take held must be looked at again.
    share->queued.fetch_sub(n);
    if (has_waiters_.load()) WakeThoseThatFit();
  }
  return false;
}

void LaunchRoom::Add(uint64_t n, LaunchShare* share) {
  queued_.fetch_add(n, std::memory_order_relaxed);
  if (share) share->queued.fetch_add(n, std::memory_order_relaxed);
}

void LaunchRoom::Give(uint64_t n, LaunchShare* share) {
  // Sequentially consistent with Await's store and load: one of the two sees the other.
  if (share) share->queued.fetch_sub(n);
  queued_.fetch_sub(n);
  if (has_waiters_.load()) WakeThoseThatFit();
}

void LaunchRoom::Await(uint64_t n, std::shared_ptr<LaunchShare> share, std::function<void()> wake) {
  const bool fits_share = FitsShare(share.get(), 0, n);
  {
    MutexLock lock(&mu_);
    waiters_.push_back(Waiter{n, std::move(share), std::move(wake)});
    has_waiters_.store(true);
  }
  // Room may have come between the caller's TryTake and the registration (a Give that saw
  // no waiter): look again, so that no waiter is left with nobody to wake it.
  if (fits_share && Fits(queued_.load(), n, limit_)) WakeThoseThatFit();
}

void LaunchRoom::WakeThoseThatFit() {
  std::vector<std::function<void()>> wake;
  {
    MutexLock lock(&mu_);
    uint64_t promised = queued_.load();
    // Promised to the shares of those woken in this pass (few: one entry per identity).
    std::vector<std::pair<const LaunchShare*, uint64_t>> promised_to_share;
    auto share_promised = [&](const LaunchShare* s) -> uint64_t& {
      for (auto& [share, n] : promised_to_share) {
        if (share == s) return n;
      }
      return promised_to_share.emplace_back(s, 0).second;
    };
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      const LaunchShare* share = it->share.get();
      if (share && !FitsShare(share, share_promised(share), it->n)) {
        ++it;  // waits for its own identity's commands: holds back nobody
        continue;
      }
      if (!Fits(promised, it->n, limit_)) break;
      promised += it->n;
      if (share) share_promised(share) += it->n;
      wake.push_back(std::move(it->wake));
      it = waiters_.erase(it);
    }
    has_waiters_.store(!waiters_.empty());
  }
  for (auto& w : wake) w();
}

}  // namespace ferry::session
