// The session's pinned buffers: slabs mapped from the daemon (SlabMapping), the first-fit
// sub-allocator over them (SlabArena), and the memory behind one PinnedBuffer (BufferBlock).
// Internal to libferry.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "ferry/mutex.h"

namespace ferry::internal {

// One slab mapped into this process; unmapped when the last buffer carved from it and the
// session's arena are gone.
struct SlabMapping {
  uint64_t id = 0;
  char* base = nullptr;
  uint64_t size = 0;
  ~SlabMapping() {
    if (base) ::munmap(base, size);
  }
};

// First-fit sub-allocator over the session's mapped slabs. Thread-safe (a buffer may be
// dropped on any thread).
class SlabArena {
 public:
  // Take `m` in, all of it free.
  void Add(std::shared_ptr<SlabMapping> m);
  // Carve `bytes` (aligned) out of some slab; false when none has room.
  bool Allocate(uint64_t bytes, std::shared_ptr<SlabMapping>* map, uint64_t* offset);
  // Return a range Allocate gave out of slab `slab`, merging it with its free neighbours.
  void Free(uint64_t slab, uint64_t offset, uint64_t bytes);
  // Take out every slab no buffer uses (all of it free), for the next session on a kept
  // stream (docs/protocol.md, "Kept slabs"); nothing is carved from them here any more.
  std::vector<std::shared_ptr<SlabMapping>> TakeUnused();

 private:
  struct Entry {
    std::shared_ptr<SlabMapping> map;
    std::map<uint64_t, uint64_t> free;  // offset -> bytes
  };
  Mutex mu_;
  std::vector<Entry> slabs_ ABSL_GUARDED_BY(mu_);
};

// The memory of one PinnedBuffer: a range of a slab, or heap memory.
struct BufferBlock {
  char* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<SlabMapping> slab;  // null: heap
  uint64_t slab_offset = 0;
  uint64_t reserved = 0;  // bytes taken from the slab
  std::weak_ptr<SlabArena> arena;
  std::unique_ptr<char[]> heap;
  ~BufferBlock() {
    if (!slab) return;
    if (auto a = arena.lock()) a->Free(slab->id, slab_offset, reserved);
  }
};

}  // namespace ferry::internal
