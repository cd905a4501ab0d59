// Tenant isolation through a real ferryd: what one session wrote must never be readable by
// another, neither through a new tensor's device memory nor through a shared-memory slab the
// first session's client still maps after it ended, nor through the daemon's pinned staging
// that inline downloads pass through.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/v1/session.grpc.pb.h"
#include "ferryd_process.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::FerrydProcess;
using testing::RawSlabConnection;
using testing::RawStream;

// Item 1: a local session writes tensors of 4 KiB, 1 MiB and 64 MiB and frees them; a remote
// (TCP) session then creates tensors of the same sizes and downloads them without writing.
// Every byte it reads is zero.
TEST(IsolationTest, NewTensorsNeverShowAnotherSessionsBytes) {
  FerrydProcess d({"--allow-insecure-remote"}, /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  ASSERT_FALSE(d.tcp_target().empty());
  const std::vector<int64_t> sizes = {4 << 10, 1 << 20, 64 << 20};
  auto local = Client::connect(d.unix_target());
  auto remote = Client::connect(d.tcp_target());
  ASSERT_TRUE(local.ok() && remote.ok());
  auto a = local->open_session();
  auto b = remote->open_session();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (int round = 0; round < 3; ++round) {
    {
      std::vector<Tensor> written;
      for (int64_t n : sizes) {
        written.push_back(a->create_tensor<uint8_t>({n}));
        std::vector<uint8_t> secret(static_cast<size_t>(n), static_cast<uint8_t>(0xA5 + round));
        ASSERT_TRUE(a->upload(written.back(), secret).ok());
      }
      ASSERT_TRUE(a->synchronize().ok());
    }  // freed
    ASSERT_TRUE(a->synchronize().ok());
    for (int64_t n : sizes) {
      Tensor t = b->create_tensor<uint8_t>({n});
      auto seen = b->download<uint8_t>(t);
      ASSERT_TRUE(seen.ok()) << seen.status().ToString();
      ASSERT_EQ(seen->size(), static_cast<size_t>(n));
      const auto nonzero =
          std::count_if(seen->begin(), seen->end(), [](uint8_t v) { return v != 0; });
      EXPECT_EQ(nonzero, 0) << "round " << round << ": " << nonzero << " of " << n
                            << " bytes of a new tensor came from another session";
    }
  }
  EXPECT_TRUE(a->close().ok());
  EXPECT_TRUE(b->close().ok());
}

// Item 5: session A maps a slab and ends, its client keeping the mapping (nothing can take it
// back). Session B, of the same uid (tenants in containers often share one), then takes every
// slab the budget allows and writes a secret into each. A's old mapping never shows it: a
// slab a client held is never handed to another session.
TEST(IsolationTest, OldSlabMappingNeverSeesTheNextSessionsBytes) {
  constexpr uint64_t kSlab = 4u << 20;
  FerrydProcess d({"--slab-size", "4M", "--pinned-budget", "8M", "--initial-slabs", "0"});
  ASSERT_TRUE(d.ok()) << d.log();
  static constexpr char kSecret[] = "SESSION-B-SECRET";

  void* old_map = MAP_FAILED;
  {
    RawStream a(d.unix_target());
    auto opened = a.Open();
    ASSERT_TRUE(opened);
    RawSlabConnection conn(opened->slab_socket());
    ASSERT_EQ(conn.Hello(opened->slab_token()), 0);
    auto slab = conn.Acquire();
    ASSERT_TRUE(slab && slab->kind == 0);
    old_map = ::mmap(nullptr, kSlab, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd, 0);
    ASSERT_NE(old_map, MAP_FAILED);
    ::close(slab->fd);
    std::memset(old_map, 0x11, kSlab);
    a.Close();  // the session ends; the mapping stays
  }
  auto* old_bytes = static_cast<const char*>(old_map);
  // Wait for A's session to be gone (its slabs released).
  for (int i = 0; i < 500 && d.AdminStatus().slabs_in_use() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(d.AdminStatus().slabs_in_use(), 0u);

  for (int round = 0; round < 3; ++round) {
    RawStream b(d.unix_target());
    auto opened = b.Open();
    ASSERT_TRUE(opened);
    RawSlabConnection conn(opened->slab_socket());
    ASSERT_EQ(conn.Hello(opened->slab_token()), 0);
    std::vector<void*> maps;
    for (int i = 0; i < 2; ++i) {  // the whole budget
      auto slab = conn.Acquire();
      ASSERT_TRUE(slab);
      ASSERT_EQ(slab->kind, 0u) << "round " << round << " slab " << i;
      void* m = ::mmap(nullptr, kSlab, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd, 0);
      ASSERT_NE(m, MAP_FAILED);
      ::close(slab->fd);
      auto* bytes = static_cast<char*>(m);
      for (uint64_t off = 0; off + sizeof(kSecret) <= kSlab; off += 4096) {
        std::memcpy(bytes + off, kSecret, sizeof(kSecret));
      }
      maps.push_back(m);
    }
    for (uint64_t off = 0; off + sizeof(kSecret) <= kSlab; off += 4096) {
      ASSERT_NE(std::memcmp(old_bytes + off, kSecret, sizeof(kSecret)), 0)
          << "round " << round << ": session A's old mapping shows session B's secret at " << off;
    }
    for (void* m : maps) ::munmap(m, kSlab);
    b.Close();
    for (int i = 0; i < 500 && d.AdminStatus().slabs_in_use() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::munmap(old_map, kSlab);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Inline downloads go through the daemon's pinned staging, whose ranges are reused across
// sessions and never zeroed: what keeps another session's bytes out of a download is that
// chunks go out only for a submit that succeeded, and that the device wrote every byte of
// them. Session A fills staging with a secret (inline uploads and downloads, many rounds);
// session B then downloads a fresh tensor in a submit that fails at a later op (a Fill its
// dtype cannot hold, refused when enqueued): no chunk comes for it. B's download of the same
// fresh tensor in a submit that succeeds is all zeros.
TEST(IsolationTest, StagedDownloadsNeverShowAnotherSessionsBytes) {
  FerrydProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  constexpr uint64_t kBytes = 1 << 20;
  const std::string secret(kBytes, '\xA5');
  testing::RawStream a(d.unix_target(), std::chrono::seconds(60));
  ASSERT_TRUE(a.Open());
  ASSERT_TRUE(a.Submit(1, {testing::Create(1, v1::DTYPE_U8, {static_cast<int64_t>(kBytes)})}));
  ASSERT_EQ(a.Completion(1).kind(), v1::ERROR_KIND_NONE);
  for (uint64_t id = 2; id < 34; ++id) {
    std::string back;
    ASSERT_TRUE(
        a.Submit(id, {testing::InlineUpload(1, 0, secret), testing::Download(1, 0, kBytes)}));
    ASSERT_EQ(a.Completion(id, &back).kind(), v1::ERROR_KIND_NONE);
    ASSERT_EQ(back, secret);
  }
  a.Close();

  testing::RawStream b(d.unix_target(), std::chrono::seconds(60));
  ASSERT_TRUE(b.Open());
  for (uint64_t round = 0; round < 8; ++round) {
    const uint64_t h = 10 + round;
    const uint64_t id = 1 + 2 * round;
    std::string leaked;
    ASSERT_TRUE(
        b.Submit(id, {testing::Create(h, v1::DTYPE_U8, {static_cast<int64_t>(kBytes)}),
                      testing::Download(h, 0, kBytes), testing::Create(100 + h, v1::DTYPE_I32, {4}),
                      testing::Fill(100 + h, 1e20)}));
    v1::Error failed = b.Completion(id, &leaked);
    EXPECT_NE(failed.kind(), v1::ERROR_KIND_NONE) << "the Fill of 1e20 into i32 fails";
    EXPECT_EQ(failed.op_index(), 3) << failed.message();
    EXPECT_EQ(leaked.size(), 0u) << "a failed submit's download sent " << leaked.size()
                                 << " bytes, " << std::count(leaked.begin(), leaked.end(), '\xA5')
                                 << " of them session A's secret";
    // The tensor was created before the failing op: downloading it alone succeeds, zeros.
    std::string zeros;
    ASSERT_TRUE(b.Submit(id + 1, {testing::Download(h, 0, kBytes)}));
    ASSERT_EQ(b.Completion(id + 1, &zeros).kind(), v1::ERROR_KIND_NONE);
    ASSERT_EQ(zeros.size(), kBytes);
    EXPECT_EQ(std::count(zeros.begin(), zeros.end(), '\0'), static_cast<long>(kBytes))
        << "round " << round << ": a fresh tensor's staged download is not all zeros";
  }
  b.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

}  // namespace
}  // namespace ferry
