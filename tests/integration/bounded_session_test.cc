// A session's client must not be able to grow ferryd without bound: a client that
// writes and never reads (Synchronize, refused submits, downloads) is held back by the daemon
// instead of filling its memory, loses nothing once it reads, and does not hold up others;
// live objects and recorded graph ops per session are bounded; a submit too large for the
// session's in-flight bytes is refused. Each test runs a real ferryd on the host backend and
// asserts on the daemon's own gauges (metrics) plus a generous bound on its resident memory.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "metrics_scrape.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Create;
using testing::Download;
using testing::Eventually;
using testing::FerrydProcess;
using testing::Fill;
using testing::InlineUpload;
using testing::MetricsEndpoint;
using testing::RawRing;
using testing::RawStream;
using testing::Scrape;
using testing::Value;

// --- the daemon's metrics and memory ---------------------------------------------------------

// Resident memory of process `pid` in bytes, less its resident shared memory (VmRSS -
// RssShmem): the slabs and staging the daemon maps are memfds, paged in as they are first
// used (on CUDA, remote transfers' staging), and are bounded by --pinned-budget, not by what
// these tests bound. 0 when unreadable.
uint64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  uint64_t rss = 0, shmem = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6)) * 1024;
    if (line.rfind("RssShmem:", 0) == 0) shmem = std::stoull(line.substr(9)) * 1024;
  }
  return rss > shmem ? rss - shmem : 0;
}

// Fills of a 64 MiB tensor that keep a stream busy for a while (about a second) on the
// backend under test: a GPU writes 64 MiB in tens of microseconds, the host backend in tens
// of milliseconds.
int LongFillCount() { return testing::TestBackend() == "cuda" ? 20000 : 300; }

// Run `write` on a thread of its own (it writes and never reads), and return once the daemon
// stopped reading the stream (ferry_streams_paused) and the writer made no progress since the
// last look: the daemon pushes back, and the transport's window is full or the writer is done.
// Bounded: at most ~60 s of looking (a daemon that never pushes back reads all and is caught
// by the checks after).
class Flood {
 public:
  Flood(const std::string& metrics, std::function<bool(int)> write, int messages)
      : thread_([this, write = std::move(write), messages] {
          for (int i = 1; i <= messages; ++i) {
            if (!write(i)) break;
            ++sent_;
          }
          done_ = true;
        }) {
    int last = -1;
    for (int i = 0; i < 600; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const bool paused = Value(Scrape(metrics), "ferry_streams_paused") >= 1;
      const int now = sent_;
      if (paused && now == last) break;
      last = now;
    }
  }
  ~Flood() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  int sent() const { return sent_; }
  bool done() const { return done_; }

 private:
  std::atomic<int> sent_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// The daemon's backpressure gauges stay within what the session's limits allow.
void ExpectBounded(const std::string& metrics, uint64_t max_in_flight, uint64_t in_flight_bytes) {
  const std::string body = Scrape(metrics);
  const double unanswered = Value(body, "ferry_stream_unanswered_messages");
  const double unsent = Value(body, "ferry_stream_unsent_messages");
  const double bytes = Value(body, "ferry_stream_in_flight_bytes");
  const double unsent_bytes = Value(body, "ferry_stream_unsent_bytes");
  ASSERT_GE(unanswered, 0) << "no ferry_stream_unanswered_messages in\n" << body;
  ASSERT_GE(unsent, 0) << "no ferry_stream_unsent_messages in\n" << body;
  // A message being read and one held ahead may count besides the limit.
  EXPECT_LE(unanswered, static_cast<double>(max_in_flight + 2));
  EXPECT_LE(unsent, static_cast<double>(max_in_flight + 2 + 2 * in_flight_bytes / (1 << 20)));
  EXPECT_LE(bytes, 2.0 * static_cast<double>(in_flight_bytes));
  EXPECT_LE(unsent_bytes, 2.0 * static_cast<double>(in_flight_bytes));
  EXPECT_GE(Value(body, "ferry_stream_read_pauses_total"), 1) << "the daemon never pushed back";
}

// Another session on the same daemon works meanwhile.
void ExpectAnotherSessionWorks(const FerrydProcess& d) {
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<double> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) * 0.5;
  Tensor t = session->create_tensor<double>({static_cast<int64_t>(v.size())});
  ASSERT_TRUE(session->upload(t, v).ok());
  auto back = session->download<double>(t);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, v);
  ASSERT_TRUE(session->close().ok());
}

// Start a daemon with a metrics endpoint. Under AddressSanitizer a process keeps up to
// 256 MiB of the memory it freed in quarantine, resident, and gives free memory back to the
// system rarely; these tests bound what the daemon holds, so the daemons they start keep at
// most 16 MiB in quarantine (a use after free of what is in it is still caught) and release
// free memory every 100 ms. Measured with SessionsTogetherHoldAtMostTheDaemonsInFlightBytes
// (at most 59 MB held): the plain daemon grew 90 MiB; under ASan 411 MiB with its defaults
// (a CI failure), 103-294 MiB in three runs with these. Set whenever the build has ASan, not
// only when ASAN_OPTIONS is (tests/run.sh sets it): a plain `ctest` in an ASan build grew
// the flooded daemons by 320-390 MiB without them.
FerrydProcess* StartDaemon(std::unique_ptr<FerrydProcess>& d, std::vector<std::string> args,
                           bool tcp = false) {
  args.push_back("--metrics-listen");
  args.push_back("127.0.0.1:0");
  testing::ScopedSmallAsanQuarantine small_quarantine;
  d = std::make_unique<FerrydProcess>(std::move(args), tcp);
  return d.get();
}

// A daemon started with StartDaemon(args, tcp), for the tests of streams without a session.
// Check d->ok() first.
struct MeteredDaemon {
  explicit MeteredDaemon(std::vector<std::string> args, bool tcp = false)
      : d(StartDaemon(owner, std::move(args), tcp)), metrics(d->ok() ? MetricsEndpoint(*d) : "") {}
  // The value of metric `name` (with `label`, as Value takes it) on a fresh scrape.
  double value(const std::string& name, const std::string& label = "") const {
    return Value(Scrape(metrics), name, label);
  }
  // Where each of these tests ends: another session works, and the daemon exits cleanly.
  void ExpectAnotherSessionWorksAndStop() const {
    ExpectAnotherSessionWorks(*d);
    EXPECT_EQ(d->Stop(), 0) << d->log();
  }

  std::unique_ptr<FerrydProcess> owner;
  FerrydProcess* d;
  std::string metrics;
};

// A channel to `target`, connected; nullptr when it did not connect within 10 s.
std::shared_ptr<grpc::Channel> ConnectedChannel(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return nullptr;
  }
  return channel;
}

// A client's Open (the current protocol version) and Close messages.
v1::ClientMessage OpenMessage() {
  v1::ClientMessage open;
  open.mutable_open()->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  return open;
}
v1::ClientMessage CloseMessage(bool keep_stream = false) {
  v1::ClientMessage close;
  close.mutable_close()->set_keep_stream(keep_stream);
  return close;
}

// Resident memory may grow this much during a flood (gRPC's own buffers, the allocator): far
// below what the floods below made the daemon hold before it pushed back (≥ 80 MiB each).
constexpr uint64_t kRssGrowthBound = 48ull << 20;

// The daemon's memory after a flood of kFloodStreams streams that it resets or ends as they come
// (holding at most what its limits allow, which the gauges check): printed, not asserted. Held,
// such streams cost 14-20 KiB each (280-400 MiB; measured before the bounds); reset, the plain
// daemon still grew by 39-74 MiB for 20,000 over a Unix socket and by 56-280 MiB over TCP,
// depending on the machine's load (measured on the development machine): gRPC frees a reset
// stream only when it gets to it, so what a flood costs while it lasts is not bounded
// (docs/operations.md, "Streams without a session").
constexpr int kFloodStreams = 20000;
// How long a flood may take to be made and answered: 6-45 s as a rule, past 60 s once under
// ASan with CI's other tests beside it (14145 streams by then). A bound, not a timing: the
// waits end as soon as the flood is done, and ctest's 300 s per test still holds.
constexpr int kFloodSeconds = 180;
void PrintFloodRss(uint64_t before, uint64_t after, const char* what) {
  std::printf("ferryd RSS %llu -> %llu KiB after %d %s (not asserted: see PrintFloodRss)\n",
              static_cast<unsigned long long>(before >> 10),
              static_cast<unsigned long long>(after >> 10), kFloodStreams, what);
}

// What one flood test varies: the messages a client writes and never reads, and what each
// answer must be once it reads.
struct FloodCase {
  int messages = 0;
  // Send message i (1-based) on the writer's thread; false when the stream ended.
  std::function<bool(int)> write;
  // Read the answer to message i and check it (with ASSERTs: a fatal failure stops the
  // reading).
  std::function<void(int)> read_answer;
  uint64_t in_flight_bytes = 256ull << 20;  // the daemon's session-in-flight-bytes
  uint64_t rss_growth_bound = kRssGrowthBound;
  const char* sent_what = "messages sent";  // for the RSS line
};

struct FloodResult {
  int sent_while_held = 0;  // what the writer had sent when the daemon held it back
  int sent = 0;             // what it sent in all, once every answer was read
};

// Flood `d` from a writer thread that never reads, until the daemon stops reading; check that
// its backpressure gauges (ExpectBounded, with the session's `max_in_flight`) and its RSS
// stay bounded and that another session works meanwhile; then read every answer, in order,
// while the writer finishes.
FloodResult FloodThenReadEveryAnswer(const FerrydProcess& d, const std::string& metrics,
                                     uint64_t max_in_flight, const FloodCase& c) {
  FloodResult result;
  const uint64_t rss_before = RssBytes(d.pid());
  Flood flood(metrics, c.write, c.messages);
  ExpectBounded(metrics, max_in_flight, c.in_flight_bytes);
  const uint64_t rss = RssBytes(d.pid());
  result.sent_while_held = flood.sent();
  std::printf("ferryd RSS %llu -> %llu KiB after %d %s\n",
              static_cast<unsigned long long>(rss_before >> 10),
              static_cast<unsigned long long>(rss >> 10), result.sent_while_held, c.sent_what);
  EXPECT_LT(rss, rss_before + c.rss_growth_bound)
      << "ferryd grew from " << rss_before << " to " << rss << " bytes";
  ExpectAnotherSessionWorks(d);
  for (int i = 1; i <= c.messages; ++i) {
    c.read_answer(i);
    if (::testing::Test::HasFatalFailure()) return result;
  }
  flood.Join();
  result.sent = flood.sent();
  return result;
}

// Send `m`, message `i` of a flood, letting gRPC hold it back to go with later ones but for
// every 1024th, which flushes them: a flood of small messages goes faster.
bool SendFloodMessage(RawStream& raw, const v1::ClientMessage& m, int i) {
  return i % 1024 == 0 ? raw.Send(m) : raw.SendBuffered(m);
}

// Read the Completed of submits [first, end), in order, and expect each to have succeeded.
void ExpectEachSubmitSucceeds(RawStream& raw, uint64_t first, uint64_t end) {
  for (uint64_t id = first; id < end; ++id) {
    v1::Error e = raw.Completion(id);
    ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << "submit " << id << ": " << e.message();
  }
}

// A daemon started with StartDaemon(args) and one raw session opened on it (asking for 1024
// submits in flight when `many_in_flight`): where the flood tests start. Check ok() first.
struct FloodedDaemon {
  explicit FloodedDaemon(std::vector<std::string> args, bool many_in_flight = false);
  bool ok() const { return d->ok() && opened.has_value(); }
  // FloodThenReadEveryAnswer on this daemon, with the session's max_in_flight_submits.
  FloodResult Flood(const FloodCase& c) {
    return FloodThenReadEveryAnswer(*d, metrics, opened->max_in_flight_submits(), c);
  }
  // Close the session; expect no message left unanswered and the daemon to exit cleanly.
  void CloseAndStop() {
    raw->Close();
    EXPECT_EQ(Value(Scrape(metrics), "ferry_stream_unanswered_messages"), 0);
    EXPECT_EQ(d->Stop(), 0) << d->log();
  }

  std::unique_ptr<FerrydProcess> d;
  std::string metrics;
  std::unique_ptr<RawStream> raw;
  std::optional<v1::Opened> opened;
};

// --- 1. outbox and in-flight messages ------------------------------------------------------

// A client that sends Synchronize after Synchronize and reads nothing: the daemon stops
// reading at the in-flight limit (a Synchronize counts until its Synchronized is written),
// another session keeps working, and once the client reads it gets every answer in order.
TEST(BoundedSessionTest, UnreadSynchronizesAreHeldBackAndNoneIsLost) {
  FloodedDaemon f({});
  ASSERT_TRUE(f.ok()) << f.d->log();
  RawStream& raw = *f.raw;
  FloodCase c;
  c.messages = 600'000;  // ~140 bytes each held by a daemon that does not push back
  c.write = [&raw](int i) {
    v1::ClientMessage m;
    m.mutable_synchronize()->set_sync_id(static_cast<uint64_t>(i));
    return SendFloodMessage(raw, m, i);
  };
  c.read_answer = [&raw](int i) {
    auto m = raw.Read();
    ASSERT_TRUE(m) << "the stream ended after " << i - 1 << " answers";
    ASSERT_TRUE(m->has_synchronized()) << m->DebugString();
    ASSERT_EQ(m->synchronized().sync_id(), static_cast<uint64_t>(i));
  };
  FloodResult r = f.Flood(c);
  if (HasFatalFailure()) return;
  EXPECT_EQ(r.sent, c.messages);
  f.CloseAndStop();
}

// A refused submit (a fill of a tensor that does not exist) is read back as a Completed
// with INVALID_HANDLE.
void ReadRefusedCompletion(RawStream& raw, int i) {
  auto m = raw.Read();
  ASSERT_TRUE(m) << "the stream ended after " << i - 1 << " answers";
  ASSERT_TRUE(m->has_completed()) << m->DebugString();
  ASSERT_EQ(m->completed().submit_id(), static_cast<uint64_t>(i));
  ASSERT_EQ(m->completed().error().kind(), v1::INVALID_HANDLE);
}

// The same with submits the daemon refuses (a fill of a tensor that does not exist): a
// refused submit counts until its Completed is written.
TEST(BoundedSessionTest, UnreadRefusedSubmitsAreHeldBackAndNoneIsLost) {
  FloodedDaemon f({});
  ASSERT_TRUE(f.ok()) << f.d->log();
  RawStream& raw = *f.raw;
  FloodCase c;
  c.messages = 400'000;  // ~240 bytes each held by a daemon that does not push back
  c.write = [&raw](int i) {
    v1::ClientMessage m;
    m.mutable_submit()->set_submit_id(static_cast<uint64_t>(i));
    *m.mutable_submit()->add_ops() = Fill(99, 1.0);
    return SendFloodMessage(raw, m, i);
  };
  c.read_answer = [&raw](int i) { ReadRefusedCompletion(raw, i); };
  FloodResult r = f.Flood(c);
  if (HasFatalFailure()) return;
  EXPECT_EQ(r.sent, c.messages);
  f.CloseAndStop();
}

// The same through the submit ring: a client that fills its ring with refused submits and
// reads no answers is held back in its ring (the daemon stops taking records), and gets every
// answer once it reads.
TEST(BoundedSessionTest, UnreadAnswersStopTheSubmitRingToo) {
  FloodedDaemon f({"--submit-ring", "64K"});
  ASSERT_TRUE(f.ok()) << f.d->log();
  RawStream& raw = *f.raw;
  RawRing ring;
  ASSERT_TRUE(ring.Map(*f.opened)) << "no submit ring";
  FloodCase c;
  c.messages = 400'000;
  c.write = [&ring](int i) {
    v1::ClientMessage m;
    m.set_sequence(static_cast<uint64_t>(i));
    m.mutable_submit()->set_submit_id(static_cast<uint64_t>(i));
    *m.mutable_submit()->add_ops() = Fill(99, 1.0);
    ring.Write(m);
    return true;
  };
  c.read_answer = [&raw](int i) { ReadRefusedCompletion(raw, i); };
  c.sent_what = "ring records";
  FloodResult r = f.Flood(c);
  EXPECT_LT(r.sent_while_held, c.messages) << "the daemon took every record without pushing back";
  if (HasFatalFailure()) return;
  EXPECT_TRUE(raw.CloseNumbered(c.messages + 1));  // numbered, like every message before it
  EXPECT_EQ(f.d->Stop(), 0) << f.d->log();
}

// --- 3. bytes in flight ----------------------------------------------------------------------

// Download submits the client does not read: the daemon holds at most about twice the
// session's in-flight bytes for them, and every byte arrives once the client reads.
TEST(BoundedSessionTest, UnreadDownloadsAreHeldBackAtTheInFlightBytes) {
  FloodedDaemon f({"--session-in-flight-bytes", "16M"});
  ASSERT_TRUE(f.ok()) << f.d->log();
  RawStream& raw = *f.raw;
  constexpr uint64_t kTensor = 1 << 20;
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_U8, {kTensor}), Fill(1, 7.0)}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  FloodCase c;
  c.messages = 256;  // 256 MiB of downloads: a daemon without the bound holds them
  c.write = [&raw](int i) {
    v1::ClientMessage m;
    m.mutable_submit()->set_submit_id(static_cast<uint64_t>(i) + 1);
    *m.mutable_submit()->add_ops() = Download(1, 0, kTensor);
    return raw.Send(m);
  };
  c.read_answer = [&raw](int i) {
    std::string got;
    v1::Error e = raw.Completion(static_cast<uint64_t>(i) + 1, &got);
    ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
    ASSERT_EQ(got, std::string(kTensor, '\7')) << "submit " << i + 1;
  };
  c.in_flight_bytes = 16ull << 20;
  c.rss_growth_bound = 2 * kRssGrowthBound;
  c.sent_what = "submits sent";
  f.Flood(c);
  if (HasFatalFailure()) return;
  raw.Close();
  EXPECT_EQ(f.d->Stop(), 0) << f.d->log();
}

// Open `raw`'s session asking for 1024 submits in flight, so that the bytes in flight, not
// the count, are what holds a flood back; the Opened, or nothing.
std::optional<v1::Opened> OpenAskingForManyInFlight(RawStream& raw) {
  return raw.OpenWithMaxInFlight(1024);
}

FloodedDaemon::FloodedDaemon(std::vector<std::string> args, bool many_in_flight) {
  if (!StartDaemon(d, std::move(args))->ok()) return;
  metrics = MetricsEndpoint(*d);
  raw = std::make_unique<RawStream>(d->unix_target());
  opened = many_in_flight ? OpenAskingForManyInFlight(*raw) : raw->Open();
}

// One round of InlineUploadsInFlightStopAtTheInFlightBytes: a daemon whose session's stream
// is kept busy by `fills` fills of 64 MiB while a writer sends 64 uploads of 8 MiB behind
// them; what was seen until the daemon held the writer back, or until the writer was done.
struct UploadFloodRound {
  bool held = false;  // the daemon stopped reading with uploads still to send
  int sent = 0;       // uploads the writer had sent by then
  double most_bytes = -1;
  uint64_t rss_before = 0, most_rss = 0;
};

// Submit `id` of the upload floods: one inline upload of `bytes` into tensor 2, at offset 0.
v1::ClientMessage UploadSubmit(uint64_t id, const std::string& bytes) {
  v1::ClientMessage m;
  m.mutable_submit()->set_submit_id(id);
  *m.mutable_submit()->add_ops() = InlineUpload(2, 0, bytes);
  return m;
}

void FloodInlineUploads(int fills, UploadFloodRound& round) {
  FloodedDaemon f({"--session-in-flight-bytes", "32M"}, /*many_in_flight=*/true);
  ASSERT_TRUE(f.ok()) << f.d->log();
  FerrydProcess* d = f.d.get();
  const std::string& metrics = f.metrics;
  RawStream& raw = *f.raw;
  constexpr uint64_t kUpload = 8 << 20;
  // (Filled here, so that the emulated device memory they take is resident before measuring.)
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {16 << 20}),
                             Create(2, v1::DTYPE_U8, {kUpload}), Fill(1, 1.0), Fill(2, 1.0)}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  round.rss_before = RssBytes(d->pid());
  // Keep the session's stream busy, then send 64 uploads of 8 MiB behind.
  ASSERT_TRUE(raw.Submit(2, std::vector<v1::Op>(fills, Fill(1, 2.0))));
  constexpr int kSubmits = 64;
  std::atomic<int> sent{0};
  std::atomic<bool> done{false};
  std::thread writer([&] {
    const std::string bytes(kUpload, 'u');
    for (int i = 0; i < kSubmits; ++i) {
      if (!raw.Send(UploadSubmit(3 + static_cast<uint64_t>(i), bytes))) break;
      ++sent;
    }
    done = true;
  });
  // Watch until the writer is done, or the daemon stopped reading and the writer stalled.
  int last = -1;
  for (int i = 0; i < 600 && !done; ++i) {
    const std::string body = Scrape(metrics);
    round.most_bytes = std::max(round.most_bytes, Value(body, "ferry_stream_in_flight_bytes"));
    round.most_rss = std::max(round.most_rss, RssBytes(d->pid()));
    const int now = sent;
    if (Value(body, "ferry_streams_paused") >= 1 && now == last) {
      round.held = now < kSubmits;
      break;
    }
    last = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  round.most_rss = std::max(round.most_rss, RssBytes(d->pid()));
  round.sent = sent;
  ExpectEachSubmitSucceeds(raw, 2, 3 + kSubmits);
  writer.join();
  raw.Close();
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// Inline uploads held while the session's device is busy: the daemon reads 8 MiB upload
// submits only up to the session's in-flight bytes (a client asking for 1024 submits in
// flight could otherwise make it hold 1024 messages of up to 64 MiB), and all of them run.
// What is measured is the daemon holding the writer back while the fills run: where the
// device finished them before that was seen (a fast or a loaded machine; a CI run once saw
// the uploads flow through, every one answered in turn), the round is run again with three
// times the fills. A daemon that never holds back fails after the last round.
TEST(BoundedSessionTest, InlineUploadsInFlightStopAtTheInFlightBytes) {
  UploadFloodRound round;
  for (int fills = LongFillCount(), rounds = 0; rounds < 3; fills *= 3, ++rounds) {
    round = UploadFloodRound{};
    FloodInlineUploads(fills, round);
    if (HasFatalFailure()) return;
    std::printf("%d fills: ferryd RSS %llu -> at most %llu KiB, %d uploads sent, %s\n", fills,
                static_cast<unsigned long long>(round.rss_before >> 10),
                static_cast<unsigned long long>(round.most_rss >> 10), round.sent,
                round.held ? "held back" : "not held back before the fills were done");
    if (round.held) break;
  }
  ASSERT_TRUE(round.held) << "the daemon read every upload while the session's device was busy";
  EXPECT_GE(round.most_bytes, 0) << "no ferry_stream_in_flight_bytes";
  EXPECT_LE(round.most_bytes, 2.0 * (32 << 20));
  // 64 MiB of charged uploads, the transport's buffers and the allocator's slack: far below
  // the 512 MiB a daemon that read every upload would hold.
  // On the H200 the daemon's memory outside shared memory grew by 138-290 MiB in this test
  // (not yet broken down: CUDA's own host allocations are the likely part), so on CUDA the
  // daemon's own count above is the check; the same rpc code is bounded in RSS on the host
  // backend.
  if (testing::TestBackend() != "cuda") {
    EXPECT_LT(round.most_rss, round.rss_before + (128ull << 20))
        << "ferryd grew from " << round.rss_before << " to " << round.most_rss << " bytes";
  } else {
    std::printf("RSS bound not asserted on the cuda backend (see the comment above)\n");
  }
}

// One round of SessionsTogetherHoldAtMostTheDaemonsInFlightBytes: kFloodSessions sessions of
// one client, each with its stream kept busy by `fills` fills of 64 MiB and a writer sending
// 16 uploads of 8 MiB behind them, to a daemon whose in-flight-bytes is 64M (max-message
// 16M): what was seen until the writers stalled, and how every upload was answered.
constexpr int kFloodSessions = 6;
constexpr int kFloodUploads = 16;
struct ManySessionsRound {
  bool held = false;        // the writers stalled with uploads left to send
  double most_held = -1;    // ferry_in_flight_bytes, the most seen
  int refused = 0, ok = 0;  // uploads answered QUOTA_EXCEEDED (the daemon's limit), and OK
  uint64_t rss_before = 0, most_rss = 0;
};

void FloodInlineUploadsFromManySessions(int fills, ManySessionsRound& round) {
  std::unique_ptr<FerrydProcess> d;
  ASSERT_TRUE(StartDaemon(d, {"--in-flight-bytes", "64M", "--max-message", "16M"})->ok())
      << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  constexpr uint64_t kUpload = 8 << 20;
  std::vector<std::unique_ptr<RawStream>> raws;
  for (int k = 0; k < kFloodSessions; ++k) {
    raws.push_back(std::make_unique<RawStream>(d->unix_target()));
    ASSERT_TRUE(OpenAskingForManyInFlight(*raws.back()));
    ASSERT_TRUE(
        raws.back()->Submit(1, {Create(1, v1::DTYPE_F32, {16 << 20}),
                                Create(2, v1::DTYPE_U8, {kUpload}), Fill(1, 1.0), Fill(2, 1.0)}));
    ASSERT_EQ(raws.back()->Completion(1).kind(), v1::ERROR_KIND_NONE);
  }
  round.rss_before = RssBytes(d->pid());
  for (auto& raw : raws) ASSERT_TRUE(raw->Submit(2, std::vector<v1::Op>(fills, Fill(1, 2.0))));
  std::atomic<int> sent{0};
  std::atomic<int> writers_done{0};
  std::vector<std::thread> writers;
  for (auto& raw : raws) {
    writers.emplace_back([&sent, &writers_done, r = raw.get()] {
      const std::string bytes(kUpload, 'u');
      for (int i = 0; i < kFloodUploads; ++i) {
        v1::ClientMessage m;
        m.mutable_submit()->set_submit_id(3 + static_cast<uint64_t>(i));
        *m.mutable_submit()->add_ops() = InlineUpload(2, 0, bytes);
        if (!r->Send(m)) break;
        ++sent;
      }
      ++writers_done;
    });
  }
  int last = -1;
  for (int i = 0; i < 600 && writers_done < kFloodSessions; ++i) {
    const std::string body = Scrape(metrics);
    round.most_held = std::max(round.most_held, Value(body, "ferry_in_flight_bytes"));
    round.most_rss = std::max(round.most_rss, RssBytes(d->pid()));
    const int now = sent;
    if (Value(body, "ferry_streams_paused") >= 1 && now == last) {
      round.held = now < kFloodSessions * kFloodUploads;
      break;
    }
    last = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  round.most_rss = std::max(round.most_rss, RssBytes(d->pid()));
  // Every upload is answered once: run, or refused at the daemon's limit (nothing lost).
  for (auto& raw : raws) {
    ASSERT_EQ(raw->Completion(2).kind(), v1::ERROR_KIND_NONE);
    for (uint64_t id = 3; id < 3 + kFloodUploads; ++id) {
      v1::Error e = raw->Completion(id);
      if (e.kind() == v1::ERROR_KIND_NONE) {
        ++round.ok;
      } else {
        ASSERT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << "upload " << id << ": " << e.message();
        ASSERT_NE(e.message().find("--in-flight-bytes"), std::string::npos) << e.message();
        ++round.refused;
      }
    }
  }
  for (auto& w : writers) w.join();
  // All answered (each charge is given back once its Completed is written, which may be
  // just after the client read it): the daemon holds nothing, and takes an upload again.
  double held = -1;
  for (int i = 0; i < 500 && held != 0; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    held = Value(Scrape(metrics), "ferry_in_flight_bytes");
  }
  EXPECT_EQ(held, 0);
  ASSERT_TRUE(raws[0]->Submit(3 + kFloodUploads, {InlineUpload(2, 0, std::string(kUpload, 'v'))}));
  EXPECT_EQ(raws[0]->Completion(3 + kFloodUploads).kind(), v1::ERROR_KIND_NONE);
  for (auto& raw : raws) raw->Close();
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// Sessions together hold at most the daemon's in-flight bytes: one session's own limit
// (session-in-flight-bytes, 256M) times the sessions one uid may open is far more memory
// than a machine has. Six sessions each send 128 MiB of inline uploads behind long device
// work, 768 MiB in all, to a daemon whose in-flight-bytes is 64M: the daemon holds at most
// that (sessions that hold some stop reading near it; a submit past it is refused with
// QUOTA_EXCEEDED), its memory stays far below what it was sent, every upload is answered,
// and once all are, it holds nothing. (Its memory also holds what gRPC buffered for the
// paused streams, up to its flow-control window each, and the allocator's slack: 90-290 MiB
// in all on the development machine.) Rounds as in InlineUploadsInFlightStopAtTheInFlightBytes.
TEST(BoundedSessionTest, SessionsTogetherHoldAtMostTheDaemonsInFlightBytes) {
  ManySessionsRound round;
  for (int fills = LongFillCount() / 3, rounds = 0; rounds < 3; fills *= 3, ++rounds) {
    round = ManySessionsRound{};
    FloodInlineUploadsFromManySessions(fills, round);
    if (HasFatalFailure()) return;
    std::printf(
        "%d fills each: at most %.0f bytes held, ferryd RSS %llu -> at most %llu KiB; "
        "%d uploads ran, %d refused; %s\n",
        fills, round.most_held, static_cast<unsigned long long>(round.rss_before >> 10),
        static_cast<unsigned long long>(round.most_rss >> 10), round.ok, round.refused,
        round.held ? "held back" : "not held back before the fills were done");
    if (round.held) break;
  }
  ASSERT_TRUE(round.held) << "the daemon read every upload while the sessions' devices were busy";
  EXPECT_GE(round.most_held, 0) << "no ferry_in_flight_bytes";
  EXPECT_LE(round.most_held, 64 << 20);
  EXPECT_EQ(round.ok + round.refused, kFloodSessions * kFloodUploads);
  if (testing::TestBackend() != "cuda") {  // see InlineUploadsInFlightStopAtTheInFlightBytes
    EXPECT_LT(round.most_rss, round.rss_before + (384ull << 20))
        << "ferryd grew from " << round.rss_before << " to " << round.most_rss << " bytes";
  }
}

// One round of HeldStreamsBufferLittleInGrpc: 16 sessions allowed one submit in flight each,
// each held by long device work `scale` times as long (on the host backend 1800 fills of 4
// MiB; on a GPU a kernel spinning about 3 s: fills there are done too soon, and thousands
// of them would measure CUDA's graphs, not gRPC), and a writer per session sending 8 MiB
// uploads the daemon does not read meanwhile. How much ferryd grew over two seconds of that,
// and whether every session was still held at their end.
void HoldSixteenStreams(int scale, uint64_t& growth, bool& held) {
  const bool cuda = testing::TestBackend() == "cuda";
  std::unique_ptr<FerrydProcess> d;
  // The default configuration: rpc-bandwidth-probe on, which is for TCP endpoints only.
  ASSERT_TRUE(StartDaemon(d, {"--raw-kernels", "uid:" + std::to_string(getuid())})->ok())
      << d->log();
  constexpr int kStreams = 16;
  constexpr uint64_t kUploads = 12;
  std::vector<std::unique_ptr<RawStream>> raws;
  for (int k = 0; k < kStreams; ++k) {
    raws.push_back(std::make_unique<RawStream>(d->unix_target()));
    ASSERT_TRUE(raws.back()->OpenWithMaxInFlight(1));
    std::vector<v1::Op> setup{Create(1, v1::DTYPE_F32, {1 << 20}),
                              Create(2, v1::DTYPE_U8, {8 << 20})};
    if (cuda) setup.push_back(testing::LoadSpin(3));
    ASSERT_TRUE(raws.back()->Submit(1, std::move(setup)));
    ASSERT_EQ(raws.back()->Completion(1).kind(), v1::ERROR_KIND_NONE);
  }
  const uint64_t before = RssBytes(d->pid());
  std::vector<std::thread> writers;
  for (auto& raw : raws) {
    ASSERT_TRUE(raw->Submit(
        2, cuda ? std::vector<v1::Op>{testing::Spin(3, 1, 2.0f, 6'000'000'000ull * scale)}
                : std::vector<v1::Op>(1800 * scale, Fill(1, 2.0))));
    writers.emplace_back([r = raw.get(), kUploads] {
      const std::string bytes(8 << 20, 'u');
      for (uint64_t id = 3; id < 3 + kUploads; ++id) {
        v1::ClientMessage m;
        m.mutable_submit()->set_submit_id(id);
        *m.mutable_submit()->add_ops() = InlineUpload(2, 0, bytes);
        if (!r->Send(m)) break;
      }
    });
  }
  uint64_t most = before;
  for (int i = 0; i < 80; ++i) {
    most = std::max(most, RssBytes(d->pid()));
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  growth = most - before;
  held = d->AdminStatus().submits_in_flight() == kStreams;  // every long submit still runs
  for (auto& raw : raws) {
    for (uint64_t id = 2; id < 3 + kUploads; ++id) {
      v1::Error e = raw->Completion(id);
      ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << "submit " << id << ": " << e.message();
    }
  }
  for (auto& w : writers) w.join();
  for (auto& raw : raws) raw->Close();
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// A client that opens stream after stream on one connection and reads nothing: on a thread of
// its own, each stream sending `first` (if any); every stream's context is kept, so that the
// test can cancel them all.
class StreamHoarder {
 public:
  StreamHoarder(std::shared_ptr<grpc::Channel> channel, int attempts,
                std::vector<v1::ClientMessage> first)
      : stub_(v1::SessionService::NewStub(channel)),
        thread_([this, attempts, first = std::move(first)] {
          for (int i = 0; i < attempts && !stop_; ++i) {
            grpc::ClientContext* ctx;
            {
              std::lock_guard<std::mutex> lock(mu_);
              held_.push_back(Held{std::make_unique<grpc::ClientContext>(), nullptr});
              ctx = held_.back().ctx.get();
            }
            auto stream = stub_->Session(ctx);
            for (const auto& m : first) stream->Write(m);
            std::lock_guard<std::mutex> lock(mu_);
            held_.back().stream = std::move(stream);
            ++opened_;
          }
        }) {}
  ~StreamHoarder() { CancelAll(); }
  int opened() const {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_;
  }
  void CancelAll() {
    stop_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& h : held_) h.ctx->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
    for (auto& h : held_) {
      if (h.stream) h.stream->Finish();
    }
    held_.clear();  // finished once: CancelAll again does nothing
  }

 private:
  struct Held {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream;
  };
  std::unique_ptr<v1::SessionService::Stub> stub_;
  mutable std::mutex mu_;
  std::vector<Held> held_;
  int opened_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: it uses the members above
};

// Streams that never send Open, on one connection whose client reads nothing: the daemon holds
// at most max-sessionless-streams-per-uid (64 by default) of them and resets the rest at once;
// those it holds end at the open timeout, and, not closed by their client, still count (gRPC
// keeps them) until it does. Without these bounds 20,000 such streams were all held (ferryd
// grew by 408 MiB); refused but not reset, 10,000 grew it by 140 MiB (both measured), for as
// long as the client kept them.
TEST(BoundedSessionTest, StreamsThatNeverSendOpenAreHeldAtTheLimitOrReset) {
  MeteredDaemon m({"--open-timeout", "1000"});
  ASSERT_TRUE(m.d->ok()) << m.d->log();
  const auto channel = ConnectedChannel(m.d->unix_target());
  ASSERT_TRUE(channel);
  const uint64_t before = RssBytes(m.d->pid());
  constexpr int kStreams = kFloodStreams;
  constexpr int kHeld = 64;  // max-sessionless-streams-per-uid's default
  StreamHoarder hoarder(channel, kStreams, {});
  // Every stream is refused, or held until its open timeout (1 s; the flood may outlast it, and
  // a place comes back when gRPC lets an ended stream go).
  auto ended = [&] {
    const std::string body = Scrape(m.metrics);
    return Value(body, "ferry_streams_refused_total", "max_sessionless_per_uid") +
           Value(body, "ferry_streams_open_timeouts_total");
  };
  Eventually([&] { return hoarder.opened() >= kStreams && ended() >= kStreams; }, kFloodSeconds);
  const uint64_t after = RssBytes(m.d->pid());
  PrintFloodRss(before, after, "streams without Open");
  ASSERT_EQ(hoarder.opened(), kStreams);
  EXPECT_EQ(ended(), kStreams);
  EXPECT_GE(m.value("ferry_streams_refused_total", "max_sessionless_per_uid"), kStreams / 2);
  EXPECT_LE(m.value("ferry_streams_sessionless"), kHeld);
  // The client gives its streams up: their places come back, and sessions open again.
  hoarder.CancelAll();
  Eventually([&] { return m.value("ferry_streams_sessionless") == 0; }, 30);
  EXPECT_EQ(m.value("ferry_streams_sessionless"), 0);
  m.ExpectAnotherSessionWorksAndStop();
}

// A process that opens a session while its uid holds its maximum of streams without a session
// is reset, and libferry's open_session retries: the open succeeds once a place comes back,
// within the client's connect timeout.
TEST(BoundedSessionTest, AnOpenPastTheSessionlessLimitSucceedsOnceAPlaceComesBack) {
  MeteredDaemon m({"--max-sessionless-streams-per-uid", "2"});
  ASSERT_TRUE(m.d->ok()) << m.d->log();
  auto refused = [&] { return m.value("ferry_streams_refused_total", "max_sessionless_per_uid"); };
  // This uid's two places, taken by streams that send nothing.
  auto held = std::make_unique<RawStream>(m.d->unix_target());
  RawStream other(m.d->unix_target());
  Eventually([&] { return m.value("ferry_streams_sessionless") >= 2; }, 5);
  ASSERT_EQ(m.value("ferry_streams_sessionless"), 2);
  auto client = Client::connect(m.d->unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::atomic<bool> opened{false};
  Status status;
  std::thread opener([&] {
    auto session = client->open_session();
    status = session.ok() ? session->close().status() : session.status();
    opened = true;
  });
  Eventually([&] { return refused() >= 2; }, 5);
  EXPECT_GE(refused(), 2) << "the open was not refused and retried";
  EXPECT_FALSE(opened) << "the open got through past the limit";
  held.reset();  // a place comes back
  opener.join();
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(m.d->Stop(), 0) << m.d->log();
}

// A remote peer without the bearer token opening stream after stream and reading nothing:
// each is refused (UNAUTHENTICATED), and gRPC would keep each refused call until the client
// closes it; so 64 are held and told why, and further ones are reset at once; a peer with the
// token opens sessions meanwhile.
TEST(BoundedSessionTest, StreamsWithoutTheTokenAreHeldAtTheLimitOrReset) {
  const testing::TempFile token_file("the-token\n");
  ASSERT_FALSE(token_file.path().empty());
  MeteredDaemon m({"--token-file", token_file.path()}, /*tcp=*/true);
  ASSERT_TRUE(m.d->ok()) << m.d->log();
  const std::string tcp = m.d->tcp_target().substr(4);
  const auto channel = ConnectedChannel(tcp);
  ASSERT_TRUE(channel);
  const uint64_t before = RssBytes(m.d->pid());
  constexpr int kStreams = kFloodStreams;
  StreamHoarder hoarder(channel, kStreams, {});
  Eventually([&] { return hoarder.opened() >= kStreams; }, kFloodSeconds);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the last ones handled
  const uint64_t after = RssBytes(m.d->pid());
  PrintFloodRss(before, after, "streams without the token");
  ASSERT_EQ(hoarder.opened(), kStreams);
  EXPECT_LE(m.value("ferry_streams_unauthenticated"), 64);
  // None of them counted among the sessionless streams of the TCP identity, which the peers
  // with the token share. (gRPC names the peer of a call its interceptor has cancelled
  // "unknown", and the handler's check once went by the peer's address: each of the 20,000
  // was taken for a Unix endpoint's call and counted, 19,813 refused in one run, and under
  // load the peer below was refused as well.)
  EXPECT_EQ(m.value("ferry_streams_refused_total", "\"max_sessionless_per_uid\""), 0);
  // A peer with the token is not held back.
  ClientOptions options;
  options.bearer_token = "the-token";
  auto client = Client::connect(m.d->tcp_target(), options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  EXPECT_TRUE(session->close().ok());
  // Once the flood is gone, a stream without the token is told why again.
  hoarder.CancelAll();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  RawStream stranger(channel);
  EXPECT_FALSE(stranger.Read());
  EXPECT_EQ(stranger.Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(m.d->Stop(), 0) << m.d->log();
}

// Sessions whose client sends Open and Close and never reads: each session ends (the sessions
// limits count it no more), and its finished stream counts among the uid's sessionless streams
// until gRPC is done with it. gRPC mostly lets such a stream go without its client (2,000
// sessions, nothing left counted, on an idle machine), but not always (9 kept under ctest -j 2):
// those stay counted until the client closes them, and while the uid is at its limit its
// further streams are reset.
TEST(BoundedSessionTest, EndedSessionsWhoseClientNeverReadsCountUntilClosed) {
  MeteredDaemon m({"--max-sessionless-streams-per-uid", "16"});
  ASSERT_TRUE(m.d->ok()) << m.d->log();
  const auto channel = ConnectedChannel(m.d->unix_target());
  ASSERT_TRUE(channel);
  const v1::ClientMessage open = OpenMessage(), close = CloseMessage();
  constexpr int kStreams = 2000;
  StreamHoarder hoarder(channel, kStreams, {open, close});
  auto accounted = [&] {
    const std::string body = Scrape(m.metrics);
    return Value(body, "ferry_sessions_total") +
           Value(body, "ferry_streams_refused_total", "max_sessionless_per_uid");
  };
  Eventually([&] { return hoarder.opened() >= kStreams && accounted() >= kStreams; },
             kFloodSeconds);
  Eventually([&] { return m.value("ferry_sessions_open") == 0; }, 30);
  ASSERT_EQ(hoarder.opened(), kStreams);
  std::printf("%.0f of %d streams became sessions\n", m.value("ferry_sessions_total"), kStreams);
  EXPECT_EQ(accounted(), kStreams);
  EXPECT_GE(m.value("ferry_sessions_total"), 16);
  EXPECT_EQ(m.value("ferry_sessions_open"), 0);
  // A finished stream is held whatever the limit (Hold): the uid's ended sessions kept by gRPC
  // may pass it, but each was a session first (so at most its sessions limit more), and while
  // they pass it the uid's new streams are reset.
  EXPECT_LE(m.value("ferry_streams_sessionless"), 16 + m.value("ferry_sessions_total"));
  hoarder.CancelAll();
  Eventually([&] { return m.value("ferry_streams_sessionless") == 0; }, 30);
  EXPECT_EQ(m.value("ferry_streams_sessionless"), 0);
  m.ExpectAnotherSessionWorksAndStop();
}

// A raw HTTP/2 client (written from RFC 7540 and the gRPC wire format, no gRPC library)
// that advertises a stream window of 0: the daemon can send it HEADERS but no DATA, so every
// answer of every stream stays unwritten for as long as the client likes. It answers the
// daemon's SETTINGS and PINGs (a reader thread discards the rest) and never sends a
// WINDOW_UPDATE.
class ZeroWindowClient {
 public:
  explicit ZeroWindowClient(const std::string& unix_path) {
    fd_ = testing::ConnectUnix(unix_path);
    if (fd_ < 0) return;
    Write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    Frame(0x4, 0, 0, std::string("\x00\x04\x00\x00\x00\x00", 6));  // INITIAL_WINDOW_SIZE 0
    reader_ = std::thread([this] { Read(); });
  }
  ~ZeroWindowClient() {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    if (reader_.joinable()) reader_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return fd_ >= 0; }

  // Start a stream of the method `path` and send `messages` (serialized) on it, gRPC-framed,
  // without ending it.
  void Stream(const std::string& path, const std::vector<std::string>& messages) {
    const uint32_t id = next_stream_;
    next_stream_ += 2;
    std::string block;
    block += '\x83';  // :method POST (static table 3)
    block += '\x86';  // :scheme http (static table 6)
    auto literal = [&block](const std::string& name, const std::string& value) {
      block += '\x00';  // literal, not indexed, new name (lengths below 127)
      block += static_cast<char>(name.size());
      block += name;
      block += static_cast<char>(value.size());
      block += value;
    };
    literal(":path", path);
    literal(":authority", "localhost");
    literal("content-type", "application/grpc");
    literal("te", "trailers");
    Frame(0x1, 0x4, id, block);  // HEADERS, END_HEADERS
    std::string data;
    for (const std::string& bytes : messages) {
      data += '\x00';
      for (int shift = 24; shift >= 0; shift -= 8) data += static_cast<char>(bytes.size() >> shift);
      data += bytes;
    }
    Frame(0x0, 0, id, data);  // DATA, the stream left open
  }

 private:
  void Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
    std::string f;
    for (int shift = 16; shift >= 0; shift -= 8) f += static_cast<char>(payload.size() >> shift);
    f += static_cast<char>(type);
    f += static_cast<char>(flags);
    for (int shift = 24; shift >= 0; shift -= 8) f += static_cast<char>(stream >> shift);
    Write(f + payload);
  }
  void Write(const std::string& bytes) {
    std::lock_guard<std::mutex> lock(write_mu_);
    (void)!::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  void Read() {
    std::string in;
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
      while (in.size() >= 9) {
        const size_t length = (size_t{static_cast<unsigned char>(in[0])} << 16) |
                              (size_t{static_cast<unsigned char>(in[1])} << 8) |
                              static_cast<unsigned char>(in[2]);
        if (in.size() < 9 + length) break;
        const uint8_t type = static_cast<uint8_t>(in[3]), flags = static_cast<uint8_t>(in[4]);
        if (type == 0x4 && !(flags & 0x1)) Frame(0x4, 0x1, 0, "");  // SETTINGS: ACK
        if (type == 0x6 && !(flags & 0x1)) Frame(0x6, 0x1, 0, in.substr(9, length));  // PING
        in.erase(0, 9 + length);
      }
    }
  }

  int fd_ = -1;
  uint32_t next_stream_ = 1;
  std::mutex write_mu_;
  std::thread reader_;
};

// Streams whose answers can never be written (a client with a zero flow-control window that
// opens a session and closes it): once the session has ended, such a stream counts among its
// uid's sessionless streams (past the limit the uid's next streams are refused), and once the
// open timeout has passed without its answers written it is cancelled, though its client
// keeps its connection: nothing of it stays in the daemon. (Found by review: these streams
// were counted by no limit and never ended.)
TEST(BoundedSessionTest, StreamsWhoseAnswersCannotBeWrittenAreCountedAndCancelled) {
  MeteredDaemon m({"--max-sessionless-streams-per-uid", "8", "--open-timeout", "1000"});
  ASSERT_TRUE(m.d->ok()) << m.d->log();
  const v1::ClientMessage open = OpenMessage(), close = CloseMessage();
  ZeroWindowClient client(m.d->unix_target().substr(5));
  ASSERT_TRUE(client.connected());
  constexpr int kStreams = 40;
  for (int i = 0; i < kStreams; ++i) {
    client.Stream("/ferry.v1.SessionService/Session",
                  {open.SerializeAsString(), close.SerializeAsString()});
  }
  EXPECT_TRUE(Eventually([&] { return m.value("ferry_streams_finish_timeouts_total") >= 1; }, 30))
      << "no stream whose answers could not be written was cancelled";
  EXPECT_GE(m.value("ferry_streams_refused_total", "max_sessionless_per_uid"), 1)
      << "the stuck streams did not count against the uid's limit";
  EXPECT_TRUE(Eventually([&] { return m.value("ferry_streams_sessionless") == 0; }, 30))
      << "streams stayed in the daemon though their client keeps its connection";
  EXPECT_EQ(m.value("ferry_sessions_open"), 0);
  m.ExpectAnotherSessionWorksAndStop();
}

// Streams of the other streaming methods (gRPC's Health/Watch, server reflection) carry no
// session either, and count among their uid's sessionless streams: past its limit the uid's
// next ones are refused, and they give their places back when they end. (Found by review:
// nothing counted them, and each held gRPC's call state, reflection's a thread too.)
TEST(BoundedSessionTest, HealthWatchAndReflectionStreamsCountAsSessionless) {
  MeteredDaemon m({"--max-sessionless-streams-per-uid", "8"});
  ASSERT_TRUE(m.d->ok()) << m.d->log();
  {
    ZeroWindowClient client(m.d->unix_target().substr(5));
    ASSERT_TRUE(client.connected());
    for (int i = 0; i < 12; ++i) client.Stream("/grpc.health.v1.Health/Watch", {std::string()});
    for (int i = 0; i < 12; ++i) {
      client.Stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", {});
    }
    EXPECT_TRUE(Eventually([&] {
      return m.value("ferry_streams_refused_total", "max_sessionless_per_uid") >= 16;
    })) << "streams past the uid's limit were not refused";
    EXPECT_EQ(m.value("ferry_streams_sessionless"), 8);
  }  // the client goes: its streams end
  EXPECT_TRUE(Eventually([&] { return m.value("ferry_streams_sessionless") == 0; }))
      << "ended streams kept their places";
  m.ExpectAnotherSessionWorksAndStop();
}

// Clients that ask to keep their stream at Close and never read: each session's Closed waits
// for the session's unwritten download answers (the stream is kept or not only once they are
// written), and while it waits those answers stay charged to the daemon's in-flight bytes,
// within its limit; the sessions themselves are closed. Cancelled, the streams give
// everything back.
TEST(BoundedSessionTest, KeepingClosesOfClientsThatNeverReadStayCharged) {
  MeteredDaemon m({});
  ASSERT_TRUE(m.d->ok()) << m.d->log();
  const auto channel = ConnectedChannel(m.d->unix_target());
  ASSERT_TRUE(channel);
  v1::ClientMessage submit;
  submit.mutable_submit()->set_submit_id(1);
  *submit.mutable_submit()->add_ops() = Create(1, v1::DTYPE_U8, {4 << 20});
  for (int k = 0; k < 4; ++k) *submit.mutable_submit()->add_ops() = Download(1, k << 20, 1 << 20);
  constexpr int kStreams = 16;
  StreamHoarder hoarder(channel, kStreams,
                        {OpenMessage(), submit, CloseMessage(/*keep_stream=*/true)});
  EXPECT_TRUE(Eventually(
      [&] {
        return hoarder.opened() == kStreams && m.value("ferry_sessions_total") == kStreams &&
               m.value("ferry_sessions_open") == 0;
      },
      60))
      << "the sessions did not all close";
  const double charged = m.value("ferry_in_flight_bytes");
  std::printf("%d closed sessions, never read: %.0f bytes in flight\n", kStreams, charged);
  EXPECT_GT(charged, 0) << "unwritten answers went uncharged";
  EXPECT_LE(charged, m.value("ferry_in_flight_bytes_limit"));
  hoarder.CancelAll();
  EXPECT_TRUE(Eventually([&] {
    return m.value("ferry_in_flight_bytes") == 0 && m.value("ferry_submits_in_flight") == 0 &&
           m.value("ferry_streams_sessionless") == 0;
  })) << "cancelled streams kept what they held";
  m.ExpectAnotherSessionWorksAndStop();
}

// What gRPC buffers for local streams the daemon stops reading is small: gRPC takes a
// client's data up to the stream's receive window even when the daemon asks for none, and
// with its bandwidth probe it grows that window to 16 MiB or more per stream (16 held
// streams grew ferryd by 179-444 MiB on the development machine when the probe was on for
// every endpoint). The probe (rpc-bandwidth-probe, on by default) is for TCP endpoints only:
// a Unix endpoint's stream keeps about 1 MiB (6-17 MiB for the 16). Where the sessions' work
// was done before the two seconds were over, the round runs again with three times the fills.
TEST(BoundedSessionTest, HeldStreamsBufferLittleInGrpc) {
  uint64_t growth = 0;
  bool held = false;
  for (int scale = 1, rounds = 0; rounds < 3; scale *= 3, ++rounds) {
    HoldSixteenStreams(scale, growth, held);
    if (HasFatalFailure()) return;
    std::printf("long work x%d: 16 held streams grew ferryd by %llu KiB%s\n", scale,
                static_cast<unsigned long long>(growth >> 10),
                held ? "" : "; not held to the end of the two seconds");
    if (held) break;
  }
  ASSERT_TRUE(held) << "the sessions' long submits were done before the measurement was";
  if (testing::TestBackend() != "cuda") {  // see InlineUploadsInFlightStopAtTheInFlightBytes
    EXPECT_LT(growth, 48ull << 20) << "about 1 MiB per held stream expected, 16 streams";
  }
}

// The same bound through the submit ring: the ring poller hands a ring's queued records over
// together, and the connection handles them one by one, looking at the bytes in flight before
// each. Inline uploads written to the ring behind a long fill are taken only up to the
// session's in-flight bytes (the rest wait in the client's ring), and every one runs.
TEST(BoundedSessionTest, InlineUploadsThroughTheRingStopAtTheInFlightBytes) {
  FloodedDaemon f({"--session-in-flight-bytes", "16M", "--submit-ring", "4M"},
                  /*many_in_flight=*/true);
  ASSERT_TRUE(f.ok()) << f.d->log();
  const std::string& metrics = f.metrics;
  RawStream& raw = *f.raw;
  RawRing ring;
  ASSERT_TRUE(ring.Map(*f.opened)) << "no submit ring";
  constexpr uint64_t kUpload = 512 << 10;
  // Through the stream: the tensors (unnumbered, answered before anything is numbered), then
  // fills of 64 MiB that keep the session's stream busy while the uploads arrive (number 1:
  // the ring's records, numbered from 2, wait for it however the two paths race).
  ASSERT_TRUE(
      raw.Submit(1, {Create(1, v1::DTYPE_F32, {16 << 20}), Create(2, v1::DTYPE_U8, {kUpload})}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  {
    v1::ClientMessage fills;
    fills.set_sequence(1);
    fills.mutable_submit()->set_submit_id(2);
    for (int i = 0; i < LongFillCount(); ++i) *fills.mutable_submit()->add_ops() = Fill(1, 2.0);
    ASSERT_TRUE(raw.Send(fills));
  }
  constexpr int kSubmits = 100;  // 50 MiB of uploads: more than the ring and the bound
  std::atomic<int> sent{0};
  std::atomic<bool> done{false};
  std::thread writer([&] {
    const std::string bytes(kUpload, 'u');
    for (int i = 0; i < kSubmits; ++i) {
      v1::ClientMessage m = UploadSubmit(3 + static_cast<uint64_t>(i), bytes);
      m.set_sequence(2 + static_cast<uint64_t>(i));
      ring.Write(m);  // waits for room while the daemon holds back
      ++sent;
    }
    done = true;
  });
  double most_bytes = 0;
  bool paused = false;
  int last = -1;
  for (int i = 0; i < 600 && !done; ++i) {
    const std::string body = Scrape(metrics);
    most_bytes = std::max(most_bytes, Value(body, "ferry_stream_in_flight_bytes"));
    paused = paused || Value(body, "ferry_streams_paused") >= 1;
    const int now = sent;
    if (paused && now == last) break;
    last = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf(
      "%d of %d uploads written to the ring when the daemon held back; at most %.0f "
      "bytes in flight\n",
      sent.load(), kSubmits, most_bytes);
  EXPECT_TRUE(paused) << "the daemon never held the ring back";
  EXPECT_GE(most_bytes, 0) << "no ferry_stream_in_flight_bytes";
  EXPECT_LE(most_bytes, 2.0 * (16 << 20));
  ExpectEachSubmitSucceeds(raw, 2, 3 + kSubmits);
  writer.join();
  EXPECT_TRUE(raw.CloseNumbered(kSubmits + 2));  // numbered, like every message since the fills
  EXPECT_EQ(f.d->Stop(), 0) << f.d->log();
}

// One submit larger than the session's in-flight bytes is refused, typed: downloads of one
// tensor add up, an upload message counts whole; a download past the tensor is OUT_OF_RANGE.
TEST(BoundedSessionTest, ASubmitOverTheInFlightBytesIsQuotaExceeded) {
  std::unique_ptr<FerrydProcess> d;
  ASSERT_TRUE(StartDaemon(d, {"--session-in-flight-bytes", "16M"})->ok()) << d->log();
  RawStream raw(d->unix_target());
  ASSERT_TRUE(raw.Open());
  constexpr uint64_t kTensor = 6 << 20;
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_U8, {kTensor}), Create(2, v1::DTYPE_U8, {1}),
                             Create(3, v1::DTYPE_U8, {20 << 20})}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  // Downloads past the end of a 1-byte tensor.
  ASSERT_TRUE(raw.Submit(2, {Download(2, 0, 2)}));
  EXPECT_EQ(raw.Completion(2).kind(), v1::OUT_OF_RANGE);
  ASSERT_TRUE(raw.Submit(3, {Download(2, 1, 1)}));
  EXPECT_EQ(raw.Completion(3).kind(), v1::OUT_OF_RANGE);
  // Three downloads of the 6 MiB tensor: 18 MiB, over 16M together.
  ASSERT_TRUE(
      raw.Submit(4, {Download(1, 0, kTensor), Download(1, 0, kTensor), Download(1, 0, kTensor)}));
  v1::Error e = raw.Completion(4);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  // Two fit.
  std::string got;
  ASSERT_TRUE(raw.Submit(5, {Download(1, 0, kTensor), Download(1, 0, kTensor)}));
  EXPECT_EQ(raw.Completion(5, &got).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(got.size(), 2 * kTensor);
  // A 17 MiB upload in one message.
  ASSERT_TRUE(raw.Submit(6, {InlineUpload(3, 0, std::string(17 << 20, 'x'))}));
  e = raw.Completion(6);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  ASSERT_TRUE(raw.Submit(7, {InlineUpload(3, 0, std::string(8 << 20, 'x'))}));
  EXPECT_EQ(raw.Completion(7).kind(), v1::ERROR_KIND_NONE);
  raw.Close();
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// libferry's inline transfers (TCP: no shared memory; 8 MiB messages, pipelined) are held back
// at the smallest in-flight bytes a daemon may be given, never refused.
TEST(BoundedSessionTest, LibferryInlineTransfersFitTheSmallestInFlightBytes) {
  FerrydProcess d({"--session-in-flight-bytes", "16M"}, /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Client::connect(d.tcp_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<double> v(8 << 20);  // 64 MiB
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 1000) - 3.5;
  Tensor t = session->create_tensor<double>({static_cast<int64_t>(v.size())});
  ASSERT_TRUE(session->upload(t, v).ok());
  auto back = session->download<double>(t);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == v);
  ASSERT_TRUE(session->close().ok());
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// --- 2. objects per session ------------------------------------------------------------------

// Tensors past --session-max-tensors are refused (zero-byte ones too: the device quota does
// not count them); freeing one lets the session create one again.
TEST(BoundedSessionTest, TensorsPastTheLimitAreRefusedUntilOneIsFreed) {
  FerrydProcess d({"--session-max-tensors", "100"});
  ASSERT_TRUE(d.ok()) << d.log();
  RawStream raw(d.unix_target());
  ASSERT_TRUE(raw.Open());
  std::vector<v1::Op> ops;
  for (uint64_t h = 1; h <= 100; ++h) ops.push_back(Create(h, v1::DTYPE_F32, {0}));
  ASSERT_TRUE(raw.Submit(1, ops));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(raw.Submit(2, {Create(101, v1::DTYPE_F32, {0})}));
  v1::Error e = raw.Completion(2);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  EXPECT_EQ(e.op_index(), 0);
  v1::Op free_one;
  free_one.mutable_free_tensor()->set_handle(1);
  ASSERT_TRUE(raw.Submit(3, {free_one, Create(101, v1::DTYPE_F32, {0})}));
  e = raw.Completion(3);
  EXPECT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  EXPECT_EQ(d.AdminStatus().live_tensors(), 100u);
  raw.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The ops that record graph `graph` of `fills` fills of tensor `tensor` (the i-th with i).
std::vector<v1::Op> RecordFills(uint64_t graph, uint64_t tensor, int fills) {
  std::vector<v1::Op> ops;
  ops.emplace_back().mutable_begin_graph()->set_handle(graph);
  for (int i = 0; i < fills; ++i) ops.push_back(Fill(tensor, i));
  ops.emplace_back().mutable_end_graph();
  return ops;
}

// Launch graph `graph`.
v1::Op LaunchGraph(uint64_t graph) {
  v1::Op launch;
  launch.mutable_launch_graph()->set_graph(graph);
  return launch;
}

// A graph recording more ops than --session-max-graph-ops is refused; the ops of the graphs a
// session holds count together, and freeing a graph makes room again.
TEST(BoundedSessionTest, GraphRecordingPastTheOpLimitIsRefused) {
  FerrydProcess d({"--session-max-graph-ops", "1000"});
  ASSERT_TRUE(d.ok()) << d.log();
  RawStream raw(d.unix_target());
  ASSERT_TRUE(raw.Open());
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {16})}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  auto graph = [](uint64_t handle, int fills) { return RecordFills(handle, 1, fills); };
  ASSERT_TRUE(raw.Submit(2, graph(1, 1001)));
  v1::Error e = raw.Completion(2);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  EXPECT_EQ(e.op_index(), 1001);  // the 1001st fill
  ASSERT_TRUE(raw.Submit(3, graph(1, 1000)));
  e = raw.Completion(3);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  ASSERT_TRUE(raw.Submit(4, {LaunchGraph(1)}));
  EXPECT_EQ(raw.Completion(4).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(raw.Submit(5, graph(2, 1)));  // graph 1 holds all 1000
  EXPECT_EQ(raw.Completion(5).kind(), v1::QUOTA_EXCEEDED);
  v1::Op free_graph;
  free_graph.mutable_free_graph()->set_handle(1);
  std::vector<v1::Op> again = graph(2, 10);
  again.insert(again.begin(), free_graph);
  ASSERT_TRUE(raw.Submit(6, again));
  e = raw.Completion(6);
  EXPECT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  raw.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A LaunchGraph counts toward the ops per submit (--session-max-submit-ops, 2^20 by default)
// as the ops its graph recorded: a submit of many launches of a graph of the most ops a
// session may record, each of which admission checks again tensor by tensor (minutes of an
// executor thread for this submit before the bound), is refused whole with QUOTA_EXCEEDED;
// the session and the daemon serve on, and launches within the limit run.
TEST(BoundedSessionTest, ManyLaunchesOfALargeGraphAreRefusedWhole) {
  FerrydProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  RawStream raw(d.unix_target());
  ASSERT_TRUE(raw.Open());
  constexpr int kGraphOps = 262144;  // --session-max-graph-ops
  std::vector<v1::Op> record = RecordFills(1, 1, kGraphOps);
  record.insert(record.begin(), Create(1, v1::DTYPE_F32, {16}));
  ASSERT_TRUE(raw.Submit(1, record));
  v1::Error e = raw.Completion(1);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  const v1::Op launch = LaunchGraph(1);
  ASSERT_TRUE(raw.Submit(2, std::vector<v1::Op>(100000, launch)));
  e = raw.Completion(2);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  EXPECT_EQ(e.op_index(), 3);  // 3 launches of 262144 and 99997 of one each already fill it
  EXPECT_NE(e.message().find("--session-max-submit-ops"), std::string::npos) << e.message();

  // Another session is served.
  RawStream other(d.unix_target());
  ASSERT_TRUE(other.Open());
  ASSERT_TRUE(other.Submit(1, {Create(1, v1::DTYPE_F32, {4}), Fill(1, 2.0), Download(1, 0, 16)}));
  std::string bytes;
  e = other.Completion(1, &bytes);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  ASSERT_EQ(bytes.size(), 16u);
  float value = 0;
  std::memcpy(&value, bytes.data() + 12, sizeof value);
  EXPECT_EQ(value, 2.0f);
  other.Close();

  // So is this one: launching the graph (4 times: the limit) runs.
  ASSERT_TRUE(raw.Submit(3, std::vector<v1::Op>(4, launch)));
  e = raw.Completion(3);
  EXPECT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  raw.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// --session-max-submit-ops sets the limit: plain ops count one each, a launch its graph's ops.
TEST(BoundedSessionTest, OpsPerSubmitFollowTheSetting) {
  FerrydProcess d({"--session-max-submit-ops", "100"});
  ASSERT_TRUE(d.ok()) << d.log();
  RawStream raw(d.unix_target());
  ASSERT_TRUE(raw.Open());
  std::vector<v1::Op> record = RecordFills(1, 1, 30);
  record.insert(record.begin(), Create(1, v1::DTYPE_F32, {16}));
  ASSERT_TRUE(raw.Submit(1, record));
  v1::Error e = raw.Completion(1);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  const v1::Op launch = LaunchGraph(1);
  ASSERT_TRUE(raw.Submit(2, std::vector<v1::Op>(3, launch)));  // 90
  e = raw.Completion(2);
  EXPECT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  ASSERT_TRUE(raw.Submit(3, std::vector<v1::Op>(4, launch)));  // 120
  e = raw.Completion(3);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  EXPECT_EQ(e.op_index(), 3);
  ASSERT_TRUE(raw.Submit(4, std::vector<v1::Op>(101, Fill(1, 0))));
  e = raw.Completion(4);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  EXPECT_EQ(e.op_index(), -1);
  EXPECT_NE(e.message().find("--session-max-submit-ops"), std::string::npos) << e.message();
  ASSERT_TRUE(raw.Submit(5, std::vector<v1::Op>(100, Fill(1, 0))));
  e = raw.Completion(5);
  EXPECT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  raw.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The objects all sessions hold together are bounded (--max-objects): a uid may open
// hundreds of sessions, each allowed 65536 tensors and 262144 recorded graph ops. A submit is
// charged as many objects as it could add before it is enqueued and given back what it did
// not leave live; one that could pass the limit is refused whole with QUOTA_EXCEEDED, a
// submit that only frees is not, and freeing objects (in any session) or closing a session
// makes room again.
TEST(BoundedSessionTest, SessionsTogetherHoldAtMostTheDaemonsObjects) {
  std::unique_ptr<FerrydProcess> d;
  ASSERT_TRUE(StartDaemon(d, {"--max-objects", "3000"})->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  RawStream a(d->unix_target()), b(d->unix_target());
  ASSERT_TRUE(a.Open() && b.Open());
  auto creates = [](uint64_t first, int n) {
    std::vector<v1::Op> ops;
    for (int i = 0; i < n; ++i) ops.push_back(Create(first + i, v1::DTYPE_U8, {0}));
    return ops;
  };
  // a: 2000 zero-byte tensors (no device quota counts them) and a graph of 10 fills (11).
  ASSERT_TRUE(a.Submit(1, creates(1, 2000)));
  ASSERT_EQ(a.Completion(1).kind(), v1::ERROR_KIND_NONE);
  std::vector<v1::Op> graph = RecordFills(1, 5000, 10);
  graph.insert(graph.begin(), Create(5000, v1::DTYPE_F32, {16}));
  ASSERT_TRUE(a.Submit(2, graph));
  ASSERT_EQ(a.Completion(2).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(Value(Scrape(metrics), "ferry_objects"), 2012);  // 2001 tensors, a graph, 10 ops
  // b: 1000 more could pass 3000: refused whole, nothing of it created.
  ASSERT_TRUE(b.Submit(1, creates(1, 1000)));
  v1::Error e = b.Completion(1);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
  EXPECT_NE(e.message().find("--max-objects"), std::string::npos) << e.message();
  EXPECT_EQ(Value(Scrape(metrics), "ferry_objects"), 2012);
  ASSERT_TRUE(b.Submit(2, creates(1, 900)));
  ASSERT_EQ(b.Completion(2).kind(), v1::ERROR_KIND_NONE);
  // 88 left: a 1000-op submit that adds nothing (fills) runs.
  ASSERT_TRUE(a.Submit(4, std::vector<v1::Op>(1000, Fill(5000, 1.0))));
  ASSERT_EQ(a.Completion(4).kind(), v1::ERROR_KIND_NONE);
  // a frees its graph and 1000 tensors: room for b's 1000.
  std::vector<v1::Op> frees;
  frees.emplace_back().mutable_free_graph()->set_handle(1);
  for (uint64_t h = 1; h <= 1000; ++h) frees.emplace_back().mutable_free_tensor()->set_handle(h);
  ASSERT_TRUE(a.Submit(5, frees));
  ASSERT_EQ(a.Completion(5).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(Value(Scrape(metrics), "ferry_objects"), 1001 + 900);
  ASSERT_TRUE(b.Submit(3, creates(1001, 1000)));
  EXPECT_EQ(b.Completion(3).kind(), v1::ERROR_KIND_NONE);
  // Closing gives everything back.
  a.Close();
  b.Close();
  double objects = -1;
  for (int i = 0; i < 500 && objects != 0; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    objects = Value(Scrape(metrics), "ferry_objects");
  }
  EXPECT_EQ(objects, 0);
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// The f32 values of `bytes` (a download of f32 elements).
std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// A submit of more ops than the session keeps on its stream (session-queued-commands)
// enqueues in parts, each continued once earlier ones complete; what it computes, its
// downloads, and the submits behind it (which wait for it) come out as if it had gone at
// once, in order.
TEST(BoundedSessionTest, LongSubmitsEnqueueInPartsAndKeepTheirOrder) {
  // Copy turns from 4 KiB, one at a time: the long submit holds one while it waits for
  // room, the one behind it asks for one when it starts.
  std::unique_ptr<FerrydProcess> daemon;
  ASSERT_TRUE(StartDaemon(daemon, {"--session-queued-commands", "16", "--kernel-batch", "0",
                                   "--copy-turn-size", "4K", "--copy-turns", "1"})
                  ->ok())
      << daemon->log();
  FerrydProcess& d = *daemon;
  const std::string metrics = MetricsEndpoint(d);
  RawStream raw(d.unix_target());
  ASSERT_TRUE(raw.Open());
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {4096}), Create(2, v1::DTYPE_F32, {4096}),
                             Fill(1, 1.0), Fill(2, 0.0)}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  // y += x 300 times, a download, x = 5 (inline), y += x 100 times, a download; a tensor
  // created half way.
  std::vector<v1::Op> ops;
  for (int i = 0; i < 300; ++i) ops.push_back(testing::Axpy(1.0, 1, 2));
  ops.push_back(Download(2, 0, 16));
  const std::vector<float> fives(4096, 5.0f);
  const std::string five_bytes(reinterpret_cast<const char*>(fives.data()), fives.size() * 4);
  ops.push_back(InlineUpload(1, 0, five_bytes));
  ops.push_back(Create(3, v1::DTYPE_F32, {4}));
  for (int i = 0; i < 100; ++i) ops.push_back(testing::Axpy(1.0, 1, 2));
  ops.push_back(Download(2, 4 * 4095, 4));
  ASSERT_TRUE(raw.Submit(2, std::move(ops)));
  // Behind it, sent before it is done: x = 5 again, y += 2 x, and the new tensor filled.
  ASSERT_TRUE(raw.Submit(3, {InlineUpload(1, 0, five_bytes), testing::Axpy(2.0, 1, 2), Fill(3, 9.0),
                             Download(2, 0, 4), Download(3, 0, 16)}));
  std::string two, three;
  v1::Error e = raw.Completion(2, &two);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  EXPECT_EQ(Floats(two), std::vector<float>({300, 300, 300, 300, 800}));
  e = raw.Completion(3, &three);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  EXPECT_EQ(Floats(three), std::vector<float>({810, 9, 9, 9, 9}));
  // 400 axpy in parts of at most 16: paused many times.
  EXPECT_GE(Value(Scrape(metrics), "ferry_enqueue_pauses_total"), 20);
  raw.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A client that goes away while its long submit is enqueued in parts: the rest is not
// enqueued, its memory is given back, and the daemon serves others.
TEST(BoundedSessionTest, AClientGoneDuringALongSubmitLeavesNothingBehind) {
  FerrydProcess d({"--session-queued-commands", "8", "--kernel-batch", "0"});
  ASSERT_TRUE(d.ok()) << d.log();
  {
    RawStream raw(d.unix_target());
    ASSERT_TRUE(raw.Open());
    std::vector<v1::Op> ops{Create(1, v1::DTYPE_F32, {1 << 20})};
    for (int i = 0; i < 20000; ++i) ops.push_back(Fill(1, i));
    ops.push_back(Create(2, v1::DTYPE_F32, {1 << 20}));  // made before enqueueing, never used
    ASSERT_TRUE(raw.Submit(1, std::move(ops)));
    ASSERT_TRUE(Eventually([&] { return d.AdminStatus().submits_in_flight() == 1; }));
  }  // cancelled: the client is gone
  ASSERT_TRUE(Eventually([&] { return d.AdminStatus().sessions_open() == 0; }))
      << "the session was not torn down";
  EXPECT_EQ(d.AdminStatus().device_bytes_in_use(), 0u);
  RawStream other(d.unix_target());
  ASSERT_TRUE(other.Open());
  ASSERT_TRUE(other.Submit(1, {Create(1, v1::DTYPE_F32, {4}), Fill(1, 3.0), Download(1, 0, 4)}));
  std::string bytes;
  ASSERT_EQ(other.Completion(1, &bytes).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(Floats(bytes), std::vector<float>({3}));
  other.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A device fault while a long submit is enqueued in parts fails it (and the submit behind
// it) with DEVICE_FAULT, and a new session works on the rebuilt device. (Host backend: the
// injected fault; on CUDA the fault tests of device_test cover faults.)
TEST(BoundedSessionTest, AFaultDuringALongSubmitFailsItAndWhatWaitsBehind) {
  if (testing::TestBackend() != "host") {
    GTEST_SKIP() << "the fault is injected into the host backend (device_test faults CUDA)";
  }
  FerrydProcess d({"--session-queued-commands", "16", "--kernel-batch", "0",
                   "--host-fault-after-ops-for-test", "300"});
  ASSERT_TRUE(d.ok()) << d.log();
  RawStream raw(d.unix_target());
  ASSERT_TRUE(raw.Open());
  std::vector<v1::Op> ops{Create(1, v1::DTYPE_F32, {4})};
  for (int i = 0; i < 1000; ++i) ops.push_back(Fill(1, i));
  ASSERT_TRUE(raw.Submit(1, std::move(ops)));
  ASSERT_TRUE(raw.Submit(2, {Fill(1, 1.0)}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::DEVICE_FAULT);
  EXPECT_EQ(raw.Completion(2).kind(), v1::DEVICE_FAULT);
  raw.Close();
  RawStream other(d.unix_target());
  ASSERT_TRUE(other.Open());
  ASSERT_TRUE(other.Submit(1, {Create(1, v1::DTYPE_F32, {4}), Fill(1, 3.0), Download(1, 0, 4)}));
  std::string bytes;
  v1::Error e = other.Completion(1, &bytes);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  EXPECT_EQ(Floats(bytes), std::vector<float>({3}));
  other.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// All sessions together keep at most queued-commands on the device: six sessions, each
// allowed 32 of its own, submit 1500 fills each against a daemon-wide 64, and the count
// never passes 64; every submit still completes, in order, with its results, and sessions
// with nothing queued of their own are woken by the others' completions.
TEST(BoundedSessionTest, SessionsTogetherKeepAtMostTheDaemonsQueuedCommands) {
  std::unique_ptr<FerrydProcess> daemon;
  ASSERT_TRUE(StartDaemon(daemon, {"--queued-commands", "64", "--session-queued-commands", "32",
                                   "--kernel-batch", "0"})
                  ->ok())
      << daemon->log();
  FerrydProcess& d = *daemon;
  const std::string metrics = MetricsEndpoint(d);
  constexpr int kSessions = 6;
  std::vector<std::unique_ptr<RawStream>> raws;
  for (int k = 0; k < kSessions; ++k) {
    raws.push_back(std::make_unique<RawStream>(d.unix_target()));
    ASSERT_TRUE(raws.back()->Open());
    ASSERT_TRUE(raws.back()->Submit(1, {Create(1, v1::DTYPE_F32, {1 << 20})}));
    ASSERT_EQ(raws.back()->Completion(1).kind(), v1::ERROR_KIND_NONE);
  }
  for (int k = 0; k < kSessions; ++k) {
    std::vector<v1::Op> ops;
    for (int i = 0; i < 1500; ++i) ops.push_back(Fill(1, k + i % 2));
    ops.push_back(Fill(1, 10 + k));
    ops.push_back(Download(1, 0, 4));
    ASSERT_TRUE(raws[k]->Submit(2, std::move(ops)));
  }
  ASSERT_TRUE(Eventually([&] { return d.AdminStatus().submits_in_flight() > 0; }, 5));
  double most = 0;
  int samples = 0;
  while (d.AdminStatus().submits_in_flight() > 0) {
    const std::string text = Scrape(metrics);
    most = std::max(most, Value(text, "ferry_queued_commands"));
    ++samples;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf("at most %.0f commands queued in %d samples\n", most, samples);
  EXPECT_LE(most, 64);
  EXPECT_GT(Value(Scrape(metrics), "ferry_enqueue_pauses_total"), 0);
  for (int k = 0; k < kSessions; ++k) {
    std::string bytes;
    v1::Error e = raws[k]->Completion(2, &bytes);
    ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
    EXPECT_EQ(Floats(bytes), std::vector<float>({10.0f + k}));
    raws[k]->Close();
  }
  EXPECT_EQ(Value(Scrape(metrics), "ferry_queued_commands"), 0);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

}  // namespace
}  // namespace ferry
