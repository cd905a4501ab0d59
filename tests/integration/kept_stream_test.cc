// Kept streams (docs/protocol.md, "Kept streams"): a session closed with Close.keep_stream
// leaves its stream open for the client's next Open. The next session on it starts from
// nothing of the last one (handles, submit ids, sequence numbers), a kept stream is a
// sessionless stream again (its open timeout, the sessionless limits), and libferry opens
// its next session on it, or on a new stream when the daemon has ended it.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "library_checks.h"
#include "metrics_scrape.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Create;
using testing::Download;
using testing::Eventually;
using testing::FerrydProcess;
using testing::Fill;
using testing::MetricsEndpoint;
using testing::RawSlabConnection;
using testing::RawStream;
using testing::Scrape;
using testing::Value;

std::unique_ptr<FerrydProcess> StartDaemon(std::vector<std::string> args) {
  args.push_back("--metrics-listen");
  args.push_back("127.0.0.1:0");
  return std::make_unique<FerrydProcess>(std::move(args));
}

// Close with keep_stream; the Closed that answers it (nullopt if none came).
std::optional<v1::Closed> CloseKeeping(RawStream& raw) {
  v1::ClientMessage m;
  m.mutable_close()->set_keep_stream(true);
  if (!raw.Send(m)) return std::nullopt;
  while (auto r = raw.Read()) {
    if (r->has_closed()) return r->closed();
  }
  return std::nullopt;
}

// libferry: sessions one after another on one Client share one stream, and each closes with
// its own counters.
TEST(KeptStreamTest, SessionsOneAfterAnotherShareOneStream) {
  auto d = StartDaemon({});
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  auto connected = Client::connect(d->unix_target());
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  auto client = std::make_unique<Client>(std::move(*connected));
  for (int i = 1; i <= 3; ++i) {
    auto session = client->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    Tensor t = session->create_tensor<float>({4});
    for (int k = 0; k < i; ++k) session->fill(t, static_cast<double>(k));
    auto values = session->download<float>(t);
    ASSERT_TRUE(values.ok()) << values.status().ToString();
    EXPECT_EQ((*values)[3], static_cast<float>(i - 1));
    auto stats = session->close();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->tensors_created, 1u) << "session " << i << " counted another's tensors";
    const std::string body = Scrape(metrics);
    EXPECT_EQ(Value(body, "ferry_streams_kept_total"), i);
    EXPECT_EQ(Value(body, "ferry_streams_started_total"), 1)
        << "session " << i << " did not open on the kept stream";
  }
  // The kept stream waits as a stream without a session, and goes with the client.
  EXPECT_EQ(Value(Scrape(metrics), "ferry_streams_sessionless"), 1);
  EXPECT_EQ(d->AdminStatus().sessions_total(), 3u);
  client.reset();
  EXPECT_TRUE(Eventually([&] { return Value(Scrape(metrics), "ferry_streams_sessionless") == 0; }))
      << "the client's kept stream outlived it";
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// Raw protocol: the next session on a kept stream sees nothing of the last one, and numbers
// its submits from 1 again.
TEST(KeptStreamTest, TheNextSessionOnAKeptStreamStartsFromNothing) {
  auto d = StartDaemon({"--open-timeout", "4000"});
  ASSERT_TRUE(d->ok()) << d->log();
  RawStream raw(d->unix_target(), std::chrono::seconds(60));
  auto first = raw.Open();
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->completion_board());
  // The first session's completion board, mapped as a client maps it.
  RawSlabConnection slab(first->slab_socket());
  ASSERT_EQ(slab.Hello(first->slab_token()), 0);
  auto board_fd = slab.Board();
  ASSERT_TRUE(board_fd && board_fd->kind == 0 && board_fd->fd >= 0);
  void* page = mmap(nullptr, board_fd->size, PROT_READ, MAP_SHARED, board_fd->fd, 0);
  ASSERT_NE(page, MAP_FAILED);
  const auto* board = static_cast<const volatile uint64_t*>(page);
  ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {4}), Fill(1, 2.0)}));
  ASSERT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(board[0], 1u) << "completed_through";
  auto closed = CloseKeeping(raw);
  ASSERT_TRUE(closed);
  EXPECT_TRUE(closed->stream_kept());
  EXPECT_EQ(closed->kept_ms(), 4000u);
  EXPECT_EQ(closed->stats().submits(), 1u);

  auto second = raw.Open();
  ASSERT_TRUE(second) << "a kept stream did not take the next Open";
  EXPECT_NE(second->session_id(), first->session_id());
  EXPECT_NE(second->slab_token(), first->slab_token());
  // The board and ring are the last session's, the board back to nothing completed.
  EXPECT_TRUE(second->channels_kept());
  EXPECT_TRUE(second->completion_board() && second->submit_ring());
  EXPECT_EQ(board[0], 0u) << "the board still shows the last session's completions";
  EXPECT_EQ(board[1], 0u) << "last_failed";
  // Submit id 1 again, and the last session's handle 1 is not this session's.
  ASSERT_TRUE(raw.Submit(1, {Download(1, 0, 16)}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::INVALID_HANDLE);
  ASSERT_TRUE(raw.Submit(2, {Create(1, v1::DTYPE_F32, {4}), Download(1, 0, 16)}));
  std::string bytes;
  EXPECT_EQ(raw.Completion(2, &bytes).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(bytes, std::string(16, '\0')) << "a new tensor showed the last session's bytes";
  EXPECT_EQ(board[0], 2u) << "the second session's completions on the kept board";
  EXPECT_EQ(board[1], 1u) << "its submit 1 failed";
  munmap(page, board_fd->size);
  close(board_fd->fd);
  // A Close without keep_stream ends the stream, as it always did.
  raw.Close();
  auto s = d->WaitIdle();
  EXPECT_EQ(s.sessions_open(), 0u);
  EXPECT_EQ(s.live_tensors(), 0u);
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// A kept stream is a stream without a session: it has the open timeout to send its next
// Open, then ends like a new stream that sent none.
// A Close sent right behind a submit whose answer is written (a download's bytes come in
// its Completed): the session closes once the submit is done, while its Completed may still
// be on its way to the client, and the stream is kept all the same (Closed follows it), 20
// times over.
TEST(KeptStreamTest, ACloseRightBehindASubmitStillKeepsTheStream) {
  auto d = StartDaemon({});
  ASSERT_TRUE(d->ok()) << d->log();
  RawStream raw(d->unix_target(), std::chrono::seconds(60));
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE("session " + std::to_string(i));
    ASSERT_TRUE(raw.Open());
    ASSERT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {1024}), Download(1, 0, 4096)}));
    auto closed = CloseKeeping(raw);  // reads the Completed on the way
    ASSERT_TRUE(closed);
    EXPECT_TRUE(closed->stream_kept());
    EXPECT_EQ(closed->stats().submits(), 1u);
    if (!closed->stream_kept()) break;
  }
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

TEST(KeptStreamTest, AKeptStreamWithoutAnOpenEndsAtTheOpenTimeout) {
  auto d = StartDaemon({"--open-timeout", "300"});
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  RawStream raw(d->unix_target(), std::chrono::seconds(60));
  ASSERT_TRUE(raw.Open());
  auto closed = CloseKeeping(raw);
  ASSERT_TRUE(closed);
  ASSERT_TRUE(closed->stream_kept());
  EXPECT_EQ(closed->kept_ms(), 300u);
  const auto start = std::chrono::steady_clock::now();
  auto m = raw.Read();
  ASSERT_TRUE(m && m->has_error()) << "the kept stream was not ended";
  EXPECT_EQ(m->error().kind(), v1::PROTOCOL_VIOLATION) << m->error().message();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_FALSE(raw.Read());
  EXPECT_EQ(raw.Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(Value(Scrape(metrics), "ferry_streams_open_timeouts_total"), 1);
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// A kept stream takes a place among the sessionless streams: where the uid has none left, the
// stream ends after Closed instead (not counted as a refused stream), and the client's next
// session takes a new stream.
TEST(KeptStreamTest, PastTheSessionlessLimitTheStreamIsNotKept) {
  auto d = StartDaemon({"--max-sessionless-streams-per-uid", "1"});
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string metrics = MetricsEndpoint(*d);
  RawStream session(d->unix_target(), std::chrono::seconds(60));
  ASSERT_TRUE(session.Open());
  // The uid's one sessionless place, taken by a stream that sends nothing.
  RawStream idle(d->unix_target(), std::chrono::seconds(60));
  ASSERT_TRUE(Eventually([&] { return Value(Scrape(metrics), "ferry_streams_sessionless") == 1; }));
  auto closed = CloseKeeping(session);
  ASSERT_TRUE(closed);
  EXPECT_FALSE(closed->stream_kept());
  EXPECT_FALSE(session.Read()) << "a stream that was not kept went on";
  EXPECT_TRUE(session.Finish().ok());
  const std::string body = Scrape(metrics);
  EXPECT_EQ(Value(body, "ferry_streams_kept_total"), 0);
  EXPECT_EQ(Value(body, "ferry_streams_refused_total", "\"max_sessionless_per_uid\""), 0);
  EXPECT_EQ(d->Stop(), 0) << d->log();
}

// libferry opens on a new stream when the daemon has ended the kept one (here: it restarted
// on the same socket).
TEST(KeptStreamTest, AnOpenAfterTheKeptStreamEndedTakesANewStream) {
  char tmpl[] = "/tmp/ferry-kept-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string socket = "unix:" + dir + "/s.sock";
  auto d = StartDaemon({"--listen", socket});
  ASSERT_TRUE(d->ok()) << d->log();
  auto client = Client::connect(socket);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  {
    auto session = client->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    ASSERT_TRUE(session->close().ok());
  }
  EXPECT_EQ(d->Stop(), 0) << d->log();
  d = StartDaemon({"--listen", socket});
  ASSERT_TRUE(d->ok()) << d->log();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ASSERT_NO_FATAL_FAILURE(testing::ExpectRoundTripAndClose(*session, 2, 3.0f));
  EXPECT_EQ(d->Stop(), 0) << d->log();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace ferry
