// LaunchRoom: the daemon-wide count of queued device commands and each identity's share of
// it (session/launch_room.h).
#include "session/launch_room.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace ferry::session {
namespace {

TEST(LaunchRoomTest, TakesWithinTheLimitAndGivesBack) {
  LaunchRoom room;
  room.SetLimit(100);
  EXPECT_TRUE(room.TryTake(60, nullptr));
  EXPECT_TRUE(room.TryTake(40, nullptr));
  EXPECT_FALSE(room.TryTake(1, nullptr));
  EXPECT_EQ(room.queued(), 100u);
  room.Give(30, nullptr);
  EXPECT_TRUE(room.TryTake(30, nullptr));
  EXPECT_FALSE(room.TryTake(1, nullptr));
}

// One op of more commands than half the limit counts as half for the test, so that it is
// not starved while others keep a few queued; it is charged whole.
TEST(LaunchRoomTest, ALargeTakeCountsAsHalfTheLimitForTheTest) {
  LaunchRoom room;
  room.SetLimit(100);
  ASSERT_TRUE(room.TryTake(40, nullptr));
  EXPECT_TRUE(room.TryTake(500, nullptr));
  EXPECT_EQ(room.queued(), 540u);
  EXPECT_FALSE(room.TryTake(1, nullptr));
  room.Give(540, nullptr);
  EXPECT_EQ(room.queued(), 0u);
  ASSERT_TRUE(room.TryTake(60, nullptr));
  EXPECT_FALSE(room.TryTake(500, nullptr)) << "60 + half of 100 passes 100";
}

TEST(LaunchRoomTest, NoLimitTakesEverythingAndStillCounts) {
  LaunchRoom room;
  EXPECT_TRUE(room.TryTake(1'000'000, nullptr));
  EXPECT_EQ(room.queued(), 1'000'000u);
  room.Give(1'000'000, nullptr);
  EXPECT_EQ(room.queued(), 0u);
}

TEST(LaunchRoomTest, AWaiterIsWokenByTheNextGiveOnce) {
  LaunchRoom room;
  room.SetLimit(10);
  ASSERT_TRUE(room.TryTake(10, nullptr));
  int woken = 0;
  room.Await(5, nullptr, [&] { return ++woken > 0; });
  EXPECT_EQ(woken, 0);
  room.Give(5, nullptr);
  EXPECT_EQ(woken, 1);
  room.Give(5, nullptr);
  EXPECT_EQ(woken, 1) << "woken once per Await";
}

// Waiters go in the order they came, as many as the room fits: one that does not fit holds
// back those behind it (a large one is not starved by small ones).
TEST(LaunchRoomTest, WaitersAreWokenInOrderAsManyAsFit) {
  LaunchRoom room;
  room.SetLimit(100);
  ASSERT_TRUE(room.TryTake(100, nullptr));
  std::vector<int> woken;
  room.Await(30, nullptr, [&] { return woken.push_back(1), true; });
  room.Await(40, nullptr, [&] { return woken.push_back(2), true; });
  room.Await(10, nullptr, [&] { return woken.push_back(3), true; });
  room.Give(50,
            nullptr);  // room for 50: the first (30) fits, the second (40) does not, nor after it
  EXPECT_EQ(woken, std::vector<int>({1}));
  room.Give(30, nullptr);  // 80 free (nobody took): 40 and 10 fit
  EXPECT_EQ(woken, std::vector<int>({1, 2, 3}));
}

// A waiter for the room is not passed by a taker that did not wait: TryTake fails while it
// waits, though the take would fit; once it is served, takes go on.
TEST(LaunchRoomTest, ATakerDoesNotPassAWaiter) {
  LaunchRoom room;
  room.SetLimit(10);
  ASSERT_TRUE(room.TryTake(10, nullptr));
  int woken = 0;
  room.Await(5, nullptr, [&] { return ++woken > 0; });
  room.Give(3, nullptr);  // 3 free: not enough for the waiter
  EXPECT_EQ(room.room_waiters(), 1u);
  EXPECT_FALSE(room.TryTake(1, nullptr)) << "the waiter came first";
  EXPECT_TRUE(room.TryTake(0, nullptr)) << "an op that queues nothing passes nobody";
  room.Give(2, nullptr);  // 5 free: the room takes them for the waiter
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(room.queued(), 10u);
  EXPECT_EQ(room.room_waiters(), 0u);
  room.Give(5, nullptr);
  EXPECT_TRUE(room.TryTake(1, nullptr));
}

// A waiter over its own share does not make other takers wait.
TEST(LaunchRoomTest, AWaiterForItsShareDoesNotHoldBackTakers) {
  LaunchRoom room;
  room.SetLimit(100);
  auto a = std::make_shared<LaunchShare>(10);
  ASSERT_TRUE(room.TryTake(10, a.get()));
  int woken = 0;
  room.Await(5, a, [&] { return ++woken > 0; });
  EXPECT_EQ(room.room_waiters(), 0u);
  EXPECT_TRUE(room.TryTake(50, nullptr));
  room.Give(5, a.get());
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(a->queued.load(), 10u) << "taken for the waiter";
}

// A waiter that is gone when its room comes (wake returns false) leaves nothing taken.
TEST(LaunchRoomTest, TheRoomOfAWaiterThatIsGoneIsGivenBack) {
  LaunchRoom room;
  room.SetLimit(10);
  auto a = std::make_shared<LaunchShare>(0);
  ASSERT_TRUE(room.TryTake(10, nullptr));
  room.Await(4, a, [] { return false; });
  room.Give(10, nullptr);
  EXPECT_EQ(room.queued(), 0u);
  EXPECT_EQ(a->queued.load(), 0u);
}

// Room that came between a failed TryTake and the Await: the waiter is woken at once
// rather than left with nobody to wake it.
TEST(LaunchRoomTest, AWaiterWhoseRoomCameAlreadyIsWokenAtOnce) {
  LaunchRoom room;
  room.SetLimit(10);
  ASSERT_TRUE(room.TryTake(10, nullptr));
  room.Give(10, nullptr);  // nobody waits yet
  int woken = 0;
  room.Await(5, nullptr, [&] { return ++woken > 0; });
  EXPECT_EQ(woken, 1);
}

// Four threads take 8 commands and give them back, 20000 times each, thread t charged to
// shares[t % shares.size()] (null: no identity); a take that fails awaits instead, and the
// waiter is gone by the time it is woken (the room takes its 8 back). Then nobody takes, and
// gives of nothing serve the waiters left. What the room and the shares held at most (seen
// after each take), and how many waited and were woken.
struct ConcurrentRun {
  uint64_t most_room = 0, most_share = 0;
  int awaits = 0, wakes = 0;
};
ConcurrentRun TakeAndGiveOnFourThreads(LaunchRoom& room,
                                       const std::vector<std::shared_ptr<LaunchShare>>& shares) {
  std::atomic<uint64_t> most_room{0}, most_share{0};
  std::atomic<int> awaits{0}, wakes{0};
  auto raise = [](std::atomic<uint64_t>& most, uint64_t now) {
    uint64_t seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, share = shares[t % shares.size()]] {
      for (int i = 0; i < 20000; ++i) {
        if (room.TryTake(8, share.get())) {
          raise(most_room, room.queued());
          if (share) raise(most_share, share->queued.load());
          room.Give(8, share.get());
        } else {
          awaits.fetch_add(1);
          room.Await(8, share, [&] { return wakes.fetch_add(1), false; });
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 100000 && wakes.load() < awaits.load(); ++i) room.Give(0, nullptr);
  return {most_room.load(), most_share.load(), awaits.load(), wakes.load()};
}

// Threads taking and giving back while others wait: the count never passes the limit (no
// take counts as half), ends at zero, and every waiter is woken.
TEST(LaunchRoomTest, ConcurrentTakesStayWithinTheLimit) {
  LaunchRoom room;
  room.SetLimit(64);
  const ConcurrentRun run = TakeAndGiveOnFourThreads(room, {nullptr});
  EXPECT_LE(run.most_room, 64u);
  EXPECT_EQ(room.queued(), 0u);
  EXPECT_EQ(run.wakes, run.awaits);
}

// An identity's sessions keep at most its share queued, however much of the room is free;
// the commands count in the room and in the share, and a give returns both.
TEST(LaunchRoomTest, AnIdentityTakesAtMostItsShare) {
  LaunchRoom room;
  room.SetLimit(100);
  LaunchShare a(50), b(50);
  EXPECT_TRUE(room.TryTake(30, &a));
  EXPECT_TRUE(room.TryTake(20, &a));
  EXPECT_FALSE(room.TryTake(1, &a)) << "a holds its 50";
  EXPECT_EQ(room.queued(), 50u) << "a refused take leaves nothing taken";
  EXPECT_EQ(a.queued.load(), 50u);
  EXPECT_TRUE(room.TryTake(50, &b)) << "the other half is b's";
  EXPECT_FALSE(room.TryTake(1, nullptr)) << "the room is full";
  room.Give(10, &a);
  EXPECT_EQ(a.queued.load(), 40u);
  EXPECT_EQ(room.queued(), 90u);
  EXPECT_FALSE(room.TryTake(11, &a));
  EXPECT_TRUE(room.TryTake(10, &a));
}

// A take that fits its share but not the room gives its share back.
TEST(LaunchRoomTest, ATakeRefusedByTheRoomLeavesTheShareAsItWas) {
  LaunchRoom room;
  room.SetLimit(10);
  LaunchShare a(0), b(8);
  ASSERT_TRUE(room.TryTake(8, &a));
  EXPECT_FALSE(room.TryTake(4, &b));
  EXPECT_EQ(b.queued.load(), 0u);
  EXPECT_EQ(room.queued(), 8u);
}

// A waiter over its own share waits for its identity's commands and holds back nobody:
// those behind it that fit are woken by others' gives; it is woken by its own identity's.
TEST(LaunchRoomTest, AWaiterOverItsShareHoldsBackNobody) {
  LaunchRoom room;
  room.SetLimit(100);
  auto a = std::make_shared<LaunchShare>(40);
  auto b = std::make_shared<LaunchShare>(40);
  ASSERT_TRUE(room.TryTake(40, a.get()));
  ASSERT_TRUE(room.TryTake(40, b.get()));
  ASSERT_TRUE(room.TryTake(20, nullptr));  // the room is full
  std::vector<char> woken;
  room.Await(10, a, [&] { return woken.push_back('a'), true; });
  room.Await(10, b, [&] { return woken.push_back('b'), true; });
  room.Give(20, nullptr);  // room for 20; neither share has any
  EXPECT_TRUE(woken.empty());
  room.Give(10, b.get());  // b's share has room: b goes, though a came first
  EXPECT_EQ(woken, std::vector<char>({'b'}));
  room.Give(10, a.get());
  EXPECT_EQ(woken, std::vector<char>({'b', 'a'}));
}

// Waiters of one identity woken by one give count together against its share: a give of
// 10 wakes one of two waiters of 10, not both.
TEST(LaunchRoomTest, WaitersOfOneIdentityAreWokenAsManyAsItsShareFits) {
  LaunchRoom room;
  room.SetLimit(100);
  auto a = std::make_shared<LaunchShare>(20);
  ASSERT_TRUE(room.TryTake(20, a.get()));
  int woken = 0;
  room.Await(10, a, [&] { return ++woken > 0; });
  room.Await(10, a, [&] { return ++woken > 0; });
  room.Give(10, a.get());
  EXPECT_EQ(woken, 1);
  room.Give(10, a.get());
  EXPECT_EQ(woken, 2);
}

// One op of more commands than half the share counts as half for the share's test, like
// the room's: it goes once the identity holds no more than half.
TEST(LaunchRoomTest, ALargeTakeCountsAsHalfTheShareForTheTest) {
  LaunchRoom room;
  room.SetLimit(1000);
  LaunchShare a(100);
  ASSERT_TRUE(room.TryTake(50, &a));
  EXPECT_TRUE(room.TryTake(300, &a));
  EXPECT_EQ(a.queued.load(), 350u);
  EXPECT_FALSE(room.TryTake(1, &a));
}

// Identities taking and giving back on threads while others wait: no share ever holds
// more than its limit, the room ends empty, and every waiter is woken.
TEST(LaunchRoomTest, ConcurrentTakesStayWithinTheShares) {
  LaunchRoom room;
  room.SetLimit(64);
  std::vector<std::shared_ptr<LaunchShare>> shares = {std::make_shared<LaunchShare>(24),
                                                      std::make_shared<LaunchShare>(24)};
  const ConcurrentRun run = TakeAndGiveOnFourThreads(room, shares);
  EXPECT_LE(run.most_share, 24u);
  EXPECT_EQ(room.queued(), 0u);
  for (const auto& s : shares) EXPECT_EQ(s->queued.load(), 0u);
  EXPECT_EQ(run.wakes, run.awaits);
}

// Many waiters whose owners are gone (their wake returns false) are served by one Give and
// each hands its commands straight back: in a loop, not a call per waiter (a recursion as
// deep as the waiters overflowed the stack once enough had piled up), and the room ends
// empty with every waiter gone.
TEST(LaunchRoomTest, ManyWaitersThatAreGoneAreServedByOneGiveWithoutRecursion) {
  LaunchRoom room;
  room.SetLimit(100);
  ASSERT_TRUE(room.TryTake(100, nullptr));
  constexpr int kWaiters = 20000;
  int wakes = 0;
  for (int i = 0; i < kWaiters; ++i) room.Await(10, nullptr, [&] { return ++wakes, false; });
  EXPECT_EQ(room.waiters(), static_cast<uint64_t>(kWaiters));
  EXPECT_EQ(room.room_waiters(), static_cast<uint64_t>(kWaiters));
  // On a thread with a 512 KiB stack: a frame per waiter (20000 of them) would overflow it.
  struct Call {
    LaunchRoom* room;
  } call{&room};
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 512 * 1024), 0);
  pthread_t thread;
  ASSERT_EQ(pthread_create(
                &thread, &attr,
                [](void* arg) -> void* {
                  static_cast<Call*>(arg)->room->Give(100, nullptr);
                  return nullptr;
                },
                &call),
            0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  pthread_attr_destroy(&attr);
  EXPECT_EQ(wakes, kWaiters);
  EXPECT_EQ(room.waiters(), 0u);
  EXPECT_EQ(room.room_waiters(), 0u);
  EXPECT_EQ(room.queued(), 0u);
  EXPECT_TRUE(room.TryTake(100, nullptr)) << "nobody holds the room";
}

// A cancelled wait is never woken and holds back nobody: the takers and waiters it held
// back go on at once; cancelling one already served changes nothing.
TEST(LaunchRoomTest, ACancelledWaitIsNotWokenAndHoldsBackNobody) {
  LaunchRoom room;
  room.SetLimit(100);
  ASSERT_TRUE(room.TryTake(80, nullptr));
  int first = 0, second = 0;
  const uint64_t big = room.Await(50, nullptr, [&] { return ++first > 0; });
  room.Await(10, nullptr, [&] { return ++second > 0; });
  EXPECT_FALSE(room.TryTake(5, nullptr)) << "behind the waiter";
  EXPECT_EQ(second, 0) << "held back by the first, which does not fit";
  room.Cancel(big);
  EXPECT_EQ(second, 1) << "the one behind fits once the first is gone";
  EXPECT_EQ(room.waiters(), 0u);
  EXPECT_EQ(room.room_waiters(), 0u);
  EXPECT_TRUE(room.TryTake(5, nullptr));
  room.Give(95, nullptr);
  room.Give(0, nullptr);
  EXPECT_EQ(first, 0) << "a cancelled wait is never woken";
  room.Cancel(big);  // again, and already gone: nothing
  EXPECT_EQ(room.queued(), 0u);
}

}  // namespace
}  // namespace ferry::session
