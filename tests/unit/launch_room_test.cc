// LaunchRoom: the daemon-wide count of queued device commands (session/launch_room.h).
#include "session/launch_room.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ferry::session {
namespace {

TEST(LaunchRoomTest, TakesWithinTheLimitAndGivesBack) {
  LaunchRoom room;
  room.SetLimit(100);
  EXPECT_TRUE(room.TryTake(60));
  EXPECT_TRUE(room.TryTake(40));
  EXPECT_FALSE(room.TryTake(1));
  EXPECT_EQ(room.queued(), 100u);
  room.Give(30);
  EXPECT_TRUE(room.TryTake(30));
  EXPECT_FALSE(room.TryTake(1));
}

// One op of more commands than half the limit counts as half for the test, so that it is
// not starved while others keep a few queued; it is charged whole.
TEST(LaunchRoomTest, ALargeTakeCountsAsHalfTheLimitForTheTest) {
  LaunchRoom room;
  room.SetLimit(100);
  ASSERT_TRUE(room.TryTake(40));
  EXPECT_TRUE(room.TryTake(500));
  EXPECT_EQ(room.queued(), 540u);
  EXPECT_FALSE(room.TryTake(1));
  room.Give(540);
  EXPECT_EQ(room.queued(), 0u);
  ASSERT_TRUE(room.TryTake(60));
  EXPECT_FALSE(room.TryTake(500)) << "60 + half of 100 passes 100";
}

TEST(LaunchRoomTest, NoLimitTakesEverythingAndStillCounts) {
  LaunchRoom room;
  EXPECT_TRUE(room.TryTake(1'000'000));
  EXPECT_EQ(room.queued(), 1'000'000u);
  room.Give(1'000'000);
  EXPECT_EQ(room.queued(), 0u);
}

TEST(LaunchRoomTest, AWaiterIsWokenByTheNextGiveOnce) {
  LaunchRoom room;
  room.SetLimit(10);
  ASSERT_TRUE(room.TryTake(10));
  int woken = 0;
  room.Await(5, [&] { ++woken; });
  EXPECT_EQ(woken, 0);
  room.Give(5);
  EXPECT_EQ(woken, 1);
  room.Give(5);
  EXPECT_EQ(woken, 1) << "woken once per Await";
}

// Waiters go in the order they came, as many as the room fits: one that does not fit holds
// back those behind it (a large one is not starved by small ones).
TEST(LaunchRoomTest, WaitersAreWokenInOrderAsManyAsFit) {
  LaunchRoom room;
  room.SetLimit(100);
  ASSERT_TRUE(room.TryTake(100));
  std::vector<int> woken;
  room.Await(30, [&] { woken.push_back(1); });
  room.Await(40, [&] { woken.push_back(2); });
  room.Await(10, [&] { woken.push_back(3); });
  room.Give(50);  // room for 50: the first (30) fits, the second (40) does not, nor after it
  EXPECT_EQ(woken, std::vector<int>({1}));
  room.Give(30);  // 80 free (nobody took): 40 and 10 fit
  EXPECT_EQ(woken, std::vector<int>({1, 2, 3}));
}

// Room that came between a failed TryTake and the Await: the waiter is woken at once
// rather than left with nobody to wake it.
TEST(LaunchRoomTest, AWaiterWhoseRoomCameAlreadyIsWokenAtOnce) {
  LaunchRoom room;
  room.SetLimit(10);
  ASSERT_TRUE(room.TryTake(10));
  room.Give(10);  // nobody waits yet
  int woken = 0;
  room.Await(5, [&] { ++woken; });
  EXPECT_EQ(woken, 1);
}

// Threads taking and giving back while others wait: the count never passes the limit (no
// take counts as half), ends at zero, and every waiter is woken.
TEST(LaunchRoomTest, ConcurrentTakesStayWithinTheLimit) {
  LaunchRoom room;
  room.SetLimit(64);
  std::atomic<uint64_t> most{0};
  std::atomic<int> awaits{0}, wakes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (room.TryTake(8)) {
          uint64_t now = room.queued();
          uint64_t seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          room.Give(8);
        } else {
          awaits.fetch_add(1);
          room.Await(8, [&] { wakes.fetch_add(1); });
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  // Nobody takes now: each Give wakes as many waiters as 64 commands fit, until none waits.
  for (int i = 0; i < 100000 && wakes.load() < awaits.load(); ++i) room.Give(0);
  EXPECT_LE(most.load(), 64u);
  EXPECT_EQ(room.queued(), 0u);
  EXPECT_EQ(wakes.load(), awaits.load());
}

}  // namespace
}  // namespace ferry::session
