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
// at once (more only while turns one identity borrowed come back, below); the others wait in
// the order they arrived. The copy engines then see the sessions' large copies a few at a
// time, in arrival order, and every session gets its share.
//
// Contract:
// - turns == 0: no limit; TryTake always succeeds (ferryd's `copy-turns = 0`).
// - A request for both directions is granted when both are free and no earlier waiter wants
//   either: each direction is served first come, first served, and a request never jumps an
//   earlier one of its direction (but other identities pass a borrowing one, below).
// - Grant callbacks run on the thread of the Give (or Wait, or Cancel) that made the grant,
//   outside the lock; they must not block (a session posts to its executor).
// - A turn is held from enqueue to completion: a large copy queued behind its own session's
//   long kernel holds its turn meanwhile (docs/architecture.md, "Copy turns").
//
// Device turns and weights (fair shares, docs/operations.md "Fair shares"):
// - device_turns > 0 (ferryd's `device-turns`): every submit with ops also takes a device
//   turn (kDevice), so at most device_turns submits of all sessions are on the device at once.
// - Waiters name the identity they belong to ("uid:1000", "remote", "remote:NAME";
//   `uid-weights` gives each a weight, 1 unless set). Among identities the turns go by start-time
//   fair queuing: each take advances its identity's pass by kStride / weight, and the waiting
//   request whose identity's pass is lowest goes first (the k-th request of an identity counts k
//   strides on), ties in arrival order. An identity that comes back after idling starts at the pass
//   of the last grant, so it banks no credit. Within one identity requests keep arrival
//   order, and with one identity (or none named) the order is plain first come, first served.
//   A request that cannot go yet blocks the directions it wants for every request ranked
//   after it, so nobody starves (a borrowing one only its own identity's, below).
//
// Half a direction per identity (the turns are held across a session's own earlier device
// work, so without it one tenant with a few sessions, each a long kernel followed by a large
// upload, could hold every turn for as long as its kernels run, and every other tenant's
// large copies would wait that long). For each direction with a limit L > 0 (`turns`, or
// `device_turns` for kDevice) an identity's half is ceil(L / 2) (L = 4: 2, L = 1: 1). A
// waiting request *borrows* when its identity holds its half of a direction it wants, or
// when it waits behind a borrowing request of its identity that wants one of its directions;
// every other request (those of no identity always) is *ordinary*.
// - An ordinary request goes while the turns held within halves (those held, less what each
//   identity holds beyond its half) are fewer than L in each direction it wants: turns an
//   identity borrowed do not stand in another's way. Turns on the device cannot be taken
//   back, so this is what keeps a tenant that took every turn while alone, each held behind
//   a long kernel of its own, from making a tenant that comes later wait for those kernels.
// - A borrowing request goes beyond its identity's half of a direction only while fewer than
//   L are held in all and no ordinary request of another identity waits for that direction;
//   in its other directions, as an ordinary one. An identity alone therefore uses every
//   turn, in the order it always did.
// - An ordinary request that cannot go blocks the directions it wants for every request
//   ranked after it (above); a borrowing one only for its own identity's later requests.
// So while an ordinary request waits for a direction, no other identity is granted beyond
// its half of it, whatever its weight, and up to L + (L - half) turns of a direction (6 of 4)
// are held only while borrowed ones come back. Ordinary requests never wait for borrowing
// ones, so requests never wait for each other in a circle: when every waiting request would
// find room, none is left waiting. A borrowing request is not starved: while it waits, its
// identity takes no more of the directions it wants (its later requests wait behind it, and
// TryTake passes no waiter), so what it holds comes back and it becomes ordinary. The cost:
// a turn can stay idle while an ordinary request that wants it waits for another direction
// and the requests that could take it would borrow it. What each identity holds counts from
// its take to the Give, which names the identity the turns were taken for.
//
// Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "session/ops.h"

namespace ferry::session {

/// Parse `uid-weights`: "uid:N=W,remote=W,remote:NAME=W,..." (W 1..1000) into weights by
/// identity ("uid:N", "remote", "remote:NAME"); "" is none. INVALID_ARGUMENT naming what is wrong.
Result<std::map<std::string, uint32_t>> ParseUidWeights(const std::string& text);
/// The weights as ParseUidWeights reads them back.
std::string FormatUidWeights(const std::map<std::string, uint32_t>& weights);

class CopyTurns {
 public:
  /// Directions, as a bit mask.
  enum : uint8_t { kNone = 0, kToDevice = 1, kToHost = 2, kDevice = 4 };
  /// A take advances its identity's pass by kStride / weight.
  static constexpr uint64_t kStride = 1ull << 20;

  /// `turns`: large-copy submits per direction on the device at once (0: no limit);
  /// `min_bytes`: the bytes one submit copies in a direction from which it takes a turn;
  /// `device_turns`: submits of all sessions on the device at once (0: no limit).
  CopyTurns(uint32_t turns, uint64_t min_bytes, uint32_t device_turns = 0)
      : turns_(turns), min_bytes_(min_bytes), device_turns_(device_turns) {}

  /// Set the weights by identity (call before use); identities not named weigh 1.
  void SetWeights(std::map<std::string, uint32_t> weights);

  /// The turns a submit of `ops` needs: the directions in which its copies (uploads and
  /// downloads, inline or through slabs) add up to at least min_bytes (none when copy turns
  /// are off), and kDevice for any op when device turns are on.
  uint8_t Needs(const std::vector<Op>& ops) const;

  /// Take the turns of `mask` for `who` if they are free and nobody waits for them; true if
  /// taken (always for kNone).
  bool TryTake(uint8_t mask, const std::string& who = "");
  /// Queue `who` for the turns of `mask` (not kNone); `granted` runs once they are taken for
  /// the caller, possibly before Wait returns. Returns the request's ticket, for Cancel.
  uint64_t Wait(uint8_t mask, std::function<void()> granted, const std::string& who = "");
  /// Withdraw the request of `ticket` if it still waits: true, and its `granted` never runs
  /// (it is destroyed, outside the lock, with what it holds); what waited behind it may be
  /// granted now. False if it was granted already: its `granted` has run or is running, and
  /// the turns it took are given back as usual.
  bool Cancel(uint64_t ticket);
  /// Give back turns taken by TryTake or granted by Wait for `who` (the identity they were
  /// taken for: the halves count what each identity holds); grants what waited for them. A
  /// direction of which `who` holds none (a bug of the caller's) is charged to the identity
  /// holding the most of it, so that the turns themselves are not lost.
  void Give(uint8_t mask, const std::string& who);

  struct Stats {
    uint64_t waits = 0;                             // requests that had to queue, since start
    uint64_t waiting = 0;                           // requests queued now
    uint32_t held_to_device = 0, held_to_host = 0;  // turns taken now
    uint32_t held_device = 0;                       // device turns taken now
  };
  Stats stats() const;
  uint32_t turns() const { return turns_; }
  uint32_t device_turns() const { return device_turns_; }
  uint64_t min_bytes() const { return min_bytes_; }

 private:
  struct Waiter {
    uint8_t mask;
    std::function<void()> granted;
    std::string who;
    uint64_t ticket;
  };
  uint32_t LimitOf(uint8_t direction) const;
  // Turns of direction `i` held in all, and within their identities' halves.
  uint32_t HeldLocked(int i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t HeldWithinHalvesLocked(int i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The directions of `mask`, with a limit, of which `who` holds its half.
  uint8_t AtHalfLocked(uint8_t mask, const std::string& who) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `who` may take `mask` now; `others`: the directions an ordinary request of another
  // identity waits for.
  bool FitsLocked(uint8_t mask, const std::string& who, uint8_t others) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeLocked(uint8_t mask, const std::string& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t WeightLocked(const std::string& who) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At least vtime_.
  uint64_t PassLocked(const std::string& who) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take turns for the waiters that can go now, in rank order; returns their callbacks.
  std::vector<std::function<void()>> GrantLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The waiter (not `taken`) ranked first in `order` that may go now; waiters_.size() if none.
  size_t NextLocked(const std::vector<size_t>& order, const std::vector<bool>& taken) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t turns_;
  const uint64_t min_bytes_;
  const uint32_t device_turns_;
  mutable Mutex mu_;
  // What each identity ("" too) holds, by direction (to device, to host, device); entries go
  // when they reach zero.
  std::map<std::string, std::array<uint32_t, 3>> held_by_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);               // arrival order
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;                       // also the last ticket given
  std::map<std::string, uint32_t> weights_ ABSL_GUARDED_BY(mu_);  // set before use
  std::map<std::string, uint64_t> pass_ ABSL_GUARDED_BY(mu_);     // per identity
  uint64_t vtime_ ABSL_GUARDED_BY(mu_) = 0;                       // the start pass of the last take
};

}  // namespace ferry::session
