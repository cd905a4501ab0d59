// The submit ring (docs/protocol.md, "Submit ring") against a real ferryd: a raw client
// numbers its messages and sends some through the ring and some through the stream, and the
// daemon handles them in number order; every way of breaking the ring or the numbering ends
// that session with PROTOCOL_VIOLATION while another session goes on; libferry uses the ring,
// falls back to the stream when it is full, and loses nothing either way.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "library_checks.h"
#include "metrics_scrape.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Create;
using testing::Download;
using testing::FerrydProcess;
using testing::Fill;
using testing::InlineUpload;
using testing::RawRing;
using testing::RawSlabConnection;
using testing::RawStream;

v1::ClientMessage SubmitMessage(uint64_t sequence, uint64_t id, std::vector<v1::Op> ops) {
  v1::ClientMessage m;
  m.set_sequence(sequence);
  m.mutable_submit()->set_submit_id(id);
  for (auto& op : ops) *m.mutable_submit()->add_ops() = op;
  return m;
}

// Read until the stream ends; the kind of the Error it carried (ERROR_KIND_NONE: none).
v1::ErrorKind EndingError(RawStream& raw) {
  v1::ErrorKind kind = v1::ERROR_KIND_NONE;
  while (auto m = raw.Read()) {
    if (m->has_error()) kind = m->error().kind();
  }
  return kind;
}

// Close the session with a Close numbered `sequence`, through the ring: the stream then
// ends cleanly, with the session's Closed.
void CloseThroughRing(RawStream& raw, RawRing& ring, uint64_t sequence) {
  v1::ClientMessage close;
  close.set_sequence(sequence);
  close.mutable_close();
  ring.Write(close);
  bool closed = false;
  while (auto m = raw.Read()) closed |= m->has_closed();
  EXPECT_TRUE(closed);
  EXPECT_TRUE(raw.Finish().ok());
}

class SubmitRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<FerrydProcess>(std::vector<std::string>{"--submit-ring", "4K"});
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
  }
  void TearDown() override {
    if (!daemon_->ok()) return;
    v1::StatusReply s = daemon_->WaitIdle();
    EXPECT_EQ(s.sessions_open(), 0u);
    EXPECT_EQ(s.live_tensors(), 0u);
    for (int i = 0; i < 200 && daemon_->AdminStatus().submit_rings() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(daemon_->AdminStatus().submit_rings(), 0u) << "a ring outlived its session";
    EXPECT_EQ(daemon_->Stop(), 0) << daemon_->log();
  }
  std::unique_ptr<FerrydProcess> daemon_;
};

// Numbered messages through both paths, sent out of number order: the daemon handles them
// in number order (the download sees the fill numbered before it, not the one sent before it).
TEST_F(SubmitRingTest, BothPathsAreHandledInSequenceOrder) {
  RawStream raw(daemon_->unix_target());
  RawRing ring;
  ASSERT_TRUE(ring.OpenAndMap(raw));
  EXPECT_EQ(ring.capacity(), 4096u);

  v1::ClientMessage m3 = SubmitMessage(3, 3, {Fill(1, 3.0)});
  ASSERT_TRUE(raw.Send(m3));  // waits for 1 and 2
  ring.Write(SubmitMessage(1, 1, {Create(1, v1::DTYPE_F32, {4}), Fill(1, 1.0)}));
  ring.Write(SubmitMessage(2, 2, {Fill(1, 2.0), Download(1, 0, 4)}));
  ring.Write(SubmitMessage(4, 4, {Download(1, 0, 4)}));
  std::string chunks;
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(raw.Completion(2, &chunks).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(raw.Completion(3).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(raw.Completion(4, &chunks).kind(), v1::ERROR_KIND_NONE);
  ASSERT_EQ(chunks.size(), 8u);
  float values[2];
  std::memcpy(values, chunks.data(), 8);
  EXPECT_EQ(values[0], 2.0f);
  EXPECT_EQ(values[1], 3.0f);
  EXPECT_GE(daemon_->AdminStatus().submit_ring_messages_total(), 3u);

  CloseThroughRing(raw, ring, 5);
}

// A client that rings its doorbell without pause has its doorbell muted, but its ring is
// still read: every record it writes during the storm is taken and runs, in
// order, and its results are right.
TEST_F(SubmitRingTest, RecordsWrittenDuringADoorbellStormAreNotLost) {
  RawStream raw(daemon_->unix_target());
  RawRing ring;
  ASSERT_TRUE(ring.OpenAndMap(raw));
  std::atomic<bool> stop{false};
  std::thread ringer([&] {
    const uint64_t one = 1;
    for (int i = 0; i < 5'000'000 && !stop.load(std::memory_order_relaxed); ++i) {
      (void)!::write(ring.doorbell(), &one, sizeof(one));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // muted by now
  ring.Write(SubmitMessage(1, 1, {Create(1, v1::DTYPE_F32, {1})}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  std::string chunks;
  for (uint64_t id = 2; id <= 40; ++id) {
    ring.Write(SubmitMessage(id, id, {Fill(1, static_cast<double>(id)), Download(1, 0, 4)}));
  }
  for (uint64_t id = 2; id <= 40; ++id) {
    ASSERT_EQ(raw.Completion(id, &chunks).kind(), v1::ERROR_KIND_NONE) << id;
  }
  stop = true;
  ringer.join();
  ASSERT_EQ(chunks.size(), 39u * 4);
  for (uint64_t id = 2; id <= 40; ++id) {
    float v;
    std::memcpy(&v, chunks.data() + (id - 2) * 4, 4);
    EXPECT_EQ(v, static_cast<float>(id));
  }
  raw.Close();
}

// The doorbell a client is handed is its own: a client that makes it blocking (clears
// O_NONBLOCK on it, as any process holding an fd may) and never rings must not make the
// poller block when it next clears doorbells after a sleep, which would stop every other
// session's ring. (Found by review: the doorbell was an eventfd, whose O_NONBLOCK flag the
// daemon's descriptor and the client's share.)
TEST_F(SubmitRingTest, ADoorbellItsClientMadeBlockingStopsNoOtherRing) {
  RawStream hostile(daemon_->unix_target());
  RawRing hostile_ring;
  ASSERT_TRUE(hostile_ring.OpenAndMap(hostile));
  const int flags = ::fcntl(hostile_ring.doorbell(), F_GETFL);
  ASSERT_GE(flags, 0);
  ASSERT_EQ(::fcntl(hostile_ring.doorbell(), F_SETFL, flags & ~O_NONBLOCK), 0);
  // The poller spins, then sleeps (kSleepMax 50 ms at most), then clears every doorbell.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Bounded: on a stuck poller the other session's submits would never complete.
  RawStream other(daemon_->unix_target(), std::chrono::seconds(30));
  RawRing ring;
  ASSERT_TRUE(ring.OpenAndMap(other));
  ring.Write(SubmitMessage(1, 1, {Create(1, v1::DTYPE_F32, {1})}));
  ASSERT_EQ(other.Completion(1).kind(), v1::ERROR_KIND_NONE);
  for (uint64_t id = 2; id <= 5; ++id) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the poller sleeps again
    std::string chunks;
    ring.Write(SubmitMessage(id, id, {Fill(1, static_cast<double>(id)), Download(1, 0, 4)}));
    ASSERT_EQ(other.Completion(id, &chunks).kind(), v1::ERROR_KIND_NONE) << id;
    float v = 0;
    ASSERT_EQ(chunks.size(), 4u);
    std::memcpy(&v, chunks.data(), 4);
    EXPECT_EQ(v, static_cast<float>(id));
  }
  other.Close();
  hostile.Close();
}

// A client that keeps its ring's memfd after the session does not keep the daemon's pages:
// the ring's pages (the header the daemon writes, the records the client wrote) are punched
// out when the daemon lets the ring go, so they are charged to nobody any more.
TEST_F(SubmitRingTest, ARingsPagesGoWithTheSessionThoughItsClientKeepsTheMemfd) {
  int memfd = -1;
  {
    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    ASSERT_TRUE(opened && opened->submit_ring());
    RawSlabConnection conn(opened->slab_socket());
    ASSERT_EQ(conn.Hello(opened->slab_token()), 0);
    auto ring = conn.Ring();
    ASSERT_TRUE(ring && ring->kind == 0 && ring->fd >= 0);
    memfd = ring->fd;
    void* map = ::mmap(nullptr, ring->size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    ASSERT_NE(map, MAP_FAILED);
    std::memset(static_cast<char*>(map) + 4096, 0x5a, ring->size - 4096);  // the client's pages
    ::munmap(map, ring->size);
    struct stat st {};
    ASSERT_EQ(::fstat(memfd, &st), 0);
    EXPECT_GT(st.st_blocks, 0);
    raw.Close();
  }
  struct stat st {};
  EXPECT_TRUE(testing::Eventually([&] { return ::fstat(memfd, &st) == 0 && st.st_blocks == 0; }))
      << st.st_blocks << " blocks of the ring stayed after the session";
  ::close(memfd);
}

// The daemon takes ring records only while the session is below its in-flight limit (the
// way it stops reading the stream): a client that writes many submits into its ring at once
// is held back in the ring, and every submit still runs, in order.
TEST_F(SubmitRingTest, InFlightLimitHoldsForTheRing) {
  RawStream raw(daemon_->unix_target());
  auto opened = raw.OpenWithMaxInFlight(2);
  ASSERT_TRUE(opened);
  ASSERT_EQ(opened->max_in_flight_submits(), 2u);
  RawRing ring;
  ASSERT_TRUE(ring.Map(*opened));
  // Long enough for the sampler to see submits in flight: 1 MiB on the host backend, 64 MiB
  // on a GPU (as in BadInputTest.InFlightLimitHoldsAgainstAFastSender).
  const int64_t elements = testing::TestBackend() == "host" ? int64_t{1} << 18 : int64_t{1} << 24;
  ring.Write(SubmitMessage(1, 1, {Create(1, v1::DTYPE_F32, {elements})}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);

  testing::InFlightSampler sampler(*daemon_);
  constexpr uint64_t kSubmits = 12;
  std::thread writer([&] {  // as fast as the ring takes them: 100 fills (~1.5 KiB) each
    for (uint64_t n = 2; n < 2 + kSubmits; ++n) {
      ring.Write(SubmitMessage(n, n, std::vector<v1::Op>(100, Fill(1, static_cast<double>(n)))));
    }
    ring.Write(SubmitMessage(2 + kSubmits, 2 + kSubmits, {Download(1, 0, 4)}));
  });
  for (uint64_t id = 2; id < 2 + kSubmits; ++id) {
    EXPECT_EQ(raw.Completion(id).kind(), v1::ERROR_KIND_NONE) << "submit " << id;
  }
  std::string chunks;
  EXPECT_EQ(raw.Completion(2 + kSubmits, &chunks).kind(), v1::ERROR_KIND_NONE);
  writer.join();
  const uint64_t most_in_flight = sampler.Stop();
  ASSERT_EQ(chunks.size(), 4u);
  float value;
  std::memcpy(&value, chunks.data(), 4);
  EXPECT_EQ(value, static_cast<float>(1 + kSubmits)) << "the last fill ran last";
  EXPECT_LE(most_in_flight, 2u);
  EXPECT_GE(most_in_flight, 1u) << "the sampler never saw work in flight";
  raw.Close();
}

// Each way of breaking the ring or the numbering: the session ends with PROTOCOL_VIOLATION, its
// memory is freed, and a session opened beside it carries on.
TEST_F(SubmitRingTest, BrokenRingsAndNumbersEndOnlyThatSession) {
  struct Case {
    const char* what;
    std::function<void(RawStream&, RawRing&)> send;
  };
  const Case cases[] = {
      {"head past the ring", [](RawStream&, RawRing& r) { r.SetHead(r.capacity() * 2); }},
      {"length past head",
       [](RawStream&, RawRing& r) {
         r.Put32(0, 64);
         r.SetHead(16);
       }},
      {"bytes that do not parse", [](RawStream&, RawRing& r) { r.WriteBytes("\xff\xff\xff"); }},
      {"a message without a number through the ring",
       [](RawStream&, RawRing& r) { r.Write(SubmitMessage(0, 2, {Fill(1, 1.0)})); }},
      {"Open through the ring",
       [](RawStream&, RawRing& r) {
         v1::ClientMessage m;
         m.set_sequence(1);
         m.mutable_open()->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
         r.Write(m);
       }},
      {"a number repeated",
       [](RawStream&, RawRing& r) {
         r.Write(SubmitMessage(1, 2, {Fill(1, 1.0)}));
         r.Write(SubmitMessage(1, 3, {Fill(1, 1.0)}));
       }},
      {"an unnumbered message after numbered ones",
       [](RawStream& s, RawRing& r) {
         r.Write(SubmitMessage(1, 2, {Fill(1, 1.0)}));
         std::this_thread::sleep_for(std::chrono::milliseconds(50));
         s.Submit(3, {Fill(1, 1.0)});
       }},
      {"a number missing on both paths",
       [](RawStream& s, RawRing& r) {
         r.Write(SubmitMessage(3, 2, {Fill(1, 1.0)}));
         s.Send(SubmitMessage(4, 3, {Fill(1, 1.0)}));  // 1 and 2 never come
       }},
  };
  const v1::StatusReply start = daemon_->AdminStatus();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto good = Client::connect(daemon_->unix_target());
    ASSERT_TRUE(good.ok());
    auto bystander = good->open_session();
    ASSERT_TRUE(bystander.ok()) << bystander.status().ToString();
    Tensor t = bystander->create_tensor<float>({256});
    bystander->fill(t, 1.0f);

    RawStream raw(daemon_->unix_target());
    auto opened = raw.Open();
    ASSERT_TRUE(opened);
    ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {1 << 20})}));  // unnumbered: fine
    ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
    RawRing ring;
    ASSERT_TRUE(ring.Map(*opened));
    c.send(raw, ring);
    EXPECT_EQ(EndingError(raw), v1::PROTOCOL_VIOLATION);
    EXPECT_EQ(raw.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

    // The bystander was not disturbed.
    bystander->axpy(2.0f, t, t);
    auto v = bystander->download<float>(t);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ((*v)[255], 3.0f);
    t = Tensor();
    ASSERT_TRUE(bystander->close().ok());
  }
  v1::StatusReply end = daemon_->WaitIdle();
  EXPECT_EQ(end.live_tensors(), start.live_tensors());
  EXPECT_EQ(end.device_bytes_in_use(), start.device_bytes_in_use());
}

// libferry numbers its messages and writes them into the ring, waiting while the ring is
// full, and sends those over a quarter of the ring (here 1 KiB) through the stream. With a
// 4 KiB ring and many submits in flight, both paths interleave. All run, in order.
TEST_F(SubmitRingTest, LibferryUsesTheRingAndFallsBackToTheStreamInOrder) {
  auto client = Client::connect(daemon_->unix_target());
  ASSERT_TRUE(client.ok());
  auto s = client->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const uint64_t before = daemon_->AdminStatus().submit_ring_messages_total();
  Tensor x = s->create_tensor<float>({256});
  Tensor y = s->create_tensor<float>({256});
  s->fill(x, 1.0f);
  s->fill(y, 0.0f);
  // 2000 submits of axpy with alpha 1..7: every third of 80 ops (over 1 KiB: the stream), the
  // others of one op (the ring, which fills).
  double expected = 0;
  for (int i = 0; i < 2000; ++i) {
    const int ops = i % 3 == 0 ? 80 : 1;
    for (int k = 0; k < ops; ++k) {
      s->axpy(static_cast<float>(1 + i % 7), x, y);
      expected += 1 + i % 7;
    }
    ASSERT_TRUE(s->submit().ok());
  }
  auto v = s->download<float>(y);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ((*v)[0], static_cast<float>(expected));
  EXPECT_EQ((*v)[255], static_cast<float>(expected));
  const uint64_t through_ring = daemon_->AdminStatus().submit_ring_messages_total() - before;
  // The 1333 one-op submits (and the download's) came through the ring, the 667 of 80 ops
  // through the stream.
  EXPECT_GE(through_ring, 1333u);
  EXPECT_LT(through_ring, 1333u + 667u);
  x = Tensor();
  y = Tensor();
  ASSERT_TRUE(s->close().ok());
}

// A ring record larger than the ring poller parses (64 KiB; a ring larger than the default
// lets a client write records of megabytes) is parsed and handled on the long lane, not on
// the poller's thread that every session's ring shares. It is handled in its place among the
// records around it, and one that does not parse ends only its session.
TEST(SubmitRingLargeRecordTest, ARecordTooLargeForThePollerIsHandledInItsPlace) {
  FerrydProcess d({"--submit-ring", "1M", "--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(d.ok()) << d.log();
  auto long_lane_turns = [&] {
    return testing::Value(testing::ResponseBody(testing::Scrape(testing::MetricsEndpoint(d))),
                          "ferry_long_lane_turns_total");
  };
  const double turns_before = long_lane_turns();
  RawStream raw(d.unix_target());
  RawRing ring;
  ASSERT_TRUE(ring.OpenAndMap(raw));
  // 20000 fills of one value after another: about 280 KB.
  std::vector<v1::Op> fills;
  for (int i = 1; i <= 20000; ++i) fills.push_back(Fill(1, static_cast<double>(i % 7)));
  const v1::ClientMessage large = SubmitMessage(2, 2, fills);
  ASSERT_GT(large.ByteSizeLong(), 64u << 10);
  ring.Write(SubmitMessage(1, 1, {Create(1, v1::DTYPE_F32, {4}), Fill(1, 9.0)}));
  ring.Write(large);
  ring.Write(SubmitMessage(3, 3, {Download(1, 0, 16)}));
  std::string chunks;
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(raw.Completion(2).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(raw.Completion(3, &chunks).kind(), v1::ERROR_KIND_NONE);
  ASSERT_EQ(chunks.size(), 16u);
  float values[4];
  std::memcpy(values, chunks.data(), 16);
  for (float v : values) EXPECT_EQ(v, static_cast<float>(20000 % 7)) << "not the last fill's";
  EXPECT_GE(long_lane_turns(), turns_before + 1) << "the large record was not on the long lane";
  CloseThroughRing(raw, ring, 4);

  // A large record that does not parse: that session ends, and another goes on.
  auto good = Client::connect(d.unix_target());
  ASSERT_TRUE(good.ok());
  auto bystander = good->open_session();
  ASSERT_TRUE(bystander.ok()) << bystander.status().ToString();
  RawStream bad(d.unix_target());
  RawRing bad_ring;
  ASSERT_TRUE(bad_ring.OpenAndMap(bad));
  bad_ring.WriteBytes(std::string(100 << 10, '\xff'));
  EXPECT_EQ(EndingError(bad), v1::PROTOCOL_VIOLATION);
  ASSERT_NO_FATAL_FAILURE(testing::ExpectRoundTripAndClose(*bystander, 256, 2.0f));
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
}

// What the ring poller takes waits in the daemon until its session accepts the messages, so
// the poller takes no more bytes than the session, its identity and the daemon may still hold
// in flight (and one record), whatever the client has written: before, it took up to 32
// records (with a 16 MiB ring, 512 MiB), held while a missing number kept them waiting.
TEST(SubmitRingBoundTest, ThePollerTakesNoMoreThanTheInFlightBytesLeft) {
  FerrydProcess d({"--submit-ring", "1M", "--uid-limits", "uid:0:inflight-bytes=300K"});
  ASSERT_TRUE(d.ok()) << d.log();
  RawStream raw(d.unix_target());
  RawRing ring;
  ASSERT_TRUE(ring.OpenAndMap(raw));
  constexpr int64_t kElements = 50 << 10;  // an upload of 200 KiB a record
  // Numbers 2 to 5 through the ring, visible together; 1 is not sent yet, so they wait.
  std::vector<v1::ClientMessage> uploads;
  for (uint64_t n = 2; n <= 5; ++n) {
    uploads.push_back(SubmitMessage(
        n, n, {InlineUpload(1, 0, std::string(kElements * 4, static_cast<char>(n)))}));
  }
  const uint64_t before = d.AdminStatus().submit_ring_messages_total();
  ring.WriteTogether(uploads);
  uint64_t taken = 0;
  for (int i = 0; i < 500 && taken == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    taken = d.AdminStatus().submit_ring_messages_total() - before;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // and anything it takes after
  taken = d.AdminStatus().submit_ring_messages_total() - before;
  // 300 KiB of room: one record (200 KiB), one more since that is less than the room, no third.
  EXPECT_EQ(taken, 2u) << "records taken while the session could hold 300 KiB";

  // The missing number: everything runs, in order, and none is refused.
  ASSERT_TRUE(raw.Send(SubmitMessage(1, 1, {Create(1, v1::DTYPE_F32, {kElements})})));
  ring.Write(SubmitMessage(6, 6, {Download(1, 0, 4)}));
  std::string chunks;
  for (uint64_t id = 1; id <= 5; ++id) {
    EXPECT_EQ(raw.Completion(id).kind(), v1::ERROR_KIND_NONE) << "submit " << id;
  }
  EXPECT_EQ(raw.Completion(6, &chunks).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(chunks, std::string(4, '\x05')) << "not the last upload's bytes";
  CloseThroughRing(raw, ring, 7);
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
}

// What the poller takes from a ring at once goes to the device as runs (--submit-run): one
// completion watch per run, and one batch for consecutive one-op kernel submits. A client
// pipelining 3000 of them sees every result and every submit counted; close() counts the
// batches, and with runs off there are none and the result is the same.
TEST(SubmitRunTest, PipelinedOneOpSubmitsGoToTheDeviceAsBatches) {
  for (const char* runs : {"32", "0"}) {
    SCOPED_TRACE(std::string("--submit-run ") + runs);
    FerrydProcess daemon({"--submit-run", runs});
    ASSERT_TRUE(daemon.ok()) << daemon.log();
    auto client = Client::connect(daemon.unix_target());
    ASSERT_TRUE(client.ok());
    auto s = client->open_session();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Tensor x = s->create_tensor<double>({256});
    Tensor y = s->create_tensor<double>({256});
    s->fill(x, 1.0);
    s->fill(y, 0.0);
    ASSERT_TRUE(s->synchronize().ok());
    double expected = 0;
    for (int i = 0; i < 3000; ++i) {
      s->axpy(1 + i % 7, x, y);
      expected += 1 + i % 7;
      ASSERT_TRUE(s->submit().ok());
    }
    ASSERT_TRUE(s->synchronize().ok());
    auto v = s->download<double>(y);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, std::vector<double>(256, expected));
    x = Tensor();
    y = Tensor();
    auto stats = s->close();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->failed_submits, 0u);
    EXPECT_GE(stats->submits, 3002u);
    std::printf("--submit-run %s: %llu kernel batches for 3000 one-op submits\n", runs,
                static_cast<unsigned long long>(stats->kernel_batches));
    if (std::string(runs) == "0") {
      EXPECT_EQ(stats->kernel_batches, 0u);
    } else {
      // The client writes far faster than one-op submits run: runs form.
      EXPECT_GT(stats->kernel_batches, 0u);
    }
  }
}

// With rings off the daemon offers none, and libferry sends everything through the stream.
TEST(SubmitRingOffTest, NoRingWhenTheDaemonHasNone) {
  FerrydProcess daemon({"--submit-ring", "0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  RawStream raw(daemon.unix_target());
  auto opened = raw.Open();
  ASSERT_TRUE(opened);
  EXPECT_FALSE(opened->submit_ring());
  RawSlabConnection conn(opened->slab_socket());
  ASSERT_EQ(conn.Hello(opened->slab_token()), 0);
  auto ring = conn.Ring();
  ASSERT_TRUE(ring);
  EXPECT_EQ(ring->kind, static_cast<uint32_t>(v1::UNSUPPORTED));
  EXPECT_LT(ring->fd, 0);
  raw.Close();

  auto client = Client::connect(daemon.unix_target());
  ASSERT_TRUE(client.ok());
  auto s = client->open_session();
  ASSERT_TRUE(s.ok());
  Tensor t = s->create_tensor<float>({16});
  s->fill(t, 4.0f);
  auto v = s->download<float>(t);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ((*v)[15], 4.0f);
  t = Tensor();
  ASSERT_TRUE(s->close().ok());
  EXPECT_EQ(daemon.AdminStatus().submit_ring_messages_total(), 0u);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.log();
}

}  // namespace
}  // namespace ferry
