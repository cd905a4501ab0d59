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
//   drain: Admin.Drain; exit 0 when granted, 7 when PERMISSION_DENIED.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/v1/admin.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET hang|exit\n", argv[0]);
    return 2;
  }
  auto client = ferry::Client::connect(argv[1]);
  if (!client.ok()) return 1;
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
    return other ? 3 : own ? 0 : 4;
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
