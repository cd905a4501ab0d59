// CopyTurns: the daemon-wide turns for large copies, on their own (session_test.cc has
// sessions waiting for them).
#include "session/copy_turns.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace ferry::session {
namespace {

constexpr uint8_t kUp = CopyTurns::kToDevice;
constexpr uint8_t kDown = CopyTurns::kToHost;

TEST(CopyTurnsTest, NeedsAddsEachDirectionsCopiesUpAgainstTheSize) {
  CopyTurns turns(4, 1000);
  const std::string bytes(600, 'x');
  EXPECT_EQ(turns.Needs({FillOp{1, 1.0}, AxpyOp{1.0, 1, 2}}), CopyTurns::kNone);
  EXPECT_EQ(turns.Needs({UploadOp{1, 0, bytes}}), CopyTurns::kNone);  // 600 < 1000
  // Inline and slab uploads add up.
  EXPECT_EQ(turns.Needs({UploadOp{1, 0, bytes}, UploadFromSlabOp{1, 0, 1, 0, 400}}), kUp);
  EXPECT_EQ(turns.Needs({DownloadOp{1, 0, 999}}), CopyTurns::kNone);
  EXPECT_EQ(turns.Needs({DownloadOp{1, 0, 500}, DownloadToSlabOp{1, 0, 1, 0, 500}}), kDown);
  EXPECT_EQ(turns.Needs({UploadFromSlabOp{1, 0, 1, 0, 1000}, DownloadOp{1, 0, 1000}}), kUp | kDown);
  // Lengths from the wire that would wrap a sum still count as large (admission refuses them).
  const uint64_t huge = std::numeric_limits<uint64_t>::max() - 10;
  EXPECT_EQ(turns.Needs({DownloadOp{1, 0, huge}, DownloadOp{1, 0, huge}}), kDown);
  // Off: nothing needs a turn, and TryTake always succeeds.
  CopyTurns off(0, 1000);
  EXPECT_EQ(off.Needs({DownloadOp{1, 0, 1 << 20}}), CopyTurns::kNone);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(off.TryTake(kUp | kDown));
}

TEST(CopyTurnsTest, TryTakeHoldsTheLimitOfEachDirectionApart) {
  CopyTurns turns(2, 1);
  EXPECT_TRUE(turns.TryTake(kUp));
  EXPECT_TRUE(turns.TryTake(kUp));
  EXPECT_FALSE(turns.TryTake(kUp));
  EXPECT_FALSE(turns.TryTake(kUp | kDown));  // all or nothing
  EXPECT_TRUE(turns.TryTake(kDown));
  CopyTurns::Stats s = turns.stats();
  EXPECT_EQ(s.held_to_device, 2u);
  EXPECT_EQ(s.held_to_host, 1u);
  turns.Give(kUp);
  EXPECT_TRUE(turns.TryTake(kUp | kDown));
  EXPECT_EQ(turns.stats().held_to_host, 2u);
  EXPECT_TRUE(turns.TryTake(CopyTurns::kNone));
}

TEST(CopyTurnsTest, WaitersGetTheirTurnsInArrivalOrder) {
  CopyTurns turns(1, 1);
  ASSERT_TRUE(turns.TryTake(kUp));
  std::vector<int> granted;
  for (int i = 0; i < 3; ++i) turns.Wait(kUp, [&granted, i] { granted.push_back(i); });
  EXPECT_TRUE(granted.empty());
  EXPECT_EQ(turns.stats().waiting, 3u);
  EXPECT_EQ(turns.stats().waits, 3u);
  for (int i = 0; i < 3; ++i) {
    turns.Give(kUp);  // the holder's copy completed: the next waiter, and only it, goes
    ASSERT_EQ(granted.size(), static_cast<size_t>(i + 1));
    EXPECT_EQ(granted.back(), i);
    EXPECT_EQ(turns.stats().held_to_device, 1u);
  }
  turns.Give(kUp);
  EXPECT_EQ(turns.stats().held_to_device, 0u);
  EXPECT_EQ(turns.stats().waiting, 0u);
}

TEST(CopyTurnsTest, AWaitForAFreeTurnIsGrantedAtOnce) {
  CopyTurns turns(1, 1);
  bool granted = false;
  turns.Wait(kDown, [&granted] { granted = true; });
  EXPECT_TRUE(granted);
  EXPECT_EQ(turns.stats().held_to_host, 1u);
}

TEST(CopyTurnsTest, NobodyJumpsAnEarlierWaiterOfTheSameDirection) {
  CopyTurns turns(1, 1);
  ASSERT_TRUE(turns.TryTake(kUp));
  bool both = false;
  turns.Wait(kUp | kDown, [&both] { both = true; });  // waits for the upload turn
  // The download turn is free, but the waiter ahead wants it too.
  EXPECT_FALSE(turns.TryTake(kDown));
  bool down = false;
  turns.Wait(kDown, [&down] { down = true; });
  EXPECT_FALSE(down);
  turns.Give(kUp);
  EXPECT_TRUE(both);
  EXPECT_FALSE(down);  // `both` holds the download turn now
  turns.Give(kUp | kDown);
  EXPECT_TRUE(down);
}

TEST(CopyTurnsTest, AWaiterOfOneDirectionDoesNotHoldUpTheOther) {
  CopyTurns turns(1, 1);
  ASSERT_TRUE(turns.TryTake(kUp));
  bool up = false, down = false;
  turns.Wait(kUp, [&up] { up = true; });
  turns.Wait(kDown, [&down] { down = true; });
  EXPECT_FALSE(up);
  EXPECT_TRUE(down);  // granted at once: nothing ahead of it wants a download turn
  EXPECT_TRUE(turns.TryTake(CopyTurns::kNone));
  EXPECT_FALSE(turns.TryTake(kDown));  // the one download turn is held
  turns.Give(kUp);
  EXPECT_TRUE(up);
}

}  // namespace
}  // namespace ferry::session
