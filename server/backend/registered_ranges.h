// RegisteredRanges: the host ranges a device registered with RegisterHostMemory (first byte
// -> length), and the containment check a copy makes against them to choose between the
// direct DMA path and the pageable one. One copy for the host and the CUDA backends.
//
// Thread-safety: none of its own. The device holds its lock around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace ferry::backend {

class RegisteredRanges {
 public:
  /// Record [ptr, ptr + bytes); false when a range starting at `ptr` is already recorded.
  bool Add(const void* ptr, uint64_t bytes) {
    return ranges_.emplace(static_cast<const char*>(ptr), bytes).second;
  }
  /// Forget the range starting at `ptr`; false when there is none.
  bool Remove(const void* ptr) { return ranges_.erase(static_cast<const char*>(ptr)) != 0; }
  /// True where [ptr, ptr + bytes) lies within one recorded range.
  bool Contains(const void* ptr, uint64_t bytes) const {
    const auto* p = static_cast<const char*>(ptr);
    auto it = ranges_.upper_bound(p);  // the first range starting after p
    if (it == ranges_.begin()) return false;
    --it;
    const uint64_t offset = static_cast<uint64_t>(p - it->first);
    return bytes <= it->second && offset <= it->second - bytes;
  }
  size_t size() const { return ranges_.size(); }

 private:
  std::map<const char*, uint64_t> ranges_;
};

}  // namespace ferry::backend
