// SlabPool: the daemon's pinned shared-memory slabs.
//
// A slab is a memfd_create file of a fixed size, sealed against shrink and grow (and
// against further sealing), mapped MAP_SHARED and populated by the daemon, and registered
// with the device once, when it is made (cudaHostRegister on CUDA; a no-op on the host
// backend). Registration never happens on a transfer's path.
//
// Ownership: a slab is held by at most one session at a time. A released slab goes back to
// a free list tagged with the uid of the user who held it; it is handed out again only to
// the same uid, and zeroed first. A slab that was never handed out can go to anyone. When
// the budget is full and no free slab of the uid exists, a free slab of another uid is
// destroyed (unregistered, unmapped, closed) and a fresh one is made in its place: no byte
// one user wrote ever becomes readable by another.
//
// Thread-safe: the slab acceptor (connection threads) acquires, session executors release,
// the Admin service reads the counters.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/status.h"

namespace ferry::pool {

struct SlabPoolOptions {
  uint64_t slab_size = 64ull << 20;
  uint64_t budget = 1ull << 30;  // the most bytes all slabs together may take
  uint32_t initial_slabs = 1;    // made (and registered) at start
};

/// Registers host memory with the device; the daemon wires these to the current device.
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
  uint64_t slabs_total = 0;
  uint64_t slabs_in_use = 0;  // held by sessions
  uint64_t slabs_daemon = 0;  // held by the daemon itself (staging for remote clients)
  uint64_t slabs_free = 0;
  uint64_t bytes_total = 0;    // slabs_total * slab size
  uint64_t fds_open = 0;       // memfds the pool holds open
  uint64_t zeroed_total = 0;   // reuses that zeroed a slab
  uint64_t evicted_total = 0;  // free slabs destroyed to make room for another uid
};

class SlabPool {
 public:
  /// Make the pool and its initial slabs. INVALID_ARGUMENT for a zero slab size or a budget
  /// below one slab; the system's error when a slab cannot be made.
  static Result<std::unique_ptr<SlabPool>> Create(const SlabPoolOptions& options,
                                                  HostRegistration registration);
  ~SlabPool();
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  /// Hand a slab to a session of user `uid`: a free slab of that uid (zeroed), a fresh one,
  /// or one made by evicting another uid's free slab. QUOTA_EXCEEDED when the budget is
  /// held by slabs in use.
  Result<SlabRef> Acquire(uid_t uid);
  /// Take a slab for the daemon's own use (staging): held by no session, counted against
  /// no client uid (it is tagged with a uid no client has, so a client only ever gets it
  /// after it was destroyed and made afresh), not in slabs_in_use. Errors as Acquire.
  Result<SlabRef> AcquireDaemon();
  /// Give a slab back. `quarantined`: its memory is of unknown state (a failed copy): the
  /// slab is destroyed instead of pooled.
  void Release(uint64_t id, bool quarantined);

  /// Register every slab again (after the device was rebuilt: the old registrations went
  /// with the old context).
  void ReregisterAll();

  uint64_t slab_size() const { return options_.slab_size; }
  SlabPoolStats stats() const;

 private:
  struct Slab {
    uint64_t id = 0;
    int fd = -1;
    char* data = nullptr;
    bool in_use = false;
    bool daemon = false;  // held by the daemon (AcquireDaemon)
    bool fresh = true;    // never handed out: all zeros, any uid may take it
    uid_t uid = 0;        // the last holder's uid (when !fresh)
  };

  SlabPool(const SlabPoolOptions& options, HostRegistration registration)
      : options_(options), registration_(std::move(registration)) {}
  Result<Slab*> MakeSlabLocked();
  void DestroySlabLocked(uint64_t id);

  const SlabPoolOptions options_;
  const HostRegistration registration_;
  mutable std::mutex mu_;
  std::map<uint64_t, Slab> slabs_;     // guarded by mu_
  uint64_t next_id_ = 1;               // guarded by mu_
  uint64_t zeroed_ = 0, evicted_ = 0;  // guarded by mu_
};

}  // namespace ferry::pool
