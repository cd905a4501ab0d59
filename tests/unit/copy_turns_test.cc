// CopyTurns: the daemon-wide turns for large copies, on their own (session_test.cc has
// sessions waiting for them).
#include "session/copy_turns.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// --- fair shares: weights and device turns -----------------------------------------------

// Queue `n` waiters of each identity in `order` (round robin), one turn of `mask` held by
// nobody in particular; give the turn back `grants` times and return who got it, in order.
std::string GrantOrder(CopyTurns& turns, uint8_t mask, const std::vector<std::string>& order, int n,
                       int grants) {
  EXPECT_TRUE(turns.TryTake(mask, "holder"));
  std::string got;
  for (int i = 0; i < n; ++i) {
    for (const std::string& who : order) {
      turns.Wait(
          mask, [&got, who] { got += who; }, who);
    }
  }
  EXPECT_TRUE(got.empty()) << "the one turn is held";
  for (int i = 0; i < grants; ++i) turns.Give(mask);  // each Give grants exactly one waiter
  return got;
}

TEST(CopyTurnsSharesTest, WaitersOfWeightedUidsGetTurnsInProportion) {
  CopyTurns turns(1, 1);
  turns.SetWeights({{"A", 3}, {"B", 1}});
  // A weighs 3, B 1: of every four turns A gets three, whatever the arrival order.
  const std::string got = GrantOrder(turns, kUp, {"B", "A"}, 8, 8);
  EXPECT_EQ(got.size(), 8u);
  EXPECT_EQ(std::count(got.begin(), got.end(), 'A'), 6) << got;
  EXPECT_EQ(std::count(got.begin(), got.end(), 'B'), 2) << got;
  for (size_t i = 0; i + 4 <= got.size(); i += 4) {
    EXPECT_EQ(std::count(got.begin() + i, got.begin() + i + 4, 'A'), 3) << got;
  }
}

TEST(CopyTurnsSharesTest, EqualWeightsAlternateBetweenUidsNotArrivalOrder) {
  CopyTurns turns(1, 1);
  EXPECT_TRUE(turns.TryTake(kUp, "holder"));
  std::string got;
  // A queues four requests before B's first: with turns by identity they still alternate.
  for (int i = 0; i < 4; ++i)
    turns.Wait(
        kUp, [&got] { got += 'A'; }, "A");
  for (int i = 0; i < 4; ++i)
    turns.Wait(
        kUp, [&got] { got += 'B'; }, "B");
  for (int i = 0; i < 8; ++i) turns.Give(kUp);
  EXPECT_EQ(got, "ABABABAB");
}

TEST(CopyTurnsSharesTest, AnIdentityThatIdledBanksNoCredit) {
  CopyTurns turns(1, 1);
  // A takes many turns alone; B arrives late and must not then get a long run of turns.
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(turns.TryTake(kUp, "A"));
    turns.Give(kUp);
  }
  const std::string got = GrantOrder(turns, kUp, {"A", "B"}, 4, 8);
  EXPECT_EQ(std::count(got.begin(), got.begin() + 4, 'B'), 2) << got;
}

TEST(CopyTurnsSharesTest, DeviceTurnsGateEverySubmitWithOps) {
  CopyTurns turns(/*turns=*/0, /*min_bytes=*/1, /*device_turns=*/1);
  std::vector<Op> ops;
  EXPECT_EQ(turns.Needs(ops), CopyTurns::kNone) << "no ops, nothing on the device";
  ops.push_back(FillOp{});
  EXPECT_EQ(turns.Needs(ops), CopyTurns::kDevice);
  ASSERT_TRUE(turns.TryTake(CopyTurns::kDevice, "A"));
  EXPECT_FALSE(turns.TryTake(CopyTurns::kDevice, "B"));
  EXPECT_EQ(turns.stats().held_device, 1u);
  bool b = false;
  turns.Wait(
      CopyTurns::kDevice, [&b] { b = true; }, "B");
  EXPECT_FALSE(b);
  turns.Give(CopyTurns::kDevice);
  EXPECT_TRUE(b);
  // Copy turns off: copies take no copy turn, only the device turn.
  UploadOp up;
  up.data = "sixteen bytes...";
  EXPECT_EQ(turns.Needs({Op(up)}), CopyTurns::kDevice);
}

TEST(CopyTurnsSharesTest, UidWeightsParseAndFormat) {
  auto w = ParseUidWeights("uid:1000=2, uid:1001=1,remote=5,remote:alice=3");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->at("uid:1000"), 2u);
  EXPECT_EQ(w->at("uid:1001"), 1u);
  EXPECT_EQ(w->at("remote"), 5u);
  EXPECT_EQ(w->at("remote:alice"), 3u);
  EXPECT_EQ(FormatUidWeights(*w), "remote=5,remote:alice=3,uid:1000=2,uid:1001=1");
  EXPECT_EQ(*ParseUidWeights(FormatUidWeights(*w)), *w);
  EXPECT_TRUE(ParseUidWeights("")->empty());
  for (const char* bad :
       {"uid:1000", "uid:x=2", "gid:5=2", "uid:1=0", "uid:1=1001", "uid:1=2,uid:1=3", "uid:1=-2",
        ",", "uid:99999999999=1", "remote:=2", "remote:a/b=2"}) {
    auto r = ParseUidWeights(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().kind(), ErrorKind::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ferry::session
