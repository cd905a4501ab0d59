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

uint64_t LaunchRoom::Await(uint64_t n, std::shared_ptr<LaunchShare> share,
                           std::function<bool()> wake) {
  uint64_t id = 0;
  {
    MutexLock lock(&mu_);
    id = next_wait_id_++;
    waiters_.push_back(Waiter{id, n, std::move(share), std::move(wake)});
    waiter_count_.store(waiters_.size(), std::memory_order_relaxed);
    has_waiters_.store(true);
  }
  // Room may have come between the caller's TryTake and the registration (a Give that saw
  // no waiter): look again, so that no waiter is left with nobody to wake it. (This also
  // counts the new waiter in room_waiters_ where the room is what it waits for.)
  WakeThoseThatFit();
  return id;
}

void LaunchRoom::Cancel(uint64_t id) {
  bool removed = false;
  {
    MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->id != id) continue;
      if (it->for_room) room_waiters_.fetch_sub(1);
      waiters_.erase(it);
      removed = true;
      break;
    }
    waiter_count_.store(waiters_.size(), std::memory_order_relaxed);
    has_waiters_.store(!waiters_.empty());
  }
  // It may have held back those behind it (and every TryTake): look at them again.
  if (removed && has_waiters_.load()) WakeThoseThatFit();
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
  // Commands that served waiters gave back (nobody held them) make room for those behind:
  // another pass, until a pass gives nothing back.
  for (bool again = true; again;) {
    again = false;
    served.clear();
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
      waiter_count_.store(waiters_.size(), std::memory_order_relaxed);
      has_waiters_.store(!waiters_.empty());
    }
    for (Served& w : served) {
      if (w.wake()) continue;
      // Nobody holds them: back at once (Give's accounting, without its own pass).
      if (w.share) w.share->queued.fetch_sub(w.n);
      queued_.fetch_sub(w.n);
      again = true;
    }
    again = again && has_waiters_.load();
  }
}

}  // namespace ferry::session
