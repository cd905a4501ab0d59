// A small client program for tests that need a separate process: it opens a session,
// queues work, and then (mode "hang") waits to be killed, or (mode "exit") exits without
// closing. Shared-memory modes:
//   pending-drop: start a pending download, drop the handle, exit at once;
//   fill-slabs N: take N slab-sized pinned buffers, fill them with 0xA5, close;
//   zero-slabs N: take N slab-sized pinned buffers; exit 0 if every byte is 0, 3 if not;
//   pending-loop: pending uploads and downloads through pinned buffers in a loop, for ever;
//     prints "ready" (and flushes stdout) once transfers are going, to be killed.
// Access modes (for tests run as another user; each prints what it saw):
//   raw-kernel: one submit that creates a tensor and loads a PTX module; exits with the
//     ErrorKind number the submit failed with (0: it succeeded). A refusal must be whole:
//     when it is PERMISSION_DENIED the tensor must not exist (else exit 101), and the session
//     must go on serving built-in ops (else exit 100);
//   list-sessions: with this session open, Admin.ListSessions; exit 0 when it lists this
//     session and no session of another uid, 3 when it lists another uid's, 4 when not its own;
//     5 when it lists another uid's usage identity, 6 when none of its own;
//   drain: Admin.Drain; exit 0 when granted, 7 when PERMISSION_DENIED.
// Soak mode (tests/integration/soak_test.cc): `soak THREADS SECONDS` runs THREADS sessions
//   at once, each on a thread of its own, mixing blocking and pending pinned transfers, ops
//   and submit floods (with a session closed and reopened now and then) until SECONDS have
//   passed; every result is checked. Prints "soak: N rounds, E errors" and exits 0 only
//   when E is 0 (each error is printed to stderr).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/v1/admin.grpc.pb.h"

namespace {

std::atomic<uint64_t> soak_errors{0};
std::atomic<uint64_t> soak_rounds{0};
std::mutex soak_print_mu;

void SoakError(int thread, const std::string& what, const ferry::Status& s) {
  soak_errors++;
  std::lock_guard lock(soak_print_mu);
  std::fprintf(stderr, "soak thread %d: %s: %s\n", thread, what.c_str(), s.ToString().c_str());
}

// One session's share of the soak: until `until`, rounds of (a) a blocking upload and
// download, (b) a pending upload and download through pinned buffers, (c) ops checked by a
// download, (d) a flood of small submits; after the second round, and every 16th round after
// it, the session is closed and a new one opened (the second round, so that every session is
// churned even on a machine slow enough that a session makes fewer than 16 rounds in the soak:
// soak_test counts on it). Returns when the time is up or after an error (a soak counts errors, it
// does not retry them).
void SoakThread(ferry::Client& client, int index, std::chrono::steady_clock::time_point until) {
  constexpr int64_t kElements = 16 << 10;  // 64 KiB of f32
  auto opened = client.open_session();
  if (!opened.ok()) return SoakError(index, "open_session", opened.status());
  ferry::Session session = std::move(*opened);
  std::vector<float> up(kElements), down;
  for (uint64_t round = 0; std::chrono::steady_clock::now() < until; ++round) {
    const float v = static_cast<float>(index * 1000 + round % 1000);
    switch ((round + index) % 4) {
      case 0: {
        ferry::Tensor t = session.create_tensor<float>({kElements});
        for (int64_t i = 0; i < kElements; ++i) up[i] = v + static_cast<float>(i % 7);
        if (auto s = session.upload(t, up); !s.ok()) return SoakError(index, "upload", s);
        if (auto s = session.download_into(t, down); !s.ok()) {
          return SoakError(index, "download", s);
        }
        if (down != up) return SoakError(index, "download", ferry::Status::Ok());
        session.free(std::move(t));
        break;
      }
      case 1: {
        ferry::Tensor src = session.create_tensor<float>({kElements});
        ferry::Tensor dst = session.create_tensor<float>({kElements});
        auto ub = session.pinned_buffer(kElements * sizeof(float));
        auto db = session.pinned_buffer(kElements * sizeof(float));
        if (!ub.ok()) return SoakError(index, "pinned_buffer", ub.status());
        if (!db.ok()) return SoakError(index, "pinned_buffer", db.status());
        for (float& f : ub->span<float>()) f = v;
        ferry::Transfer u = session.upload_pending(std::move(*ub), std::move(src)).wait();
        if (!u.status.ok()) return SoakError(index, "upload_pending", u.status);
        session.copy(u.tensor, dst);
        ferry::Transfer d = session.download_pending(std::move(dst), std::move(*db)).wait();
        if (!d.status.ok()) return SoakError(index, "download_pending", d.status);
        for (float f : d.buffer.span<float>()) {
          if (f != v) return SoakError(index, "download_pending bytes", ferry::Status::Ok());
        }
        break;
      }
      case 2: {
        ferry::Tensor x = session.create_tensor<double>({256});
        ferry::Tensor y = session.create_tensor<double>({256});
        ferry::Tensor sum = session.create_tensor<double>({1});
        session.fill(x, 2.0);
        session.fill(y, 1.0);
        session.axpy(0.5, x, y);   // y = 2
        session.scale(y, 3.0, y);  // y = 6
        session.sum(y, sum);       // 1536
        auto got = session.download<double>(sum);
        if (!got.ok()) return SoakError(index, "ops", got.status());
        if ((*got)[0] != 1536.0) return SoakError(index, "ops value", ferry::Status::Ok());
        session.free(std::move(x));
        session.free(std::move(y));
        session.free(std::move(sum));
        break;
      }
      default: {  // a flood: many small submits back to back, then one wait
        ferry::Tensor t = session.create_tensor<float>({64});
        for (int i = 0; i < 200; ++i) {
          session.fill(t, i);
          if (auto s = session.submit(); !s.ok()) return SoakError(index, "flood submit", s);
        }
        if (auto s = session.synchronize(); !s.ok()) return SoakError(index, "flood sync", s);
        session.free(std::move(t));
        break;
      }
    }
    if (auto s = session.synchronize(); !s.ok()) return SoakError(index, "synchronize", s);
    soak_rounds++;
    if (round % 16 == 1) {
      if (auto c = session.close(); !c.ok()) return SoakError(index, "close", c.status());
      auto again = client.open_session();
      if (!again.ok()) return SoakError(index, "reopen", again.status());
      session = std::move(*again);
    }
  }
  if (auto c = session.close(); !c.ok()) SoakError(index, "close", c.status());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET hang|exit\n", argv[0]);
    return 2;
  }
  auto client = ferry::Client::connect(argv[1]);
  if (!client.ok()) return 1;
  if (std::strcmp(argv[2], "soak") == 0) {
    const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
    const int seconds = argc > 4 ? std::atoi(argv[4]) : 10;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&client, i, until] { SoakThread(*client, i, until); });
    }
    for (auto& t : pool) t.join();
    std::printf("soak: %llu rounds, %llu errors\n",
                static_cast<unsigned long long>(soak_rounds.load()),
                static_cast<unsigned long long>(soak_errors.load()));
    return soak_errors == 0 ? 0 : 1;
  }
  auto session = client->open_session();
  if (!session.ok()) return 1;
  std::string mode = argv[2];
  if (mode == "raw-kernel") {
    ferry::Tensor t = session->create_tensor<float>({16});
    session->load_module(ferry::ModuleFormat::kPtx, ".version 7.0\n.target sm_50\n");
    ferry::Status s = session->synchronize();
    std::printf("raw-kernel: %s\n", s.ToString().c_str());
    if (s.kind() == ferry::ErrorKind::kPermissionDenied) {
      std::vector<float> x(16, 1.0f);
      ferry::Status up = session->upload(t, x);
      std::printf("upload to the refused submit's tensor: %s\n", up.ToString().c_str());
      if (up.kind() != ferry::ErrorKind::kInvalidHandle) return 101;
    }
    ferry::Tensor u = session->create_tensor<float>({16});
    std::vector<float> y(16, 3.0f);
    if (!session->upload(u, y).ok()) return 100;
    auto back = session->download<float>(u);
    if (!back.ok() || *back != y) return 100;
    return static_cast<int>(s.kind());
  }
  if (mode == "gemm") {  // one small f32 GEMM, checked; prints its time with the synchronize
    ferry::Tensor a = session->create_tensor<float>({64, 64});
    ferry::Tensor c = session->create_tensor<float>({64, 64});
    session->fill(a, 1.0f);
    if (!session->synchronize().ok()) return 1;
    const auto start = std::chrono::steady_clock::now();
    session->gemm(a, a, c);
    ferry::Status s = session->synchronize();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    auto back = session->download<float>(c);
    const bool right = s.ok() && back.ok() && *back == std::vector<float>(64 * 64, 64.0f);
    std::printf("gemm: %s, %.1f ms%s\n", s.ToString().c_str(), ms, right ? "" : ", wrong result");
    return right ? 0 : 1;
  }
  if (mode == "list-sessions" || mode == "drain") {
    auto channel = grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials());
    auto stub = ferry::v1::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (mode == "drain") {
      ferry::v1::DrainReply reply;
      grpc::Status s = stub->Drain(&ctx, ferry::v1::DrainRequest(), &reply);
      std::printf("drain: %d %s\n", static_cast<int>(s.error_code()), s.error_message().c_str());
      if (s.ok()) return 0;
      return s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? 7 : 1;
    }
    ferry::v1::ListSessionsReply reply;
    grpc::Status s = stub->ListSessions(&ctx, ferry::v1::ListSessionsRequest(), &reply);
    if (!s.ok()) {
      std::printf("list-sessions: %s\n", s.error_message().c_str());
      return 1;
    }
    bool own = false;
    bool other = false;
    for (const auto& info : reply.sessions()) {
      std::printf("session %llu uid %u pid %d\n",
                  static_cast<unsigned long long>(info.session_id()), info.uid(), info.pid());
      if (info.uid() == ::getuid() && info.pid() == ::getpid()) own = true;
      if (!info.has_uid() || info.uid() != ::getuid()) other = true;
    }
    // Usage identities: this uid's only, its own among them.
    bool own_identity = false, other_identity = false;
    for (const auto& u : reply.identities()) {
      std::printf("identity uid %s client %s\n", u.uid().c_str(), u.client().c_str());
      (u.uid() == std::to_string(::getuid()) ? own_identity : other_identity) = true;
    }
    if (other) return 3;
    if (!own) return 4;
    if (other_identity) return 5;
    return own_identity ? 0 : 6;
  }
  if (mode == "fill-slabs" || mode == "zero-slabs") {
    int n = argc > 3 ? std::atoi(argv[3]) : 1;
    std::vector<ferry::PinnedBuffer> held;
    for (int i = 0; i < n; ++i) {
      auto b = session->pinned_buffer(session->slab_size());
      if (!b.ok() || !b->is_shared()) {
        std::fprintf(stderr, "pinned_buffer: %s\n", b.status().ToString().c_str());
        return 1;
      }
      auto bytes = b->span<unsigned char>();
      if (mode == "fill-slabs") {
        std::memset(bytes.data(), 0xA5, bytes.size());
      } else {
        for (unsigned char c : bytes) {
          if (c != 0) return 3;
        }
      }
      held.push_back(std::move(*b));
    }
    return session->close().ok() ? 0 : 1;
  }
  if (mode == "pending-loop") {
    const int64_t n = 1 << 19;  // 2 MiB of f32 per buffer
    ferry::Tensor up_t = session->create_tensor<float>({n});
    ferry::Tensor down_t = session->create_tensor<float>({n});
    session->fill(down_t, 3.0);
    auto up_b = session->pinned_buffer(n * sizeof(float));
    auto down_b = session->pinned_buffer(n * sizeof(float));
    if (!up_b.ok() || !down_b.ok()) return 1;
    ferry::PinnedBuffer ub = std::move(*up_b), db = std::move(*down_b);
    for (uint64_t i = 0;; ++i) {
      for (float& f : ub.span<float>()) f = static_cast<float>(i);
      auto pu = session->upload_pending(std::move(ub), std::move(up_t));
      auto pd = session->download_pending(std::move(down_t), std::move(db));
      if (i == 2) {
        std::printf("ready\n");
        std::fflush(stdout);
      }
      ferry::Transfer u = pu.wait();
      ferry::Transfer d = pd.wait();
      if (!u.status.ok() || !d.status.ok()) return 1;
      ub = std::move(u.buffer);
      up_t = std::move(u.tensor);
      db = std::move(d.buffer);
      down_t = std::move(d.tensor);
    }
  }
  if (mode == "pending-drop") {
    ferry::Tensor t = session->create_tensor<float>({1 << 20});
    session->fill(t, 2.0);
    auto buf = session->pinned_buffer(t.byte_size());
    if (!buf.ok()) return 1;
    { auto pending = session->download_pending(std::move(t), std::move(*buf)); }
    _exit(0);
  }
  ferry::Tensor a = session->create_tensor<double>({1 << 16});
  ferry::Tensor b = session->create_tensor<double>({1 << 16});
  session->fill(a, 1.0);
  if (!session->synchronize().ok()) return 1;
  for (int i = 0; i < 100; ++i) {
    session->axpy(0.5, a, b);
    if (!session->submit().ok()) return 1;
  }
  if (std::strcmp(argv[2], "exit") == 0) _exit(0);
  for (;;) pause();
}
