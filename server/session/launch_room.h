// LaunchRoom: the daemon-wide count of device commands all sessions keep queued, so that no
// enqueue waits in CUDA's launch queue, and each identity's share of it, so that one tenant
// cannot take all of it.
//
// Why: CUDA's launch queue holds about 1024 commands per hardware work queue, and the
// streams CUDA maps to one work queue share it (measured on the H200: docs/performance.md,
// "Launch queue"); a launch beyond them blocks its thread, an executor thread every session
// needs. Each session keeps at most session-queued-commands on its own stream
// (session/session.h), but sessions on one work queue add up, and which work queue a
// stream gets is CUDA's choice. So all sessions together keep at most `limit` (ferryd's
// `queued-commands`, below one work queue's room): whatever the mapping, no work queue is
// full. And the sessions of one identity (a uid, or every TCP peer together) keep at most
// their LaunchShare's limit (uid-limits `queued`, built in half): a tenant with many
// sessions of long work cannot keep the room full, so that another's submits wait for its
// commands to run before they are even enqueued.
//
// Contract:
// - limit == 0: no limit; a share's limit == 0: none for that identity. Counts are kept
//   either way (the metrics show them).
// - TryTake(n, share) takes n when the total stays within the limit and the share's count
//   within its own; a take of more than half a limit counts as half for that limit's test,
//   so that it is not starved while others keep the count above zero (the count may then
//   pass the limit for as long as that op's commands are queued). `share` may be null (a
//   session charged to no identity).
// - Await(n, share, wake) runs `wake` once, when n fits: at once if it does by then, else
//   from a later Give (on that Give's thread, outside the lock). Waiters are woken in the
//   order they came, as many as the room then fits: one that does not fit the daemon-wide
//   room holds back those behind it (so a large one is not starved), but one that does not
//   fit its own share is passed over (it waits for its own identity's commands, and must
//   not hold back others). `wake` must not block (a session posts to its executor, and takes
//   again: one that loses the room to another taker awaits again, at the back).
//
// Thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>

#include "ferry/mutex.h"

namespace ferry::session {

/// One identity's part of the LaunchRoom: the commands its sessions keep queued, and the
/// most they may (0: no limit). Held by the identity's UidAccount.
struct LaunchShare {
  explicit LaunchShare(uint64_t limit) : limit(limit) {}
  const uint64_t limit;
  std::atomic<uint64_t> queued{0};
};

class LaunchRoom {
 public:
  /// Set the limit (0: none) before sessions open.
  void SetLimit(uint64_t limit) { limit_ = limit; }
  uint64_t limit() const { return limit_; }
  uint64_t queued() const { return queued_.load(std::memory_order_relaxed); }

  /// Take `n` commands if they fit the room and `share` (see the contract); false takes
  /// nothing.
  bool TryTake(uint64_t n, LaunchShare* share);
  /// Count `n` commands taken without asking (a batch's launch at the end of a run).
  void Add(uint64_t n, LaunchShare* share);
  /// Give back `n` commands the device has run; wakes the waiters that then fit.
  void Give(uint64_t n, LaunchShare* share);
  /// Run `wake` after a later Give, or at once if `n` commands fit already. The share is
  /// kept alive while the waiter waits.
  void Await(uint64_t n, std::shared_ptr<LaunchShare> share, std::function<void()> wake);

 private:
  // Whether `n` more fit `now` under `limit` (a take of more than half counts as half).
  static bool Fits(uint64_t now, uint64_t n, uint64_t limit) {
    return limit == 0 || now + std::min(n, (limit + 1) / 2) <= limit;
  }
  static bool FitsShare(const LaunchShare* share, uint64_t promised, uint64_t n) {
    return !share || Fits(share->queued.load() + promised, n, share->limit);
  }
  // Wake the waiters, in order, that fit the room and their shares now.
  void WakeThoseThatFit();

  uint64_t limit_ = 0;
  std::atomic<uint64_t> queued_{0};
  Mutex mu_;
  struct Waiter {
    uint64_t n = 0;
    std::shared_ptr<LaunchShare> share;
    std::function<void()> wake;
  };
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> has_waiters_{false};  // a cheap look before taking mu_ in Give
};

}  // namespace ferry::session
