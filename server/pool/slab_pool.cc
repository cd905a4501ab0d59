#include "pool/slab_pool.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "pool/sys_error.h"

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
  std::lock_guard lock(pool->mu_);
  uint64_t initial = std::min<uint64_t>(options.initial_slabs, options.budget / options.slab_size);
  for (uint64_t i = 0; i < initial; ++i) {
    FERRY_ASSIGN_OR_RETURN([[maybe_unused]] Slab * slab, pool->MakeSlabLocked());
  }
  return pool;
}

SlabPool::~SlabPool() {
  std::lock_guard lock(mu_);
  while (!slabs_.empty()) DestroySlabLocked(slabs_.begin()->first);
}

Result<SlabPool::Slab*> SlabPool::MakeSlabLocked() {
  uint64_t id = next_id_++;
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
  Slab& slab = slabs_[id];
  slab.id = id;
  slab.fd = fd;
  slab.data = static_cast<char*>(p);
  return &slab;
}

void SlabPool::DestroySlabLocked(uint64_t id) {
  auto it = slabs_.find(id);
  if (it == slabs_.end()) return;
  if (registration_.unregister_memory) registration_.unregister_memory(it->second.data);
  ::munmap(it->second.data, options_.slab_size);
  ::close(it->second.fd);
  slabs_.erase(it);
}

Result<SlabRef> SlabPool::Acquire(uid_t uid) {
  std::lock_guard lock(mu_);
  Slab* chosen = nullptr;
  // 1. A free slab this uid held before (zeroed: the session must not see an earlier
  //    session's bytes either), else 2. one never handed out.
  for (auto& [id, slab] : slabs_) {
    if (!slab.in_use && !slab.fresh && slab.uid == uid) {
      chosen = &slab;
      std::memset(slab.data, 0, options_.slab_size);
      ++zeroed_;
      break;
    }
  }
  if (!chosen) {
    for (auto& [id, slab] : slabs_) {
      if (!slab.in_use && slab.fresh) {
        chosen = &slab;
        break;
      }
    }
  }
  if (!chosen) {
    // 3. A new slab, after destroying a free slab of another uid if the budget needs it.
    if ((slabs_.size() + 1) * options_.slab_size > options_.budget) {
      uint64_t victim = 0;
      for (auto& [id, slab] : slabs_) {
        if (!slab.in_use) {
          victim = id;
          break;
        }
      }
      if (victim == 0) {
        return Status(ErrorKind::kQuotaExceeded, "the pinned-memory budget (" +
                                                     std::to_string(options_.budget) +
                                                     " bytes) is held by slabs in use");
      }
      DestroySlabLocked(victim);
      ++evicted_;
    }
    FERRY_ASSIGN_OR_RETURN(chosen, MakeSlabLocked());
  }
  chosen->in_use = true;
  chosen->fresh = false;
  chosen->uid = uid;
  return SlabRef{chosen->id, chosen->fd, chosen->data, options_.slab_size};
}

Result<SlabRef> SlabPool::AcquireDaemon() {
  FERRY_ASSIGN_OR_RETURN(SlabRef ref, Acquire(static_cast<uid_t>(-1)));
  std::lock_guard lock(mu_);
  slabs_.at(ref.id).daemon = true;
  return ref;
}

void SlabPool::Release(uint64_t id, bool quarantined) {
  std::lock_guard lock(mu_);
  auto it = slabs_.find(id);
  if (it == slabs_.end()) return;
  it->second.daemon = false;
  if (quarantined) {
    DestroySlabLocked(id);
    return;
  }
  it->second.in_use = false;
}

void SlabPool::ReregisterAll() {
  if (!registration_.register_memory) return;
  std::lock_guard lock(mu_);
  for (auto& [id, slab] : slabs_) {
    Status s = registration_.register_memory(slab.data, options_.slab_size);
    if (!s.ok()) spdlog::warn("re-registering slab {}: {}", id, s.ToString());
  }
}

SlabPoolStats SlabPool::stats() const {
  std::lock_guard lock(mu_);
  SlabPoolStats s;
  s.slabs_total = slabs_.size();
  for (const auto& [id, slab] : slabs_) {
    if (slab.in_use && slab.daemon) {
      ++s.slabs_daemon;
    } else if (slab.in_use) {
      ++s.slabs_in_use;
    }
  }
  s.slabs_free = s.slabs_total - s.slabs_in_use - s.slabs_daemon;
  s.bytes_total = s.slabs_total * options_.slab_size;
  s.fds_open = s.slabs_total;
  s.zeroed_total = zeroed_;
  s.evicted_total = evicted_;
  return s;
}

}  // namespace ferry::pool
