// AllocationTable: a device's live allocations (base address -> bytes), and the range check
// every enqueue makes against them. One copy for the host and the CUDA backends.
//
// Thread-safety: none of its own. The device holds its lock around every call (the same
// lock that guards its other memory accounting, so a reservation and its entry stay in one
// critical section).
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "backend/backend.h"
#include "ferry/dtype.h"

namespace ferry::backend {

class AllocationTable {
 public:
  /// Record a live allocation of `bytes` at `base`.
  void Insert(DevicePtr base, uint64_t bytes) { allocations_[base] = Entry{bytes, false}; }
  /// Forget the allocation at `base` and return its size; nullopt when there is none.
  std::optional<uint64_t> Erase(DevicePtr base) {
    auto it = allocations_.find(base);
    if (it == allocations_.end()) return std::nullopt;
    const uint64_t bytes = it->second.bytes;
    allocations_.erase(it);
    return bytes;
  }
  /// Mark the allocation at `base` freed-but-pending (its Free is enqueued: newly enqueued
  /// work may not use it). False when there is no such allocation or it is already marked.
  bool MarkFreePending(DevicePtr base) {
    auto it = allocations_.find(base);
    if (it == allocations_.end() || it->second.free_pending) return false;
    it->second.free_pending = true;
    return true;
  }

  enum class Range { kInside, kFreePending, kOutside };
  /// Where [ptr, ptr + bytes) lies: inside one allocation, inside one whose free is pending,
  /// or not inside any one allocation (an overflowing end included). `bytes` > 0.
  Range Find(DevicePtr ptr, uint64_t bytes) const {
    uint64_t end = 0;
    const bool fits = CheckedAdd(ptr, bytes, &end);
    auto it = allocations_.upper_bound(ptr);
    if (fits && it != allocations_.begin()) {
      --it;
      if (end <= it->first + it->second.bytes) {
        return it->second.free_pending ? Range::kFreePending : Range::kInside;
      }
    }
    return Range::kOutside;
  }

  /// Call fn(base, bytes) for every live allocation, in address order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& [base, entry] : allocations_) fn(base, entry.bytes);
  }
  size_t size() const { return allocations_.size(); }

 private:
  struct Entry {
    uint64_t bytes = 0;
    bool free_pending = false;
  };
  std::map<DevicePtr, Entry> allocations_;
};

}  // namespace ferry::backend
