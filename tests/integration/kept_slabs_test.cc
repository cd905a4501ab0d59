// Kept slabs (docs/protocol.md, "Kept slabs"): a local session closed with its stream kept
// may hand the slabs no buffer uses to the next session on that stream, which the same
// client has mapped, instead of the daemon destroying them and making fresh ones. They never
// go to another stream, and they go back to the pool when the stream is not kept or ends.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "metrics_scrape.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Create;
using testing::Eventually;
using testing::FerrydProcess;
using testing::MetricsEndpoint;
using testing::RawSlabConnection;
using testing::RawStream;
using testing::Scrape;
using testing::Value;

constexpr uint64_t kSlabBytes = 4ull << 20;

std::unique_ptr<FerrydProcess> StartDaemon() {
  return std::make_unique<FerrydProcess>(std::vector<std::string>{
      "--slab-size", "4M", "--pinned-budget", "64M", "--metrics-listen", "127.0.0.1:0"});
}

// This uid's slab bytes in the daemon, from its metrics (0 when it holds none).
double PinnedBytes(const std::string& metrics) {
  const double v = Value(Scrape(metrics), "ferry_uid_pinned_bytes",
                         "identity=\"uid:" + std::to_string(getuid()) + "\"");
  return std::max(v, 0.0);
}

v1::Op UploadFromSlab(uint64_t tensor, uint64_t slab, uint64_t slab_offset, uint64_t length) {
  v1::Op op;
  auto* u = op.mutable_upload_from_slab();
  u->set_tensor(tensor);
  u->set_slab(slab);
  u->set_slab_offset(slab_offset);
  u->set_length(length);
  return op;
}

v1::Op DownloadToSlab(uint64_t tensor, uint64_t slab, uint64_t slab_offset, uint64_t length) {
  v1::Op op;
  auto* d = op.mutable_download_to_slab();
  d->set_tensor(tensor);
  d->set_slab(slab);
  d->set_slab_offset(slab_offset);
  d->set_length(length);
  return op;
}

// Close with keep_stream, asking to keep `slabs`; the Closed that answers it.
std::optional<v1::Closed> CloseKeeping(RawStream& raw, const std::vector<uint64_t>& slabs) {
  v1::ClientMessage m;
  m.mutable_close()->set_keep_stream(true);
  for (uint64_t id : slabs) m.mutable_close()->add_keep_slabs(id);
  if (!raw.Send(m)) return std::nullopt;
  while (auto r = raw.Read()) {
    if (r->has_closed()) return r->closed();
  }
  return std::nullopt;
}

// libferry: the next session on a Client's kept stream allocates its buffers from the slab
// the last one left unused, already mapped, and moves bytes through it as through any slab.
TEST(KeptSlabsTest, TheNextSessionTakesOverTheSlabNoBufferUsed) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  auto client = Client::connect(d->unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  void* first_data = nullptr;
  {
    auto session = client->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    auto buffer = session->pinned_buffer(4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    ASSERT_TRUE(buffer->is_shared());
    first_data = buffer->data();
    *buffer = PinnedBuffer();  // nothing of the slab is in use at the close
    ASSERT_TRUE(session->close().ok());
  }
  // Kept with the stream: still held and charged to this uid.
  EXPECT_EQ(PinnedBytes(metrics), static_cast<double>(kSlabBytes));
  EXPECT_EQ(d->AdminStatus().slabs_in_use(), 1u);
  EXPECT_EQ(d->AdminStatus().slabs_kept(), 1u);
  EXPECT_EQ(Value(Scrape(metrics), "ferry_slab_pool_slabs_kept"), 1);

  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_EQ(Value(Scrape(metrics), "ferry_slabs_kept_total"), 1);
  auto buffer = session->pinned_buffer(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  EXPECT_EQ(buffer->data(), first_data) << "the kept slab's mapping was not reused";
  EXPECT_EQ(d->AdminStatus().slabs_in_use(), 1u) << "a fresh slab was taken besides the kept one";
  EXPECT_EQ(d->AdminStatus().slabs_kept(), 0u) << "the session's own slab still counts as kept";
  // Through the kept slab, both ways.
  std::vector<float> values = {1.5f, -2.0f, 3.25f, 8.0f};
  std::memcpy(buffer->data(), values.data(), sizeof(float) * values.size());
  Tensor t = session->create_tensor<float>({4});
  Transfer up = session->upload_pending(std::move(*buffer), std::move(t)).wait();
  ASSERT_TRUE(up.status.ok()) << up.status.ToString();
  std::memset(up.buffer.data(), 0, 16);
  Transfer down = session->download_pending(std::move(up.tensor), std::move(up.buffer)).wait();
  ASSERT_TRUE(down.status.ok()) << down.status.ToString();
  EXPECT_EQ(std::memcmp(down.buffer.data(), values.data(), 16), 0);
  down = Transfer();
  ASSERT_TRUE(session->close().ok());
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// A slab a buffer of the closed session still uses is not kept (the next session's buffers
// would share its bytes with that buffer): the next session gets a fresh one.
TEST(KeptSlabsTest, ASlabABufferStillUsesIsNotKept) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  auto client = Client::connect(d->unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto first = client->open_session();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto held = first->pinned_buffer(4096);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  std::memset(held->data(), 0x5a, 4096);
  ASSERT_TRUE(first->close().ok());

  auto second = client->open_session();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(Value(Scrape(metrics), "ferry_slabs_kept_total"), 0);
  auto buffer = second->pinned_buffer(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  const auto* bytes = static_cast<const unsigned char*>(buffer->data());
  EXPECT_TRUE(std::all_of(bytes, bytes + 4096, [](unsigned char b) { return b == 0; }))
      << "the new session's buffer has the bytes of a buffer of the last session";
  EXPECT_TRUE(second->close().ok());
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// Kept slabs belong to their stream: another client's session gets fresh memory, and a
// stream that names slab ids it never held (every small id) keeps none of them. When the
// stream that kept a slab ends, the slab goes back and its charge with it.
TEST(KeptSlabsTest, KeptSlabsNeverGoToAnotherStreamAndGoBackWithTheirs) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  auto connected = Client::connect(d->unix_target());
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  auto owner = std::make_unique<Client>(std::move(*connected));
  {
    auto session = owner->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    auto buffer = session->pinned_buffer(4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    std::memset(buffer->data(), 0xa5, 4096);
    *buffer = PinnedBuffer();
    ASSERT_TRUE(session->close().ok());
  }
  ASSERT_EQ(d->AdminStatus().slabs_in_use(), 1u);

  // Another client (its own stream) gets a fresh slab, zeros only.
  {
    auto other = Client::connect(d->unix_target());
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    auto session = other->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    auto buffer = session->pinned_buffer(4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    const auto* bytes = static_cast<const unsigned char*>(buffer->data());
    EXPECT_TRUE(std::all_of(bytes, bytes + 4096, [](unsigned char b) { return b == 0; }))
        << "another stream's session got the kept slab's bytes";
    *buffer = PinnedBuffer();
    ASSERT_TRUE(session->close().ok());
  }  // the other client goes, and the slab its stream kept with it

  // A raw stream names every small slab id at its Close; its next session keeps none.
  RawStream raw(d->unix_target(), std::chrono::seconds(60));
  ASSERT_TRUE(raw.Open());
  std::vector<uint64_t> guesses;
  for (uint64_t id = 0; id <= 64; ++id) guesses.push_back(id);
  guesses.push_back(~uint64_t{0});
  auto closed = CloseKeeping(raw, guesses);
  ASSERT_TRUE(closed && closed->stream_kept());
  auto next = raw.Open();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->kept_slabs_size(), 0) << "a stream kept slabs it never held";
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {4})}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  uint64_t submit = 1;
  for (uint64_t id : guesses) {
    ASSERT_TRUE(raw.Submit(++submit, {DownloadToSlab(1, id, 0, 16)}));
    EXPECT_EQ(raw.Completion(submit).kind(), v1::INVALID_HANDLE) << "slab " << id;
  }
  raw.Close();

  // The owner's stream ends with its client: the kept slab goes back, and its charge.
  EXPECT_TRUE(Eventually([&] { return PinnedBytes(metrics) == kSlabBytes; }))
      << PinnedBytes(metrics) << " bytes held, not the owner's kept slab alone";
  owner.reset();
  EXPECT_TRUE(Eventually([&] { return d->AdminStatus().slabs_in_use() == 0; }))
      << "a kept slab outlived its stream";
  EXPECT_EQ(d->AdminStatus().slabs_kept(), 0u);
  EXPECT_TRUE(Eventually([&] { return PinnedBytes(metrics) == 0; }));
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// Kept slabs are idle: another client short of room in the pinned budget gets it from them
// instead of QUOTA_EXCEEDED, and the client whose slabs went back still works (its next
// session takes a fresh slab).
TEST(KeptSlabsTest, AnotherClientShortOfRoomGetsItFromKeptSlabs) {
  FerrydProcess d({"--slab-size", "4M", "--pinned-budget", "8M", "--initial-slabs", "0"});
  ASSERT_TRUE(d.ok()) << d.log();
  auto keeper = Client::connect(d.unix_target());
  ASSERT_TRUE(keeper.ok()) << keeper.status().ToString();
  {
    auto session = keeper->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    auto a = session->pinned_buffer(kSlabBytes);
    auto b = session->pinned_buffer(kSlabBytes);
    ASSERT_TRUE(a.ok() && b.ok());
    *a = PinnedBuffer();
    *b = PinnedBuffer();
    ASSERT_TRUE(session->close().ok());
  }
  ASSERT_EQ(d.AdminStatus().slabs_in_use(), 2u) << "both slabs kept: the budget is full";
  EXPECT_EQ(d.AdminStatus().slabs_kept(), 2u);

  auto other = Client::connect(d.unix_target());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto session = other->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  auto buffer = session->pinned_buffer(4096);
  ASSERT_TRUE(buffer.ok()) << "kept slabs held the budget: " << buffer.status().ToString();
  EXPECT_EQ(d.AdminStatus().slabs_kept(), 0u) << "the oldest holder gives back all it kept";

  // The keeper's next session starts with nothing kept, and gets a fresh slab.
  auto next = keeper->open_session();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  auto mine = next->pinned_buffer(4096);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  std::memset(mine->data(), 7, 4096);
  Tensor t = next->create_tensor<uint8_t>({4096});
  Transfer up = next->upload_pending(std::move(*mine), std::move(t)).wait();
  EXPECT_TRUE(up.status.ok()) << up.status.ToString();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Raw protocol: the slab a session kept is the next one's (Opened.kept_slabs) without the
// slab socket; a Close that keeps nothing gives it back.
TEST(KeptSlabsTest, TheKeptSlabIsTheNextSessionsUntilAStreamKeepsNothing) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  RawStream raw(d->unix_target(), std::chrono::seconds(60));
  auto first = raw.Open();
  ASSERT_TRUE(first);
  RawSlabConnection slab(first->slab_socket());
  ASSERT_EQ(slab.Hello(first->slab_token()), 0);
  auto granted = slab.Acquire();
  ASSERT_TRUE(granted && granted->kind == 0 && granted->fd >= 0);
  auto* map = static_cast<char*>(
      mmap(nullptr, granted->size, PROT_READ | PROT_WRITE, MAP_SHARED, granted->fd, 0));
  ASSERT_NE(map, MAP_FAILED);
  const float values[4] = {4.0f, 3.0f, 2.0f, 1.0f};
  std::memcpy(map, values, sizeof(values));
  ASSERT_TRUE(
      raw.Submit(1, {Create(1, v1::DTYPE_F32, {4}), UploadFromSlab(1, granted->id, 0, 16)}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  auto closed = CloseKeeping(raw, {granted->id});
  ASSERT_TRUE(closed && closed->stream_kept());

  auto second = raw.Open();
  ASSERT_TRUE(second);
  ASSERT_EQ(second->kept_slabs_size(), 1);
  EXPECT_EQ(second->kept_slabs(0), granted->id);
  // The new session names the slab without a slab connection of its own.
  std::memset(map + 4096, 0, 16);
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {4}), UploadFromSlab(1, granted->id, 0, 16),
                             DownloadToSlab(1, granted->id, 4096, 16)}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(std::memcmp(map + 4096, values, 16), 0);
  EXPECT_EQ(d->AdminStatus().slabs_in_use(), 1u);

  closed = CloseKeeping(raw, {});
  ASSERT_TRUE(closed && closed->stream_kept());
  EXPECT_TRUE(Eventually([&] { return d->AdminStatus().slabs_in_use() == 0; }))
      << "a slab kept by no Close is still held";
  auto third = raw.Open();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->kept_slabs_size(), 0);
  ASSERT_TRUE(
      raw.Submit(1, {Create(1, v1::DTYPE_F32, {4}), DownloadToSlab(1, granted->id, 0, 16)}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::INVALID_HANDLE) << "a slab given back is still named";
  EXPECT_EQ(PinnedBytes(metrics), 0);
  raw.Close();
  munmap(map, granted->size);
  ::close(granted->fd);
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

}  // namespace
}  // namespace ferry
