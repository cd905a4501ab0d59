// LaunchRoom: the daemon-wide count of device commands all sessions keep queued, so that no
// enqueue waits in CUDA's launch queue.
//
// Why: CUDA's launch queue holds about 1024 commands per hardware work queue, and the
// streams CUDA maps to one work queue share it (measured on the H200: docs/performance.md,
// "Launch queue"); a launch beyond them blocks its thread, an executor thread every session
// needs. Each session keeps at most session-queued-commands on its own stream
// (session/session.h), but sessions on one work queue add up, and which work queue a
// stream gets is CUDA's choice. So all sessions together keep at most `limit` (ferryd's
// `queued-commands`, below one work queue's room): whatever the mapping, no work queue is
// full.
//
// Contract:
// - limit == 0: no limit; TryTake always succeeds.
// - TryTake(n) takes n when the total stays within the limit; a take of more than half the
//   limit (one op of many copy pieces) counts as half for that test, so that it is not
//   starved while others keep the total above zero (the total may then pass the limit for
//   as long as that op's commands are queued).
// - Await(n, wake) runs `wake` once, when n fits: at once if it does by then, else from a
//   later Give (on that Give's thread, outside the lock). Waiters are woken in the order
//   they came, as many as the room then fits (a Give wakes no more than can go; one that
//   does not fit holds back those behind it, so a large one is not starved). `wake` must
//   not block (a session posts to its executor, and takes again: one that loses the room
//   to another taker awaits again, at the back).
//
// Thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "ferry/mutex.h"

namespace ferry::session {

class LaunchRoom {
 public:
  /// Set the limit (0: none) before sessions open.
  void SetLimit(uint64_t limit) { limit_ = limit; }
  uint64_t limit() const { return limit_; }
  uint64_t queued() const { return queued_.load(std::memory_order_relaxed); }

  /// Take `n` commands if they fit (see the contract); false takes nothing.
  bool TryTake(uint64_t n);
  /// Count `n` commands taken without asking (a batch's launch at the end of a run).
  void Add(uint64_t n) { queued_.fetch_add(n, std::memory_order_relaxed); }
  /// Give back `n` commands the device has run; wakes the waiters that then fit.
  void Give(uint64_t n);
  /// Run `wake` after the next Give, or at once if `n` commands fit already.
  void Await(uint64_t n, std::function<void()> wake);

 private:
  bool Fits(uint64_t now, uint64_t n) const {
    return limit_ == 0 || now + std::min(n, limit_ / 2) <= limit_;
  }
  // Wake the waiters at the front whose commands fit the room now.
  void WakeThoseThatFit();

  uint64_t limit_ = 0;
  std::atomic<uint64_t> queued_{0};
  Mutex mu_;
  struct Waiter {
    uint64_t n = 0;
    std::function<void()> wake;
  };
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> has_waiters_{false};  // a cheap look before taking mu_ in Give
};

}  // namespace ferry::session
