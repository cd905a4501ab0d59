// SessionSlabs: the slabs one session holds, and which byte ranges of them the device is
// still reading or writing.
//
// Shared by the session (its executor: checks, marks and releases ranges) and the slab
// socket (its poll thread binds the uid, a grant thread acquires slabs). Thread-safe: one
// mutex, not held while the pool makes a slab.
// Slabs are only ever added until Close, so a range checked on the executor stays owned
// until the same executor marks it.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "pool/slab_pool.h"

namespace ferry::pool {

/// A byte range of one slab, as a transfer names it.
struct SlabRange {
  uint64_t slab = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// Byte ranges of one slab that device copies in flight use, kept apart even when they overlap
/// (two reads of one submit may): a byte is busy while any range that holds it is, so ending a
/// short copy never frees bytes a longer one still uses. Each Add must be matched by one Remove
/// of the same range (or by none: the range stays busy for good). Not thread-safe. A few nodes
/// of segments merged away are kept for the next ranges (kSpareNodes): a transfer's Add and
/// Remove allocate nothing while few ranges of the slab are busy at once.
class BusyRanges {
 public:
  /// Hold [begin, end); empty ranges hold nothing.
  void Add(uint64_t begin, uint64_t end) { Shift(begin, end, +1); }
  /// Release one earlier Add of [begin, end).
  void Remove(uint64_t begin, uint64_t end) { Shift(begin, end, -1); }
  /// Return the first busy stretch [first, second) that overlaps [begin, end), if any.
  std::optional<std::pair<uint64_t, uint64_t>> FindOverlap(uint64_t begin, uint64_t end) const;
  bool empty() const { return cover_.empty(); }

 private:
  void Shift(uint64_t begin, uint64_t end, int delta);
  // Ensure a segment starts at `at`; return it.
  using Cover = std::map<uint64_t, uint32_t>;
  Cover::iterator Split(uint64_t at);
  // Drop the segment starting at `at` when its count equals the one before it.
  void Merge(uint64_t at);

  // How many ranges hold each byte, piecewise constant: a key starts a segment holding that
  // count up to the next key; bytes before the first key and from the last key on (whose
  // count is 0) are free. Neighbouring segments have different counts.
  Cover cover_;
  // Nodes Merge took out of cover_, for Split to reuse; at most kSpareNodes (the rest are
  // freed, so a slab that once had many ranges busy keeps no more than these).
  static constexpr size_t kSpareNodes = 8;
  std::array<Cover::node_type, kSpareNodes> spare_;
  size_t spares_ = 0;
};

/// Who else pays for a session's slabs besides its own quota (the per-uid pinned limit):
/// charged before a slab is acquired, refunded when it goes back. Thread-safe.
class PinnedCharge {
 public:
  virtual ~PinnedCharge() = default;
  /// QUOTA_EXCEEDED (naming the limit) when `bytes` more would pass it.
  virtual Status TryCharge(uint64_t bytes) = 0;
  virtual void Refund(uint64_t bytes) = 0;
};

class SessionSlabs : public std::enable_shared_from_this<SessionSlabs> {
 public:
  /// `pinned_quota`: the most slab bytes the session may hold (0: no limit but the pool's).
  explicit SessionSlabs(SlabPool* pool, uint64_t pinned_quota = 0)
      : pool_(pool), pinned_quota_(pinned_quota) {}
  ~SessionSlabs() {
    Close();
    ReleaseKept();
  }
  SessionSlabs(const SessionSlabs&) = delete;
  SessionSlabs& operator=(const SessionSlabs&) = delete;

  /// Charge every slab to `charge` too (before the slabs are shared with the broker).
  void SetCharge(std::shared_ptr<PinnedCharge> charge) { charge_ = std::move(charge); }
  /// Fix the session's uid (the first slab connection does); false when already bound.
  bool Bind(uid_t uid);
  /// True once Close ran: the session hands out nothing more.
  bool closed() const {
    MutexLock lock(&mu_);
    return closed_;
  }
  /// Acquire one more slab for the session. SESSION_CLOSED once closed (also when Close came
  /// while the slab was made: it goes back to the pool); QUOTA_EXCEEDED when one more slab
  /// would take the session past its pinned quota (slabs being acquired count), or the
  /// pool's budget is held by slabs in use. Where the charge or the budget has no room,
  /// kept slabs (the uid's, or anyone's for the budget) are given back first, oldest first
  /// (KeptSlabsIndex). The session's mutex is not held while the pool makes the slab:
  /// Check, MarkBusy and Finish go on meanwhile.
  Result<SlabRef> Acquire();

  /// A duplicate of the memfd of slab `id` (the caller closes it), taken while the session
  /// holds the slab, so it is that slab's file even if the session closes right after
  /// (the pool then closes its own fd, and the number may be reused). SESSION_CLOSED when
  /// the session no longer holds it; INTERNAL when dup fails.
  Result<int> DuplicateFd(uint64_t id) const;

  /// Check that `r` lies inside a slab this session holds and overlaps no busy range.
  Status Check(const SlabRange& r) const;
  /// Mark `r` busy (checked before) and return where its bytes are.
  char* MarkBusy(const SlabRange& r);
  /// The copy of `r` completed: free the range, or keep it busy for ever when the copy
  /// failed (quarantined: the slab is destroyed, not pooled, at Close).
  void Finish(const SlabRange& r, bool failed);

  /// Give every slab back to the pool (quarantined ones are destroyed), except those named
  /// by KeepAtClose, which the session kept for the next one on its stream. Call only once no
  /// device work touches them. Idempotent.
  void Close();

  // --- kept slabs (docs/protocol.md, "Kept slabs") ------------------------------------------
  // A session closed with its stream kept may hand the slabs its client asked to keep to the
  // next session on that stream: the same client, which has them mapped, so no one sees
  // memory they could not see before. Until then they stay held and charged.

  /// At Close, keep the slabs of `ids` that the session holds and no failed copy quarantined
  /// (other ids are ignored) instead of giving them back. Before Close; the last call wins.
  void KeepAtClose(std::vector<uint64_t> ids);
  /// Give the slabs kept at Close back to the pool (the stream was not kept, or ended before
  /// the next Open, or a grant needs the room); a Close after it keeps nothing. Returns how
  /// many went back. Idempotent; the destructor does it too.
  size_t ReleaseKept();
  /// Take over the slabs `last` kept at its Close, as if this session had acquired them; the
  /// ids taken, in order. A slab that would pass this session's pinned quota, or its charge,
  /// goes back to the pool instead. Call before the slabs are shared with the broker.
  std::vector<uint64_t> AdoptKept(SessionSlabs& last);

  size_t slab_count() const;

 private:
  struct Held {
    SlabRef ref;
    BusyRanges busy;
    bool quarantined = false;
  };

  SlabPool* pool_;
  const uint64_t pinned_quota_;
  std::shared_ptr<PinnedCharge> charge_;  // set before sharing; then read-only
  mutable Mutex mu_;
  std::optional<uid_t> uid_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Held> slabs_ ABSL_GUARDED_BY(mu_);
  uint64_t acquiring_ ABSL_GUARDED_BY(mu_) = 0;  // Acquire calls waiting for the pool
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> keep_at_close_ ABSL_GUARDED_BY(mu_);  // KeepAtClose
  std::map<uint64_t, SlabRef> kept_ ABSL_GUARDED_BY(mu_);     // kept at Close, still charged
  bool keeping_over_ ABSL_GUARDED_BY(mu_) = false;            // ReleaseKept ran: keep no more
};

}  // namespace ferry::pool
