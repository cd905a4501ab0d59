// Outbox (server/rpc/outbox.h): a stream's server messages are written one at a time in the
// order queued, counted (messages, bytes) until written or dropped; a staged chunk's bytes are
// copied into its message only when it is next to be written, or all at once when a write
// stalls; consecutive successful completions go out as one where the client reads ranges.
#include "rpc/outbox.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rpc/session_context.h"

namespace ferry::rpc {
namespace {

// Records what it was asked to write; a write is "done" when the test says so.
class RecordingWriter : public MessageWriter {
 public:
  void StartWrite(const v1::ServerMessage* message) override { started.push_back(*message); }
  std::vector<v1::ServerMessage> started;
};

std::unique_ptr<v1::ServerMessage> Completed(uint64_t id, bool failed = false) {
  auto m = std::make_unique<v1::ServerMessage>();
  m->mutable_completed()->set_submit_id(id);
  if (failed) m->mutable_completed()->mutable_error()->set_message("no");
  return m;
}

TEST(OutboxTest, WritesOneAtATimeInOrderAndCountsWhatItHolds) {
  StreamGauges gauges;
  RecordingWriter writer;
  Outbox outbox(&gauges);
  outbox.set_writer(&writer);
  outbox.Push(Completed(1));
  outbox.Push(Completed(2));
  outbox.Push(Completed(3));
  ASSERT_EQ(writer.started.size(), 1u);  // one write in flight
  EXPECT_EQ(writer.started[0].completed().submit_id(), 1u);
  EXPECT_EQ(outbox.size(), 3u);
  EXPECT_EQ(outbox.bytes(), 3 * Outbox::kMessageCost);
  EXPECT_EQ(gauges.unsent.load(), 3);
  EXPECT_EQ(gauges.unsent_bytes.load(), static_cast<int64_t>(3 * Outbox::kMessageCost));

  auto written = outbox.WriteDone();
  ASSERT_TRUE(written);
  EXPECT_EQ(written->completed().submit_id(), 1u);
  EXPECT_EQ(outbox.size(), 2u);
  EXPECT_EQ(writer.started.size(), 1u) << "WriteDone starts nothing; Pump does";
  outbox.Pump();
  ASSERT_EQ(writer.started.size(), 2u);
  EXPECT_EQ(writer.started[1].completed().submit_id(), 2u);
  outbox.DropUnsent(1);  // the one being written stays
  EXPECT_EQ(outbox.size(), 1u);
  EXPECT_EQ(gauges.unsent.load(), 1);
  outbox.WriteDone();
  EXPECT_TRUE(outbox.empty());
  EXPECT_EQ(gauges.unsent.load(), 0);
  EXPECT_EQ(gauges.unsent_bytes.load(), 0);
  EXPECT_EQ(outbox.writes_started(), 2u);
}

TEST(OutboxTest, WithoutAWriterNothingIsWritten) {
  StreamGauges gauges;
  Outbox outbox(&gauges);
  outbox.Push(Completed(1));
  EXPECT_FALSE(outbox.write_in_flight());
  RecordingWriter writer;
  outbox.set_writer(&writer);
  outbox.Pump();
  EXPECT_EQ(writer.started.size(), 1u);
}

TEST(OutboxTest, AStagedChunkIsCopiedOutWhenNextToBeWrittenOrWhenAWriteStalls) {
  StreamGauges gauges;
  RecordingWriter writer;
  Outbox outbox(&gauges);
  outbox.set_writer(&writer);
  auto lease = std::make_shared<const pool::StagingLease>();
  const std::string bytes[4] = {"aaaa", "bbbb", "cccc", "dddd"};
  auto push = [&](int i) {
    auto m = std::make_unique<v1::ServerMessage>();
    m->mutable_download_chunk()->set_offset(static_cast<uint64_t>(i));
    session::ChunkBytes staged;
    staged.keep = lease;
    staged.staged = bytes[i].data();
    staged.length = bytes[i].size();
    outbox.Push(std::move(m), std::move(staged), bytes[i].size());
  };
  for (int i = 0; i < 3; ++i) push(i);
  // The first is being written (copied out); the others wait in staging.
  ASSERT_EQ(writer.started.size(), 1u);
  EXPECT_EQ(writer.started[0].download_chunk().data(), "aaaa");
  EXPECT_EQ(outbox.chunks_in_staging(), 2u);
  EXPECT_EQ(outbox.bytes(), 12 + 3 * Outbox::kMessageCost);
  // The next write copies its chunk out, and the one after it while gRPC writes.
  outbox.WriteDone();
  outbox.Pump();
  ASSERT_EQ(writer.started.size(), 2u);
  EXPECT_EQ(writer.started[1].download_chunk().data(), "bbbb");
  EXPECT_EQ(outbox.chunks_in_staging(), 0u);
  // A write that stalls: what waits behind it is copied out at once, still counted.
  push(3);
  EXPECT_EQ(outbox.chunks_in_staging(), 1u);
  outbox.CopyOutStaged();
  EXPECT_EQ(outbox.chunks_in_staging(), 0u);
  EXPECT_EQ(outbox.bytes(), 12 + 3 * Outbox::kMessageCost) << "counted until written";
  for (int i = 0; i < 2; ++i) {
    outbox.WriteDone();
    outbox.Pump();
  }
  ASSERT_EQ(writer.started.size(), 4u);
  EXPECT_EQ(writer.started[2].download_chunk().data(), "cccc");
  EXPECT_EQ(writer.started[3].download_chunk().data(), "dddd");
}

TEST(OutboxTest, ConsecutiveSuccessesGoOutAsOneWhereTheClientReadsRanges) {
  StreamGauges gauges;
  RecordingWriter writer;
  Outbox outbox(&gauges);
  outbox.set_coalesce(true);
  outbox.Push(Completed(1));  // no writer yet: they queue
  outbox.Push(Completed(2));
  outbox.Push(Completed(3));
  outbox.Push(Completed(4, /*failed=*/true));
  outbox.Push(Completed(5));
  outbox.set_writer(&writer);
  outbox.Pump();
  ASSERT_EQ(writer.started.size(), 1u);
  EXPECT_EQ(writer.started[0].completed().first_submit_id(), 1u);
  EXPECT_EQ(writer.started[0].completed().submit_id(), 3u);
  EXPECT_EQ(outbox.size(), 3u) << "2 and 3 folded into 1; the failure and 5 wait";
  EXPECT_EQ(gauges.unsent.load(), 3);
}

}  // namespace
}  // namespace ferry::rpc
