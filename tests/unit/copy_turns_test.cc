// CopyTurns: the daemon-wide turns for large copies, on their own (session_test.cc has
// sessions waiting for them).
#include "session/copy_turns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ferry::session {
namespace {

constexpr uint8_t kUp = CopyTurns::kToDevice;

// The turns a submit of `ops` needs (what Session::Submit asks, of the submit's summary).
uint8_t Needs(const CopyTurns& turns, const std::vector<Op>& ops) {
  return turns.Needs(Summarize(ops));
}
constexpr uint8_t kDown = CopyTurns::kToHost;

TEST(CopyTurnsTest, NeedsAddsEachDirectionsCopiesUpAgainstTheSize) {
  CopyTurns turns(4, 1000);
  const std::string bytes(600, 'x');
  EXPECT_EQ(Needs(turns, {FillOp{1, 1.0}, AxpyOp{1.0, 1, 2}}), CopyTurns::kNone);
  EXPECT_EQ(Needs(turns, {UploadOp{1, 0, bytes}}), CopyTurns::kNone);  // 600 < 1000
  // Inline and slab uploads add up.
  EXPECT_EQ(Needs(turns, {UploadOp{1, 0, bytes}, UploadFromSlabOp{1, 0, 1, 0, 400}}), kUp);
  EXPECT_EQ(Needs(turns, {DownloadOp{1, 0, 999}}), CopyTurns::kNone);
  EXPECT_EQ(Needs(turns, {DownloadOp{1, 0, 500}, DownloadToSlabOp{1, 0, 1, 0, 500}}), kDown);
  EXPECT_EQ(Needs(turns, {UploadFromSlabOp{1, 0, 1, 0, 1000}, DownloadOp{1, 0, 1000}}),
            kUp | kDown);
  // Lengths from the wire that would wrap a sum still count as large (admission refuses them).
  const uint64_t huge = std::numeric_limits<uint64_t>::max() - 10;
  EXPECT_EQ(Needs(turns, {DownloadOp{1, 0, huge}, DownloadOp{1, 0, huge}}), kDown);
  // Off: nothing needs a turn, and TryTake always succeeds.
  CopyTurns off(0, 1000);
  EXPECT_EQ(Needs(off, {DownloadOp{1, 0, 1 << 20}}), CopyTurns::kNone);
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
  turns.Give(kUp, "");
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
    turns.Give(kUp, "");  // the holder's copy completed: the next waiter, and only it, goes
    ASSERT_EQ(granted.size(), static_cast<size_t>(i + 1));
    EXPECT_EQ(granted.back(), i);
    EXPECT_EQ(turns.stats().held_to_device, 1u);
  }
  turns.Give(kUp, "");
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
  turns.Give(kUp, "");
  EXPECT_TRUE(both);
  EXPECT_FALSE(down);  // `both` holds the download turn now
  turns.Give(kUp | kDown, "");
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
  turns.Give(kUp, "");
  EXPECT_TRUE(up);
}

// A cancelled request is never granted, what its callback held is let go at the Cancel, and
// a request it held back goes at once; a request granted already cannot be cancelled.
TEST(CopyTurnsTest, ACancelledRequestIsNeverGrantedAndHoldsUpNobody) {
  CopyTurns turns(1, 1);
  ASSERT_TRUE(turns.TryTake(kUp));
  auto held = std::make_shared<int>(0);
  bool cancelled_ran = false;
  const uint64_t ticket = turns.Wait(kUp | kDown, [&cancelled_ran, held] { cancelled_ran = true; });
  bool down = false;
  turns.Wait(kDown, [&down] { down = true; });
  EXPECT_FALSE(down);  // held back by the request for both
  EXPECT_EQ(held.use_count(), 2);
  EXPECT_TRUE(turns.Cancel(ticket));
  EXPECT_EQ(held.use_count(), 1);  // the callback is gone
  EXPECT_TRUE(down);               // granted by the Cancel
  EXPECT_EQ(turns.stats().waiting, 0u);
  EXPECT_FALSE(turns.Cancel(ticket));  // not twice
  bool up = false;
  const uint64_t granted = turns.Wait(kUp, [&up] { up = true; });
  turns.Give(kUp, "");
  EXPECT_TRUE(up);
  EXPECT_FALSE(turns.Cancel(granted));  // granted: its turn is given back as usual
  EXPECT_FALSE(cancelled_ran);
  EXPECT_EQ(turns.stats().held_to_device, 1u);
}

// --- fair shares: weights and device turns -----------------------------------------------

// Queue `n` waiters of each identity in `order` (round robin), the one turn of `mask` held by
// "holder"; give the turn back `grants` times and return who got it, in order.
std::string GrantOrder(CopyTurns& turns, uint8_t mask, const std::vector<std::string>& order, int n,
                       int grants) {
  EXPECT_TRUE(turns.TryTake(mask, "holder"));
  std::string got, holder = "holder";
  for (int i = 0; i < n; ++i) {
    for (const std::string& who : order) {
      turns.Wait(
          mask,
          [&got, &holder, who] {
            got += who;
            holder = who;
          },
          who);
    }
  }
  EXPECT_TRUE(got.empty()) << "the one turn is held";
  for (int i = 0; i < grants; ++i) turns.Give(mask, holder);  // each Give grants one waiter
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
  turns.Give(kUp, "holder");
  for (int i = 0; i < 7; ++i) turns.Give(kUp, std::string(1, got.back()));
  EXPECT_EQ(got, "ABABABAB");
}

TEST(CopyTurnsSharesTest, AnIdentityThatIdledBanksNoCredit) {
  CopyTurns turns(1, 1);
  // A takes many turns alone; B arrives late and must not then get a long run of turns.
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(turns.TryTake(kUp, "A"));
    turns.Give(kUp, "A");
  }
  const std::string got = GrantOrder(turns, kUp, {"A", "B"}, 4, 8);
  EXPECT_EQ(std::count(got.begin(), got.begin() + 4, 'B'), 2) << got;
}

TEST(CopyTurnsSharesTest, DeviceTurnsGateEverySubmitWithOps) {
  CopyTurns turns(/*turns=*/0, /*min_bytes=*/1, /*device_turns=*/1);
  std::vector<Op> ops;
  EXPECT_EQ(Needs(turns, ops), CopyTurns::kNone) << "no ops, nothing on the device";
  ops.push_back(FillOp{});
  EXPECT_EQ(Needs(turns, ops), CopyTurns::kDevice);
  ASSERT_TRUE(turns.TryTake(CopyTurns::kDevice, "A"));
  EXPECT_FALSE(turns.TryTake(CopyTurns::kDevice, "B"));
  EXPECT_EQ(turns.stats().held_device, 1u);
  bool b = false;
  turns.Wait(
      CopyTurns::kDevice, [&b] { b = true; }, "B");
  EXPECT_FALSE(b);
  turns.Give(CopyTurns::kDevice, "A");
  EXPECT_TRUE(b);
  // Copy turns off: copies take no copy turn, only the device turn.
  UploadOp up;
  up.data = "sixteen bytes...";
  EXPECT_EQ(Needs(turns, {Op(up)}), CopyTurns::kDevice);
}

// --- each identity's half: borrowing ------------------------------------------------------

// Queue a request of `who` for `mask` that appends `tag` to `got` when granted.
void Queue(CopyTurns& turns, uint8_t mask, const std::string& who, std::string& got,
           const std::string& tag) {
  turns.Wait(
      mask, [&got, tag] { got += tag; }, who);
}

TEST(CopyTurnsHalfTest, AnIdentityAloneTakesEveryTurn) {
  CopyTurns turns(4, 1);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(turns.TryTake(kUp, "A")) << i;
  EXPECT_FALSE(turns.TryTake(kUp, "A"));  // the limit itself still holds
  EXPECT_EQ(turns.stats().held_to_device, 4u);
  // Through Wait alike: with nobody else waiting, its requests borrow beyond its half.
  CopyTurns waited(4, 1);
  std::string got;
  for (int i = 0; i < 5; ++i) Queue(waited, kUp, "A", got, std::to_string(i));
  EXPECT_EQ(got, "0123");
  EXPECT_EQ(waited.stats().waiting, 1u);
  waited.Give(kUp, "A");
  EXPECT_EQ(got, "01234");
  // One turn: the half is that turn, and an identity alone uses it.
  CopyTurns one(1, 1);
  EXPECT_TRUE(one.TryTake(kUp, "A"));
  one.Give(kUp, "A");
  EXPECT_TRUE(one.TryTake(kUp, "A"));
}

// A and Z hold two upload turns each (of 4); A's passes and the idle B's are level, so A's
// request, queued first, ranks first.
void HoldAllFour(CopyTurns& turns) {
  ASSERT_TRUE(turns.TryTake(kUp, "A"));
  ASSERT_TRUE(turns.TryTake(kUp, "A"));
  ASSERT_TRUE(turns.TryTake(kUp, "Z"));
  ASSERT_TRUE(turns.TryTake(kUp, "Z"));
  ASSERT_EQ(turns.stats().held_to_device, 4u);
}

TEST(CopyTurnsHalfTest, AnIdentityAtItsHalfYieldsToAnotherThatWaitsWithoutHoldingItUp) {
  CopyTurns turns(4, 1);
  HoldAllFour(turns);
  std::string got;
  Queue(turns, kUp, "A", got, "a");  // first in rank, but A holds its half (2 of 4)
  Queue(turns, kUp, "B", got, "b");
  EXPECT_EQ(got, "");
  turns.Give(kUp, "Z");
  // A's request would borrow: it yields to B's, an ordinary one, and does not hold it up.
  EXPECT_EQ(got, "b");
  EXPECT_EQ(turns.stats().waiting, 1u);
  // B has left; A may borrow now that nobody else waits, as soon as a turn is free.
  turns.Give(kUp, "Z");
  EXPECT_EQ(got, "ba");
  EXPECT_EQ(turns.stats().held_to_device, 4u);  // A 3, B 1
  EXPECT_EQ(turns.stats().waiting, 0u);
}

TEST(CopyTurnsHalfTest, ABorrowingRequestGoesInTheSameGiveAsTheOneItYieldedTo) {
  CopyTurns turns(4, 1);
  turns.SetWeights({{"A", 2}});  // so that A's request ranks ahead of B's
  for (const char* who : {"Y", "Y", "Z", "Z"}) ASSERT_TRUE(turns.TryTake(kDown, who));  // all
  ASSERT_TRUE(turns.TryTake(kUp, "A"));
  ASSERT_TRUE(turns.TryTake(kUp, "A"));  // A holds its half of the upload turns
  ASSERT_TRUE(turns.TryTake(kUp, "B"));
  turns.Give(kUp, "B");
  std::string got;
  Queue(turns, kUp | kDown, "B", got, "b");  // waits for a download turn
  Queue(turns, kUp, "A", got, "a");          // ranks first, but would borrow: yields to B's
  // The cost: two upload turns stay free while B's request waits for a download.
  EXPECT_EQ(got, "");
  EXPECT_EQ(turns.stats().held_to_device, 2u);
  // A download turn comes back: B's request goes, and then A's, which had yielded to it.
  turns.Give(kDown, "Z");
  EXPECT_EQ(got, "ba");
  EXPECT_EQ(turns.stats().held_to_device, 4u);
}

TEST(CopyTurnsHalfTest, ABorrowingIdentityIsNotStarvedWhileAnotherKeepsWaiting) {
  CopyTurns turns(4, 1);
  HoldAllFour(turns);
  std::string got;
  Queue(turns, kUp, "A", got, "a");
  int b = 0;
  auto queue_b = [&] { Queue(turns, kUp, "B", got, "b" + std::to_string(b++)); };
  queue_b();
  turns.Give(kUp, "Z");  // b0 goes (A's would borrow)
  queue_b();
  turns.Give(kUp, "Z");  // b1 goes: B takes up to its half, A still at its own
  queue_b();
  EXPECT_EQ(got, "b0b1");
  turns.Give(kUp, "B");  // B's turn back: B is within its half again, A not, so b2 goes
  queue_b();
  EXPECT_EQ(got, "b0b1b2");
  // B always has a request waiting; A holds its half and takes no more of it. Once one of
  // A's own turns comes back A is within its half, and its request, passed over while
  // borrowing, ranks ahead of B's (B's pass advanced three times).
  turns.Give(kUp, "A");
  EXPECT_EQ(got, "b0b1b2a");
  EXPECT_EQ(turns.stats().waiting, 1u);  // b3
  turns.Give(kUp, "B");
  EXPECT_EQ(got, "b0b1b2ab3");
}

TEST(CopyTurnsHalfTest, ABorrowingRequestHoldsBackItsOwnIdentityOnlyAndKeepsItsOrder) {
  CopyTurns turns(4, 1);
  HoldAllFour(turns);
  std::string got;
  Queue(turns, kUp | kDown, "A", got, "a1");  // would borrow an upload turn: waits
  Queue(turns, kDown, "A", got, "a2");        // A holds no download turn, but waits behind a1
  Queue(turns, kUp, "B", got, "b1");
  Queue(turns, kDown, "B", got, "b2");
  // Both download turns are free: B's download is not held up by A's borrowing request, and
  // A's later download waits behind its own earlier one.
  EXPECT_EQ(got, "b2");
  turns.Give(kUp, "Z");  // B's upload; then nobody else waits, and a1 and a2 go in order
  EXPECT_EQ(got, "b2b1");
  turns.Give(kUp, "Z");
  EXPECT_EQ(got, "b2b1a1a2");
}

TEST(CopyTurnsHalfTest, TurnsBorrowedByOneIdentityDoNotHoldUpAnother) {
  // The case the half is for: A, alone, takes every upload turn, each held behind a long
  // kernel of its own. B, coming later, still gets its half at once.
  CopyTurns turns(4, 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(turns.TryTake(kUp, "A"));
  EXPECT_TRUE(turns.TryTake(kUp, "B"));
  EXPECT_TRUE(turns.TryTake(kUp, "B"));
  EXPECT_FALSE(turns.TryTake(kUp, "B"));        // at its half, and nothing is free
  EXPECT_FALSE(turns.TryTake(kUp, "C"));        // the turns within halves fill the limit
  EXPECT_EQ(turns.stats().held_to_device, 6u);  // L + (L - half) at most
  std::string got;
  Queue(turns, kUp, "C", got, "c");
  turns.Give(kUp, "A");  // A's borrowed turns come back first: they free nothing for C
  turns.Give(kUp, "A");
  EXPECT_EQ(got, "");
  turns.Give(kUp, "A");  // one of A's half
  EXPECT_EQ(got, "c");
  EXPECT_EQ(turns.stats().held_to_device, 4u);
}

TEST(CopyTurnsHalfTest, TwoIdentitiesThatWouldBorrowDoNotWaitForEachOther) {
  // Regression: A's request was capped on the upload turns because B's waited for one, B's on
  // the download turns because A's waited for one, and both waited with a turn of each
  // direction free, until a turn of A's or B's own (behind a long kernel) came back.
  CopyTurns turns(2, 1);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(turns.TryTake(kUp, "A"));    // alone: borrows one
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(turns.TryTake(kDown, "B"));  // the same
  std::string got;
  Queue(turns, kUp | kDown, "A", got, "a");
  Queue(turns, kUp | kDown, "B", got, "b");
  EXPECT_EQ(got, "");
  turns.Give(kUp, "A");  // A holds its half of the upload turns, B of the download turns
  turns.Give(kDown, "B");
  // Neither request is ordinary, so neither yields to the other: the first ranked goes (the
  // download turn B borrowed does not stand in its way).
  EXPECT_EQ(got, "a");
  EXPECT_EQ(turns.stats().waiting, 1u);
}

TEST(CopyTurnsHalfTest, ABorrowingRequestDoesNotHoldUpAnotherIdentityInItsOtherDirection) {
  // Regression: A's request, which would borrow a fifth upload turn, blocked the download
  // turns too for B's request ranked after it, so B's download waited for A's uploads (each
  // behind a long kernel of A's) with no download turn held.
  CopyTurns turns(4, 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(turns.TryTake(kUp, "A"));  // alone: all four
  ASSERT_TRUE(turns.TryTake(kDown, "B"));  // B's pass level with A's: a ranks first
  turns.Give(kDown, "B");
  std::string got;
  Queue(turns, kUp | kDown, "A", got, "a");
  EXPECT_FALSE(turns.TryTake(kDown, "B"));  // TryTake passes no waiter; B waits
  Queue(turns, kDown, "B", got, "b");
  EXPECT_EQ(got, "b");
  turns.Give(kUp, "A");
  EXPECT_EQ(got, "ba");
}

TEST(CopyTurnsHalfTest, AGiveNamingAnIdentityThatHoldsNoneStillGivesTheTurnBack) {
  // A caller's bug, but the turn must not be lost: it is taken from the identity holding most.
  CopyTurns turns(2, 1);
  ASSERT_TRUE(turns.TryTake(kUp, "A"));
  ASSERT_TRUE(turns.TryTake(kUp, "A"));
  turns.Give(kUp, "B");
  EXPECT_EQ(turns.stats().held_to_device, 1u);
  EXPECT_TRUE(turns.TryTake(kUp, "B"));
  turns.Give(kUp | kDown, "B");  // a direction nobody holds is left alone
  EXPECT_EQ(turns.stats().held_to_device, 1u);
  EXPECT_EQ(turns.stats().held_to_host, 0u);
}

TEST(CopyTurnsHalfTest, RequestsOfNoIdentityNeverBorrow) {
  CopyTurns turns(4, 1);
  turns.SetWeights({{"", 1000}});  // so that the request of no identity ranks first
  ASSERT_TRUE(turns.TryTake(kUp, "B"));
  ASSERT_TRUE(turns.TryTake(kUp));
  ASSERT_TRUE(turns.TryTake(kUp));
  ASSERT_TRUE(turns.TryTake(kUp, "Z"));
  std::string got;
  Queue(turns, kUp, "", got, "n");  // holds 2 of 4, and B waits: a named one would yield
  Queue(turns, kUp, "B", got, "b");
  turns.Give(kUp, "Z");
  EXPECT_EQ(got, "n");
}

TEST(CopyTurnsHalfTest, DeviceTurnsHaveTheSameHalves) {
  constexpr uint8_t kDev = CopyTurns::kDevice;
  CopyTurns turns(/*turns=*/0, /*min_bytes=*/1, /*device_turns=*/4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(turns.TryTake(kDev, "A"));  // alone: every turn
  EXPECT_TRUE(turns.TryTake(kDev, "B"));  // A's borrowed turns do not hold B up
  std::string got;
  Queue(turns, kDev, "A", got, "a");  // would borrow a fifth; then yields to B's request
  Queue(turns, kDev, "B", got, "b");
  EXPECT_EQ(got, "b");  // B within its half, the turns within halves 3 of 4
  turns.Give(kDev, "A");
  turns.Give(kDev, "A");
  EXPECT_EQ(got, "b");    // nothing of the limit is free (A 2, B 2)
  turns.Give(kDev, "B");  // nobody else waits: A borrows again
  EXPECT_EQ(got, "ba");
  EXPECT_EQ(turns.stats().held_device, 4u);
  // With one device turn the half is that turn, and the passes alone decide.
  CopyTurns one(0, 1, 1);
  ASSERT_TRUE(one.TryTake(kDev, "A"));
  got.clear();
  Queue(one, kDev, "A", got, "a");
  Queue(one, kDev, "B", got, "b");
  one.Give(kDev, "A");
  EXPECT_EQ(got, "b");  // B's pass is behind A's
  one.Give(kDev, "B");
  EXPECT_EQ(got, "ba");
}

// --- properties under random use --------------------------------------------------------

constexpr uint8_t kDirs[] = {CopyTurns::kToDevice, CopyTurns::kToHost, CopyTurns::kDevice};

int IndexOf(uint8_t d) { return d == kUp ? 0 : d == kDown ? 1 : 2; }
// An identity's half of `limit` (> 0) turns.
uint32_t HalfOf(uint32_t limit) { return (limit + 1) / 2; }

// The turns as they were before halves: one queue in arrival order, a request that cannot go
// blocks its directions for every request behind it. With one identity CopyTurns must grant
// exactly as this does.
class FifoTurns {
 public:
  FifoTurns(uint32_t turns, uint32_t device_turns) : limit_{turns, turns, device_turns} {}
  bool TryTake(uint8_t mask) {
    for (const auto& [id, m] : waiters_) {
      if (m & mask) return false;
    }
    if (!Free(mask)) return false;
    Take(mask);
    return true;
  }
  // The ids granted, in order.
  std::vector<int> Wait(int id, uint8_t mask) {
    waiters_.emplace_back(id, mask);
    return Grant();
  }
  std::vector<int> Give(uint8_t mask) {
    for (uint8_t d : kDirs) {
      if ((mask & d) && held_[IndexOf(d)] > 0) --held_[IndexOf(d)];
    }
    return Grant();
  }
  // `id` waits no more.
  std::vector<int> Cancel(int id) {
    waiters_.erase(std::find_if(waiters_.begin(), waiters_.end(),
                                [id](const auto& w) { return w.first == id; }));
    return Grant();
  }

 private:
  bool Free(uint8_t mask) const {
    for (uint8_t d : kDirs) {
      const uint32_t l = limit_[IndexOf(d)];
      if ((mask & d) && l > 0 && held_[IndexOf(d)] >= l) return false;
    }
    return true;
  }
  void Take(uint8_t mask) {
    for (uint8_t d : kDirs) {
      if (mask & d) ++held_[IndexOf(d)];
    }
  }
  std::vector<int> Grant() {
    std::vector<int> granted;
    uint8_t blocked = CopyTurns::kNone;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((it->second & blocked) == 0 && Free(it->second)) {
        Take(it->second);
        granted.push_back(it->first);
        it = waiters_.erase(it);
      } else {
        blocked |= it->second;
        ++it;
      }
    }
    return granted;
  }

  const uint32_t limit_[3];
  uint32_t held_[3] = {0, 0, 0};
  std::deque<std::pair<int, uint8_t>> waiters_;
};

// Random TryTake, Wait and Give by a few identities (and Cancel, with WithCancels), with the
// invariants a user relies on checked after every step. What holds is counted by the identity
// that took it (Give names it, as sessions do).
class RandomUse {
 public:
  RandomUse(uint32_t turns, uint32_t device_turns, std::vector<std::string> ids, uint32_t seed,
            std::map<std::string, uint32_t> weights = {})
      : turns_(turns, 1, device_turns),
        fifo_(turns, device_turns),
        limit_{turns, turns, device_turns},
        ids_(std::move(ids)),
        rng_(seed) {
    turns_.SetWeights(std::move(weights));
    // Masks as submits need them: the copy directions only with copy turns on, the device
    // one only with device turns on; now and then a direction without a limit too.
    for (uint8_t d : kDirs) {
      if (limit_[IndexOf(d)] > 0) dirs_ |= d;
    }
  }

  // Make a tenth of the steps Cancel a request (at random: mostly a waiting one, now and then
  // one granted already); without, the steps draw the same numbers as before there was Cancel.
  RandomUse& WithCancels(bool on = true) {
    cancels_ = on;
    return *this;
  }

  void Run(int steps) {
    for (int step = 0; step < steps && !::testing::Test::HasFailure(); ++step) {
      const uint32_t r = Pick(100);
      if (r < 30) {
        TryTake();
      } else if (r < 60 || held_.empty()) {
        Wait();
      } else if (cancels_ && r < 70) {
        Cancel();
      } else {
        Give(Pick(static_cast<uint32_t>(held_.size())), Pick(4) == 0);
      }
      Check();
    }
    // Every turn back, in random order: then every request not cancelled has been granted.
    while (!held_.empty() && !::testing::Test::HasFailure()) {
      Give(Pick(static_cast<uint32_t>(held_.size())), false);
      Check();
    }
    EXPECT_TRUE(waiting_.empty()) << Trace();
    EXPECT_EQ(granted_ + cancelled_.size(), waits_) << Trace();
  }

 private:
  struct Waiter {
    std::string who;
    uint8_t mask;
  };
  struct Held {
    std::string who;
    uint8_t mask;  // not given back yet
  };

  uint32_t Pick(uint32_t n) { return std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_); }
  const std::string& Who() { return ids_[Pick(static_cast<uint32_t>(ids_.size()))]; }
  uint8_t Mask() {
    uint8_t from = dirs_;
    if (from == CopyTurns::kNone || Pick(10) == 0) from = kUp | kDown | CopyTurns::kDevice;
    uint8_t mask = CopyTurns::kNone;
    while (mask == CopyTurns::kNone) mask = static_cast<uint8_t>(Pick(8)) & from;
    return mask;
  }
  bool OneIdentity() const { return ids_.size() == 1; }

  void TryTake() {
    const std::string who = Who();
    const uint8_t mask = Mask();
    const bool took = turns_.TryTake(mask, who);
    Log("TryTake(" + Dirs(mask) + ", " + who + ") = " + (took ? "true" : "false"));
    if (OneIdentity()) EXPECT_EQ(took, fifo_.TryTake(mask)) << "as before halves" << Trace();
    if (!took) return;
    for (const auto& [id, w] : waiting_) {
      EXPECT_EQ(w.mask & mask, 0) << "TryTake passed waiting request " << id << Trace();
    }
    Taken(who, mask);
  }

  void Wait() {
    const int id = next_id_++;
    const std::string who = Who();
    const uint8_t mask = Mask();
    waiting_.emplace(id, Waiter{who, mask});
    ++waits_;
    Log("Wait(" + Dirs(mask) + ", " + who + ") #" + std::to_string(id));
    const uint64_t ticket = turns_.Wait(
        mask, [this, id] { fired_.push_back(id); }, who);
    tickets_[id] = ticket;
    std::vector<int> expected;
    if (OneIdentity()) expected = fifo_.Wait(id, mask);
    Settle(expected);
  }

  // Withdraw a waiting request: it is never granted (Settle checks, whenever callbacks run),
  // and what it held back may go. Or try to withdraw one granted already: nothing changes.
  void Cancel() {
    if (waiting_.empty() || Pick(5) == 0) {
      if (tickets_.empty()) return;
      auto it = tickets_.begin();
      std::advance(it, Pick(static_cast<uint32_t>(tickets_.size())));
      const auto [id, ticket] = *it;
      if (waiting_.count(id) > 0) return;  // it waits (the other branch's case)
      Log("Cancel #" + std::to_string(id) + ", granted or cancelled before");
      EXPECT_FALSE(turns_.Cancel(ticket)) << "request " << id << Trace();
      Settle({});
      return;
    }
    auto it = waiting_.begin();
    std::advance(it, Pick(static_cast<uint32_t>(waiting_.size())));
    const int id = it->first;
    waiting_.erase(it);
    cancelled_.insert(id);
    Log("Cancel #" + std::to_string(id));
    EXPECT_TRUE(turns_.Cancel(tickets_.at(id))) << "request " << id << " waited" << Trace();
    std::vector<int> expected;
    if (OneIdentity()) expected = fifo_.Cancel(id);
    Settle(expected);
  }

  void Give(size_t k, bool part) {
    Held& h = held_[k];
    uint8_t mask = h.mask;
    if (part) {
      mask = CopyTurns::kNone;
      while (mask == CopyTurns::kNone) mask = static_cast<uint8_t>(Pick(8)) & h.mask;
    }
    const std::string who = h.who;
    h.mask &= ~mask;
    if (h.mask == CopyTurns::kNone) held_.erase(held_.begin() + static_cast<ptrdiff_t>(k));
    for (uint8_t d : kDirs) {
      if (mask & d) --holds_[who][IndexOf(d)];
    }
    Log("Give(" + Dirs(mask) + ", " + who + ")");
    turns_.Give(mask, who);
    std::vector<int> expected;
    if (OneIdentity()) expected = fifo_.Give(mask);
    Settle(expected);
  }

  // The callbacks of the last call ran (in grant order): check each grant.
  void Settle(const std::vector<int>& expected) {
    std::vector<int> fired = std::move(fired_);
    fired_.clear();
    if (OneIdentity()) EXPECT_EQ(fired, expected) << "granted as before halves" << Trace();
    for (int id : fired) {
      if (cancelled_.count(id) > 0) {
        ADD_FAILURE() << "request " << id << " granted after it was cancelled" << Trace();
        continue;
      }
      auto it = waiting_.find(id);
      if (it == waiting_.end()) {
        ADD_FAILURE() << "request " << id << " granted twice" << Trace();
        continue;
      }
      const Waiter w = it->second;
      waiting_.erase(it);
      ++granted_;
      Log("  granted #" + std::to_string(id));
      // Within an identity, arrival order among requests that share a direction.
      for (const auto& [other, o] : waiting_) {
        if (other > id) break;
        EXPECT_FALSE(o.who == w.who && (o.mask & w.mask))
            << "request " << id << " of '" << w.who << "' went before its earlier " << other
            << Trace();
      }
      Taken(w.who, w.mask);
    }
  }

  // `mask` was taken for `who`, the requests in waiting_ still waiting.
  void Taken(const std::string& who, uint8_t mask) {
    held_.push_back(Held{who, mask});
    for (uint8_t d : kDirs) {
      if ((mask & d) == 0) continue;
      const int i = IndexOf(d);
      const uint32_t mine = ++holds_[who][i];
      // Beyond its half only while no ordinary request of another identity waits for it.
      if (who.empty() || limit_[i] == 0 || mine <= HalfOf(limit_[i])) continue;
      const std::map<int, bool> borrows = Borrowing();
      for (const auto& [id, w] : waiting_) {
        EXPECT_FALSE(w.who != who && (w.mask & d) && !borrows.at(id))
            << "'" << who << "' granted " << mine << " of " << Dirs(d) << " (half "
            << HalfOf(limit_[i]) << ") while request " << id << " of '" << w.who << "' waits"
            << Trace();
      }
    }
  }

  void Check() {
    const CopyTurns::Stats s = turns_.stats();
    uint32_t held[3] = {0, 0, 0};
    for (const Held& h : held_) {
      for (uint8_t d : kDirs) {
        if (h.mask & d) ++held[IndexOf(d)];
      }
    }
    EXPECT_EQ(s.held_to_device, held[0]) << Trace();
    EXPECT_EQ(s.held_to_host, held[1]) << Trace();
    EXPECT_EQ(s.held_device, held[2]) << Trace();
    EXPECT_EQ(s.waiting, waiting_.size()) << Trace();
    EXPECT_EQ(s.waits, waits_) << Trace();
    const std::map<int, bool> borrows = Borrowing();
    bool any_held = false;
    for (uint8_t d : kDirs) {
      const int i = IndexOf(d);
      const uint32_t l = limit_[i];
      any_held = any_held || held[i] > 0;
      if (l > 0) {
        // The limit, and while borrowed turns come back at most the other half more.
        EXPECT_LE(held[i], OneIdentity() ? l : l + (l - HalfOf(l))) << Dirs(d) << Trace();
      }
      // Turns within halves: the limit bounds them.
      uint32_t within = 0;
      for (const auto& [who, n] : holds_) {
        within += l > 0 && !who.empty() ? std::min(n[i], HalfOf(l)) : n[i];
      }
      if (l > 0) EXPECT_LE(within, l) << Dirs(d) << Trace();
      // Progress: a request for `d` alone that has room waits only behind a request for `d`
      // and another direction, of its own identity or an ordinary one; room: within halves,
      // or, where its identity holds its half, below the limit and no ordinary request of
      // another identity waiting for `d`. Another identity's borrowing never holds it up.
      for (const auto& [id, w] : waiting_) {
        if (w.mask != d) continue;
        bool behind_wider = false;
        for (const auto& [o, ow] : waiting_) {
          behind_wider = behind_wider ||
                         ((ow.mask & d) && ow.mask != d && (ow.who == w.who || !borrows.at(o)));
        }
        if (behind_wider) continue;
        const auto mine = holds_.find(w.who);
        const bool at_half =
            l > 0 && !w.who.empty() && mine != holds_.end() && mine->second[i] >= HalfOf(l);
        if (!at_half) {
          EXPECT_FALSE(l == 0 || within < l)
              << "request " << id << " of '" << w.who << "' waits with " << Dirs(d)
              << " turns free (within halves " << within << " of " << l << ")" << Trace();
          continue;
        }
        bool contested = false;
        for (const auto& [o, ow] : waiting_) {
          contested = contested || (ow.who != w.who && (ow.mask & d) && !borrows.at(o));
        }
        EXPECT_FALSE(!contested && held[i] < l)
            << "request " << id << " of '" << w.who << "' waits, uncontested, with " << held[i]
            << " of " << l << " " << Dirs(d) << " turns held" << Trace();
      }
    }
    // Nothing held: nothing waits.
    if (!any_held) EXPECT_TRUE(waiting_.empty()) << Trace();
    // Requests do not wait for each other alone: when every waiting request would find room
    // in each direction it wants (within its identity's half, or held below the limit to
    // borrow), none is left waiting.
    bool all_room = true;
    for (const auto& [id, w] : waiting_) all_room = all_room && Room(w, held);
    if (all_room) EXPECT_TRUE(waiting_.empty()) << "every waiting request has room" << Trace();
  }

  // Which waiting requests borrow (by id), in the contract's words: those whose identity holds
  // its half of a direction they want, and those behind a borrowing request of their identity
  // that wants one of their directions.
  std::map<int, bool> Borrowing() const {
    std::map<int, bool> out;
    std::map<std::string, uint8_t> theirs;
    for (const auto& [id, w] : waiting_) {
      uint8_t& t = theirs[w.who];
      bool b = (w.mask & t) != 0;
      const auto mine = holds_.find(w.who);
      for (uint8_t d : kDirs) {
        const uint32_t l = limit_[IndexOf(d)];
        b = b || (!w.who.empty() && (w.mask & d) && l > 0 && mine != holds_.end() &&
                  mine->second[IndexOf(d)] >= HalfOf(l));
      }
      if (b) t |= w.mask;
      out[id] = b;
    }
    return out;
  }

  bool Room(const Waiter& w, const uint32_t held[3]) const {
    for (uint8_t d : kDirs) {
      const int i = IndexOf(d);
      const uint32_t l = limit_[i];
      if ((w.mask & d) == 0 || l == 0) continue;
      const auto mine = holds_.find(w.who);
      if (!w.who.empty() && mine != holds_.end() && mine->second[i] >= HalfOf(l)) {
        if (held[i] >= l) return false;
        continue;
      }
      uint32_t within = 0;
      for (const auto& [who, n] : holds_) within += !who.empty() ? std::min(n[i], HalfOf(l)) : n[i];
      if (within >= l) return false;
    }
    return true;
  }

  static std::string Dirs(uint8_t mask) {
    std::string s;
    if (mask & kUp) s += "up|";
    if (mask & kDown) s += "down|";
    if (mask & CopyTurns::kDevice) s += "dev|";
    if (!s.empty()) s.pop_back();
    return s;
  }
  void Log(std::string line) {
    log_.push_back(std::move(line));
    if (log_.size() > 40) log_.pop_front();
  }
  std::string Trace() const {
    std::string t = "\nlimits " + std::to_string(limit_[0]) + "/" + std::to_string(limit_[2]) +
                    "; the last calls:";
    for (const std::string& l : log_) t += "\n  " + l;
    t += "\nheld (up, down, dev):";
    for (const auto& [who, n] : holds_) {
      t += " '" + who + "' " + std::to_string(n[0]) + "," + std::to_string(n[1]) + "," +
           std::to_string(n[2]) + ";";
    }
    t += "\nwaiting:";
    for (const auto& [id, w] : waiting_)
      t += " #" + std::to_string(id) + " " + Dirs(w.mask) + " '" + w.who + "';";
    return t;
  }

  CopyTurns turns_;
  FifoTurns fifo_;
  const uint32_t limit_[3];
  const std::vector<std::string> ids_;
  std::mt19937 rng_;
  uint8_t dirs_ = CopyTurns::kNone;
  int next_id_ = 0;
  uint64_t waits_ = 0, granted_ = 0;
  std::map<int, Waiter> waiting_;    // by id: arrival order
  std::map<int, uint64_t> tickets_;  // of every request, by id
  std::set<int> cancelled_;
  bool cancels_ = false;
  std::vector<int> fired_;
  std::vector<Held> held_;
  std::map<std::string, std::array<uint32_t, 3>> holds_;  // by the identity that took them
  std::deque<std::string> log_;
};

// One identity (or none): the same grants as before there were halves.
void RunOneIdentity(bool cancels) {
  for (uint32_t seed = 1; seed <= 40 && !::testing::Test::HasFailure(); ++seed) {
    const uint32_t turns = seed % 5, device_turns = (seed / 5) % 4;
    SCOPED_TRACE("seed " + std::to_string(seed));
    RandomUse(turns, device_turns, {seed % 2 ? "uid:1000" : ""}, seed)
        .WithCancels(cancels)
        .Run(3000);
  }
}

// Two to four identities (one may be none), some weighted: halves and the bound hold.
void RunSeveralIdentities(bool cancels) {
  const std::vector<std::vector<std::string>> groups = {
      {"A", "B"}, {"A", "B", "C"}, {"A", "B", ""}, {"A", "B", "C", ""}};
  for (uint32_t seed = 1; seed <= 120 && !::testing::Test::HasFailure(); ++seed) {
    const uint32_t turns = seed % 6, device_turns = (seed / 6) % 4;
    std::map<std::string, uint32_t> weights;
    if (seed % 3 == 0) weights = {{"A", 3}, {"C", 2}};
    SCOPED_TRACE("seed " + std::to_string(seed));
    RandomUse(turns, device_turns, groups[seed % groups.size()], seed, weights)
        .WithCancels(cancels)
        .Run(3000);
  }
}

TEST(CopyTurnsPropertyTest, OneIdentityGrantsExactlyAsBeforeHalves) {
  RunOneIdentity(/*cancels=*/false);
}

TEST(CopyTurnsPropertyTest, SeveralIdentitiesKeepTheirHalvesAndTheBound) {
  RunSeveralIdentities(/*cancels=*/false);
}

TEST(CopyTurnsPropertyTest, OneIdentityGrantsExactlyAsBeforeHalvesWithCancels) {
  RunOneIdentity(/*cancels=*/true);
}

TEST(CopyTurnsPropertyTest, SeveralIdentitiesKeepTheirHalvesAndTheBoundWithCancels) {
  RunSeveralIdentities(/*cancels=*/true);
}

// --- the same grants as when everything is derived anew ----------------------------------

// CopyTurns as it was before it kept what is held and waiting in counts: every grant ranks
// the requests, sums what each identity holds within its half and decides which requests
// borrow afresh, straight from the contract. CopyTurns must grant exactly as this does.
class RederivingTurns {
 public:
  RederivingTurns(uint32_t turns, uint32_t device_turns, std::map<std::string, uint32_t> weights)
      : limit_{turns, turns, device_turns}, weights_(std::move(weights)) {}

  bool TryTake(uint8_t mask, const std::string& who) {
    for (const Waiter& w : waiters_) {
      if (w.mask & mask) return false;
    }
    if (!Fits(mask, who, CopyTurns::kNone)) return false;
    Take(mask, who);
    return true;
  }
  // The ids granted, in order.
  std::vector<int> Wait(int id, uint8_t mask, const std::string& who) {
    waiters_.push_back(Waiter{id, mask, who});
    return Grant();
  }
  // Whether `id` waited; the ids granted then.
  std::pair<bool, std::vector<int>> Cancel(int id) {
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [id](const Waiter& w) { return w.id == id; });
    if (it == waiters_.end()) return {false, {}};
    waiters_.erase(it);
    return {true, Grant()};
  }
  std::vector<int> Give(uint8_t mask, const std::string& who) {
    for (uint8_t d : kDirs) {
      const int i = IndexOf(d);
      if ((mask & d) == 0) continue;
      auto holder = held_by_.find(who);
      if (holder == held_by_.end() || holder->second[i] == 0) {  // the one holding the most
        holder = std::max_element(
            held_by_.begin(), held_by_.end(),
            [i](const auto& a, const auto& b) { return a.second[i] < b.second[i]; });
      }
      if (holder != held_by_.end() && holder->second[i] > 0) --holder->second[i];
    }
    return Grant();
  }
  uint32_t Held(int i) const {
    uint32_t n = 0;
    for (const auto& [who, held] : held_by_) n += held[i];
    return n;
  }
  size_t waiting() const { return waiters_.size(); }

 private:
  struct Waiter {
    int id;
    uint8_t mask;
    std::string who;
  };

  uint32_t HeldWithinHalves(int i) const {
    uint32_t n = 0;
    for (const auto& [who, held] : held_by_) {
      n += who.empty() ? held[i] : std::min(held[i], HalfOf(limit_[i]));
    }
    return n;
  }
  uint8_t AtHalf(uint8_t mask, const std::string& who) const {
    auto mine = held_by_.find(who);
    uint8_t at_half = CopyTurns::kNone;
    for (uint8_t d : kDirs) {
      const uint32_t l = limit_[IndexOf(d)];
      if (!who.empty() && (mask & d) && l > 0 && mine != held_by_.end() &&
          mine->second[IndexOf(d)] >= HalfOf(l)) {
        at_half |= d;
      }
    }
    return at_half;
  }
  bool Fits(uint8_t mask, const std::string& who, uint8_t others) const {
    const uint8_t borrow = AtHalf(mask, who);
    for (uint8_t d : kDirs) {
      const int i = IndexOf(d);
      if ((mask & d) == 0 || limit_[i] == 0) continue;
      if ((borrow & d) ? (others & d) || Held(i) >= limit_[i] : HeldWithinHalves(i) >= limit_[i]) {
        return false;
      }
    }
    return true;
  }
  uint32_t Weight(const std::string& who) const {
    auto it = weights_.find(who);
    return it == weights_.end() || it->second == 0 ? 1 : it->second;
  }
  uint64_t Pass(const std::string& who) const {
    auto it = pass_.find(who);
    return it == pass_.end() ? vtime_ : std::max(it->second, vtime_);
  }
  void Take(uint8_t mask, const std::string& who) {
    for (uint8_t d : kDirs) {
      if (mask & d) ++held_by_[who][IndexOf(d)];
    }
    const uint64_t start = Pass(who);
    pass_[who] = start + CopyTurns::kStride / Weight(who);
    vtime_ = start;
  }

  std::vector<int> Grant() {
    // Rank: an identity's k-th waiting request at its pass plus k strides, ties in arrival
    // order.
    std::vector<std::pair<uint64_t, size_t>> ranked;  // (start, arrival)
    std::map<std::string, uint64_t> projected;
    for (size_t i = 0; i < waiters_.size(); ++i) {
      const std::string& who = waiters_[i].who;
      auto [it, fresh] = projected.emplace(who, Pass(who));
      ranked.emplace_back(it->second, i);
      it->second += CopyTurns::kStride / Weight(who);
    }
    std::sort(ranked.begin(), ranked.end());
    std::vector<bool> taken(waiters_.size(), false);
    std::vector<int> granted;
    for (;;) {  // one at a time: each grant changes what the next is judged by
      const size_t i = Next(ranked, taken);
      if (i == waiters_.size()) break;
      Take(waiters_[i].mask, waiters_[i].who);
      granted.push_back(waiters_[i].id);
      taken[i] = true;
    }
    std::deque<Waiter> rest;
    for (size_t i = 0; i < waiters_.size(); ++i) {
      if (!taken[i]) rest.push_back(waiters_[i]);
    }
    waiters_.swap(rest);
    return granted;
  }

  // The waiter (not taken) ranked first that may go now; waiters_.size() if none.
  size_t Next(const std::vector<std::pair<uint64_t, size_t>>& ranked,
              const std::vector<bool>& taken) const {
    // Which requests borrow, and the ordinary ones waiting for each direction, by identity.
    std::vector<bool> borrows(waiters_.size(), false);
    std::map<std::string, uint8_t> borrowing;
    std::map<std::string, std::array<uint32_t, 3>> ordinary;
    std::array<uint32_t, 3> all_ordinary{};
    for (size_t i = 0; i < waiters_.size(); ++i) {
      if (taken[i]) continue;
      const Waiter& w = waiters_[i];
      uint8_t& theirs = borrowing[w.who];
      borrows[i] = (w.mask & theirs) != 0 || AtHalf(w.mask, w.who) != CopyTurns::kNone;
      if (borrows[i]) {
        theirs |= w.mask;
        continue;
      }
      for (uint8_t d : kDirs) {
        if ((w.mask & d) == 0) continue;
        ++ordinary[w.who][IndexOf(d)];
        ++all_ordinary[IndexOf(d)];
      }
    }
    uint8_t blocked = CopyTurns::kNone;
    std::map<std::string, uint8_t> held_back;
    for (const auto& [start, i] : ranked) {
      if (taken[i]) continue;
      const Waiter& w = waiters_[i];
      uint8_t others = CopyTurns::kNone;
      for (uint8_t d : kDirs) {
        if (all_ordinary[IndexOf(d)] > ordinary[w.who][IndexOf(d)]) others |= d;
      }
      uint8_t& back = held_back[w.who];
      if ((w.mask & (blocked | back)) == 0 && Fits(w.mask, w.who, others)) return i;
      (borrows[i] ? back : blocked) |= w.mask;
    }
    return waiters_.size();
  }

  const uint32_t limit_[3];
  const std::map<std::string, uint32_t> weights_;
  std::map<std::string, std::array<uint32_t, 3>> held_by_;
  std::map<std::string, uint64_t> pass_;
  uint64_t vtime_ = 0;
  std::deque<Waiter> waiters_;  // arrival order
};

// Random TryTake, Wait, Cancel and Give (now and then naming the wrong identity) by several
// identities with weights, masks of every kind: after each call, the same answer, the same
// grants in the same order and the same turns held as RederivingTurns.
TEST(CopyTurnsPropertyTest, GrantsExactlyAsWhenEverythingIsDerivedAnew) {
  const std::vector<std::string> names = {"", "A", "B", "C", "uid:1000"};
  for (uint32_t seed = 1; seed <= 200 && !HasFailure(); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto pick = [&rng](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
    const uint32_t limit = static_cast<uint32_t>(pick(6)),
                   device_limit = static_cast<uint32_t>(pick(4));
    std::vector<std::string> ids;
    for (size_t n = 1 + pick(4); ids.size() < n;) ids.push_back(names[pick(names.size())]);
    std::map<std::string, uint32_t> weights;
    if (pick(2)) weights = {{"A", 1 + static_cast<uint32_t>(pick(4))}, {"C", 1000}};
    CopyTurns turns(limit, 1, device_limit);
    turns.SetWeights(weights);
    RederivingTurns expect(limit, device_limit, weights);
    constexpr uint8_t kAll = kUp | kDown | CopyTurns::kDevice;
    const uint8_t limited =
        (limit > 0 ? kUp | kDown : 0) | (device_limit > 0 ? CopyTurns::kDevice : 0);
    auto mask = [&]() {
      const uint8_t from = limited != 0 && pick(4) ? limited : kAll;
      uint8_t m = 0;
      while (m == 0) m = static_cast<uint8_t>(pick(8)) & from;
      return m;
    };
    std::vector<int> fired;
    std::vector<std::pair<std::string, uint8_t>> held;  // as taken
    std::map<int, std::pair<std::string, uint8_t>> waiting;
    std::vector<uint64_t> tickets;  // by id
    auto same = [&](const std::vector<int>& granted, const std::string& call) {
      EXPECT_EQ(fired, granted) << call;
      for (int id : fired) {
        if (waiting.count(id) == 0) continue;  // (failed above)
        held.push_back(waiting.at(id));
        waiting.erase(id);
      }
      fired.clear();
      const CopyTurns::Stats s = turns.stats();
      EXPECT_EQ(s.waiting, expect.waiting()) << call;
      EXPECT_EQ(s.held_to_device, expect.Held(0)) << call;
      EXPECT_EQ(s.held_to_host, expect.Held(1)) << call;
      EXPECT_EQ(s.held_device, expect.Held(2)) << call;
    };
    auto give = [&](const std::string& step) {
      const size_t k = pick(held.size());
      auto [who, m] = held[k];
      uint8_t back = m;
      if (pick(4) == 0) {
        back = 0;
        while (back == 0) back = static_cast<uint8_t>(pick(8)) & m;
      }
      if (m & ~back) {
        held[k].second = m & ~back;
      } else {
        held.erase(held.begin() + static_cast<ptrdiff_t>(k));
      }
      if (pick(30) == 0) who = ids[pick(ids.size())];
      turns.Give(back, who);
      same(expect.Give(back, who), step + "Give " + std::to_string(back) + " '" + who + "'");
    };
    for (int step = 0; step < 2000 && !HasFailure(); ++step) {
      const std::string at = "step " + std::to_string(step) + ": ";
      const size_t r = pick(100);
      const std::string who = ids[pick(ids.size())];
      if (r < 20) {
        const uint8_t m = mask();
        const bool took = turns.TryTake(m, who);
        EXPECT_EQ(took, expect.TryTake(m, who)) << at << "TryTake";
        if (took) held.emplace_back(who, m);
        same({}, at + "TryTake");
      } else if (r < 55 || held.empty()) {
        const int id = static_cast<int>(tickets.size());
        const uint8_t m = mask();
        waiting[id] = {who, m};
        tickets.push_back(turns.Wait(
            m, [&fired, id] { fired.push_back(id); }, who));
        same(expect.Wait(id, m, who), at + "Wait #" + std::to_string(id));
      } else if (r < 65 && !tickets.empty()) {
        // Mostly a waiting request; else any, most likely one granted already.
        int id = static_cast<int>(pick(tickets.size()));
        if (!waiting.empty() && pick(5) > 0)
          id = std::next(waiting.begin(), pick(waiting.size()))->first;
        const bool waited = turns.Cancel(tickets[id]);
        auto [expect_waited, granted] = expect.Cancel(id);
        EXPECT_EQ(waited, expect_waited) << at << "Cancel #" << id;
        waiting.erase(id);
        same(granted, at + "Cancel #" + std::to_string(id));
      } else {
        give(at);
      }
    }
    while (!held.empty() && !HasFailure()) give("the end: ");
    EXPECT_TRUE(waiting.empty());
  }
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
