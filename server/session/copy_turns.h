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
// Cost, under the lock (Give runs on the daemon's completion thread): what is held and
// waiting is kept in counts as it changes, never summed over identities or requests. Give,
// Wait and Cancel rank the I identities with waiting requests (a heap of one entry each) and
// walk requests in rank order only until no more may go: about I + R log I for R walked. A
// change to what an identity holds or waits for may walk that identity's queue; Cancel also
// looks for its ticket in the queues.
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
#include <unordered_map>
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

  /// The turns a submit needs: the directions in which its copies (uploads and downloads,
  /// inline or through slabs) add up to at least min_bytes (none when copy turns are off),
  /// and kDevice for any op when device turns are on.
  uint8_t Needs(const SubmitSummary& submit) const;

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
  // A request that waits, in its identity's queue.
  struct Waiter {
    uint8_t mask;
    bool borrows;     // as the contract says; kept up to date by RecountBorrowingLocked
    bool taken;       // granted by the GrantLocked under way, which removes it before it returns
    uint64_t ticket;  // also its place in arrival order
    std::function<void()> granted;
  };
  // An identity ("" too), from the first call that names it on (like its pass, never
  // forgotten: identities are uids and tenants, few). Everything GrantLocked asks of an
  // identity is kept here as it changes, so that a grant costs no walk over every request.
  struct Identity {
    std::string name;
    uint32_t weight = 1;                 // from weights_
    uint64_t pass = 0;                   // of its next take, before max(pass, vtime_)
    std::array<uint32_t, 3> held{};      // by direction (to device, to host, device)
    uint8_t at_half = kNone;             // directions with a limit of which it holds its half
    std::deque<Waiter> waiting;          // arrival order
    uint8_t wants = kNone;               // what its waiting requests want, together
    uint8_t borrowed = kNone;            // what its borrowing waiting requests want, together
    std::array<uint32_t, 3> ordinary{};  // its ordinary waiting requests, by direction
    size_t queued_at = kNotQueued;       // its place in queued_ while it has waiting requests
    uint32_t taken = 0;                  // its requests granted by the GrantLocked under way
    uint64_t scan = 0;                   // NextLocked's scan that last set held_back
    uint8_t held_back = kNone;           // what its borrowing requests hold back, in that scan
  };
  static constexpr size_t kNotQueued = ~size_t{0};
  struct Ranking;  // copy_turns.cc

  uint32_t LimitOf(uint8_t direction) const;
  uint32_t WeightLocked(const std::string& who) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The identity named `who`, added if new.
  uint32_t InternLocked(const std::string& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Turns of direction `i` that `id` holds within its half (all of them for "").
  uint32_t WithinHalfLocked(const Identity& id, int i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Add `delta` (+1 or -1) to what `who` holds of direction `i`, and to the totals.
  void AddHeldLocked(uint32_t who, int i, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Set `who`'s at_half from what it holds; true if that changed (its requests' status may
  // have changed: RecountBorrowingLocked).
  bool UpdateAtHalfLocked(uint32_t who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decide which of `who`'s waiting requests (not taken) borrow, and count its ordinary ones.
  void RecountBorrowingLocked(uint32_t who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Set id.wants, and wanting_bit_ with it.
  void SetWantsLocked(Identity& id, uint8_t wants) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Count `w` into (delta +1) or out of (-1) the waiting totals.
  void CountWaitingLocked(const Waiter& w, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take `who`, whose queue has emptied, out of queued_.
  void UnqueueLocked(uint32_t who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `id` may take `mask` now; `others`: the directions an ordinary request of another
  // identity waits for.
  bool FitsLocked(uint8_t mask, const Identity& id, uint8_t others) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeLocked(uint8_t mask, uint32_t who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At least vtime_.
  uint64_t PassLocked(const Identity& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take turns for the waiters that can go now, in rank order; returns their callbacks.
  std::vector<std::function<void()>> GrantLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The place in `ranking.order` of the request (not taken) ranked first that may go now,
  // ranking more as needed; Ranking::kNoOne if none.
  size_t NextLocked(Ranking& ranking) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t turns_;
  const uint64_t min_bytes_;
  const uint32_t device_turns_;
  mutable Mutex mu_;
  std::vector<Identity> identities_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, uint32_t> identity_of_ ABSL_GUARDED_BY(mu_);  // by name
  std::vector<uint32_t> queued_ ABSL_GUARDED_BY(mu_);  // the identities with waiting requests
  // Totals over the identities, by direction: turns held; held within halves (each named
  // identity's up to its half, all of ""'s); ordinary waiting requests.
  std::array<uint32_t, 3> held_ ABSL_GUARDED_BY(mu_){};
  std::array<uint32_t, 3> held_within_halves_ ABSL_GUARDED_BY(mu_){};
  std::array<uint32_t, 3> ordinary_waiting_ ABSL_GUARDED_BY(mu_){};
  // Waiting requests (not taken): in all, and for kNone; identities whose `wants` has each bit
  // of the mask.
  uint64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waiting_for_none_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<uint32_t, 8> wanting_bit_ ABSL_GUARDED_BY(mu_){};
  uint64_t scans_ ABSL_GUARDED_BY(mu_) = 0;                       // NextLocked's so far
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;                       // also the last ticket given
  std::map<std::string, uint32_t> weights_ ABSL_GUARDED_BY(mu_);  // set before use
  uint64_t vtime_ ABSL_GUARDED_BY(mu_) = 0;                       // the start pass of the last take
};

}  // namespace ferry::session
