#include "pool/slab_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ferry/sys_error.h"

namespace ferry::pool {

Result<std::unique_ptr<SlabPool>> SlabPool::Create(const SlabPoolOptions& options,
                                                   HostRegistration registration) {
  if (options.slab_size == 0 || options.slab_size % 4096 != 0) {
    return Status(ErrorKind::kInvalidArgument, "the slab size must be a non-zero multiple of 4K");
  }
  if (options.budget < options.slab_size) {
    return Status(ErrorKind::kInvalidArgument, "the pinned budget is below one slab");
  }
  std::unique_ptr<SlabPool> pool(new SlabPool(options, std::move(registration)));
  uint64_t initial = std::min<uint64_t>(options.initial_slabs, options.budget / options.slab_size);
  {
    MutexLock lock(&pool->mu_);  // no other thread yet: for the analysis
    for (uint64_t i = 0; i < initial; ++i) {
      FERRY_ASSIGN_OR_RETURN(Slab slab, pool->MakeSlab(pool->next_id_++));
      pool->slabs_[slab.id] = slab;
      ++pool->made_;
    }
  }
  pool->thread_ = std::thread([raw = pool.get()] {
    pthread_setname_np(pthread_self(), "ferry-slabmk");
    raw->Run();
  });
  return pool;
}

SlabPool::~SlabPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [&] {  // grants still making (their callers should be gone by now)
    mu_.AssertHeld();
    return making_ == 0 && destroying_ == 0;
  });
  for (auto& [id, slab] : slabs_) DestroySlab(slab);
  slabs_.clear();
}

Result<SlabPool::Slab> SlabPool::MakeSlab(uint64_t id) const {
  std::string name = "ferry-slab-" + std::to_string(id);
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SysError("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(options_.slab_size)) != 0) {
    Status s = SysError("ftruncate of a slab");
    ::close(fd);
    return s;
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = SysError("sealing a slab");
    ::close(fd);
    return s;
  }
  // The pages are made by writing zeros to the file, not by faulting the mapping in: a
  // write holds only this file's lock, while MAP_POPULATE over pages not yet made holds
  // the daemon's mmap lock for the whole allocation (~4x longer), and every page fault of
  // every daemon thread (executors, gRPC) waits behind any mmap or munmap queued behind it.
  // Populating the mapping afterwards only maps pages that exist.
  static const char kZeros[1 << 20] = {};  // reads as the one zero page: stays in cache
  for (uint64_t at = 0; at < options_.slab_size;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(sizeof(kZeros), options_.slab_size - at));
    const ssize_t w = ::pwrite(fd, kZeros, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      Status s = SysError("writing a slab's pages");
      ::close(fd);
      return s;
    }
    at += static_cast<uint64_t>(w);
  }
  void* p =
      ::mmap(nullptr, options_.slab_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    Status s = SysError("mmap of a slab");
    ::close(fd);
    return s;
  }
  if (registration_.register_memory) {
    Status s = registration_.register_memory(p, options_.slab_size);
    if (!s.ok()) {
      ::munmap(p, options_.slab_size);
      ::close(fd);
      return s.WithContext("registering a slab with the device");
    }
  }
  Slab slab;
  slab.id = id;
  slab.fd = fd;
  slab.data = static_cast<char*>(p);
  return slab;
}

void SlabPool::DestroySlab(const Slab& slab) const {
  if (registration_.unregister_memory) registration_.unregister_memory(slab.data);
  // A client may still map the memfd: free its pages now (the seals allow a hole, not a
  // resize), so what the session wrote is gone and the daemon's memory is not held by a
  // mapping it cannot see. The old mapping then reads zeros and its own later writes.
  if (::fallocate(slab.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                  static_cast<off_t>(options_.slab_size)) != 0) {
    spdlog::debug("punching slab {}: {}", slab.id, std::strerror(errno));
  }
  ::munmap(slab.data, options_.slab_size);
  ::close(slab.fd);
}

SlabRef SlabPool::TakeLocked(Slab& slab, Use use, uid_t uid) {
  slab.use = use;
  slab.uid = uid;
  return SlabRef{slab.id, slab.fd, slab.data, options_.slab_size};
}

uint64_t SlabPool::CountLocked(Use use) const {
  uint64_t n = 0;
  for (const auto& [id, slab] : slabs_) n += slab.use == use ? 1 : 0;
  return n;
}

SlabPool::Slab* SlabPool::FindLocked(Use use) {
  for (auto& [id, slab] : slabs_) {
    if (slab.use == use) return &slab;
  }
  return nullptr;
}

bool SlabPool::DestroyOneLocked(Use use) {
  Slab* found = FindLocked(use);
  if (!found) return false;
  const Slab slab = *found;
  slabs_.erase(slab.id);
  ++destroying_;  // still takes its budget until destroyed
  mu_.Unlock();
  DestroySlab(slab);
  mu_.Lock();
  --destroying_;
  ++destroyed_;
  cv_.NotifyAll();  // room in the budget for a grant that waits
  return true;
}

Result<SlabPool::Slab> SlabPool::MakeOneLocked() {
  const uint64_t id = next_id_++;
  ++making_;
  most_making_ = std::max(most_making_, making_);
  mu_.Unlock();
  Result<Slab> made = MakeSlab(id);
  mu_.Lock();
  --making_;
  cv_.NotifyAll();  // a fresh slab, or room, for a grant that waits; or ReregisterAll
  return made;
}

Result<SlabRef> SlabPool::Grant(Use use, uid_t uid) {
  // A daemon slab first when the daemon asks (reused only by the daemon), else a fresh one.
  auto take_ready = [&]() -> Slab* {
    mu_.AssertHeld();
    Slab* daemon_free = use == Use::kDaemon ? FindLocked(Use::kDaemonFree) : nullptr;
    return daemon_free ? daemon_free : FindLocked(Use::kFresh);
  };
  MutexLock lock(&mu_);
  for (;;) {
    // From here to counting a make or destroy in flight, one critical section: the budget
    // check holds, and no re-registration starts in between.
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return !reregistering_;
    });
    if (Slab* slab = take_ready()) {
      make_failed_ = false;
      SlabRef ref = TakeLocked(*slab, use, uid);
      cv_.NotifyAll();  // make the next one ahead
      return ref;
    }
    // None ready: make one here (the cost the slabs made ahead exist to avoid), beside any
    // other grant's make.
    if ((HeldLocked() + 1) * options_.slab_size <= options_.budget) break;
    // Room from a slab no one holds: a released one not destroyed yet, else a free daemon
    // slab (the daemon makes another when it needs one). Destroyed here, then look again.
    if (DestroyOneLocked(Use::kRetired) || DestroyOneLocked(Use::kDaemonFree)) continue;
    // Budget taken by makes or destroys in flight: each ends in a fresh slab or in room.
    if (making_ == 0 && destroying_ == 0) {
      return Status(ErrorKind::kQuotaExceeded, "the pinned-memory budget (" +
                                                   std::to_string(options_.budget) +
                                                   " bytes) is held by slabs in use");
    }
    cv_.Wait(&mu_);
  }
  Result<Slab> made = MakeOneLocked();
  FERRY_RETURN_IF_ERROR(made.status());
  ++made_;
  ++made_on_grant_;
  Slab& slab = slabs_[made->id] = *made;
  return TakeLocked(slab, use, uid);
}

Result<SlabRef> SlabPool::Acquire(uid_t uid) { return Grant(Use::kSession, uid); }

Result<SlabRef> SlabPool::AcquireDaemon() { return Grant(Use::kDaemon, static_cast<uid_t>(-1)); }

void SlabPool::Release(uint64_t id, bool quarantined) {
  {
    MutexLock lock(&mu_);
    auto it = slabs_.find(id);
    if (it == slabs_.end()) return;
    Slab& slab = it->second;
    if (slab.use == Use::kDaemon && !quarantined) {
      slab.use = Use::kDaemonFree;  // never mapped by a client: the daemon may reuse it
      return;
    }
    slab.use = Use::kRetired;
    make_failed_ = false;
  }
  cv_.NotifyAll();
}

bool SlabPool::HasWorkLocked() const {
  if (CountLocked(Use::kRetired) > 0) return true;
  if (make_failed_) return false;
  return CountLocked(Use::kFresh) < options_.initial_slabs &&
         (HeldLocked() + 1) * options_.slab_size <= options_.budget;
}

void SlabPool::Run() {
  MutexLock lock(&mu_);
  for (;;) {
    busy_ = false;
    cv_.NotifyAll();  // WaitIdleForTest
    cv_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return stop_ || (!reregistering_ && HasWorkLocked());
    });
    if (stop_) return;
    busy_ = true;
    // 1. Destroy a released slab (its budget goes to the next fresh one).
    if (DestroyOneLocked(Use::kRetired)) continue;
    // 2. Make a fresh slab ahead, within the budget.
    if (!HasWorkLocked()) continue;
    Result<Slab> made = MakeOneLocked();
    if (!made.ok()) {
      make_failed_ = true;  // retried after the next grant or release, not in a loop
      spdlog::warn("making a slab ahead: {}", made.status().ToString());
      continue;
    }
    slabs_[made->id] = *made;
    ++made_;
  }
}

void SlabPool::WaitIdleForTest() {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [&] {
    mu_.AssertHeld();
    return stop_ || (!busy_ && making_ == 0 && destroying_ == 0 && !HasWorkLocked());
  });
}

void SlabPool::ReregisterAll() {
  if (!registration_.register_memory) return;
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [&] {  // one at a time
    mu_.AssertHeld();
    return !reregistering_;
  });
  reregistering_ = true;  // no make or destroy starts from here
  cv_.Wait(&mu_, [&] {    // and none is half done (registered with the old device)
    mu_.AssertHeld();
    return making_ == 0 && destroying_ == 0;
  });
  for (auto& [id, slab] : slabs_) {
    Status s = registration_.register_memory(slab.data, options_.slab_size);
    if (!s.ok()) spdlog::warn("re-registering slab {}: {}", id, s.ToString());
  }
  reregistering_ = false;
  cv_.NotifyAll();
}

SlabPoolStats SlabPool::stats() const {
  MutexLock lock(&mu_);
  SlabPoolStats s;
  s.slabs_total = slabs_.size();
  s.slabs_in_use = CountLocked(Use::kSession);
  s.slabs_kept = kept_.slabs();
  s.slabs_daemon = CountLocked(Use::kDaemon);
  s.slabs_fresh = CountLocked(Use::kFresh);
  s.slabs_free = s.slabs_fresh + CountLocked(Use::kDaemonFree);
  s.bytes_total = s.slabs_total * options_.slab_size;
  s.fds_open = s.slabs_total;
  s.made_total = made_;
  s.made_on_grant_total = made_on_grant_;
  s.destroyed_total = destroyed_;
  s.most_made_at_once = most_making_;
  return s;
}

}  // namespace ferry::pool
