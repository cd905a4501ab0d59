// CopyTurns: daemon-wide turns for large host<->device copies, so that sessions share the
// copy engines fairly.
//
// Why: every session has a stream of its own, and CUDA spreads the streams over its hardware
// work queues, which the copy engines serve in an order of their own. Measured on the H200,
// 64 sessions each moving 8 MiB one transfer at a time finished up to 1.3-1.5x apart
// (fastest / slowest session's rate), through ferryd or in one process alike. With turns, a
// submit that copies at least `min_bytes` in one direction (host to device, or device to
// host; summed over its ops) takes a turn of that direction before it is enqueued and gives
// it back once it has completed. At most `turns` such submits per direction are on the device
// at once; the others wait in the order they arrived. The copy engines then see the sessions'
// large copies a few at a time, in arrival order, and every session gets its share.
//
// Contract:
// - turns == 0: no limit; TryTake always succeeds (ferryd's `copy-turns = 0`).
// - A request for both directions is granted when both are free and no earlier waiter wants
//   either: each direction is served first come, first served, and a request never jumps an
//   earlier one of its direction.
// - Grant callbacks run on the thread of the Give (or Wait) that made the grant, outside the
//   lock; they must not block (a session posts to its executor).
// - A turn is held from enqueue to completion: a large copy queued behind its own session's
//   long kernel holds its turn meanwhile (docs/architecture.md, "Copy turns").
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "ferry/mutex.h"
#include "session/ops.h"

namespace ferry::session {

class CopyTurns {
 public:
  /// Directions, as a bit mask.
  enum : uint8_t { kNone = 0, kToDevice = 1, kToHost = 2 };

  /// `turns`: large-copy submits per direction on the device at once (0: no limit);
  /// `min_bytes`: the bytes one submit copies in a direction from which it takes a turn.
  CopyTurns(uint32_t turns, uint64_t min_bytes) : turns_(turns), min_bytes_(min_bytes) {}

  /// The turns a submit of `ops` needs: the directions in which its copies (uploads and
  /// downloads, inline or through slabs) add up to at least min_bytes. kNone when turns are off.
  uint8_t Needs(const std::vector<Op>& ops) const;

  /// Take the turns of `mask` if they are free and nobody waits for them; true if taken
  /// (always for kNone, and always when turns are off).
  bool TryTake(uint8_t mask);
  /// Queue for the turns of `mask` (not kNone); `granted` runs once they are taken for
  /// the caller, possibly before Wait returns.
  void Wait(uint8_t mask, std::function<void()> granted);
  /// Give back turns taken by TryTake or granted by Wait; grants what waited for them.
  void Give(uint8_t mask);

  struct Stats {
    uint64_t waits = 0;                             // requests that had to queue, since start
    uint64_t waiting = 0;                           // requests queued now
    uint32_t held_to_device = 0, held_to_host = 0;  // turns taken now
  };
  Stats stats() const;
  uint32_t turns() const { return turns_; }
  uint64_t min_bytes() const { return min_bytes_; }

 private:
  struct Waiter {
    uint8_t mask;
    std::function<void()> granted;
  };
  bool FreeLocked(uint8_t mask) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeLocked(uint8_t mask) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take turns for the waiters that can go now, in order; returns their callbacks.
  std::vector<std::function<void()>> GrantLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t turns_;
  const uint64_t min_bytes_;
  mutable Mutex mu_;
  uint32_t held_[2] ABSL_GUARDED_BY(mu_) = {0, 0};   // per direction
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);  // arrival order
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::session
