// End to end through a real ferryd: sessions, ops checked against CPU references, batching,
// synchronize, close counters, many concurrent clients on Unix and TCP sockets.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "ferry/client.h"
#include "ferryd_process.h"

namespace ferry {
namespace {

using testing::FerrydProcess;

std::vector<double> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

class SessionTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<FerrydProcess>(std::vector<std::string>{}, /*tcp=*/true);
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
    target_ = GetParam() ? daemon_->tcp_target() : daemon_->unix_target();
    auto client = Client::connect(target_);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::make_unique<Client>(std::move(*client));
  }
  void TearDown() override {
    if (!daemon_ || !daemon_->ok()) return;
    // Nothing leaks: every session's memory comes back.
    auto s = daemon_->WaitIdle();
    EXPECT_EQ(s.sessions_open(), 0u);
    EXPECT_EQ(s.live_tensors(), 0u);
    EXPECT_EQ(s.device_bytes_in_use(), 0u);
    client_.reset();
    EXPECT_EQ(daemon_->Stop(), 0) << daemon_->log();
  }

  std::unique_ptr<FerrydProcess> daemon_;
  std::string target_;
  std::unique_ptr<Client> client_;
};

TEST_P(SessionTest, UploadComputeDownloadMatchesCpuReference) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  const size_t n = 100'003;
  auto a = RandomVector(n, 1), b = RandomVector(n, 2);
  Tensor ta = session->create_tensor<double>({static_cast<int64_t>(n)});
  Tensor tb = session->create_tensor<double>({static_cast<int64_t>(n)});
  Tensor tc = session->create_tensor<double>({static_cast<int64_t>(n)});
  Tensor total = session->create_tensor<double>({1});
  ASSERT_TRUE(session->upload(ta, a).ok());
  ASSERT_TRUE(session->upload(tb, b).ok());
  session->mul(ta, tb, tc);     // c = a * b
  session->axpy(2.0, ta, tc);   // c += 2a
  session->sub(tc, tb, tc);     // c -= b
  session->scale(tc, 0.5, tc);  // c *= 0.5
  session->sum(tc, total);
  auto c = session->download<double>(tc);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto sum = session->download<double>(total);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  double ref_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    double ref = 0.5 * (a[i] * b[i] + 2.0 * a[i] - b[i]);
    ASSERT_NEAR((*c)[i], ref, 1e-12 * std::max(1.0, std::abs(ref))) << "element " << i;
    ref_sum += ref;
  }
  EXPECT_NEAR((*sum)[0], ref_sum, 1e-9 * n);
  auto stats = session->close();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
}

TEST_P(SessionTest, Float32GemmAndDivide) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  const int m = 37, k = 19, n = 23;
  std::vector<float> a(m * k), b(k * n), c0(m * n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  for (auto& x : c0) x = dist(rng);
  Tensor ta = session->create_tensor<float>({m, k});
  Tensor tb = session->create_tensor<float>({k, n});
  Tensor tc = session->create_tensor<float>({m, n});
  ASSERT_TRUE(session->upload(ta, a).ok());
  ASSERT_TRUE(session->upload(tb, b).ok());
  ASSERT_TRUE(session->upload(tc, c0).ok());
  session->gemm(ta, tb, tc, {.alpha = 2.0, .beta = 0.5});
  auto c = session->download<float>(tc);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = 0.5 * c0[i * n + j];
      for (int p = 0; p < k; ++p) ref += 2.0 * a[i * k + p] * b[p * n + j];
      ASSERT_NEAR((*c)[i * n + j], ref, 1e-5 * k) << i << "," << j;
    }
  }
  // Elementwise divide on f32.
  Tensor ones = session->create_tensor<float>({m, n});
  Tensor q = session->create_tensor<float>({m, n});
  session->fill(ones, 4.0);
  session->div(tc, ones, q);
  auto qv = session->download<float>(q);
  ASSERT_TRUE(qv.ok());
  for (size_t i = 0; i < qv->size(); ++i) ASSERT_FLOAT_EQ((*qv)[i], (*c)[i] / 4.0f);
  ASSERT_TRUE(session->close().ok());
}

TEST_P(SessionTest, OneSubmitCreatesComputesAndFrees) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  Tensor keep = session->create_tensor<double>({4});
  {
    Tensor x = session->create_tensor<double>({4});
    Tensor y = session->create_tensor<double>({4});
    session->fill(x, 3.0);
    session->fill(y, 1.0);
    session->axpy(2.0, x, y);  // y = 7
    session->copy(y, keep);
    session->free(std::move(x));
  }  // y's destructor records its free into the same batch
  EXPECT_EQ(session->recorded_ops(), 9u);
  ASSERT_TRUE(session->submit().ok());
  EXPECT_EQ(session->recorded_ops(), 0u);
  ASSERT_TRUE(session->synchronize().ok());
  auto v = session->download<double>(keep);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, std::vector<double>(4, 7.0));
  auto stats = session->close();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->tensors_created, 3u);
}

TEST_P(SessionTest, SynchronizeWaitsForEverySubmitInOrder) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  Tensor acc = session->create_tensor<double>({1024});
  Tensor one = session->create_tensor<double>({1024});
  session->fill(acc, 0.0);
  session->fill(one, 1.0);
  ASSERT_TRUE(session->submit().ok());
  for (int i = 0; i < 200; ++i) {
    session->axpy(1.0, one, acc);
    ASSERT_TRUE(session->submit().ok());
  }
  ASSERT_TRUE(session->synchronize().ok());
  auto v = session->download<double>(acc);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, std::vector<double>(1024, 200.0));
  ASSERT_TRUE(session->close().ok());
}

TEST_P(SessionTest, ReluInPlaceAndIntoAnotherTensorAndItsTypedErrors) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  const auto a = RandomVector(1001, 3);
  Tensor x = session->create_tensor<double>({7, 143});
  Tensor out = session->create_tensor<double>({7, 143});
  ASSERT_TRUE(session->upload(x, a).ok());
  session->relu(x, out);
  session->relu(x, x);  // in place
  auto got = session->download<double>(out);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto in_place = session->download<double>(x);
  ASSERT_TRUE(in_place.ok()) << in_place.status().ToString();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ((*got)[i], a[i] < 0 ? 0.0 : a[i]) << "element " << i;
    ASSERT_EQ((*in_place)[i], (*got)[i]) << "element " << i;
  }
  // Refused whole, with the failing op's index: a dtype other than f32/f64, dtypes or
  // shapes that differ, a handle that does not exist.
  Tensor ints = session->create_tensor<int32_t>({7, 143});
  Tensor floats = session->create_tensor<float>({7, 143});
  Tensor other_shape = session->create_tensor<double>({143, 7});
  ASSERT_TRUE(session->synchronize().ok());
  auto refused = [&](auto record) {
    session->fill(x, 1.0);
    record();
    EXPECT_TRUE(session->submit().ok());
    return session->synchronize();
  };
  Status s = refused([&] { session->relu(ints, ints); });
  EXPECT_EQ(s.kind(), ErrorKind::kDtypeMismatch) << s.ToString();
  EXPECT_EQ(s.op_index(), 1);
  s = refused([&] { session->relu(x, floats); });
  EXPECT_EQ(s.kind(), ErrorKind::kDtypeMismatch) << s.ToString();
  s = refused([&] { session->relu(x, other_shape); });
  EXPECT_EQ(s.kind(), ErrorKind::kShapeMismatch) << s.ToString();
  s = refused([&] { session->relu(Tensor(), x); });
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidHandle) << s.ToString();
  // Nothing of a refused submit ran: x still holds relu(a), not the fills.
  auto after = session->download<double>(x);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(*after, *got);
  ASSERT_TRUE(session->close().ok());
}

TEST_P(SessionTest, CloseCountersMatchWhatWasDone) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  std::vector<float> data(1000, 1.5f);
  Tensor t = session->create_tensor<float>({1000});
  Tensor u = session->create_tensor<float>({1000});
  ASSERT_TRUE(session->upload(t, data).ok());  // submit 1: create t, create u; submit 2: upload
  session->scale(t, 2.0, u);
  session->add(t, u, u);
  auto out = session->download<float>(u);  // submit 3: scale, add; submit 4: download
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[999], 4.5f);
  session->fill(t, 0.0);
  session->fill(Tensor(), 0.0);  // an invalid handle: this submit fails
  ASSERT_TRUE(session->submit().ok());
  Status sync = session->synchronize();
  EXPECT_EQ(sync.kind(), ErrorKind::kInvalidHandle);
  EXPECT_EQ(sync.op_index(), 1);
  auto stats = session->close();  // the destructors' frees go in the final submit
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->submits, 5u);
  EXPECT_EQ(stats->failed_submits, 1u);
  EXPECT_EQ(stats->ops, 2u + 1u + 2u + 1u);  // the failed submit's ops are not counted
  EXPECT_EQ(stats->kernel_launches, 2u);
  EXPECT_EQ(stats->bytes_uploaded, 4000u);
  EXPECT_EQ(stats->bytes_downloaded, 4000u);
  EXPECT_EQ(stats->tensors_created, 2u);
  EXPECT_EQ(stats->peak_device_bytes, 8000u);
  // libferry's own: a local session's blocking transfers go through its staging buffer, a
  // remote one's inline.
  const bool tcp = GetParam();
  EXPECT_EQ(stats->staged_upload_bytes, tcp ? 0u : 4000u);
  EXPECT_EQ(stats->staged_download_bytes, tcp ? 0u : 4000u);
}

// Runs of 8 or more kernel ops in one submit go to the device as batches (kernel-batch,
// default 8), shorter runs op by op; a copy ends a run. The results are the same with
// batches off, and close() counts the batches.
struct BatchedWork {
  std::vector<float> y, z;
  SessionStats stats;
};
BatchedWork RunBatchedWork(Client& client) {
  BatchedWork out;
  auto session = client.open_session();
  EXPECT_TRUE(session.ok());
  if (!session.ok()) return out;
  constexpr int64_t kCount = 1024;
  Tensor x = session->create_tensor<float>({kCount});
  Tensor y = session->create_tensor<float>({kCount});
  Tensor z = session->create_tensor<float>({kCount});
  session->fill(x, 1.0);
  session->fill(y, 0.0);
  // Each submit waited for, so that none shares a batch with the next (SubmitRunTest).
  EXPECT_TRUE(session->synchronize().ok());  // 2 kernel ops: no batch
  for (int k = 0; k < 64; ++k) session->axpy(k % 4 + 1, x, y);
  EXPECT_TRUE(session->synchronize().ok());  // one batch: y = 16 * (1 + 2 + 3 + 4) = 160
  for (int k = 0; k < 7; ++k) session->axpy(1.0, x, y);
  EXPECT_TRUE(session->synchronize().ok());  // 7: no batch; y = 167
  for (int k = 0; k < 8; ++k) session->axpy(1.0, x, y);
  session->copy(y, z);
  for (int k = 0; k < 8; ++k) session->scale(z, 2.0, z);
  EXPECT_TRUE(session->submit().ok());  // two batches: y = 175, z = 175 * 256
  auto y_host = session->download<float>(y);
  auto z_host = session->download<float>(z);
  EXPECT_TRUE(y_host.ok() && z_host.ok());
  if (y_host.ok()) out.y = std::move(*y_host);
  if (z_host.ok()) out.z = std::move(*z_host);
  session->free(std::move(x));
  session->free(std::move(y));
  session->free(std::move(z));
  auto stats = session->close();
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (stats.ok()) out.stats = *stats;
  return out;
}

TEST_P(SessionTest, RunsOfKernelOpsGoAsBatches) {
  BatchedWork batched = RunBatchedWork(*client_);
  EXPECT_EQ(batched.y, std::vector<float>(1024, 175.0f));
  EXPECT_EQ(batched.z, std::vector<float>(1024, 44800.0f));
  EXPECT_EQ(batched.stats.kernel_batches, 3u);
  EXPECT_EQ(batched.stats.kernel_launches, 2u + 64 + 7 + 8 + 1 + 8);  // the copy counts too

  FerrydProcess unbatched_daemon({"--kernel-batch", "0"});
  ASSERT_TRUE(unbatched_daemon.ok()) << unbatched_daemon.log();
  auto client = Client::connect(unbatched_daemon.unix_target());
  ASSERT_TRUE(client.ok());
  BatchedWork unbatched = RunBatchedWork(*client);
  EXPECT_EQ(unbatched.y, batched.y);
  EXPECT_EQ(unbatched.z, batched.z);
  EXPECT_EQ(unbatched.stats.kernel_batches, 0u);
  EXPECT_EQ(unbatched.stats.kernel_launches, batched.stats.kernel_launches);
}

// Failures among successes are each reported once, by the wait that covers them, and never
// hide behind a later success; on a local session the waits read the completion board first
// (docs/protocol.md), so this also checks that the board never answers for a failure.
TEST_P(SessionTest, FailuresAmongSuccessesAreReportedExactly) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  Tensor t = session->create_tensor<float>({256});
  std::vector<float> data(256);
  for (int round = 0; round < 150; ++round) {
    const bool fail = round % 3 == 0;
    session->fill(t, static_cast<double>(round));
    ASSERT_TRUE(session->submit().ok());
    if (fail) {
      session->fill(Tensor(), 0.0);  // an invalid handle: this submit fails
      ASSERT_TRUE(session->submit().ok());
    }
    session->scale(t, 2.0, t);
    ASSERT_TRUE(session->submit().ok());
    Status sync = session->synchronize();
    if (fail) {
      EXPECT_EQ(sync.kind(), ErrorKind::kInvalidHandle) << "round " << round;
    } else {
      EXPECT_TRUE(sync.ok()) << "round " << round << ": " << sync.ToString();
    }
    // A blocking transfer and a pending one after it succeed and carry the right bytes.
    if (round % 5 == 0) {
      auto v = session->download<float>(t);
      ASSERT_TRUE(v.ok()) << "round " << round << ": " << v.status().ToString();
      EXPECT_EQ((*v)[255], 2.0f * static_cast<float>(round)) << "round " << round;
      auto buf = session->pinned_buffer(t.byte_size());
      ASSERT_TRUE(buf.ok());
      Transfer r = session->download_pending(std::move(t), std::move(*buf)).wait();
      ASSERT_TRUE(r.status.ok()) << "round " << round << ": " << r.status.ToString();
      std::memcpy(data.data(), r.buffer.data(), r.tensor.byte_size());
      EXPECT_EQ(data[255], 2.0f * static_cast<float>(round)) << "round " << round;
      t = std::move(r.tensor);
    }
  }
  // A failure in a submit waited for alone (a pending upload's own submit) is its own.
  session->fill(Tensor(), 0.0);
  ASSERT_TRUE(session->submit().ok());
  auto buf = session->pinned_buffer(t.byte_size());
  ASSERT_TRUE(buf.ok());
  Transfer up = session->upload_pending(std::move(*buf), std::move(t)).wait();
  EXPECT_TRUE(up.status.ok()) << up.status.ToString();
  EXPECT_EQ(session->synchronize().kind(), ErrorKind::kInvalidHandle);
  EXPECT_TRUE(session->synchronize().ok());
  auto stats = session->close();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->failed_submits, 51u);
}

TEST_P(SessionTest, WithSessionOpensRunsAndCloses) {
  std::vector<double> got;
  Status s = client_->with_session([&](Session& session) -> Status {
    Tensor t = session.create_tensor<double>({3});
    session.fill(t, 2.5);
    return session.download_into(t, got);
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, std::vector<double>(3, 2.5));
  // A failing body's error comes back, and the session is still closed.
  Status bad = client_->with_session([&](Session& session) {
    Tensor t = session.create_tensor<double>({3});
    return session.upload(t, std::vector<double>(4, 1.0));
  });
  EXPECT_EQ(bad.kind(), ErrorKind::kShapeMismatch);
}

TEST_P(SessionTest, LargeTransfersAreChunked) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  const size_t n = (24u << 20) / sizeof(float) + 17;  // 24 MiB and change
  std::vector<float> data(n);
  std::iota(data.begin(), data.end(), 0.0f);
  Tensor t = session->create_tensor<float>({static_cast<int64_t>(n)});
  ASSERT_TRUE(session->upload(t, data).ok());
  std::vector<float> back;
  back.reserve(n);
  const float* before = back.data();
  ASSERT_TRUE(session->download_into(t, back).ok());
  EXPECT_EQ(back.data(), before);  // capacity was reused
  EXPECT_EQ(back, data);
  auto stats = session->close();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  // Each way in parts of at most 8 MiB (a staging half, or inline submits), each a submit of
  // its own, after the one that created the tensor.
  EXPECT_GE(stats->submits, 1u + 3u + 3u);
  const uint64_t staged = GetParam() ? 0 : n * sizeof(float);
  EXPECT_EQ(stats->staged_upload_bytes, staged);
  EXPECT_EQ(stats->staged_download_bytes, staged);
}

// Blocking transfers between one staging half and a few MiB (LargeTransfersAreChunked
// takes several halves), of sizes that are a multiple of no copy or piece size.
TEST_P(SessionTest, MidSizeTransfersRoundTrip) {
  auto session = client_->open_session();
  ASSERT_TRUE(session.ok());
  for (size_t bytes : {(256u << 10) - 4, (256u << 10) + 4, (1u << 20) + 12, (3u << 20) + 20}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    const size_t n = bytes / sizeof(float);
    std::vector<float> data(n);
    std::iota(data.begin(), data.end(), static_cast<float>(bytes));
    Tensor t = session->create_tensor<float>({static_cast<int64_t>(n)});
    ASSERT_TRUE(session->upload(t, data).ok());
    std::vector<float> back;
    ASSERT_TRUE(session->download_into(t, back).ok());
    EXPECT_EQ(back, data);
  }
  ASSERT_TRUE(session->close().ok());
}

TEST_P(SessionTest, ManyConcurrentClients) {
  constexpr int kClients = 40;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      // Half share this test's connection, half bring their own.
      std::optional<Client> own;
      if (c % 2) {
        auto cl = Client::connect(target_);
        if (!cl.ok()) return;
        own.emplace(std::move(*cl));
      }
      Client& client = own ? *own : *client_;
      auto session = client.open_session();
      if (!session.ok()) return;
      const size_t n = 4096 + c;
      auto x = RandomVector(n, 100 + c);
      Tensor t = session->create_tensor<double>({static_cast<int64_t>(n)});
      Tensor s = session->create_tensor<double>({1});
      if (!session->upload(t, x).ok()) return;
      for (int round = 0; round < 10; ++round) {
        session->scale(t, 1.0 + c, t);
        session->scale(t, 1.0 / (1.0 + c), t);
        if (!session->submit().ok()) return;
      }
      session->sum(t, s);
      auto got = session->download<double>(t);
      auto sum = session->download<double>(s);
      if (!got.ok() || !sum.ok()) return;
      double ref = std::accumulate(x.begin(), x.end(), 0.0);
      for (size_t i = 0; i < n; ++i) {
        if (std::abs((*got)[i] - x[i]) > 1e-12) return;
      }
      if (std::abs((*sum)[0] - ref) > 1e-9) return;
      auto stats = session->close();
      if (stats.ok() && stats->failed_submits == 0) ++good;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kClients);
  auto s = daemon_->AdminStatus();
  EXPECT_GE(s.sessions_total(), static_cast<uint64_t>(kClients));
}

INSTANTIATE_TEST_SUITE_P(Transports, SessionTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tcp" : "Unix"; });

}  // namespace
// ferryd binds its Unix socket itself: it replaces a socket file a dead daemon left behind,
// and refuses a path where a daemon still accepts connections (which keeps serving).
TEST(DaemonSocketTest, LivePathIsRefusedStalePathIsReplaced) {
  FerrydProcess first;
  ASSERT_TRUE(first.ok()) << first.log();
  std::string path = first.unix_target().substr(5);
  std::string log_path = path + ".second.log";
  pid_t second = testing::Spawn(testing::FerrydPath(),
                                {"--backend", testing::TestBackend(), "--listen",
                                 first.unix_target(), "--ready-file", path + ".second.ready"},
                                log_path);
  ASSERT_GT(second, 0);
  int status = testing::WaitExit(second, std::chrono::seconds(20));
  if (status == -1) kill(second, SIGKILL);
  ASSERT_NE(status, -1) << "a second ferryd started on a live socket path";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  std::ifstream in(log_path);
  std::string log((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(log.find("another process is accepting connections"), std::string::npos) << log;
  auto client = Client::connect(first.unix_target());
  ASSERT_TRUE(client.ok());
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << "the first daemon stopped serving: " << session.status().ToString();
  ASSERT_TRUE(session->close().ok());

  // A socket file nobody accepts on (its daemon was killed): the next daemon takes the path.
  int killed = first.Stop(SIGKILL);
  ASSERT_TRUE(killed != -1 && WIFSIGNALED(killed)) << killed;
  ASSERT_TRUE(std::filesystem::exists(path));
  pid_t third = testing::Spawn(testing::FerrydPath(),
                               {"--backend", testing::TestBackend(), "--listen", "unix:" + path,
                                "--ready-file", path + ".third.ready"},
                               path + ".third.log");
  ASSERT_GT(third, 0);
  bool served = false;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       !served && std::chrono::steady_clock::now() < until;) {
    served = std::filesystem::exists(path + ".third.ready");
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(served) << "ferryd did not replace a stale socket file";
  if (served) {
    auto again = Client::connect("unix:" + path);
    ASSERT_TRUE(again.ok());
    auto s2 = again->open_session();
    EXPECT_TRUE(s2.ok()) << s2.status().ToString();
    if (s2.ok()) EXPECT_TRUE(s2->close().ok());
  }
  kill(third, SIGTERM);
  EXPECT_NE(testing::WaitExit(third, std::chrono::seconds(30)), -1);
  // A daemon that stops normally removes the socket file it made.
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace ferry
