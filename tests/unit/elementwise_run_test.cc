#include "backend/elementwise_run.h"

#include <gtest/gtest.h>

namespace ferry::backend {
namespace {

using Range = ElementwiseRun::Range;

TEST(ElementwiseRunTest, AnEmptyRunTakesAnyOp) {
  ElementwiseRun run;
  EXPECT_TRUE(run.empty());
  EXPECT_TRUE(run.CanJoin(DType::kF64, 1, {Range{100, 80, false}, Range{104, 80, true}}));
}

TEST(ElementwiseRunTest, OpsOnTheSameElementsOrOnOthersJoin) {
  ElementwiseRun run;
  run.Add(DType::kF32, 1, {Range{1000, 400, false}, Range{2000, 400, true}});  // y = a * x
  // The same y again, read and written at the same start (longer or shorter).
  EXPECT_TRUE(run.CanJoin(DType::kF32, 1, {Range{2000, 800, false}, Range{2000, 800, true}}));
  EXPECT_TRUE(run.CanJoin(DType::kF32, 1, {Range{2000, 4, true}}));
  // Elsewhere entirely (touching ends do not overlap).
  EXPECT_TRUE(run.CanJoin(DType::kF32, 1, {Range{2400, 400, true}, Range{0, 1000, false}}));
  // Reading x at another start: nobody writes x.
  EXPECT_TRUE(run.CanJoin(DType::kF32, 1, {Range{1004, 400, false}, Range{3000, 400, true}}));
  // Ranges of zero bytes touch nothing.
  EXPECT_TRUE(run.CanJoin(DType::kF32, 1, {Range{2004, 0, true}}));
  EXPECT_EQ(run.ops(), 1u);
}

TEST(ElementwiseRunTest, AnOpOnWrittenElementsAtAnotherIndexDoesNotJoin) {
  ElementwiseRun run;
  run.Add(DType::kF32, 1, {Range{1000, 400, false}, Range{2000, 400, true}});
  // Reads y shifted by one element: element i of it is another thread's y[i + 1].
  EXPECT_FALSE(run.CanJoin(DType::kF32, 1, {Range{2004, 400, false}, Range{3000, 400, true}}));
  // Writes x shifted: an earlier op's reads of x would race with it.
  EXPECT_FALSE(run.CanJoin(DType::kF32, 1, {Range{996, 400, true}}));
  // Writes into the middle of y.
  EXPECT_FALSE(run.CanJoin(DType::kF32, 1, {Range{2200, 8, true}}));
}

TEST(ElementwiseRunTest, ARunHasOneDtypeAndAtMostMaxOps) {
  ElementwiseRun run;
  run.Add(DType::kF32, 1, {Range{0, 4, true}});
  EXPECT_FALSE(run.CanJoin(DType::kF64, 1, {Range{8000, 8, true}}));
  for (size_t i = 1; i < ElementwiseRun::kMaxOps; ++i) {
    ASSERT_TRUE(run.CanJoin(DType::kF32, 1, {Range{0, 4, true}}));
    run.Add(DType::kF32, 1, {Range{0, 4, true}});
  }
  EXPECT_EQ(run.ops(), ElementwiseRun::kMaxOps);
  EXPECT_FALSE(run.CanJoin(DType::kF32, 1, {Range{0, 4, true}}));
  run.Clear();
  EXPECT_TRUE(run.empty());
  EXPECT_TRUE(run.CanJoin(DType::kF64, 1, {Range{2, 8, true}}));
}

TEST(ElementwiseRunTest, OpsOfVeryDifferentLengthsDoNotShareARun) {
  ElementwiseRun run;
  run.Add(DType::kF32, 1000, {Range{0, 4000, true}});
  EXPECT_TRUE(run.CanJoin(DType::kF32, 250, {Range{0, 1000, true}}));
  EXPECT_TRUE(run.CanJoin(DType::kF32, 4000, {Range{0, 16000, true}}));
  EXPECT_FALSE(run.CanJoin(DType::kF32, 249, {Range{0, 996, true}}));
  EXPECT_FALSE(run.CanJoin(DType::kF32, 4004, {Range{0, 16016, true}}));
  run.Add(DType::kF32, 250, {Range{0, 1000, true}});
  // Now 250..1000: a 1001-element op would make the ratio exceed 4.
  EXPECT_FALSE(run.CanJoin(DType::kF32, 1001, {Range{0, 4004, true}}));
  EXPECT_TRUE(run.CanJoin(DType::kF32, 1000, {Range{0, 4000, true}}));
}

}  // namespace
}  // namespace ferry::backend
