// LaunchRoom: the daemon-wide count of device commands all sessions keep queued, so that no
// enqueue waits in CUDA's launch queue, and each identity's share of it, so that one tenant
// cannot take all of it.
//
// Why: CUDA's launch queue holds about 1024 commands per hardware work queue, and the
// streams CUDA maps to one work queue share it (measured on the H200: docs/performance.md,
// "Known bounds"); a launch beyond them blocks its thread, an executor thread every session
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
//   within its own, and no waiter waits for the room (takers do not pass those waiting; a
//   take of nothing is not held back);
//   a take of more than half a limit counts as half for that limit's test, so that it is
//   not starved while others keep the count above zero (the count may then pass the limit
//   for as long as that op's commands are queued). `share` may be null (a session charged
//   to no identity).
// - Await(n, share, wake): once n fits, the room takes them for the waiter (as TryTake
//   would) and runs `wake`: at once if they fit by then, else from a later Give (on that
//   Give's thread, outside the lock). The waiter then holds those n and gives them back
//   with Give; `wake` returning false (the waiter is gone) gives them back at once. Waiters
//   are served in the order they came, as many as the room then fits: one that does not fit
//   the daemon-wide room holds back those behind it and every TryTake (so a large one is not
//   starved, and none is passed by takers that did not wait), but one that does not fit its
//   own share is passed over (it waits for its own identity's commands, and must not hold
//   back others). `wake` must not block (a session posts to its executor). Waiters whose
//   `wake` returns false give their commands back before the next waiters are looked at, in
//   a loop (never by recursion, however many there are). Cancel(id) removes a wait.
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

  /// Take `n` commands if they fit the room and `share` and nobody waits for the room (see
  /// the contract); false takes nothing.
  bool TryTake(uint64_t n, LaunchShare* share);
  /// Count `n` commands taken without asking (a batch's launch at the end of a run).
  void Add(uint64_t n, LaunchShare* share);
  /// Give back `n` commands the device has run; wakes the waiters that then fit.
  void Give(uint64_t n, LaunchShare* share);
  /// Take `n` commands for the caller once they fit, then run `wake` (at once if they fit
  /// already); `wake` returns false when nobody holds them any more. The share is kept
  /// alive while the waiter waits. Returns the wait's id, for Cancel.
  uint64_t Await(uint64_t n, std::shared_ptr<LaunchShare> share, std::function<bool()> wake);
  /// Forget the wait `id` if it still waits (its `wake` will not run); one already served
  /// is not affected. A waiter that goes away (a session that ends) cancels its wait: a
  /// wait left behind would hold back every TryTake while it waits for the room.
  void Cancel(uint64_t id);
  /// Waiters now, whatever they wait for.
  uint64_t waiters() const { return waiter_count_.load(std::memory_order_relaxed); }
  /// Waiters that wait for the room now (not for their share).
  uint64_t room_waiters() const { return room_waiters_.load(std::memory_order_relaxed); }

 private:
  // Whether `n` more fit `now` under `limit` (a take of more than half counts as half).
  static bool Fits(uint64_t now, uint64_t n, uint64_t limit) {
    return limit == 0 || now + std::min(n, (limit + 1) / 2) <= limit;
  }
  static bool FitsShare(const LaunchShare* share, uint64_t n) {
    return !share || Fits(share->queued.load(), n, share->limit);
  }
  // Take n from `share` (may be null), then from the room; all or nothing.
  bool TakeBoth(uint64_t n, LaunchShare* share);
  // Take the room for the waiters, in order, that fit it and their shares now, and wake
  // them.
  void WakeThoseThatFit();

  uint64_t limit_ = 0;
  std::atomic<uint64_t> queued_{0};
  Mutex mu_;
  struct Waiter {
    uint64_t id = 0;
    uint64_t n = 0;
    std::shared_ptr<LaunchShare> share;
    std::function<bool()> wake;
    bool for_room = false;  // counted in room_waiters_: its share fits, the room does not
  };
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<uint64_t> waiter_count_{0};  // waiters_.size()
  std::atomic<bool> has_waiters_{false};   // a cheap look before taking mu_ in Give
  std::atomic<uint64_t> room_waiters_{0};  // waiters with for_room set
};

}  // namespace ferry::session
