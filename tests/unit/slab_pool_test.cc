#include "pool/slab_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "pool/session_slabs.h"
#include "session/admission.h"

namespace ferry::pool {
namespace {

constexpr uint64_t kSlab = 1ull << 20;

// A pool of `budget_slabs` slabs; where `registered` is given, it counts the slabs registered
// with the host (made on several threads) and not yet unregistered.
std::unique_ptr<SlabPool> MakePool(uint64_t budget_slabs, uint32_t initial,
                                   std::atomic<int>* registered = nullptr) {
  HostRegistration reg;
  reg.register_memory = [registered](void*, uint64_t) {
    if (registered) ++*registered;
    return Status::Ok();
  };
  reg.unregister_memory = [registered](void*) {
    if (registered) --*registered;
  };
  auto pool = SlabPool::Create({kSlab, budget_slabs * kSlab, initial}, reg);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return std::move(*pool);
}

bool AllZero(const char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i]) return false;
  }
  return true;
}

TEST(SlabPoolTest, SealsHoldAgainstShrinkAndGrow) {
  std::atomic<int> registered{0};
  auto pool = MakePool(2, 1, &registered);
  EXPECT_EQ(registered.load(), 1);
  auto slab = pool->Acquire(1000);
  ASSERT_TRUE(slab.ok());
  EXPECT_NE(slab->id, 0u);
  EXPECT_NE(ftruncate(slab->fd, kSlab / 2), 0);
  EXPECT_NE(ftruncate(slab->fd, kSlab * 2), 0);
  EXPECT_NE(fcntl(slab->fd, F_ADD_SEALS, F_SEAL_WRITE), 0);  // F_SEAL_SEAL
  int seals = fcntl(slab->fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
}

// A client can keep its mapping of a slab after its session ended, and
// tenants often share a uid. A released slab is never handed out again (to the same uid
// either): its id and its memfd never come back, and the old mapping never shows what the
// next session writes.
TEST(SlabPoolTest, ReleasedSlabIsNeverHandedOutAgain) {
  auto pool = MakePool(2, 1);
  auto a = pool->Acquire(1000);
  ASSERT_TRUE(a.ok());
  // The client's own mapping, through its own fd (as the slab socket hands it over).
  int client_fd = ::dup(a->fd);
  ASSERT_GE(client_fd, 0);
  struct stat a_stat = {};
  ASSERT_EQ(::fstat(client_fd, &a_stat), 0);
  void* old = ::mmap(nullptr, kSlab, PROT_READ | PROT_WRITE, MAP_SHARED, client_fd, 0);
  ASSERT_NE(old, MAP_FAILED);
  auto* old_bytes = static_cast<unsigned char*>(old);
  std::memset(old_bytes, 0xAB, kSlab);
  const uint64_t a_id = a->id;
  pool->Release(a_id, false);
  pool->WaitIdleForTest();
  EXPECT_TRUE(AllZero(reinterpret_cast<const char*>(old_bytes), kSlab))
      << "the released slab's pages were not dropped";

  std::set<uint64_t> ids = {a_id};
  for (int round = 0; round < 6; ++round) {
    auto b = pool->Acquire(1000);  // the same uid
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_TRUE(ids.insert(b->id).second) << "slab id " << b->id << " was handed out twice";
    struct stat b_stat = {};
    ASSERT_EQ(::fstat(b->fd, &b_stat), 0);
    EXPECT_NE(b_stat.st_ino, a_stat.st_ino) << "the released memfd was handed out again";
    EXPECT_TRUE(AllZero(b->data, kSlab)) << "a fresh slab held bytes";
    std::memset(b->data, 0x5C, kSlab);  // session B's secret
    for (uint64_t i = 0; i < kSlab; i += 512) {
      ASSERT_NE(old_bytes[i], 0x5C) << "the old mapping shows the next session's byte " << i;
    }
    pool->Release(b->id, false);
    pool->WaitIdleForTest();
  }
  EXPECT_GE(pool->stats().destroyed_total, 7u);
  ::munmap(old, kSlab);
  ::close(client_fd);
}

// The pool's thread keeps `initial_slabs` fresh slabs ready, so a grant takes one made ahead
// instead of making it (memfd, populate, register) on the session's path.
TEST(SlabPoolTest, FreshSlabsAreMadeAheadWithinTheBudget) {
  std::atomic<int> registered{0};
  auto pool = MakePool(3, 2, &registered);
  EXPECT_EQ(pool->stats().slabs_fresh, 2u);
  auto a = pool->Acquire(1);
  ASSERT_TRUE(a.ok());
  pool->WaitIdleForTest();
  SlabPoolStats s = pool->stats();
  EXPECT_EQ(s.made_on_grant_total, 0u);
  EXPECT_EQ(s.slabs_fresh, 2u);  // made again ahead
  EXPECT_EQ(s.slabs_total, 3u);
  auto b = pool->Acquire(1);
  ASSERT_TRUE(b.ok());
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().slabs_total, 3u) << "the budget bounds the slabs made ahead";
  EXPECT_EQ(pool->stats().slabs_fresh, 1u);
  EXPECT_EQ(registered.load(), 3);
}

TEST(SlabPoolTest, BudgetFullDestroysReleasedSlabsNotHeldOnes) {
  std::atomic<int> registered{0};
  auto pool = MakePool(2, 0, &registered);
  auto a1 = pool->Acquire(1);
  auto a2 = pool->Acquire(1);
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(pool->stats().made_on_grant_total, 2u);
  EXPECT_EQ(pool->Acquire(2).status().kind(), ErrorKind::kQuotaExceeded);
  pool->Release(a1->id, false);
  auto b = pool->Acquire(2);  // room from A's released slab; a fresh one
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(b->id, a1->id);
  EXPECT_NE(b->id, a2->id);
  EXPECT_TRUE(AllZero(b->data, kSlab));
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().destroyed_total, 1u);
  EXPECT_EQ(pool->stats().slabs_total, 2u);
  EXPECT_EQ(registered.load(), 2);
}

// Daemon (staging) slabs are never mapped by a client: they go back to the daemon, and only
// to the daemon.
TEST(SlabPoolTest, DaemonSlabsAreReusedByTheDaemonOnly) {
  auto pool = MakePool(2, 0);
  auto d = pool->AcquireDaemon();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(pool->stats().slabs_daemon, 1u);
  EXPECT_EQ(pool->stats().slabs_in_use, 0u);
  pool->Release(d->id, false);
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().destroyed_total, 0u);
  auto s = pool->Acquire(5);
  ASSERT_TRUE(s.ok());
  EXPECT_NE(s->id, d->id) << "a client got a daemon slab";
  auto d2 = pool->AcquireDaemon();
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->id, d->id);
  // The budget is full: a client's grant may take the room of a free daemon slab.
  pool->Release(d2->id, false);
  pool->Release(s->id, false);
  pool->WaitIdleForTest();
  auto s2 = pool->Acquire(5);
  auto s3 = pool->Acquire(5);
  ASSERT_TRUE(s2.ok() && s3.ok()) << s3.status().ToString();
  EXPECT_NE(s2->id, d->id);
  EXPECT_NE(s3->id, d->id);
}

TEST(SlabPoolTest, QuarantinedSlabIsDestroyed) {
  std::atomic<int> registered{0};
  auto pool = MakePool(4, 0, &registered);
  auto a = pool->Acquire(1);
  ASSERT_TRUE(a.ok());
  pool->Release(a->id, true);
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().slabs_total, 0u);
  EXPECT_EQ(registered.load(), 0);
}

TEST(SlabPoolTest, AccountingReturnsToStart) {
  auto pool = MakePool(4, 1);
  SlabPoolStats start = pool->stats();
  EXPECT_EQ(start.slabs_total, 1u);
  EXPECT_EQ(start.slabs_in_use, 0u);
  for (int i = 0; i < 50; ++i) {
    SessionSlabs s(pool.get());
    ASSERT_TRUE(s.Bind(1000));
    EXPECT_FALSE(s.Bind(1000));  // the uid is fixed once
    ASSERT_TRUE(s.Acquire().ok());
    ASSERT_TRUE(s.Acquire().ok());
    EXPECT_EQ(pool->stats().slabs_in_use, 2u);
  }
  pool->WaitIdleForTest();
  SlabPoolStats end = pool->stats();
  EXPECT_EQ(end.slabs_in_use, 0u);
  EXPECT_EQ(end.slabs_total, 1u);  // the one kept ready; every released slab destroyed
  EXPECT_EQ(end.destroyed_total, 100u);
  EXPECT_EQ(end.fds_open, end.slabs_total);
}

// A pool of two slabs and a session bound to uid 7 on it, holding one slab (`ref`): where the
// tests of a slab's ranges start. Check ok() first.
struct OneSlabSession {
  OneSlabSession() {
    if (slabs.Bind(7)) ref = slabs.Acquire();
  }
  bool ok() const { return ref.ok(); }

  std::unique_ptr<SlabPool> pool = MakePool(2, 0);
  SessionSlabs slabs{pool.get()};
  Result<SlabRef> ref = Status(ErrorKind::kInvalidArgument, "not bound");
};

TEST(SessionSlabsTest, RangesAreCheckedAndBusy) {
  OneSlabSession one;
  ASSERT_TRUE(one.ok()) << one.ref.status().ToString();
  SessionSlabs& s = one.slabs;
  auto& ref = one.ref;
  EXPECT_EQ(s.Check({ref->id + 100, 0, 1}).kind(), ErrorKind::kInvalidHandle);
  EXPECT_EQ(s.Check({ref->id, kSlab, 1}).kind(), ErrorKind::kOutOfRange);
  EXPECT_EQ(s.Check({ref->id, 1, ~0ull}).kind(), ErrorKind::kOutOfRange);  // overflows
  EXPECT_TRUE(s.Check({ref->id, 0, kSlab}).ok());
  s.MarkBusy({ref->id, 4096, 4096});
  EXPECT_EQ(s.Check({ref->id, 0, 4097}).kind(), ErrorKind::kBusy);
  EXPECT_EQ(s.Check({ref->id, 8191, 1}).kind(), ErrorKind::kBusy);
  EXPECT_TRUE(s.Check({ref->id, 0, 4096}).ok());
  EXPECT_TRUE(s.Check({ref->id, 8192, 4096}).ok());
  s.Finish({ref->id, 4096, 4096}, false);
  EXPECT_TRUE(s.Check({ref->id, 4096, 4096}).ok());
  s.MarkBusy({ref->id, 0, 16});
  s.Finish({ref->id, 0, 16}, true);  // quarantined for good
  EXPECT_EQ(s.Check({ref->id, 0, 1}).kind(), ErrorKind::kBusy);
  s.Close();
  one.pool->WaitIdleForTest();
  EXPECT_EQ(one.pool->stats().slabs_total, 0u);  // destroyed, not pooled
}

// What Close keeps for the next session on a kept stream (docs/protocol.md, "Kept slabs"):
// only slabs the session holds, none a failed copy quarantined, none still busy; the next
// session takes them over, charge and all, and what no session takes goes back.
class CountingCharge : public PinnedCharge {
 public:
  Status TryCharge(uint64_t bytes) override {
    if (limit && held + bytes > limit) return Status(ErrorKind::kQuotaExceeded, "limit");
    held += bytes;
    return Status::Ok();
  }
  void Refund(uint64_t bytes) override { held -= bytes; }
  uint64_t held = 0;
  uint64_t limit = 0;
};

TEST(SessionSlabsTest, CloseKeepsOnlyHealthySlabsItHoldsAndTheNextSessionTakesThem) {
  auto pool = MakePool(8, 0);
  auto charge = std::make_shared<CountingCharge>();
  auto last = std::make_unique<SessionSlabs>(pool.get());
  last->SetCharge(charge);
  ASSERT_TRUE(last->Bind(7));
  auto healthy = last->Acquire(), quarantined = last->Acquire(), busy = last->Acquire();
  ASSERT_TRUE(healthy.ok() && quarantined.ok() && busy.ok());
  last->MarkBusy({quarantined->id, 0, 16});
  last->Finish({quarantined->id, 0, 16}, /*failed=*/true);
  last->MarkBusy({busy->id, 0, 16});  // never finished
  EXPECT_EQ(charge->held, 3 * kSlab);
  last->KeepAtClose({healthy->id, quarantined->id, busy->id, healthy->id + 1000});
  last->Close();
  last->Close();  // as the session's destructor does again: nothing more is kept or counted
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().slabs_in_use, 1u) << "only the healthy slab is kept";
  EXPECT_EQ(pool->stats().slabs_kept, 1u);
  EXPECT_EQ(charge->held, kSlab) << "a kept slab stays charged";

  SessionSlabs next(pool.get());
  next.SetCharge(charge);
  EXPECT_EQ(next.AdoptKept(*last), std::vector<uint64_t>{healthy->id});
  EXPECT_TRUE(next.Check({healthy->id, 0, kSlab}).ok());
  EXPECT_EQ(charge->held, kSlab) << "the same account pays once";
  EXPECT_EQ(pool->stats().slabs_kept, 0u) << "taken over, no longer kept";
  last.reset();  // the taken slab is not the last session's to give back any more
  EXPECT_EQ(pool->stats().slabs_in_use, 1u);
  next.Close();
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().slabs_in_use, 0u);
  EXPECT_EQ(charge->held, 0u);
}

TEST(SessionSlabsTest, KeptSlabsNoSessionTakesGoBack) {
  auto pool = MakePool(4, 0);
  auto charge = std::make_shared<CountingCharge>();
  {  // the stream was not kept, or ended before the next Open
    SessionSlabs last(pool.get());
    last.SetCharge(charge);
    ASSERT_TRUE(last.Bind(7));
    auto slab = last.Acquire();
    ASSERT_TRUE(slab.ok());
    last.KeepAtClose({slab->id});
    last.Close();
    EXPECT_EQ(pool->stats().slabs_in_use, 1u);
    EXPECT_EQ(pool->stats().slabs_kept, 1u);
    last.ReleaseKept();
    pool->WaitIdleForTest();
    EXPECT_EQ(pool->stats().slabs_in_use, 0u);
    EXPECT_EQ(pool->stats().slabs_kept, 0u);
    EXPECT_EQ(charge->held, 0u);
  }
  {  // given up before the Close: the Close keeps nothing
    SessionSlabs last(pool.get());
    ASSERT_TRUE(last.Bind(7));
    auto slab = last.Acquire();
    ASSERT_TRUE(slab.ok());
    last.KeepAtClose({slab->id});
    last.ReleaseKept();
    last.Close();
    pool->WaitIdleForTest();
    EXPECT_EQ(pool->stats().slabs_in_use, 0u);
  }
  {  // dropped with its kept slab
    auto last = std::make_unique<SessionSlabs>(pool.get());
    ASSERT_TRUE(last->Bind(7));
    auto slab = last->Acquire();
    ASSERT_TRUE(slab.ok());
    last->KeepAtClose({slab->id});
    last->Close();
    last.reset();
    pool->WaitIdleForTest();
    EXPECT_EQ(pool->stats().slabs_in_use, 0u);
  }
}

// The next session's own limits hold for what it takes over: past its pinned quota, or its
// account's limit where another account pays, a kept slab goes back instead.
TEST(SessionSlabsTest, AdoptedSlabsStayWithinTheNextSessionsLimits) {
  auto pool = MakePool(8, 0);
  SessionSlabs last(pool.get());
  auto last_charge = std::make_shared<CountingCharge>();
  last.SetCharge(last_charge);
  ASSERT_TRUE(last.Bind(7));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    auto slab = last.Acquire();
    ASSERT_TRUE(slab.ok());
    ids.push_back(slab->id);
  }
  last.KeepAtClose(ids);
  last.Close();
  SessionSlabs next(pool.get(), /*pinned_quota=*/2 * kSlab);
  auto next_charge = std::make_shared<CountingCharge>();
  next_charge->limit = kSlab;
  next.SetCharge(next_charge);
  EXPECT_EQ(next.AdoptKept(last).size(), 1u) << "its account's limit admits one slab";
  EXPECT_EQ(last_charge->held, 0u);
  EXPECT_EQ(next_charge->held, kSlab);
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().slabs_in_use, 1u);
}

// Kept slabs are idle: a grant short of room has them given back first, oldest first, rather
// than fail while they wait for their stream's next session. The pool's budget takes anyone's;
// a uid's pinned limit only that uid's own.
TEST(SessionSlabsTest, AGrantShortOfRoomHasKeptSlabsGivenBackFirst) {
  auto pool = MakePool(2, 0);  // room for two slabs
  auto charge7 = std::make_shared<CountingCharge>();
  charge7->limit = kSlab;  // uid 7 may hold one
  auto charge8 = std::make_shared<CountingCharge>();
  auto keep_one = [&](uid_t uid, std::shared_ptr<CountingCharge> charge) {
    auto last = std::make_shared<SessionSlabs>(pool.get());
    last->SetCharge(std::move(charge));
    EXPECT_TRUE(last->Bind(uid));
    auto slab = last->Acquire();
    EXPECT_TRUE(slab.ok()) << slab.status().ToString();
    last->KeepAtClose({slab.ok() ? slab->id : 0});
    last->Close();
    return last;
  };
  auto kept7 = keep_one(7, charge7);
  auto kept8 = keep_one(8, charge8);
  EXPECT_EQ(pool->stats().slabs_in_use, 2u);
  EXPECT_EQ(pool->stats().slabs_kept, 2u);

  // uid 7 at its limit, held by its own kept slab: that one goes, uid 8's stays.
  SessionSlabs next7(pool.get());
  next7.SetCharge(charge7);
  ASSERT_TRUE(next7.Bind(7));
  auto got7 = next7.Acquire();
  ASSERT_TRUE(got7.ok()) << got7.status().ToString();
  EXPECT_EQ(kept7->ReleaseKept(), 0u) << "uid 7's kept slab was not given back";
  EXPECT_EQ(charge7->held, kSlab);
  // The budget full (uid 7's new slab, uid 8's kept one): uid 8's kept slab goes for uid 9.
  SessionSlabs next9(pool.get());
  ASSERT_TRUE(next9.Bind(9));
  auto got9 = next9.Acquire();
  ASSERT_TRUE(got9.ok()) << got9.status().ToString();
  EXPECT_EQ(kept8->ReleaseKept(), 0u);
  EXPECT_EQ(charge8->held, 0u);
  EXPECT_EQ(pool->stats().slabs_kept, 0u);
  // Nothing kept is left: the budget is held by slabs in use.
  SessionSlabs next10(pool.get());
  ASSERT_TRUE(next10.Bind(10));
  EXPECT_EQ(next10.Acquire().status().kind(), ErrorKind::kQuotaExceeded);
  // A uid's limit never takes another uid's kept slab.
  next9.Close();
  pool->WaitIdleForTest();
  auto kept11 = keep_one(11, std::make_shared<CountingCharge>());
  SessionSlabs again7(pool.get());
  again7.SetCharge(charge7);
  ASSERT_TRUE(again7.Bind(7));
  EXPECT_EQ(again7.Acquire().status().kind(), ErrorKind::kQuotaExceeded);
  EXPECT_EQ(kept11->ReleaseKept(), 1u) << "uid 7's limit took uid 11's kept slab";
}

// Overlapping ranges are kept apart: a byte stays busy while any range holding it does.
TEST(BusyRangesTest, OverlappingRangesAreCountedNotOverwritten) {
  BusyRanges b;
  EXPECT_FALSE(b.FindOverlap(0, UINT64_MAX));
  b.Add(0, 100);
  b.Add(0, 8);  // a shorter range at the same offset
  b.Add(50, 150);
  b.Remove(0, 8);
  ASSERT_TRUE(b.FindOverlap(40, 41));  // still held by [0, 100)
  EXPECT_TRUE(b.FindOverlap(99, 100));
  EXPECT_TRUE(b.FindOverlap(149, 1000));
  EXPECT_FALSE(b.FindOverlap(150, 1000));
  EXPECT_FALSE(b.FindOverlap(40, 40));  // empty
  b.Remove(0, 100);
  EXPECT_FALSE(b.FindOverlap(0, 50));
  auto left = b.FindOverlap(0, 51);
  ASSERT_TRUE(left);
  EXPECT_EQ(left->first, 50u);
  EXPECT_EQ(left->second, 150u);
  b.Add(50, 150);  // the same range twice: both must go before it is free
  b.Remove(50, 150);
  EXPECT_TRUE(b.FindOverlap(60, 61));
  b.Remove(50, 150);
  EXPECT_FALSE(b.FindOverlap(0, UINT64_MAX));
  EXPECT_TRUE(b.empty());
}

// Two reads at one slab offset in one submit: finishing (or marking) the shorter one must not
// shrink the range the longer one still protects.
TEST(SessionSlabsTest, TwoRangesAtOneOffsetBothStayBusy) {
  OneSlabSession one;
  ASSERT_TRUE(one.ok()) << one.ref.status().ToString();
  SessionSlabs& s = one.slabs;
  auto& ref = one.ref;
  s.MarkBusy({ref->id, 0, kSlab / 2});
  s.MarkBusy({ref->id, 0, 8});  // overwrote the first range's end before
  EXPECT_EQ(s.Check({ref->id, 4096, 4096}).kind(), ErrorKind::kBusy);
  s.Finish({ref->id, 0, 8}, false);
  EXPECT_EQ(s.Check({ref->id, 4096, 4096}).kind(), ErrorKind::kBusy);
  EXPECT_EQ(s.Check({ref->id, 0, 1}).kind(), ErrorKind::kBusy);
  EXPECT_TRUE(s.Check({ref->id, kSlab / 2, 4096}).ok());
  s.Finish({ref->id, 0, kSlab / 2}, false);
  EXPECT_TRUE(s.Check({ref->id, 0, kSlab}).ok());
}

// The per-submit download limit bounds the inline Download bytes the daemon buffers; bytes a
// submit downloads into the client's slabs do not count toward it.
TEST(SessionSlabsTest, SlabDownloadsDoNotCountTowardTheInlineDownloadLimit) {
  OneSlabSession one;
  ASSERT_TRUE(one.ok()) << one.ref.status().ToString();
  SessionSlabs& slabs = one.slabs;
  auto& ref = one.ref;
  session::HandleTable table;
  session::TensorRecord t;
  t.dtype = DType::kU8;
  t.shape = Shape({8192});
  t.ptr = 0x1000;
  t.bytes = *session::TensorBytes(t.dtype, t.shape, &t.elements);
  table.Insert(1, t);
  session::AdmissionLimits limits;
  limits.device_bytes_quota = 1 << 20;
  limits.max_download_bytes = 4096;
  session::SubmitRequest req;
  req.submit_id = 1;
  req.ops = {session::DownloadToSlabOp{1, 0, ref->id, 0, 8192}, session::DownloadOp{1, 0, 4096}};
  auto admitted = session::AdmitSubmit(req, table, limits, &slabs);
  ASSERT_TRUE(admitted.ok()) << admitted.status().ToString();
  EXPECT_EQ(admitted->download_bytes, 8192u + 4096u);
  req.ops.push_back(session::DownloadOp{1, 4096, 1});  // one inline byte over the limit
  EXPECT_EQ(session::AdmitSubmit(req, table, limits, &slabs).status().kind(),
            ErrorKind::kQuotaExceeded);
}

}  // namespace
}  // namespace ferry::pool
