// SlabPool: the daemon's pinned shared-memory slabs.
//
// A slab is a memfd_create file of a fixed size, sealed against shrink and grow (and
// against further sealing), mapped MAP_SHARED and populated by the daemon, and registered
// with the device once, when it is made (cudaHostRegister on CUDA; a no-op on the host
// backend). Registration never happens on a transfer's path.
//
// Ownership and isolation: a slab is held by at most one session, once. A client maps what
// it is given and may keep the mapping after its session ended (nothing can take it back),
// and tenants in containers often share a uid; so a slab a session held is never handed out
// again, to anyone: on release it is destroyed (unregistered, its pages punched out,
// unmapped, closed). A client's old mapping then sees only its own writes, never another
// session's. Every grant is a fresh memfd that no client has seen. Slabs the daemon holds
// for itself (AcquireDaemon: staging of remote clients' bytes) are never given to a client,
// and go back to the daemon alone on release.
//
// Cost: making a slab (memfd, populate, register: ~70 us per MiB with CUDA, tens of ms for
// a 64 MiB slab) is kept off the grant's path by `initial_slabs` fresh slabs made ahead and
// kept ready by a background thread (within the budget), which also destroys released
// slabs. A grant makes its slab itself only when none is ready (stats().made_on_grant_total
// counts those). Slabs are made concurrently: grants on several threads (the slab socket's
// grant threads) each make their own while the pool's thread makes ahead, so a burst of new
// sessions waits for the slowest of a few makes, not for every make before its own.
//
// Thread-safe: the slab socket's grant threads acquire, session executors release, the
// Admin service reads the counters, and the pool's own thread ("ferry-slabmk") makes and
// destroys slabs. One mutex guards the bookkeeping; no make or destroy runs under it. The
// budget counts slabs being made or destroyed beside those in the map, so concurrent makes
// never take more than it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"

namespace ferry::pool {

class SessionSlabs;  // session_slabs.h

/// The slab sets that hold kept slabs (SessionSlabs::KeepAtClose: slabs a closed session
/// keeps for the next session on its stream), oldest first. Kept slabs are idle: they only
/// save their stream's next session a fresh slab. So a grant that finds no room, in the
/// pool's budget or under its uid's pinned limit, has them given back first (ReleaseOldest)
/// rather than fail while they wait. Thread-safe; its lock is never held while a slab set's
/// or the pool's is taken.
class KeptSlabsIndex {
 public:
  /// `holder` (of `uid`) keeps slabs now.
  void Add(std::weak_ptr<SessionSlabs> holder, uid_t uid);
  /// Have the oldest holder that still keeps slabs (of `uid` only, where set) give them
  /// back (SessionSlabs::ReleaseKept); false when no holder had any.
  bool ReleaseOldest(std::optional<uid_t> uid);
  /// Count `delta` slabs kept (+) or no longer kept (-): every slab set does, indexed or not.
  void Count(int64_t delta) { slabs_.fetch_add(delta, std::memory_order_relaxed); }
  /// Slabs kept now (SlabPoolStats::slabs_kept).
  uint64_t slabs() const { return static_cast<uint64_t>(slabs_.load(std::memory_order_relaxed)); }

 private:
  struct Holder {
    std::weak_ptr<SessionSlabs> slabs;
    uid_t uid;
  };
  Mutex mu_;
  std::vector<Holder> holders_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::atomic<int64_t> slabs_{0};
};

struct SlabPoolOptions {
  uint64_t slab_size = 64ull << 20;
  uint64_t budget = 1ull << 30;  // the most bytes all slabs together may take
  // Fresh slabs made (and registered) at start, and kept ready from then on: each grant of
  // one has the pool's thread make another, within the budget.
  uint32_t initial_slabs = 1;
};

/// Registers host memory with the device; the daemon wires these to the current device.
/// Called from several threads at once (slabs are made side by side).
struct HostRegistration {
  std::function<Status(void* ptr, uint64_t bytes)> register_memory;
  std::function<void(void* ptr)> unregister_memory;
};

/// One slab as a session sees it. `fd` and `data` stay valid until the slab is released.
struct SlabRef {
  uint64_t id = 0;
  int fd = -1;
  char* data = nullptr;
  uint64_t size = 0;
};

struct SlabPoolStats {
  uint64_t slabs_total = 0;          // every slab the pool has, whatever its state
  uint64_t slabs_in_use = 0;         // held by sessions
  uint64_t slabs_kept = 0;           // of slabs_in_use: kept for a kept stream's next session
  uint64_t slabs_daemon = 0;         // held by the daemon itself (staging for remote clients)
  uint64_t slabs_free = 0;           // ready: fresh (any grant) or the daemon's own (daemon only)
  uint64_t slabs_fresh = 0;          // of slabs_free: never handed out, ready for the next grant
  uint64_t bytes_total = 0;          // slabs_total * slab size
  uint64_t fds_open = 0;             // memfds the pool holds open
  uint64_t made_total = 0;           // slabs made since start
  uint64_t made_on_grant_total = 0;  // grants that found no slab ready and made their own
  uint64_t destroyed_total = 0;      // slabs destroyed (released by a session, quarantined,
                                     // or a daemon slab evicted to make room)
  uint64_t most_made_at_once = 0;    // the most slabs ever being made at the same time
};

class SlabPool {
 public:
  /// Make the pool and its initial slabs. INVALID_ARGUMENT for a zero slab size or a budget
  /// below one slab; the system's error when a slab cannot be made.
  static Result<std::unique_ptr<SlabPool>> Create(const SlabPoolOptions& options,
                                                  HostRegistration registration);
  /// Stops the pool's thread and destroys every slab.
  ~SlabPool();
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  /// Hand a fresh slab (never handed out before) to a session of user `uid`: one made
  /// ahead, else one made now (destroying a released slab or a free daemon slab first when
  /// the budget needs it). QUOTA_EXCEEDED when the budget is held by slabs in use.
  Result<SlabRef> Acquire(uid_t uid);
  /// Take a slab for the daemon's own use (staging): a free daemon slab, else as Acquire.
  /// Held by no session, not in slabs_in_use; never handed to a client afterwards.
  Result<SlabRef> AcquireDaemon();
  /// Give a slab back. A session's slab is destroyed (by the pool's thread, soon); a daemon
  /// slab is kept for the daemon. `quarantined`: its memory is of unknown state (a failed
  /// copy): destroyed whoever held it.
  void Release(uint64_t id, bool quarantined);

  /// Register every slab again (after the device was rebuilt: the old registrations went
  /// with the old context).
  void ReregisterAll();

  uint64_t slab_size() const { return options_.slab_size; }
  SlabPoolStats stats() const;
  /// The slab sets holding kept slabs of this pool's slabs.
  KeptSlabsIndex& kept() { return kept_; }

  /// Wait until the pool's thread has nothing left to do (released slabs destroyed, fresh
  /// slabs made up to the target the budget allows, or a make failed), so tests see
  /// settled counts.
  void WaitIdleForTest();

 private:
  enum class Use {
    kFresh,       // never handed out: any grant may take it
    kSession,     // held by a session
    kDaemon,      // held by the daemon
    kDaemonFree,  // the daemon's, free: only AcquireDaemon takes it
    kRetired,     // released by a session (or quarantined): waiting to be destroyed
  };
  struct Slab {
    uint64_t id = 0;
    int fd = -1;
    char* data = nullptr;
    Use use = Use::kFresh;
    uid_t uid = 0;  // the holder's uid (kSession), for logs
  };

  SlabPool(const SlabPoolOptions& options, HostRegistration registration)
      : options_(options), registration_(std::move(registration)) {}
  // Make one slab (memfd, seal, map, populate, register); no lock needed.
  Result<Slab> MakeSlab(uint64_t id) const;
  // Undo MakeSlab; the pages are punched out first, so a client's old mapping keeps none of
  // them. No lock needed.
  void DestroySlab(const Slab& slab) const;
  Result<SlabRef> Grant(Use use, uid_t uid);
  SlabRef TakeLocked(Slab& slab, Use use, uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Slabs that take budget now: in the map, being made, or being destroyed.
  uint64_t HeldLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slabs_.size() + making_ + destroying_;
  }
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t CountLocked(Use use) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first slab of `use`, or null.
  Slab* FindLocked(Use use) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take the first slab of `use` out of the map and destroy it with mu_ released (counted
  // in destroying_ meanwhile); false when there is none. Callers checked in the same
  // critical section that no re-registration runs.
  bool DestroyOneLocked(Use use) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Make one slab with mu_ released (counted in making_ meanwhile); the caller puts it in
  // the map. Callers checked the budget and that no re-registration runs in the same
  // critical section.
  Result<Slab> MakeOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();

  const SlabPoolOptions options_;
  const HostRegistration registration_;
  KeptSlabsIndex kept_;
  mutable Mutex mu_;
  CondVar cv_;  // work for the thread, a make or destroy ended, or the thread went idle
  std::map<uint64_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t made_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t made_on_grant_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t destroyed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t making_ ABSL_GUARDED_BY(mu_) = 0;       // makes in flight (any thread)
  uint64_t destroying_ ABSL_GUARDED_BY(mu_) = 0;   // destroys in flight (out of the map)
  uint64_t most_making_ ABSL_GUARDED_BY(mu_) = 0;  // the most makes ever in flight at once
  // ReregisterAll runs: no make or destroy starts (a slab half made would be registered
  // with the old device and missed).
  bool reregistering_ ABSL_GUARDED_BY(mu_) = false;
  bool make_failed_ ABSL_GUARDED_BY(mu_) = false;  // retried after the next grant/release
  bool busy_ ABSL_GUARDED_BY(mu_) = false;         // the thread is working
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry::pool
