// AllocationTable (server/backend/allocation_table.h), the live-allocation table both
// backends check every enqueue against: a range is inside only when one allocation holds
// all of it; an allocation whose free is pending is told apart; erasing gives the size back.
#include "backend/allocation_table.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace ferry::backend {
namespace {

using Range = AllocationTable::Range;

TEST(AllocationTableTest, ARangeIsInsideOnlyWhenOneAllocationHoldsAllOfIt) {
  AllocationTable t;
  t.Insert(0x1000, 0x100);
  t.Insert(0x1100, 0x100);  // adjacent: a range across both is in no single one
  EXPECT_EQ(t.Find(0x1000, 0x100), Range::kInside);
  EXPECT_EQ(t.Find(0x10ff, 1), Range::kInside);
  EXPECT_EQ(t.Find(0x10ff, 2), Range::kOutside);
  EXPECT_EQ(t.Find(0x0fff, 1), Range::kOutside);
  EXPECT_EQ(t.Find(0x1200, 1), Range::kOutside);
  EXPECT_EQ(t.Find(0x1000, ~uint64_t{0}), Range::kOutside) << "an end that overflows";
}

TEST(AllocationTableTest, AFreePendingAllocationIsToldApart) {
  AllocationTable t;
  t.Insert(0x2000, 64);
  EXPECT_TRUE(t.MarkFreePending(0x2000));
  EXPECT_FALSE(t.MarkFreePending(0x2000)) << "already marked";
  EXPECT_FALSE(t.MarkFreePending(0x3000)) << "no such allocation";
  EXPECT_EQ(t.Find(0x2000, 64), Range::kFreePending);
}

TEST(AllocationTableTest, EraseGivesTheSizeBackOnce) {
  AllocationTable t;
  t.Insert(0x4000, 4096);
  t.Insert(0x1000, 16);
  std::vector<std::pair<DevicePtr, uint64_t>> seen;
  t.ForEach([&](DevicePtr base, uint64_t bytes) { seen.push_back({base, bytes}); });
  EXPECT_EQ(seen, (std::vector<std::pair<DevicePtr, uint64_t>>{{0x1000, 16}, {0x4000, 4096}}));
  EXPECT_EQ(t.Erase(0x4000), std::optional<uint64_t>(4096));
  EXPECT_EQ(t.Erase(0x4000), std::nullopt);
  EXPECT_EQ(t.Find(0x4000, 1), Range::kOutside);
  EXPECT_EQ(t.size(), 1u);
}

}  // namespace
}  // namespace ferry::backend
