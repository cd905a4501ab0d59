// RegisteredRanges (server/backend/registered_ranges.h), the host ranges a device registered:
// a copy takes the direct path only when one registered range holds all of its bytes.
#include "backend/registered_ranges.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace ferry::backend {
namespace {

TEST(RegisteredRangesTest, ACopyIsContainedOnlyWhenOneRangeHoldsAllOfIt) {
  std::vector<char> memory(257);
  char* a = memory.data() + 1;
  char* b = a + 128;  // adjacent: a copy across both is in no single range
  RegisteredRanges ranges;
  ASSERT_TRUE(ranges.Add(a, 128));
  ASSERT_TRUE(ranges.Add(b, 64));
  EXPECT_TRUE(ranges.Contains(a, 128));
  EXPECT_TRUE(ranges.Contains(a + 127, 1));
  EXPECT_FALSE(ranges.Contains(a + 127, 2));
  EXPECT_TRUE(ranges.Contains(b + 63, 1));
  EXPECT_FALSE(ranges.Contains(b + 64, 1)) << "past the last range";
  EXPECT_FALSE(ranges.Contains(b, 65));
  EXPECT_FALSE(ranges.Contains(a, UINT64_MAX)) << "a length no range can hold";
  EXPECT_FALSE(ranges.Contains(a - 1, 1)) << "before the first range";
}

TEST(RegisteredRangesTest, ARangeIsAddedAndRemovedOnceByItsFirstByte) {
  std::vector<char> memory(64);
  RegisteredRanges ranges;
  ASSERT_TRUE(ranges.Add(memory.data(), 64));
  EXPECT_FALSE(ranges.Add(memory.data(), 32)) << "already recorded";
  EXPECT_FALSE(ranges.Remove(memory.data() + 1)) << "not a range's first byte";
  EXPECT_EQ(ranges.size(), 1u);
  EXPECT_TRUE(ranges.Remove(memory.data()));
  EXPECT_FALSE(ranges.Remove(memory.data()));
  EXPECT_FALSE(ranges.Contains(memory.data(), 1));
  EXPECT_EQ(ranges.size(), 0u);
}

}  // namespace
}  // namespace ferry::backend
