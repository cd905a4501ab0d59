// A small client program for tests that need a separate process: it opens a session,
// queues work, and then (mode "hang") waits to be killed, or (mode "exit") exits without
// closing. Shared-memory modes:
//   pending-drop: start a pending download, drop the handle, exit at once;
//   fill-slabs N: take N slab-sized pinned buffers, fill them with 0xA5, close;
//   zero-slabs N: take N slab-sized pinned buffers; exit 0 if every byte is 0, 3 if not;
//   pending-loop: pending uploads and downloads through pinned buffers in a loop, for ever;
//     prints "ready" (and flushes stdout) once transfers are going, to be killed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/client.h"

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
