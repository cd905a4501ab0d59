// A misbehaving client gets typed errors, never crashes the daemon, never disturbs another
// session, and leaks nothing. Uses the raw ferry.v1 protocol where the library would not
// let a client misbehave.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "ferry/client.h"
#include "ferry/v1/session.grpc.pb.h"
#include "ferryd_process.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Create;
using testing::Download;
using testing::FerrydProcess;
using testing::Fill;
using testing::InlineUpload;
using testing::RawStream;

v1::Op Binary(v1::BinaryKind kind, uint64_t a, uint64_t b, uint64_t out) {
  v1::Op op;
  op.mutable_binary()->set_kind(kind);
  op.mutable_binary()->set_a(a);
  op.mutable_binary()->set_b(b);
  op.mutable_binary()->set_out(out);
  return op;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<FerrydProcess>(
        std::vector<std::string>{"--session-quota", "1M", "--max-session-quota", "2M",
                                 // Module tests: raw kernels for this uid (off by default).
                                 "--raw-kernels", "uid:" + std::to_string(getuid())});
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
  }
  void TearDown() override {
    if (!daemon_->ok()) return;
    auto s = daemon_->WaitIdle();
    EXPECT_EQ(s.sessions_open(), 0u);
    EXPECT_EQ(s.live_tensors(), 0u);
    EXPECT_EQ(s.device_bytes_in_use(), 0u) << "device memory leaked";
    EXPECT_EQ(daemon_->Stop(), 0) << "ferryd did not exit cleanly:\n" << daemon_->log();
  }

  // Open a well-behaved session that must keep working beside the bad ones.
  void StartBystander() {
    auto c = Client::connect(daemon_->unix_target());
    ASSERT_TRUE(c.ok());
    bystander_client_.emplace(std::move(*c));
    auto s = bystander_client_->open_session();
    ASSERT_TRUE(s.ok());
    bystander_.emplace(std::move(*s));
    bystander_tensor_ = bystander_->create_tensor<double>({64});
    bystander_->fill(bystander_tensor_, 1.0);
    ASSERT_TRUE(bystander_->synchronize().ok());
  }
  void CheckBystander() {
    bystander_->axpy(1.0, bystander_tensor_, bystander_tensor_);
    auto v = bystander_->download<double>(bystander_tensor_);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ((*v)[0], 2.0);
    bystander_tensor_ = Tensor();
    ASSERT_TRUE(bystander_->close().ok());
  }

  std::unique_ptr<FerrydProcess> daemon_;
  std::optional<Client> bystander_client_;
  std::optional<Session> bystander_;
  Tensor bystander_tensor_;
};

TEST_F(BadInputTest, InvalidHandlesShapesAndDtypesAreTypedAndAtomic) {
  StartBystander();
  RawStream raw(daemon_->unix_target());
  ASSERT_TRUE(raw.Open());

  // A submit that creates a tensor and then uses an invalid handle: refused whole.
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {8}), Fill(99, 1.0)}));
  v1::Error e = raw.Completion(1);
  EXPECT_EQ(e.kind(), v1::INVALID_HANDLE);
  EXPECT_EQ(e.op_index(), 1);
  // Nothing of it happened: handle 1 does not exist.
  ASSERT_TRUE(raw.Submit(2, {Fill(1, 1.0)}));
  EXPECT_EQ(raw.Completion(2).kind(), v1::INVALID_HANDLE);

  ASSERT_TRUE(raw.Submit(3, {Create(1, v1::DTYPE_F32, {8}), Create(2, v1::DTYPE_F64, {8}),
                             Create(3, v1::DTYPE_F32, {2, 4})}));
  EXPECT_EQ(raw.Completion(3).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(raw.Submit(4, {Binary(v1::ADD, 1, 2, 1)}));
  EXPECT_EQ(raw.Completion(4).kind(), v1::DTYPE_MISMATCH);
  ASSERT_TRUE(raw.Submit(5, {Binary(v1::MUL, 1, 3, 1)}));
  EXPECT_EQ(raw.Completion(5).kind(), v1::SHAPE_MISMATCH);
  ASSERT_TRUE(raw.Submit(6, {Binary(v1::BINARY_INVALID, 1, 1, 1)}));
  EXPECT_EQ(raw.Completion(6).kind(), v1::INVALID_ARGUMENT);
  ASSERT_TRUE(raw.Submit(7, {Create(9, v1::DTYPE_INVALID, {1})}));
  EXPECT_EQ(raw.Completion(7).kind(), v1::INVALID_ARGUMENT);
  ASSERT_TRUE(raw.Submit(8, {Create(9, v1::DTYPE_F32, {1, 1, 1, 1, 1, 1, 1, 1, 1})}));
  EXPECT_EQ(raw.Completion(8).kind(), v1::SHAPE_MISMATCH);
  ASSERT_TRUE(raw.Submit(9, {Create(9, v1::DTYPE_F32, {-4})}));
  EXPECT_EQ(raw.Completion(9).kind(), v1::SHAPE_MISMATCH);
  ASSERT_TRUE(raw.Submit(10, {v1::Op()}));  // an op with no kind
  EXPECT_EQ(raw.Completion(10).kind(), v1::INVALID_ARGUMENT);
  CheckBystander();
}

// The daemon reads a stream's next message while it enqueues the current one (read-ahead),
// yet never holds more submits of a session in flight than the session's limit: a client
// that sends faster than the device runs is held back by the stream.
TEST_F(BadInputTest, InFlightLimitHoldsAgainstAFastSender) {
  // Its own daemon: the fixture's 2 MiB session quota cannot hold the GPU's 64 MiB tensor.
  FerrydProcess daemon({"--session-quota", "64M", "--max-session-quota", "64M"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  RawStream raw(daemon.unix_target());
  auto opened = raw.OpenWithMaxInFlight(2);
  ASSERT_TRUE(opened);
  ASSERT_EQ(opened->max_in_flight_submits(), 2u);
  // Long enough for the sampler below to see the submits in flight: 1 MiB on the host
  // backend; 64 MiB on a GPU, where 1600 fills of 1 MiB take a few milliseconds (on the H200
  // the sampler once saw none in flight).
  const int64_t elements = testing::TestBackend() == "host" ? int64_t{1} << 18 : int64_t{1} << 24;
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {elements})}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);

  testing::InFlightSampler sampler(daemon);
  constexpr int kSubmits = 8;
  std::thread sender([&] {  // as fast as the stream lets it
    for (uint64_t id = 2; id < 2 + kSubmits; ++id) {
      std::vector<v1::Op> fills(200, Fill(1, static_cast<double>(id)));
      if (!raw.Submit(id, std::move(fills))) return;
    }
  });
  for (uint64_t id = 2; id < 2 + kSubmits; ++id) {
    EXPECT_EQ(raw.Completion(id).kind(), v1::ERROR_KIND_NONE) << "submit " << id;
  }
  sender.join();
  const uint64_t most_in_flight = sampler.Stop();
  EXPECT_LE(most_in_flight, 2u);
  EXPECT_GE(most_in_flight, 1u) << "the sampler never saw work in flight";
  v1::ClientMessage close;
  close.mutable_close();
  ASSERT_TRUE(raw.Send(close));
  while (auto m = raw.Read()) {
    if (m->has_closed()) break;
  }
}

// A session cannot pile up modules (each up to 64 MiB of code) without bound: past 256 live
// modules a submit is refused whole with QUOTA_EXCEEDED, naming the op; the session goes on.
// Free a graph, record one under the same handle, free it, then replay the handle: a stale
// use the daemon must refuse (INVALID_HANDLE), not reach the device with. The daemon and the
// session go on.
TEST_F(BadInputTest, GraphFreedAroundARecreateIsGone) {
  StartBystander();
  RawStream raw(daemon_->unix_target());
  ASSERT_TRUE(raw.Open());
  auto op = [](auto set) {
    v1::Op o;
    set(&o);
    return o;
  };
  auto begin = op([](v1::Op* o) { o->mutable_begin_graph()->set_handle(5); });
  auto end = op([](v1::Op* o) { o->mutable_end_graph(); });
  auto free = op([](v1::Op* o) { o->mutable_free_graph()->set_handle(5); });
  auto replay = op([](v1::Op* o) { o->mutable_launch_graph()->set_graph(5); });
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {4}), begin, Fill(1, 1.0), end}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(raw.Submit(2, {free, begin, Fill(1, 2.0), end, free, replay}));
  v1::Error e = raw.Completion(2);
  EXPECT_EQ(e.kind(), v1::INVALID_HANDLE) << e.message();
  EXPECT_EQ(e.op_index(), 5);
  ASSERT_TRUE(raw.Submit(3, {replay}));  // graph 5 still exists: submit 2 was refused whole
  EXPECT_EQ(raw.Completion(3).kind(), v1::ERROR_KIND_NONE);
  raw.Close();
  CheckBystander();
}

TEST_F(BadInputTest, ModulesPerSessionAreLimited) {
  RawStream raw(daemon_->unix_target());
  ASSERT_TRUE(raw.Open());
  std::vector<v1::Op> loads;
  for (uint64_t h = 1; h <= 257; ++h) {
    v1::Op op;
    op.mutable_load_module()->set_handle(h);
    op.mutable_load_module()->set_format(v1::PTX);
    op.mutable_load_module()->set_image("not ptx " + std::to_string(h));
    loads.push_back(std::move(op));
  }
  ASSERT_TRUE(raw.Submit(1, loads));
  v1::Error e = raw.Completion(1);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  EXPECT_EQ(e.op_index(), 256);
  ASSERT_TRUE(raw.Submit(2, {Create(1, v1::DTYPE_F32, {4}), Fill(1, 2.0)}));
  EXPECT_EQ(raw.Completion(2).kind(), v1::ERROR_KIND_NONE);
  raw.Close();
}

// Resident memory of a process, in bytes (VmRSS); 0 when unreadable.
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      uint64_t kib = 0;
      in >> kib;
      return kib << 10;
    }
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

// A client that asks for downloads and never reads them must not make the daemon hold them
// without bound: past its buffered-download limit the daemon stops reading that stream. Here
// 40 submits of 64 MiB each (2.5 GiB) are sent by a client that reads nothing for a while;
// the daemon's memory grows by far less, then everything arrives once the client reads.
TEST(BufferedDownloadTest, AClientThatDoesNotReadIsHeldBack) {
  FerrydProcess daemon({"--session-quota", "64M", "--max-session-quota", "64M"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  constexpr uint64_t kBytes = 64ull << 20;
  constexpr int kSubmits = 40;
  RawStream raw(daemon.unix_target());
  ASSERT_TRUE(raw.Open());
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_U8, {static_cast<int64_t>(kBytes)}), Fill(1, 7)}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  const uint64_t before = ResidentBytes(daemon.pid());
  ASSERT_GT(before, 0u);
  std::thread sender([&] {  // blocks once the daemon stops reading
    for (uint64_t id = 2; id < 2 + kSubmits; ++id) {
      if (!raw.Submit(id, {Download(1, 0, kBytes)})) return;
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const uint64_t held = ResidentBytes(daemon.pid());
  EXPECT_LT(held, before + (1ull << 30))
      << "ferryd grew by " << ((held - before) >> 20) << " MiB for a client that reads nothing";
  // Reading now: every download arrives, whole and right.
  uint64_t got = 0;
  int completed = 0;
  while (completed < kSubmits) {
    auto m = raw.Read();
    ASSERT_TRUE(m.has_value()) << "the stream ended after " << completed << " completions";
    if (m->has_download_chunk()) {
      const std::string& d = m->download_chunk().data();
      got += d.size();
      ASSERT_TRUE(d.empty() || (d.front() == 7 && d.back() == 7));
    }
    if (m->has_completed()) {
      ASSERT_FALSE(m->completed().has_error()) << m->completed().error().message();
      ++completed;
    }
  }
  sender.join();
  EXPECT_EQ(got, kSubmits * kBytes);
  raw.Close();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.log();
}

TEST_F(BadInputTest, OversizeLengthsAndOffsetsAreOutOfRange) {
  RawStream raw(daemon_->unix_target());
  ASSERT_TRUE(raw.Open());
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_U8, {100})}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(raw.Submit(2, {Download(1, 0, 101)}));
  EXPECT_EQ(raw.Completion(2).kind(), v1::OUT_OF_RANGE);
  ASSERT_TRUE(raw.Submit(3, {Download(1, UINT64_MAX, 2)}));
  EXPECT_EQ(raw.Completion(3).kind(), v1::OUT_OF_RANGE);
  ASSERT_TRUE(raw.Submit(4, {InlineUpload(1, 95, std::string(6, 'x'))}));
  EXPECT_EQ(raw.Completion(4).kind(), v1::OUT_OF_RANGE);
  ASSERT_TRUE(raw.Submit(5, {InlineUpload(1, UINT64_MAX - 2, std::string(6, 'x'))}));
  EXPECT_EQ(raw.Completion(5).kind(), v1::OUT_OF_RANGE);
  // In range works.
  ASSERT_TRUE(raw.Submit(6, {InlineUpload(1, 95, std::string(5, 'x')), Download(1, 94, 6)}));
  std::string got;
  while (auto m = raw.Read()) {
    if (m->has_download_chunk()) got += m->download_chunk().data();
    if (m->has_completed()) {
      EXPECT_FALSE(m->completed().has_error());
      break;
    }
  }
  EXPECT_EQ(got.substr(1), "xxxxx");
}

TEST_F(BadInputTest, SubmitOverQuotaIsRefusedAndLosesNothing) {
  auto client = Client::connect(daemon_->unix_target());
  ASSERT_TRUE(client.ok());
  auto session = client->open_session();
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(session->device_bytes_quota(), 1u << 20);
  Tensor a = session->create_tensor<uint8_t>({600 << 10});
  session->fill(a, 7);
  ASSERT_TRUE(session->synchronize().ok());
  Tensor b = session->create_tensor<uint8_t>({600 << 10});  // 1.2 MiB in all: over quota
  session->fill(a, 9);                                      // refused with it
  ASSERT_TRUE(session->submit().ok());
  Status s = session->synchronize();
  EXPECT_EQ(s.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_EQ(s.op_index(), 0);
  // The refused submit changed nothing: `a` still holds 7 everywhere.
  auto got = session->download<uint8_t>(a);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0], 7);
  EXPECT_EQ((*got)[(600 << 10) - 1], 7);
  // A quota above the daemon's maximum is capped.
  auto big = client->open_session({.device_bytes_quota = 1ull << 40});
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->device_bytes_quota(), 2u << 20);
}

TEST_F(BadInputTest, MessagesOutOfOrderAreProtocolViolations) {
  StartBystander();
  {
    RawStream raw(daemon_->unix_target());
    ASSERT_TRUE(raw.Submit(1, {Fill(1, 0)}));  // before Open
    auto m = raw.Read();
    ASSERT_TRUE(m && m->has_error());
    EXPECT_EQ(m->error().kind(), v1::PROTOCOL_VIOLATION);
    EXPECT_EQ(raw.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    RawStream raw(daemon_->unix_target());
    ASSERT_TRUE(raw.SendOpen(7));  // unknown version
    auto m = raw.Read();
    ASSERT_TRUE(m && m->has_error());
    EXPECT_EQ(m->error().kind(), v1::PROTOCOL_VIOLATION);
  }
  {
    RawStream raw(daemon_->unix_target());
    ASSERT_TRUE(raw.Open());
    ASSERT_TRUE(raw.SendOpen());  // twice
    auto m = raw.Read();
    ASSERT_TRUE(m && m->has_error());
    EXPECT_EQ(m->error().kind(), v1::PROTOCOL_VIOLATION);
  }
  {
    RawStream raw(daemon_->unix_target());
    ASSERT_TRUE(raw.Open());
    ASSERT_TRUE(raw.Submit(5, {Create(1, v1::DTYPE_F64, {1024})}));
    EXPECT_EQ(raw.Completion(5).kind(), v1::ERROR_KIND_NONE);
    ASSERT_TRUE(raw.Submit(5, {Fill(1, 1)}));  // submit ids must increase
    v1::Error e = raw.Completion(5);
    EXPECT_EQ(e.kind(), v1::PROTOCOL_VIOLATION);
  }
  {
    RawStream raw(daemon_->unix_target());
    ASSERT_TRUE(raw.Open());
    ASSERT_TRUE(raw.Send(v1::ClientMessage()));  // a message with no kind
    auto m = raw.Read();
    ASSERT_TRUE(m && m->has_error());
    EXPECT_EQ(m->error().kind(), v1::PROTOCOL_VIOLATION);
  }
  CheckBystander();
}

// Also the regression test for a cancel that arrived while a write was in flight: the
// stream was never finished and the daemon hung in shutdown.
TEST_F(BadInputTest, ClientThatVanishesMidStreamIsCleanedUp) {
  StartBystander();
  for (int i = 0; i < 5; ++i) {
    RawStream raw(daemon_->unix_target());
    ASSERT_TRUE(raw.Open());
    std::vector<v1::Op> ops = {Create(1, v1::DTYPE_F64, {64 << 10})};
    for (int k = 0; k < 50; ++k) ops.push_back(Fill(1, k));
    ops.push_back(Download(1, 0, 512 << 10));
    for (uint64_t id = 1; id <= 10; ++id) ASSERT_TRUE(raw.Submit(id, ops));
    // RawStream's destructor cancels the call with submits in flight.
  }
  CheckBystander();
}

TEST_F(BadInputTest, KilledClientProcessIsCleanedUp) {
  StartBystander();
  // A child process opens a session, queues work, and is killed with SIGKILL.
  pid_t pid = testing::Spawn(testing::ProgramPath("FERRY_TEST_CLIENT", FERRY_TEST_CLIENT_PATH),
                             {daemon_->unix_target(), "hang"});
  ASSERT_GT(pid, 0);
  // Wait until the daemon sees its session and tensors.
  bool seen = false;
  for (int i = 0; i < 1000 && !seen; ++i) {
    auto s = daemon_->AdminStatus();
    seen = s.sessions_open() >= 2 && s.live_tensors() >= 2;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(seen);
  kill(pid, SIGKILL);
  testing::WaitExit(pid, std::chrono::seconds(10));
  CheckBystander();
}

}  // namespace
}  // namespace ferry
