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

bool LaunchRoom::TakeBoth(uint64_t n, LaunchShare* share) {
  if (share &&
      !AddIfFits(share->queued, n, [&](uint64_t now) { return Fits(now, n, share->limit); })) {
    return false;
  }
  if (AddIfFits(queued_, n, [&](uint64_t now) { return Fits(now, n, limit_); })) return true;
  if (share) share->queued.fetch_sub(n);
  return false;
}

bool LaunchRoom::TryTake(uint64_t n, LaunchShare* share) {
  // Behind those already waiting; a take of nothing (an op that puts nothing on the stream)
  // passes nobody.
  if (n > 0 && room_waiters_.load() > 0) return false;
  if (TakeBoth(n, share)) return true;
  // Not taken after all: a waiter of this identity passed over meanwhile for the share
  // this take held must be looked at again.
  if (share && has_waiters_.load()) WakeThoseThatFit();
  return false;
}

void LaunchRoom::Add(uint64_t n, LaunchShare* share) {
  queued_.fetch_add(n, std::memory_order_relaxed);
  if (share) share->queued.fetch_add(n, std::memory_order_relaxed);
}

void LaunchRoom::Give(uint64_t n, LaunchShare* share) {
  if (n == 0 && !has_waiters_.load()) return;
  // Sequentially consistent with Await's store and load: one of the two sees the other.
  if (share) share->queued.fetch_sub(n);
  queued_.fetch_sub(n);
  if (has_waiters_.load()) WakeThoseThatFit();
}

void LaunchRoom::Await(uint64_t n, std::shared_ptr<LaunchShare> share, std::function<bool()> wake) {
  {
    MutexLock lock(&mu_);
    waiters_.push_back(Waiter{n, std::move(share), std::move(wake)});
    has_waiters_.store(true);
  }
  // Room may have come between the caller's TryTake and the registration (a Give that saw
  // no waiter): look again, so that no waiter is left with nobody to wake it. (This also
  // counts the new waiter in room_waiters_ where the room is what it waits for.)
  WakeThoseThatFit();
}

void LaunchRoom::WakeThoseThatFit() {
  // The waiters served: their wake-ups run outside the lock; each keeps its share alive
  // until its commands are held or given back.
  struct Served {
    std::function<bool()> wake;
    uint64_t n = 0;
    std::shared_ptr<LaunchShare> share;
  };
  std::vector<Served> served;
  {
    MutexLock lock(&mu_);
    bool room_full = false;  // a waiter for the room was not served: those behind wait too
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      const bool fits_share = FitsShare(it->share.get(), it->n);
      if (fits_share != it->for_room) {  // what it waits for changed
        it->for_room = fits_share;
        fits_share ? room_waiters_.fetch_add(1) : room_waiters_.fetch_sub(1);
      }
      if (!fits_share || room_full || !TakeBoth(it->n, it->share.get())) {
        // Waits for its own identity's commands (holds back nobody), or for the room.
        room_full = room_full || fits_share;
        ++it;
        continue;
      }
      if (it->for_room) room_waiters_.fetch_sub(1);
      served.push_back({std::move(it->wake), it->n, std::move(it->share)});
      it = waiters_.erase(it);
    }
    has_waiters_.store(!waiters_.empty());
  }
  for (Served& w : served) {
    if (!w.wake()) Give(w.n, w.share.get());  // nobody holds them: back at once
  }
}

}  // namespace ferry::session
