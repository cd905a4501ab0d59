// Bad input through the raw protocol with slabs a session really holds: a raw client opens a
// session over gRPC, binds the slab socket with the token from Opened and acquires slabs
// itself (no library), then names out-of-range, overflowing, busy and unknown ranges, and
// uses a slab connection closed before acquire. Every one gets its typed error, the daemon
// keeps serving, and the Admin accounting returns to where it started.
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/v1/admin.grpc.pb.h"
#include "ferry/v1/session.grpc.pb.h"
#include "ferryd_process.h"
#include "library_checks.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::FerrydProcess;

using testing::Create;
using testing::Download;
using testing::Fill;
using testing::MappedAnswer;
using testing::RawSlabConnection;
using testing::RawSlabSession;
using testing::RawStream;

v1::Op FromSlab(uint64_t t, uint64_t off, uint64_t slab, uint64_t slab_off, uint64_t len) {
  v1::Op op;
  auto* u = op.mutable_upload_from_slab();
  u->set_tensor(t);
  u->set_offset(off);
  u->set_slab(slab);
  u->set_slab_offset(slab_off);
  u->set_length(len);
  return op;
}
v1::Op ToSlab(uint64_t t, uint64_t off, uint64_t slab, uint64_t slab_off, uint64_t len) {
  v1::Op op;
  auto* d = op.mutable_download_to_slab();
  d->set_tensor(t);
  d->set_offset(off);
  d->set_slab(slab);
  d->set_slab_offset(slab_off);
  d->set_length(len);
  return op;
}

constexpr uint64_t kSlab = 4u << 20;

// The daemon every test starts with: 4 MiB slabs, one made at the start.
const std::vector<std::string> kArgs = {"--slab-size",     "4M", "--pinned-budget", "32M",
                                        "--initial-slabs", "1"};

// Submit `submit` (a create and a fill) on `raw` and expect it to succeed: the session goes on.
void ExpectSessionGoesOn(RawStream& raw, uint64_t submit) {
  ASSERT_TRUE(raw.Submit(submit, {Create(1, v1::DTYPE_U8, {64}), Fill(1, 5)}));
  EXPECT_EQ(raw.Completion(submit).kind(), v1::ERROR_KIND_NONE);
}

// `n` fills of `tensor`: with a large tensor, they keep a submit on the device for a while.
std::vector<v1::Op> ManyFills(uint64_t tensor, int n = 200) {
  return std::vector<v1::Op>(n, Fill(tensor, 3.0));
}

class SlabBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<FerrydProcess>(kArgs);
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
    start_ = daemon_->AdminStatus();
  }
  void TearDown() override {
    if (!daemon_->ok()) return;
    // Accounting returns to start: no session, tensor, device byte, held slab or slab
    // connection is left, and the pool holds an fd for each slab it has and no more.
    v1::StatusReply s;
    for (int i = 0; i < 500; ++i) {
      s = daemon_->WaitIdle();
      if (s.slabs_in_use() == 0 && s.slab_connections() == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(s.sessions_open(), start_.sessions_open());
    EXPECT_EQ(s.live_tensors(), start_.live_tensors());
    EXPECT_EQ(s.device_bytes_in_use(), start_.device_bytes_in_use()) << "device memory leaked";
    EXPECT_EQ(s.slabs_in_use(), start_.slabs_in_use());
    EXPECT_EQ(s.slab_connections(), start_.slab_connections());
    EXPECT_EQ(s.slab_fds_open(), s.slabs_total());
    EXPECT_EQ(daemon_->Stop(), 0) << "ferryd did not exit cleanly:\n" << daemon_->log();
  }

  // Stop the daemon and start another with `args`, whose Admin status is the new start.
  void Restart(std::vector<std::string> args) {
    ASSERT_EQ(daemon_->Stop(), 0);
    daemon_ = std::make_unique<FerrydProcess>(std::move(args));
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
    start_ = daemon_->AdminStatus();
  }

  // The daemon still serves a well-behaved library session.
  void CheckServing() { testing::ExpectServes(daemon_->unix_target()); }

  std::unique_ptr<FerrydProcess> daemon_;
  v1::StatusReply start_;
};

TEST_F(SlabBadInputTest, RangesOfAHeldSlabAreCheckedTyped) {
  RawSlabSession session(daemon_->unix_target());
  ASSERT_TRUE(session.opened);
  ASSERT_FALSE(session.opened->slab_socket().empty());
  ASSERT_EQ(session.opened->slab_size(), kSlab);
  ASSERT_TRUE(session.bound());
  RawStream& raw = session.raw;
  auto granted = session.conn->Acquire();
  ASSERT_TRUE(granted);
  ASSERT_EQ(granted->kind, 0u);
  ASSERT_EQ(granted->size, kSlab);
  ASSERT_GE(granted->fd, 0);
  MappedAnswer slab(granted, PROT_READ | PROT_WRITE);
  ASSERT_TRUE(slab.ok());
  auto* bytes = slab.as<unsigned char>();
  const uint64_t id = slab.id();
  EXPECT_EQ(daemon_->AdminStatus().slabs_in_use(), start_.slabs_in_use() + 1);

  uint64_t sub = 0;
  ASSERT_TRUE(raw.Submit(++sub, {Create(1, v1::DTYPE_U8, {static_cast<int64_t>(kSlab)})}));
  ASSERT_EQ(raw.Completion(sub).kind(), v1::ERROR_KIND_NONE);

  struct Case {
    const char* what;
    v1::Op op;
    v1::ErrorKind kind;
  };
  const Case cases[] = {
      {"end past the slab", FromSlab(1, 0, id, kSlab - 8, 16), v1::OUT_OF_RANGE},
      {"offset at the end", ToSlab(1, 0, id, kSlab, 1), v1::OUT_OF_RANGE},
      {"offset far past", FromSlab(1, 0, id, 1ull << 40, 1), v1::OUT_OF_RANGE},
      {"offset + length wraps", FromSlab(1, 0, id, ~uint64_t{0} - 3, 16), v1::OUT_OF_RANGE},
      {"length wraps", ToSlab(1, 0, id, 8, ~uint64_t{0} - 4), v1::OUT_OF_RANGE},
      {"unknown slab id", FromSlab(1, 0, id + 1000, 0, 16), v1::INVALID_HANDLE},
      {"slab id 0", ToSlab(1, 0, 0, 0, 16), v1::INVALID_HANDLE},
  };
  for (const Case& c : cases) {
    // A create before the bad op: the refusal is whole, the create never happens.
    ++sub;
    ASSERT_TRUE(raw.Submit(sub, {Create(50 + sub, v1::DTYPE_U8, {4}), c.op}));
    v1::Error e = raw.Completion(sub);
    EXPECT_EQ(e.kind(), c.kind) << c.what << ": " << e.message();
    EXPECT_EQ(e.op_index(), 1) << c.what;
  }
  EXPECT_EQ(daemon_->AdminStatus().live_tensors(), start_.live_tensors() + 1);

  // In range works both ways, to the last byte of the slab.
  for (uint64_t i = 0; i < 4096; ++i) bytes[kSlab - 4096 + i] = static_cast<unsigned char>(i * 7);
  ASSERT_TRUE(
      raw.Submit(++sub, {FromSlab(1, 100, id, kSlab - 4096, 4096), ToSlab(1, 100, id, 0, 4096)}));
  ASSERT_EQ(raw.Completion(sub).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(std::memcmp(bytes, bytes + kSlab - 4096, 4096), 0);
  raw.Close();
  CheckServing();
}

// The completion board (docs/protocol.md): its fd is read-only and sealed, so a client can
// neither write the page nor shrink it under the daemon; the daemon posts every delivered
// submit before its Completed, and the last failed one.
TEST_F(SlabBadInputTest, CompletionBoardIsReadOnlyAndPostsEachDelivery) {
  RawSlabSession session(daemon_->unix_target());
  ASSERT_TRUE(session.opened);
  ASSERT_TRUE(session.opened->completion_board());
  ASSERT_TRUE(session.bound());
  RawStream& raw = session.raw;
  RawSlabConnection& conn = *session.conn;
  auto board = conn.Board();
  ASSERT_TRUE(board);
  ASSERT_EQ(board->kind, 0u);
  ASSERT_EQ(board->size, 4096u);
  ASSERT_GE(board->fd, 0);
  EXPECT_EQ(::mmap(nullptr, board->size, PROT_READ | PROT_WRITE, MAP_SHARED, board->fd, 0),
            MAP_FAILED);
  EXPECT_NE(::ftruncate(board->fd, 0), 0);
  EXPECT_NE(::write(board->fd, "x", 1), 1);
  void* map = ::mmap(nullptr, board->size, PROT_READ, MAP_SHARED, board->fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  ::close(board->fd);
  const volatile uint64_t* words = static_cast<const uint64_t*>(map);
  EXPECT_EQ(words[0], 0u);
  EXPECT_EQ(words[1], 0u);

  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {64})}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(words[0], 1u);  // posted before Completed was sent
  EXPECT_EQ(words[1], 0u);
  ASSERT_TRUE(raw.Submit(2, {Fill(1, 1.0), Fill(99, 1.0)}));  // tensor 99: none
  ASSERT_EQ(raw.Completion(2).kind(), v1::INVALID_HANDLE);
  EXPECT_EQ(words[0], 2u);
  EXPECT_EQ(words[1], 2u);
  ASSERT_TRUE(raw.Submit(5, {Fill(1, 2.0)}));  // ids may skip
  ASSERT_EQ(raw.Completion(5).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(words[0], 5u);
  EXPECT_EQ(words[1], 2u) << "a success does not clear the last failure";

  // The connection still serves slabs (the board is handed once: EachDescriptorOfASession...).
  auto slab = conn.Acquire();
  ASSERT_TRUE(slab && slab->kind == 0);
  ::close(slab->fd);

  ::munmap(map, board->size);
  raw.Close();
  CheckServing();
}

// Open.successes_on_board (docs/protocol.md, "Successes on the board"): a success without
// Download ops is reported on the board only; a failure and a submit with Download ops still
// get their Completed, in submit order. A success reported on the board is answered for the
// daemon's accounting too: far more of them than max-in-flight go through, and nothing stays
// counted in flight.
TEST_F(SlabBadInputTest, SuccessesOnTheBoardGetNoCompletedButFailuresAndDownloadsDo) {
  RawSlabSession session(daemon_->unix_target(), /*successes_on_board=*/true,
                         std::chrono::seconds(60));
  ASSERT_TRUE(session.opened);
  ASSERT_TRUE(session.opened->completion_board());
  ASSERT_TRUE(session.opened->successes_on_board());
  ASSERT_TRUE(session.bound());
  RawStream& raw = session.raw;
  MappedAnswer board(session.conn->Board(), PROT_READ);
  ASSERT_TRUE(board.ok());
  const volatile uint64_t* words = board.as<const uint64_t>();
  auto board_reaches = [&](uint64_t id) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (words[0] < id && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return words[0] >= id;
  };

  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {64}), Fill(1, 1.0)}));
  ASSERT_TRUE(board_reaches(1));
  ASSERT_TRUE(raw.Submit(2, {Fill(99, 1.0)}));  // tensor 99: none
  auto failed = raw.Read();                     // the next message: submit 1 got none
  ASSERT_TRUE(failed && failed->has_completed());
  EXPECT_EQ(failed->completed().submit_id(), 2u);
  EXPECT_EQ(failed->completed().first_submit_id(), 0u);
  EXPECT_EQ(failed->completed().error().kind(), v1::INVALID_HANDLE);
  EXPECT_EQ(words[0], 2u);
  EXPECT_EQ(words[1], 2u);

  // A success, then a download: its chunk and its Completed come, and nothing for submit 3.
  ASSERT_TRUE(raw.Submit(3, {Fill(1, 3.0)}));
  ASSERT_TRUE(raw.Submit(4, {Download(1, 0, 256)}));
  std::string bytes;
  for (;;) {
    auto m = raw.Read();
    ASSERT_TRUE(m);
    if (m->has_download_chunk()) {
      EXPECT_EQ(m->download_chunk().submit_id(), 4u);
      bytes += m->download_chunk().data();
      continue;
    }
    ASSERT_TRUE(m->has_completed());
    EXPECT_EQ(m->completed().submit_id(), 4u);
    EXPECT_EQ(m->completed().first_submit_id(), 0u);
    EXPECT_EQ(m->completed().error().kind(), v1::ERROR_KIND_NONE);
    break;
  }
  ASSERT_EQ(bytes.size(), 256u);
  for (int i = 0; i < 64; ++i) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    ASSERT_EQ(v, 3.0f) << "element " << i;
  }

  // 200 successes, three times the daemon's max-in-flight (64): a success the board reported
  // and the daemon did not answer would stop the daemon reading after 64 of them.
  for (uint64_t id = 5; id < 205; ++id) ASSERT_TRUE(raw.Submit(id, {Fill(1, 4.0)}));
  ASSERT_TRUE(board_reaches(204)) << "the daemon stopped reading at " << words[0];
  EXPECT_EQ(words[1], 2u);
  EXPECT_EQ(daemon_->AdminStatus().submits_in_flight(), 0u);
  {
    auto admin = v1::Admin::NewStub(
        grpc::CreateChannel(daemon_->unix_target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::ListSessionsReply list;
    ASSERT_TRUE(admin->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
    for (const auto& u : list.usage()) {
      EXPECT_EQ(u.in_flight_bytes(), 0u) << u.identity() << " still holds in-flight bytes";
      EXPECT_EQ(u.submits_in_flight(), 0u) << u.identity();
    }
  }

  // Close: Closed counts every submit, and no Completed came for any success.
  v1::ClientMessage close;
  close.mutable_close();
  ASSERT_TRUE(raw.Send(close));
  std::optional<v1::SessionStats> stats;
  while (auto m = raw.Read()) {
    EXPECT_FALSE(m->has_completed()) << "a Completed for submit " << m->completed().submit_id();
    if (m->has_closed()) stats = m->closed().stats();
  }
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->submits(), 204u);
  EXPECT_EQ(stats->failed_submits(), 1u);
  EXPECT_TRUE(raw.Finish().ok());
  CheckServing();
}

TEST_F(SlabBadInputTest, OverlappingRangeInFlightIsBusyAndLosesNothing) {
  RawSlabSession session(daemon_->unix_target());
  ASSERT_TRUE(session.bound());
  RawStream& raw = session.raw;
  MappedAnswer slab(session.conn->Acquire(), PROT_READ | PROT_WRITE);
  ASSERT_TRUE(slab.ok());
  auto* doubles = slab.as<double>();
  const uint64_t id = slab.id();

  // Tensor 1: big enough that many fills of it keep submit A on the device for a while.
  const int64_t n = 4 << 20;  // 32 MiB of f64
  ASSERT_TRUE(raw.Submit(
      1, {Create(1, v1::DTYPE_F64, {n}), Create(2, v1::DTYPE_F64, {1024}), Fill(2, 1.0)}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  for (uint64_t i = 0; i < kSlab / 8; ++i) doubles[i] = -1.0;

  // A: many fills, then a download into slab bytes [0, 1 MiB).
  std::vector<v1::Op> a = ManyFills(1);
  a.push_back(ToSlab(1, 0, id, 0, 1 << 20));
  ASSERT_TRUE(raw.Submit(2, a));
  // B, while A is in flight: fill tensor 2, then read slab bytes [512 KiB, 1.5 MiB) that
  // A is still writing: refused whole with BUSY.
  ASSERT_TRUE(raw.Submit(3, {Fill(2, 9.0), FromSlab(2, 0, id, 512 << 10, 8192)}));
  // C: a range A does not touch is fine meanwhile.
  ASSERT_TRUE(raw.Submit(4, {FromSlab(2, 0, id, 2 << 20, 8)}));
  v1::Error ea = raw.Completion(2);
  EXPECT_EQ(ea.kind(), v1::ERROR_KIND_NONE) << ea.message();
  v1::Error eb = raw.Completion(3);
  EXPECT_EQ(eb.kind(), v1::BUSY) << eb.message();
  EXPECT_EQ(eb.op_index(), 1);
  v1::Error ec = raw.Completion(4);
  EXPECT_EQ(ec.kind(), v1::ERROR_KIND_NONE) << ec.message();

  // A's bytes all landed; B changed nothing (tensor 2 still 1.0, except C's first element,
  // which C set from slab bytes A never touched: -1.0).
  for (uint64_t i = 0; i < (1u << 20) / 8; ++i) ASSERT_EQ(doubles[i], 3.0) << "element " << i;
  EXPECT_EQ(doubles[(1 << 20) / 8], -1.0);
  std::string got;
  ASSERT_TRUE(raw.Submit(5, {Download(2, 0, 1024 * 8)}));
  ASSERT_EQ(raw.Completion(5, &got).kind(), v1::ERROR_KIND_NONE);
  ASSERT_EQ(got.size(), 1024u * 8);
  const double* t2 = reinterpret_cast<const double*>(got.data());
  EXPECT_EQ(t2[0], -1.0);
  for (int i = 1; i < 1024; ++i) ASSERT_EQ(t2[i], 1.0) << "element " << i;

  // Once A completed, the range is free again.
  ASSERT_TRUE(raw.Submit(6, {FromSlab(2, 0, id, 512 << 10, 8192)}));
  EXPECT_EQ(raw.Completion(6).kind(), v1::ERROR_KIND_NONE);
  raw.Close();
  CheckServing();
}

// Two reads at one slab offset in one submit (a long one, then a short one): the daemon must
// keep the long one's range busy, so a later submit that writes into bytes the long read is
// still reading is refused with BUSY, and the read gets the bytes the slab held.
TEST_F(SlabBadInputTest, ShorterReadAtTheSameOffsetKeepsTheLongerRangeBusy) {
  RawSlabSession session(daemon_->unix_target());
  ASSERT_TRUE(session.bound());
  RawStream& raw = session.raw;
  MappedAnswer slab(session.conn->Acquire(), PROT_READ | PROT_WRITE);
  ASSERT_TRUE(slab.ok());
  auto* doubles = slab.as<double>();
  const uint64_t id = slab.id();
  const int64_t n = 4 << 20;  // 32 MiB of f64: many fills of it keep submit 2 busy
  const int64_t m = (1 << 20) / 8;
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F64, {n}), Create(2, v1::DTYPE_F64, {m}),
                             Create(3, v1::DTYPE_F64, {m})}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  for (int64_t i = 0; i < m; ++i) doubles[i] = 5.0;

  // 2: many fills, then read slab bytes [0, 1 MiB) into tensor 2 and [0, 8) into tensor 3.
  std::vector<v1::Op> a = ManyFills(1);
  a.push_back(FromSlab(2, 0, id, 0, 1 << 20));
  a.push_back(FromSlab(3, 0, id, 0, 8));
  ASSERT_TRUE(raw.Submit(2, a));
  // 3, while 2 is in flight: write slab bytes [4 KiB, 8 KiB), which 2 still reads.
  ASSERT_TRUE(raw.Submit(3, {Fill(3, 7.0), ToSlab(3, 0, id, 4096, 4096)}));
  v1::Error e2 = raw.Completion(2);
  EXPECT_EQ(e2.kind(), v1::ERROR_KIND_NONE) << e2.message();
  v1::Error e3 = raw.Completion(3);
  EXPECT_EQ(e3.kind(), v1::BUSY) << "a write into bytes a read in flight uses was admitted: "
                                 << e3.message();
  EXPECT_EQ(e3.op_index(), 1);

  // Tensor 2 holds what the slab held (5.0): nothing was written under the read.
  std::string got;
  ASSERT_TRUE(raw.Submit(4, {Download(2, 0, m * 8)}));
  ASSERT_EQ(raw.Completion(4, &got).kind(), v1::ERROR_KIND_NONE);
  ASSERT_EQ(got.size(), static_cast<size_t>(m * 8));
  const double* t2 = reinterpret_cast<const double*>(got.data());
  for (int64_t i = 0; i < m; ++i) ASSERT_EQ(t2[i], 5.0) << "element " << i;
  // Once 2 completed, the whole range is free again.
  ASSERT_TRUE(raw.Submit(5, {ToSlab(3, 0, id, 4096, 4096)}));
  EXPECT_EQ(raw.Completion(5).kind(), v1::ERROR_KIND_NONE);
  raw.Close();
  CheckServing();
}

TEST_F(SlabBadInputTest, AcquireBeyondTheSessionPinnedQuotaIsQuotaExceeded) {
  // Restart with a quota of two 4M slabs per session.
  ASSERT_NO_FATAL_FAILURE(
      Restart({"--slab-size", "4M", "--pinned-budget", "32M", "--session-pinned-quota", "8M"}));
  RawSlabSession session(daemon_->unix_target());
  ASSERT_TRUE(session.bound());
  RawSlabConnection& conn = *session.conn;
  for (int i = 0; i < 2; ++i) {
    auto slab = conn.Acquire();
    ASSERT_TRUE(slab && slab->kind == 0);
    ::close(slab->fd);
  }
  for (int i = 0; i < 3; ++i) {  // refused, typed, and the connection stays usable
    auto slab = conn.Acquire();
    ASSERT_TRUE(slab);
    EXPECT_EQ(slab->kind, static_cast<uint32_t>(ErrorKind::kQuotaExceeded));
    EXPECT_LT(slab->fd, 0) << "a refused acquire passed an fd";
  }
  EXPECT_EQ(daemon_->AdminStatus().slabs_in_use(), 2u);
  session.raw.Close();
  CheckServing();
}

TEST_F(SlabBadInputTest, SlabConnectionClosedBeforeAcquire) {
  {
    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    ASSERT_TRUE(opened);
    {
      RawSlabConnection conn(opened->slab_socket());
      ASSERT_EQ(conn.Hello(opened->slab_token()), 0);
      conn.Close();  // closed before any acquire
    }
    // The token is spent: a second connection with it is refused, typed.
    RawSlabConnection again(opened->slab_socket());
    ASSERT_TRUE(again.connected());
    EXPECT_EQ(again.Hello(opened->slab_token()), static_cast<int>(ErrorKind::kInvalidArgument));
    EXPECT_FALSE(again.Acquire().has_value()) << "the daemon kept a refused connection";
    // The session holds no slab: any slab op names an unknown slab.
    ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_U8, {64}), FromSlab(1, 0, 1, 0, 64)}));
    EXPECT_EQ(raw.Completion(1).kind(), v1::INVALID_HANDLE);
    // Inline transfers still work.
    ExpectSessionGoesOn(raw, 2);
    raw.Close();
  }
  {
    // Closed before even presenting the token: the token still binds a later connection.
    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    ASSERT_TRUE(opened);
    { RawSlabConnection conn(opened->slab_socket()); }
    RawSlabConnection conn(opened->slab_socket());
    ASSERT_EQ(conn.Hello(opened->slab_token()), 0);
    // A slab whose fd and connection the client closed stays the session's until it ends.
    auto slab = conn.Acquire();
    ASSERT_TRUE(slab && slab->kind == 0);
    ::close(slab->fd);
    conn.Close();
    ASSERT_TRUE(
        raw.Submit(1, {Create(1, v1::DTYPE_U8, {64}), Fill(1, 5), ToSlab(1, 0, slab->id, 0, 64)}));
    EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
    EXPECT_EQ(daemon_->AdminStatus().slabs_in_use(), start_.slabs_in_use() + 1);
    raw.Close();
  }
  CheckServing();
}

// Pipelined requests (docs/protocol.md, "Slab socket"): a hello and requests sent in one write
// are answered in order, each with its fd. A client that pipelines requests and never reads is
// closed (at its second board request, which is a protocol violation; or once its answers fill
// the connection), without the daemon holding them back; it gets fewer answers than it asked
// for, its session still works through its messages, and so does everyone else.
TEST_F(SlabBadInputTest, PipelinedRequestsAreAnsweredInOrderAndAnUnreadFloodIsClosed) {
  {
    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    ASSERT_TRUE(opened);
    ASSERT_TRUE(opened->completion_board() && opened->submit_ring());
    RawSlabConnection conn(opened->slab_socket());
    ASSERT_TRUE(conn.Send("FSL1" + opened->slab_token() + RawSlabConnection::RequestBytes(2) +
                          RawSlabConnection::RequestBytes(3) + RawSlabConnection::RequestBytes(4) +
                          RawSlabConnection::RequestBytes(1)));
    ASSERT_EQ(conn.HelloAnswer(), 0);
    auto board = conn.Answer();
    auto ring = conn.Answer();
    auto doorbell = conn.Answer();
    auto slab = conn.Answer();
    ASSERT_TRUE(board && ring && doorbell && slab) << "an answer is missing";
    EXPECT_EQ(board->kind, 0u);
    EXPECT_EQ(board->size, 4096u);
    EXPECT_EQ(ring->kind, 0u);
    EXPECT_EQ(ring->size, 4096 + ring->id) << "the ring's mapping is its header and capacity";
    EXPECT_EQ(doorbell->kind, 0u);
    EXPECT_EQ(doorbell->size, 8u);
    EXPECT_EQ(slab->kind, 0u);
    EXPECT_EQ(slab->size, 4u << 20);
    for (auto* a : {&*board, &*ring, &*doorbell, &*slab}) {
      EXPECT_GE(a->fd, 0);
      if (a->fd >= 0) ::close(a->fd);
    }
    raw.Close();
  }
  {
    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    ASSERT_TRUE(opened);
    RawSlabConnection conn(opened->slab_socket());
    timeval ten_seconds{10, 0};  // a daemon that stopped reading without closing fails here
    ASSERT_EQ(::setsockopt(conn.fd(), SOL_SOCKET, SO_SNDTIMEO, &ten_seconds, sizeof(ten_seconds)),
              0);
    ASSERT_EQ(::setsockopt(conn.fd(), SOL_SOCKET, SO_RCVTIMEO, &ten_seconds, sizeof(ten_seconds)),
              0);
    constexpr int kRequests = 20000;  // board requests: each answer carries the board's fd
    std::string flood = "FSL1" + opened->slab_token();
    for (int i = 0; i < kRequests; ++i) flood += RawSlabConnection::RequestBytes(2);
    (void)conn.Send(flood);  // the daemon may close before it has read them all
    ASSERT_EQ(conn.HelloAnswer(), 0);
    int answers = 0;
    while (auto a = conn.Answer()) {
      ++answers;
      if (a->fd >= 0) ::close(a->fd);
    }
    // Ended: end of file, or reset (the daemon closed with requests of ours still unread).
    char byte;
    errno = 0;
    const ssize_t last = ::recv(conn.fd(), &byte, 1, 0);
    EXPECT_TRUE(last == 0 || (last < 0 && errno == ECONNRESET))
        << "the connection did not end: recv gave " << last << " (" << std::strerror(errno) << ")";
    std::printf("%d of %d pipelined requests answered before the daemon closed\n", answers,
                kRequests);
    EXPECT_LT(answers, kRequests) << "the daemon held every answer of a client that never read";
    // The session goes on without its shared memory.
    ExpectSessionGoesOn(raw, 1);
    raw.Close();
  }
  CheckServing();
}

// A session's board, ring and doorbell are handed once each (a descriptor sent and not yet
// read is charged to the daemon's user, and enough of them stop every uid's sends): asking
// again ends the connection, typed, without a descriptor; the session goes on through its
// messages.
TEST_F(SlabBadInputTest, EachDescriptorOfASessionIsHandedOnce) {
  for (char op : {char{2}, char{3}, char{4}}) {
    RawSlabSession session(daemon_->unix_target());
    ASSERT_TRUE(session.bound());
    RawSlabConnection& conn = *session.conn;
    auto first = conn.Request(op);
    ASSERT_TRUE(first && first->kind == 0 && first->fd >= 0) << "op " << int{op};
    ::close(first->fd);
    auto again = conn.Request(op);
    ASSERT_TRUE(again) << "op " << int{op};
    EXPECT_EQ(again->kind, static_cast<uint32_t>(ErrorKind::kProtocolViolation));
    EXPECT_LT(again->fd, 0) << "a second descriptor was handed";
    EXPECT_FALSE(conn.Acquire().has_value()) << "the connection goes on after a violation";
    ExpectSessionGoesOn(session.raw, 1);
    session.raw.Close();
  }
  CheckServing();
}

// A slab connection ends with its session, so that a client cannot keep connections (and
// descriptors in flight) beyond its sessions: the daemon closes it soon after the session
// ended, whether or not the client asks anything more.
TEST_F(SlabBadInputTest, ASlabConnectionEndsWithItsSession) {
  RawSlabSession session(daemon_->unix_target());
  ASSERT_TRUE(session.bound());
  RawSlabConnection& conn = *session.conn;
  auto board = conn.Board();
  ASSERT_TRUE(board && board->kind == 0);
  ::close(board->fd);
  session.raw.Close();
  timeval ten_seconds{10, 0};
  ASSERT_EQ(::setsockopt(conn.fd(), SOL_SOCKET, SO_RCVTIMEO, &ten_seconds, sizeof(ten_seconds)), 0);
  char byte;
  EXPECT_EQ(::recv(conn.fd(), &byte, 1, 0), 0) << "the connection outlived its session";
  CheckServing();
}

// A uid whose connections ended with answers it never read (descriptors still in flight to
// it) gets no new slab connection once it has slab-max-pending-per-uid of them, until it
// reads them or closes its ends; then it is served again.
TEST_F(SlabBadInputTest, AUidThatLeavesAnswersUnreadIsHeldBackUntilItReadsThem) {
  std::vector<std::string> args = kArgs;
  args.insert(args.end(), {"--slab-max-pending-per-uid", "2"});
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  // Connect and present a session's token; the hello's answer (0: bound, -1: closed at once).
  auto try_bind = [this] {
    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    if (!opened) return -2;
    RawSlabConnection conn(opened->slab_socket());
    const int answer = conn.Hello(opened->slab_token());
    raw.Close();
    return answer;
  };
  std::vector<std::unique_ptr<RawSlabConnection>> unread;
  for (int i = 0; i < 2; ++i) {
    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    ASSERT_TRUE(opened);
    auto conn = std::make_unique<RawSlabConnection>(opened->slab_socket());
    ASSERT_TRUE(conn->Send("FSL1" + opened->slab_token() + RawSlabConnection::RequestBytes(2)));
    // Wait until the daemon has answered (both answers sit unread in our queue).
    for (int n = 0; n < 1000; ++n) {
      int queued = 0;
      ASSERT_EQ(::ioctl(conn->fd(), FIONREAD, &queued), 0);
      if (queued >= 8 + 24) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    raw.Close();  // the daemon closes the connection it cannot close: it keeps it, unread
    unread.push_back(std::move(conn));
  }
  int answer = 0;
  for (int n = 0; n < 100 && (answer = try_bind()) == 0; ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(answer, -1) << "a uid with answers unread on 2 connections still got a third";
  for (auto& conn : unread) {  // read what was sent: the descriptors arrive, and are closed
    EXPECT_EQ(conn->HelloAnswer(), 0);
    auto board = conn->Answer();
    ASSERT_TRUE(board && board->kind == 0 && board->fd >= 0);
    ::close(board->fd);
  }
  for (int n = 0; n < 100 && (answer = try_bind()) != 0; ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(answer, 0) << "the uid was not served again once it had read its answers";
  unread.clear();
  CheckServing();
}

// A hello with the right token but a bad magic is refused before the token
// is looked at, so the token still binds the session afterwards (docs/protocol.md, "Slab
// socket"); a hello with the right magic spends it, and a token that differs from a pending
// one only in its last character binds nothing and spends nothing.
TEST_F(SlabBadInputTest, BadMagicDoesNotSpendTheTokenAndNearMissesBindNothing) {
  RawStream raw(daemon_->unix_target());
  auto opened = raw.Open();
  ASSERT_TRUE(opened);
  const std::string token = opened->slab_token();
  ASSERT_EQ(token.size(), 32u);
  const int refused = static_cast<int>(ErrorKind::kInvalidArgument);
  for (const char* magic : {"FSL0", "FSL2", "fsl1", "\0\0\0\0"}) {
    RawSlabConnection bad(opened->slab_socket());
    ASSERT_TRUE(bad.connected());
    EXPECT_EQ(bad.Hello(token, std::string(magic, 4)), refused) << "magic " << magic;
    EXPECT_FALSE(bad.Acquire().has_value()) << "the daemon kept a refused connection";
  }
  // The right magic and every near miss of the token: refused, nothing spent.
  for (size_t i : {size_t{0}, size_t{15}, size_t{31}}) {
    std::string near = token;
    near[i] = near[i] == '0' ? '1' : '0';
    RawSlabConnection miss(opened->slab_socket());
    EXPECT_EQ(miss.Hello(near), refused) << "a token differing at " << i << " was accepted";
  }
  RawSlabConnection conn(opened->slab_socket());
  ASSERT_EQ(conn.Hello(token), 0) << "a refused hello spent the token";
  auto slab = conn.Acquire();
  ASSERT_TRUE(slab && slab->kind == 0);
  ::close(slab->fd);
  // Spent now: a second connection with it is refused.
  RawSlabConnection again(opened->slab_socket());
  EXPECT_EQ(again.Hello(token), refused);
  raw.Close();
  CheckServing();
}

}  // namespace
}  // namespace ferry
