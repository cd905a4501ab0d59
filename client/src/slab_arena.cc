#include "slab_arena.h"

namespace ferry::internal {

void SlabArena::Add(std::shared_ptr<SlabMapping> m) {
  MutexLock lock(&mu_);
  Entry e;
  e.free[0] = m->size;
  e.map = std::move(m);
  slabs_.push_back(std::move(e));
}

bool SlabArena::Allocate(uint64_t bytes, std::shared_ptr<SlabMapping>* map, uint64_t* offset) {
  MutexLock lock(&mu_);
  for (Entry& e : slabs_) {
    for (auto it = e.free.begin(); it != e.free.end(); ++it) {
      if (it->second < bytes) continue;
      *offset = it->first;
      *map = e.map;
      uint64_t rest = it->second - bytes, at = it->first + bytes;
      e.free.erase(it);
      if (rest) e.free[at] = rest;
      return true;
    }
  }
  return false;
}

void SlabArena::Free(uint64_t slab, uint64_t offset, uint64_t bytes) {
  MutexLock lock(&mu_);
  for (Entry& e : slabs_) {
    if (e.map->id != slab) continue;
    auto next = e.free.lower_bound(offset);
    if (next != e.free.end() && next->first == offset + bytes) {  // merge with the next
      bytes += next->second;
      next = e.free.erase(next);
    }
    if (next != e.free.begin()) {  // merge with the previous
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += bytes;
        return;
      }
    }
    e.free[offset] = bytes;
    return;
  }
}

std::vector<std::shared_ptr<SlabMapping>> SlabArena::TakeUnused() {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<SlabMapping>> unused;
  std::erase_if(slabs_, [&](Entry& e) {
    const bool all_free =
        e.free.size() == 1 && e.free.begin()->first == 0 && e.free.begin()->second == e.map->size;
    if (all_free) unused.push_back(std::move(e.map));
    return all_free;
  });
  return unused;
}

}  // namespace ferry::internal
