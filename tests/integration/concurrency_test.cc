// 64 sessions at once, each mixing transfers, elementwise ops and GEMMs (and raw kernels on
// the CUDA backend), every result checked against a CPU reference.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <thread>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "metrics_scrape.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

constexpr const char* kNegate = R"(
extern "C" __global__ void negate(double* x, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) x[i] = -x[i];
}
)";

// Run one session's workload; return an empty string on success, else what went wrong.
std::string Workload(Client& client, int index) {
  auto s = client.open_session();
  if (!s.ok()) return "open: " + s.status().ToString();
  std::mt19937 rng(index);
  std::uniform_real_distribution<double> dist(-1, 1);
  const int m = 48 + index % 7, k = 33, n = 40;
  std::vector<double> a(m * k), b(k * n), big(1 << 17);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  for (auto& x : big) x = dist(rng);
  Tensor ta = s->create_tensor<double>({m, k});
  Tensor tb = s->create_tensor<double>({k, n});
  Tensor tc = s->create_tensor<double>({m, n});
  Tensor tbig = s->create_tensor<double>({1 << 17});
  if (Status st = s->upload(ta, a); !st.ok()) return "upload a: " + st.ToString();
  if (Status st = s->upload(tb, b); !st.ok()) return "upload b: " + st.ToString();
  if (Status st = s->upload(tbig, big); !st.ok()) return "upload big: " + st.ToString();
  for (int round = 0; round < 5; ++round) {
    s->gemm(ta, tb, tc);
    s->scale(tbig, -1.0, tbig);
    if (Status st = s->submit(); !st.ok()) return "submit: " + st.ToString();
  }
  bool cuda = s->backend() == "cuda";
  Module neg;
  // Loads refused with BUSY: never created, so they are dropped only once the session is
  // closed (their unloads would be refused).
  std::vector<Module> refused;
  if (cuda) {  // one more negation through a raw kernel: an even number in all
    // CUDA C++ compiles are bounded daemon-wide (nvrtc-concurrency, a quarter of the cores):
    // 64 sessions compiling at once get BUSY past the bound, and retry as a client would.
    for (int attempt = 1;; ++attempt) {
      Module m = s->load_module(ModuleFormat::kCudaSource, kNegate);
      Status st = s->synchronize();
      if (st.ok()) {
        neg = std::move(m);
        break;
      }
      refused.push_back(std::move(m));
      if (st.kind() != ErrorKind::kBusy || attempt == 2000) return "load: " + st.ToString();
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng() % 10));
    }
    s->launch(neg, "negate", {(1u << 17) / 256}, {256},
              {KernelArg::tensor(tbig), KernelArg::u64(1u << 17)});
  } else {
    s->scale(tbig, -1.0, tbig);
  }
  auto c = s->download<double>(tc);
  if (!c.ok()) return "download c: " + c.status().ToString();
  auto back = s->download<double>(tbig);
  if (!back.ok()) return "download big: " + back.status().ToString();
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int p = 0; p < k; ++p) ref += a[i * k + p] * b[p * n + j];
      if (std::abs((*c)[i * n + j] - ref) > 1e-12 * k) return "gemm mismatch";
    }
  }
  if (*back != big) return "transfer/negate mismatch";
  auto stats = s->close();
  if (!stats.ok()) return "close: " + stats.status().ToString();
  return "";
}

TEST(ConcurrencyTest, SixtyFourSessionsMixingTransfersKernelsAndGemms) {
  // Raw kernels (on CUDA) for this uid: they are off by default.
  testing::FerrydProcess daemon({"--raw-kernels", "uid:" + std::to_string(getuid())});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  auto client = Client::connect(daemon.unix_target());
  ASSERT_TRUE(client.ok());
  constexpr int kSessions = 64;
  std::vector<std::string> errors(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] { errors[i] = Workload(*client, i); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(errors[i], "") << "session " << i;
  auto s = daemon.WaitIdle();
  EXPECT_EQ(s.sessions_total(), static_cast<uint64_t>(kSessions));
  EXPECT_EQ(s.device_bytes_in_use(), 0u);
}

// One session's turn-taking workload: `rounds` times, upload n doubles of its own, negate
// them on the device, download them and check. Local sessions (`pinned`) move the bytes
// through a pinned buffer (pending transfers); remote ones inline (upload / download).
std::string TurnsWorkload(Client& client, int index, bool pinned, int rounds) {
  auto s = client.open_session();
  if (!s.ok()) return "open: " + s.status().ToString();
  constexpr int64_t n = 1 << 16;  // 512 KiB: each copy takes a turn
  Tensor t = s->create_tensor<double>({n});
  std::vector<double> values(n);
  PinnedBuffer buf;
  if (pinned) {
    auto b = s->pinned_buffer(n * sizeof(double));
    if (!b.ok()) return "pinned_buffer: " + b.status().ToString();
    buf = std::move(*b);
  }
  for (int round = 0; round < rounds; ++round) {
    for (int64_t j = 0; j < n; ++j) values[j] = index * 1000.0 + round + j * 1e-6;
    std::vector<double> back;
    if (pinned) {
      std::copy(values.begin(), values.end(), buf.span<double>().begin());
      Transfer up = s->upload_pending(std::move(buf), std::move(t)).wait();
      if (!up.status.ok()) return "upload_pending: " + up.status.ToString();
      t = std::move(up.tensor);
      s->scale(t, -1.0, t);
      Transfer down = s->download_pending(std::move(t), std::move(up.buffer)).wait();
      if (!down.status.ok()) return "download_pending: " + down.status.ToString();
      t = std::move(down.tensor);
      buf = std::move(down.buffer);
      back.assign(buf.span<double>().begin(), buf.span<double>().end());
    } else {
      if (Status st = s->upload(t, values); !st.ok()) return "upload: " + st.ToString();
      s->scale(t, -1.0, t);
      auto d = s->download<double>(t);
      if (!d.ok()) return "download: " + d.status().ToString();
      back = std::move(*d);
    }
    for (int64_t j = 0; j < n; ++j) {
      if (back[j] != -values[j]) return "round " + std::to_string(round) + ": wrong bytes";
    }
  }
  auto stats = s->close();
  if (!stats.ok()) return "close: " + stats.status().ToString();
  return "";
}

// Copy turns under load: one turn per direction for copies of 64 KiB or more, so these
// sessions' transfers keep waiting for turns. Local sessions move their bytes through pinned
// buffers, remote ones inline over TCP, and two more clients loop on 2 MiB pending transfers;
// one of those is killed while the others run, the other at the end. Every session gets its
// own bytes back, and every turn comes back.
TEST(ConcurrencyTest, SessionsTakingTurnsForLargeCopiesAllGetTheirOwnBytesBack) {
  testing::FerrydProcess daemon({"--copy-turns", "1", "--copy-turn-size", "64K"}, /*tcp=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  char tmpl[] = "/tmp/ferry-turns-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<pid_t> loops;
  for (int i = 0; i < 2; ++i) {
    std::string log = dir + "/loop" + std::to_string(i) + ".log";
    pid_t pid = testing::Spawn(testing::ProgramPath("FERRY_TEST_CLIENT", FERRY_TEST_CLIENT_PATH),
                               {daemon.unix_target(), "pending-loop"}, log);
    ASSERT_GT(pid, 0);
    loops.push_back(pid);
    bool ready = false;
    for (int k = 0; k < 2000 && !ready; ++k) {
      std::ifstream in(log);
      ready =
          std::string(std::istreambuf_iterator<char>(in), {}).find("ready") != std::string::npos;
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(ready) << "looping client " << i << " never started its transfers";
  }
  auto local = Client::connect(daemon.unix_target());
  auto remote = Client::connect(daemon.tcp_target());
  ASSERT_TRUE(local.ok() && remote.ok());
  constexpr int kSessions = 12, kRounds = 6;
  std::vector<std::string> errors(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      errors[i] = i % 2 == 0 ? TurnsWorkload(*local, i, /*pinned=*/true, kRounds)
                             : TurnsWorkload(*remote, i, /*pinned=*/false, kRounds);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(kill(loops[0], SIGKILL), 0);
  for (auto& t : threads) t.join();
  ASSERT_EQ(kill(loops[1], SIGKILL), 0);
  for (pid_t pid : loops) testing::WaitExit(pid, std::chrono::seconds(10));
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(errors[i], "") << "session " << i;

  v1::StatusReply end = daemon.WaitIdle();
  EXPECT_EQ(end.sessions_open(), 0u);
  EXPECT_EQ(end.submits_in_flight(), 0u);
  EXPECT_EQ(end.copy_turns(), 1u);
  EXPECT_EQ(end.copy_turns_waiting(), 0u);
  // 14 clients on one turn per direction: transfers waited.
  EXPECT_GT(end.copy_turn_waits_total(), 0u);
  // The turns all came back: a new transfer runs.
  EXPECT_EQ(TurnsWorkload(*local, 99, /*pinned=*/true, 1), "");
  std::filesystem::remove_all(dir);
}

// With eager module loading, a session's first use of a kernel waits for no other session's
// work. On CUDA a kernel loaded on its first launch (lazy loading, CUDA's default) may wait
// for the whole device, so a tenant's first fill of a new type, or its first GEMM of a new
// shape, would wait for every other tenant's queued kernels. Session A keeps the device busy
// (GEMMs in flight, a pending download behind them); B, opened after,
// fills a tensor of a type nobody used yet and synchronizes, then runs a GEMM of that type
// and synchronizes. After each, A's work is still in flight: B waited for none of it.
TEST(ConcurrencyTest, ASessionsFirstKernelsWaitForNoOtherSessionsWork) {
  testing::FerrydProcess d({"--cuda-module-loading", "eager"});
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // A: about two seconds of GEMMs on an H100 or H200 (each of 8192^3 about 20 ms); smaller
  // ones on the host backend (whose streams each run on a thread of their own, so there the
  // property holds by construction).
  const bool host = testing::TestBackend() == "host";
  const int64_t n = host ? 256 : 8192;
  const int gemms = host ? 40 : 120;
  auto a = client->open_session();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Tensor x = a->create_tensor<float>({n, n});
  Tensor y = a->create_tensor<float>({n, n});
  a->fill(x, 1.0f / static_cast<float>(n));
  a->fill(y, 0.0f);
  ASSERT_TRUE(a->synchronize().ok());  // A's kernels are loaded before its long work starts
  for (int i = 0; i < gemms; ++i) a->gemm(x, x, y, {.alpha = 1.0, .beta = 1.0});
  auto buffer = a->pinned_buffer(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  Tensor tail = a->create_tensor<float>({1024});
  a->fill(tail, 3.0f);
  PendingTransfer a_done = a->download_pending(std::move(tail), std::move(*buffer));
  ASSERT_TRUE(a->submit().ok());
  const auto a_submitted = std::chrono::steady_clock::now();
  // When a check below fails, these tell "B waited for A" (B's step took about as long as
  // what was left of A) from "A was done early" (A's work took less than the steps before).
  auto since_a = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a_submitted)
        .count();
  };

  auto b = client->open_session();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Tensor m = b->create_tensor<double>({16, 16});
  Tensor out = b->create_tensor<double>({16, 16});
  b->fill(m, 1.0);
  const double fill_from = since_a();
  Status filled = b->synchronize();
  ASSERT_TRUE(filled.ok()) << filled.ToString();
  std::printf("MEASURED B's first fill: %.1f to %.1f ms after A's submit\n", fill_from, since_a());
  auto ready = a_done.is_ready();
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_FALSE(*ready) << "session A's work was done before B's first fill: either B waited "
                          "for it or A's work was too short";
  b->gemm(m, m, out, {.alpha = 1.0, .beta = 0.0});
  const double gemm_from = since_a();
  Status gemm = b->synchronize();
  ASSERT_TRUE(gemm.ok()) << gemm.ToString();
  std::printf("MEASURED B's first GEMM: %.1f to %.1f ms after A's submit\n", gemm_from, since_a());
  ready = a_done.is_ready();
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_FALSE(*ready) << "session A's work was done before B's first GEMM: either B waited "
                          "for it or A's work was too short";
  auto result = b->download<double>(out);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(*result, std::vector<double>(256, 16.0));
  EXPECT_TRUE(b->close().ok());
  Transfer done = a_done.wait();
  EXPECT_TRUE(done.status.ok()) << done.status.ToString();
  std::printf("MEASURED A's work done (waited for) %.1f ms after its submit\n", since_a());
  EXPECT_TRUE(a->close().ok());
}

// A submit of many ops is enqueued in slices (Session::kEnqueueSlice): between them its io
// thread goes to other sessions' queued work. Here two sessions send such submits back to
// back on a daemon of two io threads, while a remote session, whose 1 MiB transfers go
// inline (not on the caller's thread), opens, uploads, downloads and closes, again and
// again: everyone gets the right bytes, and the long enqueues did yield.
TEST(ConcurrencyTest, LongSubmitsAreEnqueuedInSlicesWhileOtherSessionsWork) {
  testing::FerrydProcess d({"--executor-threads", "2", "--metrics-listen", "127.0.0.1:0"},
                           /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto remote = Client::connect(d.tcp_target());
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  constexpr int kLongOps = 1 << 19;
  constexpr int kLongSubmits = 2;
  std::atomic<int> long_done{0};
  std::vector<std::string> long_errors(2);
  std::vector<std::thread> long_runners;
  for (int t = 0; t < 2; ++t) {
    long_runners.emplace_back([&, t] {
      auto s = client->open_session();
      if (!s.ok()) {
        long_errors[t] = "open: " + s.status().ToString();
      } else {
        Tensor x = s->create_tensor<float>({1});
        for (int round = 0; round < kLongSubmits && long_errors[t].empty(); ++round) {
          for (int i = 0; i < kLongOps; ++i) s->fill(x, static_cast<double>(i + round));
          if (Status st = s->synchronize(); !st.ok()) long_errors[t] = "submit: " + st.ToString();
        }
        auto back = s->download<float>(x);
        if (!back.ok()) {
          long_errors[t] = "download: " + back.status().ToString();
        } else if ((*back)[0] != kLongOps + kLongSubmits - 2) {
          long_errors[t] = "the last fill left " + std::to_string((*back)[0]);
        }
      }
      ++long_done;
    });
  }
  std::vector<float> bytes(1 << 18);
  int rounds = 0;
  for (; long_done.load() < 2; ++rounds) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<float>(i + rounds);
    auto s = remote->open_session();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Tensor t = s->create_tensor<float>({1 << 18});
    ASSERT_TRUE(s->upload(t, bytes).ok());
    auto back = s->download<float>(t);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, bytes);
    EXPECT_TRUE(s->close().ok());
  }
  for (auto& r : long_runners) r.join();
  for (const auto& e : long_errors) EXPECT_EQ(e, "");
  EXPECT_GT(rounds, 0);
  const std::string body = testing::ResponseBody(testing::Scrape(testing::MetricsEndpoint(d)));
  EXPECT_GT(testing::Value(body, "ferry_enqueue_yields_total"), 0)
      << "4 submits of 2^19 ops each took less than one slice to enqueue";
  EXPECT_GE(testing::Value(body, "ferry_long_lane_turns_total"), 4)
      << "submits of 2^19 ops were not read and admitted on the long lane";
}

// The long lane is fair between tenants, against a real ferryd. Without staging every inline
// transfer copies directly between the device and the message's ordinary memory, which waits
// for the session's earlier work (CUDA's pageable copies may; the host backend does): on the
// long lane. Tenant a ("remote": TCP peers) queues long work on three sessions and then a
// download on each, so each download holds a long-lane thread until that work has run. With
// two long-lane threads, a holds one and its other two downloads wait for it; tenant b (a
// local uid) copies on the other thread at once, and its upload completes while every one of
// a's downloads is still in flight.
TEST(ConcurrencyTest, OneTenantsDirectCopiesLeaveALongLaneThreadForAnother) {
  const bool cuda = testing::TestBackend() == "cuda";
  std::vector<std::string> args = {"--executor-threads", "2",          "--staging-slabs", "0",
                                   "--metrics-listen",   "127.0.0.1:0"};
  // a's long work on CUDA: a kernel that spins (fills run fused there, too fast to wait for).
  if (cuda) args.push_back("--allow-remote-raw-kernels");
  testing::FerrydProcess d(args, /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  using testing::Create;
  using testing::Download;
  using testing::Fill;
  using testing::InlineUpload;
  auto metric = [&](const char* name) {
    return testing::Value(testing::ResponseBody(testing::Scrape(testing::MetricsEndpoint(d))),
                          name);
  };
  const std::string tcp = d.tcp_target().substr(4);  // HOST:PORT
  std::vector<std::unique_ptr<testing::RawStream>> a;
  for (int i = 0; i < 3; ++i) {
    a.push_back(std::make_unique<testing::RawStream>(tcp));
    ASSERT_TRUE(a.back()->Open()) << d.log();
    std::vector<v1::Op> setup = {Create(1, v1::DTYPE_F32, {16 << 20}),
                                 Create(2, v1::DTYPE_U8, {4096})};
    if (cuda) setup.push_back(testing::LoadSpin(3));
    ASSERT_TRUE(a.back()->Submit(1, setup));
    ASSERT_EQ(a.back()->Completion(1).kind(), v1::ERROR_KIND_NONE);
  }
  testing::RawStream b(d.unix_target());
  ASSERT_TRUE(b.Open()) << d.log();
  ASSERT_TRUE(b.Submit(1, {Create(1, v1::DTYPE_U8, {4096})}));
  ASSERT_EQ(b.Completion(1).kind(), v1::ERROR_KIND_NONE);
  // a: work that keeps each stream busy for a few seconds (fills of 64 MiB; on CUDA a kernel
  // that spins about 2 s), then a download.
  for (auto& s : a) {
    ASSERT_TRUE(s->Submit(2, cuda ? std::vector<v1::Op>{testing::Spin(3, 1, 1.0f, 4'000'000'000ull)}
                                  : std::vector<v1::Op>(600, Fill(1, 1.0))));
    ASSERT_TRUE(s->Submit(3, {Download(2, 0, 4096)}));
  }
  // Once one of a's downloads waits for the lane, a holds all it may of it.
  ASSERT_TRUE(testing::Eventually([&] { return metric("ferry_long_lane_waiting") >= 1; }, 10))
      << "a's downloads did not go to the long lane";
  const auto b_start = std::chrono::steady_clock::now();
  ASSERT_TRUE(b.Submit(2, {InlineUpload(1, 0, std::string(4096, 'b'))}));
  EXPECT_EQ(b.Completion(2).kind(), v1::ERROR_KIND_NONE);
  std::printf(
      "when b's upload completed (after %.1f ms): %g of a's downloads waited for the long "
      "lane, %llu submits in flight\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b_start).count(),
      metric("ferry_long_lane_waiting"),
      static_cast<unsigned long long>(d.AdminStatus().submits_in_flight()));
  EXPECT_GE(d.AdminStatus().submits_in_flight(), 3u)
      << "b's upload waited for a's downloads (they should all still be in flight); ferryd's "
      << "log:\n"
      << d.log();
  for (auto& s : a) {
    EXPECT_EQ(s->Completion(2).kind(), v1::ERROR_KIND_NONE);
    std::string bytes;
    EXPECT_EQ(s->Completion(3, &bytes).kind(), v1::ERROR_KIND_NONE);
    EXPECT_EQ(bytes, std::string(4096, '\0'));
    s->Close();
  }
  ASSERT_TRUE(b.Submit(3, {Download(1, 0, 4096)}));
  std::string back;
  EXPECT_EQ(b.Completion(3, &back).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(back, std::string(4096, 'b'));
  b.Close();
  EXPECT_EQ(metric("ferry_long_lane_waiting"), 0);
  EXPECT_GE(metric("ferry_long_lane_turns_total"), 5);
}

// The daemon of the sliced graph recording tests: two executor threads, elementwise ops
// unfused (each add a kernel node of its own on CUDA: the capture is long), and metrics.
std::vector<std::string> SlicedRecordingArgs() {
  return {"--executor-threads", "2",      //
          "--fuse-elementwise", "false",  //
          "--metrics-listen",   "127.0.0.1:0"};
}

// A graph recording is cut into slices too: the session's stream keeps capturing while its
// executor thread goes to other work, and the capture goes on from whichever thread takes
// it up next (CUDA: relaxed capture). Meanwhile another session allocates, computes and
// copies on the same device. The graph replays every recorded op.
TEST(ConcurrencyTest, AGraphRecordedInSlicesReplaysEveryOpWhileOthersWork) {
  testing::FerrydProcess d(SlicedRecordingArgs());
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto s = client->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Tensor x = s->create_tensor<double>({64});
  Tensor one = s->create_tensor<double>({64});
  s->fill(x, 0.0);
  s->fill(one, 1.0);
  ASSERT_TRUE(s->synchronize().ok());
  constexpr int kAdds = 1 << 17;
  std::atomic<bool> recorded{false};
  std::string other_error;
  int other_rounds = 0;
  double other_slowest_ms = 0;  // printed: what the recording cost the other session
  std::thread other([&] {
    auto o = client->open_session();
    if (!o.ok()) {
      other_error = "open: " + o.status().ToString();
      return;
    }
    for (; !recorded.load() && other_error.empty(); ++other_rounds) {
      const auto round_start = std::chrono::steady_clock::now();
      Tensor m = o->create_tensor<double>({32, 32});
      Tensor out = o->create_tensor<double>({32, 32});
      o->fill(m, 1.0 + other_rounds % 3);
      o->gemm(m, m, out, {.alpha = 1.0, .beta = 0.0});
      auto back = o->download<double>(out);
      const double want = 32.0 * (1 + other_rounds % 3) * (1 + other_rounds % 3);
      if (!back.ok()) {
        other_error = "round " + std::to_string(other_rounds) + ": " + back.status().ToString();
      } else if (*back != std::vector<double>(32 * 32, want)) {
        other_error = "round " + std::to_string(other_rounds) + ": wrong gemm result";
      }
      other_slowest_ms = std::max(
          other_slowest_ms,
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - round_start)
              .count());
    }
  });
  Graph g = s->begin_graph();
  for (int i = 0; i < kAdds; ++i) s->axpy(1.0, one, x);
  s->end_graph();
  Status st = s->synchronize();
  recorded = true;
  other.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(other_error, "");
  s->launch_graph(g);
  s->launch_graph(g);
  auto back = s->download<double>(x);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, std::vector<double>(64, 2.0 * kAdds));
  const std::string body = testing::ResponseBody(testing::Scrape(testing::MetricsEndpoint(d)));
  EXPECT_GT(testing::Value(body, "ferry_enqueue_yields_total"), 0)
      << "recording 2^17 ops took less than one slice";
  EXPECT_GE(testing::Value(body, "ferry_long_lane_turns_total"), 1)
      << "the graph of 2^17 ops was not instantiated on the long lane";
  std::printf(
      "MEASURED the other session ran %d rounds while the graph was recorded, the slowest "
      "in %.1f ms\n",
      other_rounds, other_slowest_ms);
  // The close releases the graph (CUDA: cudaGraphExecDestroy of 2^17 kernel nodes) on an
  // executor thread: printed, with ferryd's slow-handler warnings, to see what it holds.
  const auto close_start = std::chrono::steady_clock::now();
  EXPECT_TRUE(s->close().ok());
  std::printf(
      "MEASURED close of a session holding a 2^17-op graph: %.1f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - close_start)
          .count());
  std::istringstream log(d.log());
  for (std::string line; std::getline(log, line);) {
    if (line.find("executor handler") != std::string::npos) {
      std::printf("MEASURED ferryd: %s\n", line.c_str());
    }
  }
}

// A client that goes away while its graph recording is being enqueued in slices: the daemon
// drops the rest and abandons the capture (CUDA: the recorded graph is never instantiated),
// and releases the session's tensors; another session's work and a new session's recording
// are unharmed.
TEST(ConcurrencyTest, AClientGoneDuringASlicedGraphRecordingLeavesNothingBehind) {
  testing::FerrydProcess d(SlicedRecordingArgs());
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto bystander = client->open_session();
  ASSERT_TRUE(bystander.ok()) << bystander.status().ToString();
  Tensor b = bystander->create_tensor<double>({64});
  bystander->fill(b, 1.0);
  ASSERT_TRUE(bystander->synchronize().ok());
  const v1::StatusReply idle = d.AdminStatus();

  constexpr int kAdds = (1 << 18) - 8;  // within session-max-graph-ops
  bool cancelled_while_recording = false;
  {
    testing::RawStream raw(d.unix_target(), std::chrono::seconds(60));
    ASSERT_TRUE(raw.Open());
    ASSERT_TRUE(
        raw.Submit(1, {testing::Create(1, v1::DTYPE_F64, {1 << 16}),
                       testing::Create(2, v1::DTYPE_F64, {1 << 16}), testing::Fill(2, 1.0)}));
    EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
    std::vector<v1::Op> record;
    v1::Op begin;
    begin.mutable_begin_graph()->set_handle(7);
    record.push_back(begin);
    for (int i = 0; i < kAdds; ++i) record.push_back(testing::Axpy(1.0, 2, 1));
    v1::Op end;
    end.mutable_end_graph();
    record.push_back(end);
    const std::string metrics = testing::MetricsEndpoint(d);
    ASSERT_TRUE(raw.Submit(2, std::move(record)));
    // Go away once the recording has yielded its thread at least once (or is over).
    for (int i = 0; i < 20000; ++i) {
      const std::string body = testing::ResponseBody(testing::Scrape(metrics));
      if (testing::Value(body, "ferry_enqueue_yields_total") > 0) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    cancelled_while_recording = d.AdminStatus().submits_in_flight() > 0;
  }  // cancels the call
  std::printf("the client went away %s\n", cancelled_while_recording
                                               ? "while its recording was in flight"
                                               : "after its recording was done");
  bool released = false;
  for (int i = 0; i < 1000 && !released; ++i) {
    const v1::StatusReply now = d.AdminStatus();
    released =
        now.sessions_open() == idle.sessions_open() && now.live_tensors() == idle.live_tensors() &&
        now.device_bytes_in_use() == idle.device_bytes_in_use() && now.submits_in_flight() == 0;
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(released) << d.AdminStatus().DebugString();

  bystander->axpy(1.0, b, b);
  auto back = bystander->download<double>(b);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, std::vector<double>(64, 2.0));
  // A new session records and replays a graph on the same device.
  auto s = client->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Tensor x = s->create_tensor<double>({64});
  Tensor one = s->create_tensor<double>({64});
  s->fill(x, 0.0);
  s->fill(one, 1.0);
  Graph g = s->begin_graph();
  for (int i = 0; i < 100; ++i) s->axpy(1.0, one, x);
  s->end_graph();
  s->launch_graph(g);
  auto xs = s->download<double>(x);
  ASSERT_TRUE(xs.ok()) << xs.status().ToString();
  EXPECT_EQ(*xs, std::vector<double>(64, 100.0));
  EXPECT_TRUE(s->close().ok());
  EXPECT_TRUE(bystander->close().ok());
}

}  // namespace
}  // namespace ferry
