#include "pool/staging.h"

#include <gtest/gtest.h>

#include "pool/session_slabs.h"
#include "pool/slab_pool.h"

namespace ferry::pool {
namespace {

constexpr uint64_t kSlab = 1ull << 20;

std::unique_ptr<SlabPool> MakePool(uint64_t budget_slabs) {
  auto pool = SlabPool::Create({kSlab, budget_slabs * kSlab, 0}, HostRegistration{});
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return std::move(*pool);
}

// One range of `bytes` through AllocateAll, or an empty lease when it gets none.
StagingLease One(StagingArea& area, uint64_t bytes) {
  std::vector<StagingLease> got;
  if (area.AllocateAll({bytes}, &got, [] {}) != StagingArea::Outcome::kAllocated) return {};
  return std::move(got[0]);
}

TEST(StagingTest, RangesAreDisjointFreedByLeasesAndCountNoSession) {
  auto pool = MakePool(4);
  {
    StagingArea area(pool.get(), 1);
    StagingLease a = One(area, 1000);
    StagingLease b = One(area, kSlab / 2);
    ASSERT_TRUE(a && b);
    EXPECT_GE(b.data(), a.data() + 1000);
    EXPECT_EQ(pool->stats().slabs_in_use, 0u);  // a daemon slab, held by no session
    EXPECT_EQ(pool->stats().slabs_daemon, 1u);
    // No room left for another half slab (4K granules), nor for more than a slab.
    EXPECT_FALSE(One(area, kSlab / 2));
    EXPECT_FALSE(One(area, kSlab + 1));
    EXPECT_FALSE(One(area, 0));
    StagingStats s = area.stats();
    EXPECT_EQ(s.slabs, 1u);
    EXPECT_EQ(s.bytes_in_use, 4096 + kSlab / 2);
    EXPECT_EQ(s.staged_total, 1000 + kSlab / 2);
    b = StagingLease();  // freed
    StagingLease c = One(area, kSlab / 2);
    ASSERT_TRUE(c);
    StagingLease moved = std::move(c);
    EXPECT_FALSE(c);
    EXPECT_TRUE(moved);
    area.CountFallback();
    EXPECT_EQ(area.stats().fallbacks_total, 1u);
    a.Reset();
    moved.Reset();
    EXPECT_EQ(area.stats().bytes_in_use, 0u);
  }
  // The area gave its slab back; a client uid never gets the daemon's bytes without a
  // fresh slab.
  EXPECT_EQ(pool->stats().slabs_daemon, 0u);
  EXPECT_EQ(pool->stats().slabs_in_use, 0u);
}

// AllocateAll: every range or none; when they do not fit, the caller's wake runs once bytes
// are freed (not for the ranges it gave back itself); what the area can never hold is kNever.
TEST(StagingTest, AllocateAllTakesEveryRangeOrWaitsForAFree) {
  auto pool = MakePool(4);
  StagingArea area(pool.get(), 2);  // 2M in all
  int woken = 0;
  auto wake = [&woken] { ++woken; };
  std::vector<StagingLease> first;
  ASSERT_EQ(area.AllocateAll({kSlab, kSlab / 2}, &first, wake), StagingArea::Outcome::kAllocated);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].length(), kSlab);
  EXPECT_EQ(first[1].length(), kSlab / 2);
  EXPECT_NE(first[0].data(), first[1].data());
  // Half a slab is left: two quarters fit, three halves do not, and take nothing.
  std::vector<StagingLease> second;
  EXPECT_EQ(area.AllocateAll({kSlab / 4, kSlab / 2, kSlab / 2}, &second, wake),
            StagingArea::Outcome::kWait);
  EXPECT_TRUE(second.empty());
  EXPECT_EQ(area.stats().bytes_in_use, kSlab + kSlab / 2);
  EXPECT_EQ(woken, 0) << "giving back its own partial ranges woke the waiter";
  // More than the area can ever hold, or a range above a slab: never.
  std::vector<StagingLease> never;
  EXPECT_EQ(area.AllocateAll({kSlab, kSlab, kSlab}, &never, wake), StagingArea::Outcome::kNever);
  EXPECT_EQ(area.AllocateAll({kSlab + 1}, &never, wake), StagingArea::Outcome::kNever);
  // A free wakes the waiter once; then it fits.
  first[0].Reset();
  EXPECT_EQ(woken, 1);
  first[1].Reset();
  EXPECT_EQ(woken, 1) << "a waiter is woken once per wait";
  EXPECT_EQ(area.AllocateAll({kSlab / 4, kSlab / 2, kSlab / 2}, &second, wake),
            StagingArea::Outcome::kAllocated);
  EXPECT_EQ(second.size(), 3u);
  second.clear();
  EXPECT_EQ(area.stats().bytes_in_use, 0u);
}

// A holder (a session) holds at most half of the area: past that it waits for a free
// (kWaitOwn) while another holder still gets the other half; its own free lets it take
// again. A submit larger than the share is never staged, even by a holder that holds nothing
// (kNever: the direct path): staged, it would hold the whole area for as long as its own
// earlier work runs.
TEST(StagingTest, AHolderTakesAtMostHalfOfTheArea) {
  auto pool = MakePool(4);
  StagingArea area(pool.get(), 2);  // 2M in all, 1M per holder
  EXPECT_EQ(area.holder_limit(), kSlab);
  auto a = std::make_shared<StagingHolder>();
  auto b = std::make_shared<StagingHolder>();
  int woken = 0;
  auto wake = [&woken] { ++woken; };
  std::vector<StagingLease> a1, a2, b1;
  ASSERT_EQ(area.AllocateAll({kSlab / 2}, &a1, wake, a), StagingArea::Outcome::kAllocated);
  ASSERT_EQ(area.AllocateAll({kSlab / 2}, &a2, wake, a), StagingArea::Outcome::kAllocated);
  EXPECT_EQ(a->held.load(), kSlab);
  std::vector<StagingLease> a3;
  EXPECT_EQ(area.AllocateAll({kSlab / 4}, &a3, wake, a), StagingArea::Outcome::kWaitOwn);
  EXPECT_TRUE(a3.empty());
  EXPECT_EQ(area.AllocateAll({kSlab}, &b1, wake, b), StagingArea::Outcome::kAllocated)
      << "the other half is another holder's";
  a1.clear();  // a's own free wakes it, and it fits its share again
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(a->held.load(), kSlab / 2);
  EXPECT_EQ(area.AllocateAll({kSlab / 4}, &a3, wake, a), StagingArea::Outcome::kAllocated);
  a2.clear();
  a3.clear();
  b1.clear();
  EXPECT_EQ(a->held.load(), 0u);
  EXPECT_EQ(b->held.load(), 0u);
  // Holding nothing, a submit larger than the share is not staged; its share whole is.
  std::vector<StagingLease> big;
  EXPECT_EQ(area.AllocateAll({kSlab, kSlab / 2}, &big, wake, a), StagingArea::Outcome::kNever);
  EXPECT_TRUE(big.empty());
  EXPECT_EQ(area.stats().bytes_in_use, 0u);
  EXPECT_EQ(area.AllocateAll({kSlab / 2, kSlab / 2}, &big, wake, a),
            StagingArea::Outcome::kAllocated);
  EXPECT_EQ(a->held.load(), kSlab);
  StagingLease moved = std::move(big[0]);  // a moved lease still counts for its holder
  big.clear();
  EXPECT_EQ(a->held.load(), kSlab / 2);
  moved.Reset();
  EXPECT_EQ(a->held.load(), 0u);
  EXPECT_EQ(area.stats().bytes_in_use, 0u);
  // Without a holder (no share) only the area bounds a submit.
  EXPECT_EQ(area.AllocateAll({kSlab, kSlab / 2}, &big, wake), StagingArea::Outcome::kAllocated);
  big.clear();
  EXPECT_EQ(area.stats().bytes_in_use, 0u);
}

// Two sessions of one identity: each within its own share, but together held to the
// identity's (the parent's) share; another identity's session is not.
TEST(StagingTest, SessionsOfOneIdentityTogetherTakeAtMostHalf) {
  auto pool = MakePool(4);
  StagingArea area(pool.get(), 2);  // 2M in all, 1M per holder and per identity
  auto identity = std::make_shared<StagingHolder>();
  auto s1 = std::make_shared<StagingHolder>(identity);
  auto s2 = std::make_shared<StagingHolder>(identity);
  auto other = std::make_shared<StagingHolder>(std::make_shared<StagingHolder>());
  int woken = 0;
  auto wake = [&woken] { ++woken; };
  std::vector<StagingLease> l1, l2, l3;
  ASSERT_EQ(area.AllocateAll({kSlab}, &l1, wake, s1), StagingArea::Outcome::kAllocated);
  EXPECT_EQ(identity->held.load(), kSlab);
  EXPECT_EQ(area.AllocateAll({kSlab / 4}, &l2, wake, s2), StagingArea::Outcome::kWaitOwn)
      << "s2 holds nothing, but its identity holds its share";
  EXPECT_EQ(area.AllocateAll({kSlab}, &l3, wake, other), StagingArea::Outcome::kAllocated);
  l1.clear();
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(identity->held.load(), 0u);
  EXPECT_EQ(area.AllocateAll({kSlab / 4}, &l2, wake, s2), StagingArea::Outcome::kAllocated);
  EXPECT_EQ(identity->held.load(), kSlab / 4);
  EXPECT_EQ(s1->held.load(), 0u);
  l2.clear();
  l3.clear();
  EXPECT_EQ(identity->held.load(), 0u);
  EXPECT_EQ(other->parent->held.load(), 0u);
}

TEST(StagingTest, SessionPinnedQuotaCountsWholeSlabs) {
  auto pool = MakePool(8);
  SessionSlabs slabs(pool.get(), 2 * kSlab + 100);
  ASSERT_TRUE(slabs.Bind(1000));
  ASSERT_TRUE(slabs.Acquire().ok());
  ASSERT_TRUE(slabs.Acquire().ok());
  auto third = slabs.Acquire();
  EXPECT_EQ(third.status().kind(), ErrorKind::kQuotaExceeded);
  EXPECT_EQ(slabs.slab_count(), 2u);
  EXPECT_EQ(pool->stats().slabs_in_use, 2u);
  slabs.Close();
  EXPECT_EQ(pool->stats().slabs_in_use, 0u);
}

}  // namespace
}  // namespace ferry::pool
