#include "pool/slab_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "pool/session_slabs.h"
#include "session/admission.h"

namespace ferry::pool {
namespace {

constexpr uint64_t kSlab = 1ull << 20;

std::unique_ptr<SlabPool> MakePool(uint64_t budget_slabs, uint32_t initial, int* registered) {
  HostRegistration reg;
  reg.register_memory = [registered](void*, uint64_t) {
    ++*registered;
    return Status::Ok();
  };
  reg.unregister_memory = [registered](void*) { --*registered; };
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
  int registered = 0;
  auto pool = MakePool(2, 1, &registered);
  EXPECT_EQ(registered, 1);
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

TEST(SlabPoolTest, ReusedOnlyBySameUidAndZeroed) {
  int registered = 0;
  auto pool = MakePool(2, 0, &registered);
  auto a = pool->Acquire(1000);
  ASSERT_TRUE(a.ok());
  std::memset(a->data, 0xAB, kSlab);
  uint64_t a_id = a->id;
  pool->Release(a_id, false);
  // Another uid: a fresh slab, never A's.
  auto b = pool->Acquire(2000);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->id, a_id);
  EXPECT_TRUE(AllZero(b->data, kSlab));
  // The same uid: A's slab again, zeroed.
  auto a2 = pool->Acquire(1000);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->id, a_id);
  EXPECT_TRUE(AllZero(a2->data, kSlab));
  EXPECT_EQ(pool->stats().zeroed_total, 1u);
}

TEST(SlabPoolTest, BudgetFullEvictsAnotherUidsFreeSlab) {
  int registered = 0;
  auto pool = MakePool(2, 0, &registered);
  auto a1 = pool->Acquire(1);
  auto a2 = pool->Acquire(1);
  ASSERT_TRUE(a1.ok() && a2.ok());
  std::memset(a1->data, 0x5A, kSlab);
  EXPECT_EQ(pool->Acquire(2).status().kind(), ErrorKind::kQuotaExceeded);
  pool->Release(a1->id, false);
  auto b = pool->Acquire(2);  // evicts A's free slab, makes a fresh one
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(b->id, a1->id);
  EXPECT_TRUE(AllZero(b->data, kSlab));
  EXPECT_EQ(pool->stats().evicted_total, 1u);
  EXPECT_EQ(pool->stats().slabs_total, 2u);
  EXPECT_EQ(registered, 2);
}

TEST(SlabPoolTest, QuarantinedSlabIsDestroyed) {
  int registered = 0;
  auto pool = MakePool(4, 0, &registered);
  auto a = pool->Acquire(1);
  ASSERT_TRUE(a.ok());
  pool->Release(a->id, true);
  EXPECT_EQ(pool->stats().slabs_total, 0u);
  EXPECT_EQ(registered, 0);
}

TEST(SlabPoolTest, AccountingReturnsToStart) {
  int registered = 0;
  auto pool = MakePool(4, 1, &registered);
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
  SlabPoolStats end = pool->stats();
  EXPECT_EQ(end.slabs_in_use, 0u);
  EXPECT_LE(end.slabs_total, 2u);
  EXPECT_EQ(end.fds_open, end.slabs_total);
}

TEST(SessionSlabsTest, RangesAreCheckedAndBusy) {
  int registered = 0;
  auto pool = MakePool(2, 0, &registered);
  SessionSlabs s(pool.get());
  ASSERT_TRUE(s.Bind(7));
  auto ref = s.Acquire();
  ASSERT_TRUE(ref.ok());
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
  EXPECT_EQ(pool->stats().slabs_total, 0u);  // destroyed, not pooled
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
  int registered = 0;
  auto pool = MakePool(2, 0, &registered);
  SessionSlabs s(pool.get());
  ASSERT_TRUE(s.Bind(7));
  auto ref = s.Acquire();
  ASSERT_TRUE(ref.ok());
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
  int registered = 0;
  auto pool = MakePool(2, 0, &registered);
  SessionSlabs slabs(pool.get());
  ASSERT_TRUE(slabs.Bind(7));
  auto ref = slabs.Acquire();
  ASSERT_TRUE(ref.ok());
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
