// SlabArena and BufferBlock (libferry, client/src/slab_arena.h): the first-fit sub-allocator
// over a session's mapped slabs gives out ranges that never overlap, takes them back merged
// with their free neighbours, spills to the next slab, and a slab stays mapped while a
// buffer carved from it is alive, even after its arena is gone.
#include "slab_arena.h"

#include <gtest/gtest.h>

#include <memory>

namespace ferry::internal {
namespace {

// A slab with no memory behind it (base null: nothing to unmap); the arena only does
// arithmetic on offsets.
std::shared_ptr<SlabMapping> FakeSlab(uint64_t id, uint64_t size) {
  auto m = std::make_shared<SlabMapping>();
  m->id = id;
  m->size = size;
  return m;
}

uint64_t MustAllocate(SlabArena& arena, uint64_t bytes, uint64_t* slab = nullptr) {
  std::shared_ptr<SlabMapping> map;
  uint64_t offset = ~uint64_t{0};
  EXPECT_TRUE(arena.Allocate(bytes, &map, &offset)) << bytes << " bytes";
  if (slab) *slab = map ? map->id : 0;
  return offset;
}

TEST(SlabArenaTest, NothingToAllocateFromWithoutASlab) {
  SlabArena arena;
  std::shared_ptr<SlabMapping> map;
  uint64_t offset = 0;
  EXPECT_FALSE(arena.Allocate(256, &map, &offset));
  EXPECT_EQ(map, nullptr);
}

TEST(SlabArenaTest, RangesAreCarvedFirstFitAndNeverOverlap) {
  SlabArena arena;
  arena.Add(FakeSlab(7, 4096));
  uint64_t slab = 0;
  EXPECT_EQ(MustAllocate(arena, 1024, &slab), 0u);
  EXPECT_EQ(slab, 7u);
  EXPECT_EQ(MustAllocate(arena, 1024), 1024u);
  EXPECT_EQ(MustAllocate(arena, 2048), 2048u);
  std::shared_ptr<SlabMapping> map;
  uint64_t offset = 0;
  EXPECT_FALSE(arena.Allocate(256, &map, &offset)) << "the slab is full";
  // A freed range is the first fit for a smaller request; the rest of it stays free.
  arena.Free(7, 1024, 1024);
  EXPECT_EQ(MustAllocate(arena, 256), 1024u);
  EXPECT_EQ(MustAllocate(arena, 768), 1280u);
  EXPECT_FALSE(arena.Allocate(256, &map, &offset));
}

TEST(SlabArenaTest, FreedRangesMergeWithBothNeighbours) {
  SlabArena arena;
  arena.Add(FakeSlab(1, 4096));
  for (uint64_t k = 0; k < 4; ++k) EXPECT_EQ(MustAllocate(arena, 1024), k * 1024);
  arena.Free(1, 0, 1024);
  arena.Free(1, 2048, 1024);
  std::shared_ptr<SlabMapping> map;
  uint64_t offset = 0;
  EXPECT_FALSE(arena.Allocate(2048, &map, &offset)) << "two separate holes of 1 KiB";
  arena.Free(1, 1024, 1024);  // joins the hole before and the hole after
  EXPECT_EQ(MustAllocate(arena, 3072), 0u);
  arena.Free(1, 0, 3072);
  arena.Free(1, 3072, 1024);  // merges with the previous one only
  EXPECT_EQ(MustAllocate(arena, 4096), 0u) << "the whole slab is one free range again";
}

TEST(SlabArenaTest, SpillsToTheNextSlabAndFreesIntoTheRightOne) {
  SlabArena arena;
  arena.Add(FakeSlab(1, 2048));
  arena.Add(FakeSlab(2, 2048));
  uint64_t slab = 0;
  EXPECT_EQ(MustAllocate(arena, 2048, &slab), 0u);
  EXPECT_EQ(slab, 1u);
  EXPECT_EQ(MustAllocate(arena, 1024, &slab), 0u);
  EXPECT_EQ(slab, 2u);
  arena.Free(1, 0, 2048);
  EXPECT_EQ(MustAllocate(arena, 2048, &slab), 0u);
  EXPECT_EQ(slab, 1u) << "slab 1 got its range back";
  arena.Free(99, 0, 1024);  // a slab the arena never had: ignored
  std::shared_ptr<SlabMapping> map;
  uint64_t offset = 0;
  EXPECT_FALSE(arena.Allocate(2048, &map, &offset));
}

// At a close, the slabs no buffer uses leave the arena (for the next session on a kept
// stream: docs/protocol.md, "Kept slabs"); a slab with any range given out stays.
TEST(SlabArenaTest, TakeUnusedTakesOnlyWhollyFreeSlabs) {
  SlabArena arena;
  arena.Add(FakeSlab(1, 4096));
  arena.Add(FakeSlab(2, 4096));
  arena.Add(FakeSlab(3, 4096));
  uint64_t slab = 0;
  EXPECT_EQ(MustAllocate(arena, 4096, &slab), 0u);
  EXPECT_EQ(slab, 1u);
  const uint64_t at = MustAllocate(arena, 256, &slab);
  EXPECT_EQ(slab, 2u);
  const uint64_t freed = MustAllocate(arena, 256, &slab);
  arena.Free(2, freed, 256);  // freed again: slab 2 still has one range out
  auto unused = arena.TakeUnused();
  ASSERT_EQ(unused.size(), 1u);
  EXPECT_EQ(unused[0]->id, 3u);
  // Nothing is carved from a taken slab: slab 2's rest, then no room.
  EXPECT_EQ(MustAllocate(arena, 4096 - 256, &slab), 256u);
  EXPECT_EQ(slab, 2u);
  std::shared_ptr<SlabMapping> map;
  uint64_t offset = 0;
  EXPECT_FALSE(arena.Allocate(256, &map, &offset));
  arena.Free(2, at, 256);
  arena.Free(2, 256, 4096 - 256);
  arena.Free(1, 0, 4096);
  EXPECT_EQ(arena.TakeUnused().size(), 2u);
  EXPECT_TRUE(arena.TakeUnused().empty());
}

TEST(SlabArenaTest, ADroppedBufferGivesItsRangeBack) {
  auto arena = std::make_shared<SlabArena>();
  arena->Add(FakeSlab(3, 1024));
  {
    auto block = std::make_shared<BufferBlock>();
    ASSERT_TRUE(arena->Allocate(1024, &block->slab, &block->slab_offset));
    block->reserved = 1024;
    block->arena = arena;
    std::shared_ptr<SlabMapping> map;
    uint64_t offset = 0;
    EXPECT_FALSE(arena->Allocate(256, &map, &offset));
  }
  EXPECT_EQ(MustAllocate(*arena, 1024), 0u);
}

TEST(SlabArenaTest, ASlabOutlivesItsArenaWhileABufferUsesIt) {
  auto arena = std::make_shared<SlabArena>();
  std::weak_ptr<SlabMapping> slab;
  {
    auto m = FakeSlab(4, 1024);
    slab = m;
    arena->Add(std::move(m));
  }
  auto block = std::make_shared<BufferBlock>();
  ASSERT_TRUE(arena->Allocate(512, &block->slab, &block->slab_offset));
  block->reserved = 512;
  block->arena = arena;
  arena.reset();  // the session's arena is gone first
  EXPECT_FALSE(slab.expired()) << "the buffer still maps the slab";
  block.reset();  // and its destructor does not touch the dead arena
  EXPECT_TRUE(slab.expired());
}

}  // namespace
}  // namespace ferry::internal
