// StagingArea: the daemon's own pinned staging for remote (TCP) clients' inline transfers.
//
// Bytes of an inline Upload are copied from the message into a staging range and the device
// copies from there; an inline Download lands in a staging range and is copied into the
// outgoing chunks, one by one as they are written, once the submit completes. The ranges come from
// slabs the daemon takes from its own slab pool (SlabPool::AcquireDaemon: pinned and registered
// like every slab, held by no session and counted against no client uid), at most `max_slabs` of
// them, taken when first needed and kept until the daemon exits.
//
// A first-fit allocator over those slabs. A range is held by a StagingLease and freed when
// the lease is destroyed (an upload's at the submit's delivery, a download's once its last
// chunk is written). A range is at most a slab (max_lease):
// a larger transfer takes several. Sessions take all the ranges a submit needs at once
// (AllocateAll) and, when they do not fit, wait for bytes to be freed: a copy between the
// device and ordinary (pageable) memory may hold the calling thread until the stream's
// earlier work is done (CUDA), so an executor thread must never make one.
//
// Each session is a StagingHolder, and holds at most half of the area (holder_limit): its
// uploads queued behind long device work of its own keep their ranges until the device has
// copied them, and without a share one session could so hold all of staging while every
// other session's inline transfers waited for it. So a submit that needs more than the
// share is never staged (kNever: it takes the direct path), even from a holder that holds
// nothing: staged, it would hold the whole area for as long as its own earlier work runs. A
// session's holder has its identity's (a uid, a remote tenant, the shared remote identity) as
// parent, which is held to the same share: otherwise two sessions of one identity could hold it
// all. A holder at its share, or whose parent is, waits for ranges to be freed (kWaitOwn), which
// the identity's own earlier submits do as they complete.
//
// Thread-safe: sessions' executors allocate and free concurrently; Admin reads the stats.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "ferry/mutex.h"
#include "pool/slab_pool.h"

namespace ferry::pool {

class StagingArea;

/// What one holder (a session, or an identity) holds of the area: the bytes of its live
/// leases; a lease charged to a holder counts in its parent too.
struct StagingHolder {
  explicit StagingHolder(std::shared_ptr<StagingHolder> parent = nullptr)
      : parent(std::move(parent)) {}
  std::atomic<uint64_t> held{0};
  const std::shared_ptr<StagingHolder> parent;  // may be null
};

/// One staging range; frees it when destroyed. Move-only; empty when `data()` is null.
class StagingLease {
 public:
  StagingLease() = default;
  StagingLease(StagingLease&& o) noexcept { *this = std::move(o); }
  StagingLease& operator=(StagingLease&& o) noexcept;
  ~StagingLease() { Reset(); }
  char* data() const { return data_; }
  uint64_t length() const { return length_; }
  explicit operator bool() const { return data_ != nullptr; }
  void Reset();

 private:
  friend class StagingArea;
  StagingArea* area_ = nullptr;
  std::shared_ptr<StagingHolder> holder_;  // may be null
  size_t slab_index_ = 0;
  uint64_t offset_ = 0;
  uint64_t length_ = 0;  // as asked
  uint64_t reserved_ = 0;
  char* data_ = nullptr;
};

struct StagingStats {
  uint64_t slabs = 0;            // daemon-owned slabs taken for staging
  uint64_t bytes_in_use = 0;     // staging bytes leased now
  uint64_t staged_total = 0;     // bytes that went through staging
  uint64_t fallbacks_total = 0;  // transfers that took the direct path: no staging space
};

class StagingArea {
 public:
  StagingArea(SlabPool* pool, uint32_t max_slabs)
      : pool_(pool),
        max_slabs_(max_slabs),
        holder_limit_(uint64_t{max_slabs} * pool->slab_size() / 2) {}
  ~StagingArea();  // gives the slabs back to the pool; every lease must be gone
  StagingArea(const StagingArea&) = delete;
  StagingArea& operator=(const StagingArea&) = delete;

  enum class Outcome {
    kAllocated,  // `out` holds a range for each size, in order
    kWait,       // none taken; `wake` runs once (on the freeing thread) when bytes are freed
    kWaitOwn,    // none taken: `holder` or its parent holds its share; `wake` runs as for
                 // kWait (one of its own ranges, or another's, is freed)
    kNever,      // none taken: more than the area can hold, more than a holder's share
                 // (with a holder), or it can get no slab at all
  };
  /// Ranges for every size in `sizes` (each > 0 and at most max_lease()), all or none,
  /// charged to `holder` and its parent (may be null: no share).
  Outcome AllocateAll(const std::vector<uint64_t>& sizes, std::vector<StagingLease>* out,
                      std::function<void()> wake,
                      const std::shared_ptr<StagingHolder>& holder = nullptr);
  /// The most one holder (and one parent) may hold: half of the area.
  uint64_t holder_limit() const { return holder_limit_; }
  /// The largest range Allocate can give: one slab.
  uint64_t max_lease() const { return pool_->slab_size(); }
  void CountFallback();
  StagingStats stats() const;

 private:
  friend class StagingLease;
  void Free(size_t slab_index, uint64_t offset, uint64_t reserved);

  struct Slab {
    SlabRef ref;
    std::map<uint64_t, uint64_t> used;  // offset -> end, disjoint
  };
  SlabPool* pool_;
  const uint32_t max_slabs_;
  const uint64_t holder_limit_;
  // Place one range of `bytes` (taking a new slab if needed); an empty lease if none fits.
  StagingLease AllocateLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable Mutex mu_;
  std::vector<Slab> slabs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> waiters_ ABSL_GUARDED_BY(mu_);  // AllocateAll's kWait
  StagingStats stats_ ABSL_GUARDED_BY(mu_);                          // (slabs is slabs_.size())
};

}  // namespace ferry::pool
