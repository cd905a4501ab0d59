// Completed ranges (Open.completed_ranges): a client that takes them may get one Completed
// for a run of successful submits. Whatever the daemon merges, every submit is answered
// exactly once, in order; a failed submit always has a Completed of its own, with its error;
// a submit's download bytes all come before the Completed that covers it. A client that does
// not ask gets one Completed per submit.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <vector>

#include "ferryd_process.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Create;
using testing::Download;
using testing::FerrydProcess;
using testing::Fill;
using testing::RawStream;

struct Answer {
  uint64_t first = 0, last = 0;  // the submits a Completed covers
  bool failed = false;
  std::map<uint64_t, uint64_t> chunk_bytes;  // DownloadChunk bytes per submit, before it
};

// Open (asking for ranges or not), create a tensor, then send `submits` fill submits without
// waiting, where every 50th fills a handle that does not exist (it fails) and every 40th
// downloads the tensor; return every Completed in the order it came.
std::vector<Answer> RunPipelined(const std::string& target, bool ranges, uint64_t submits) {
  RawStream raw(target);
  v1::ClientMessage open;
  open.mutable_open()->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  open.mutable_open()->set_completed_ranges(ranges);
  EXPECT_TRUE(raw.Send(open));
  auto opened = raw.Read();
  EXPECT_TRUE(opened && opened->has_opened());
  EXPECT_TRUE(raw.Submit(1, {Create(1, v1::DTYPE_F32, {64})}));
  EXPECT_EQ(raw.Completion(1).kind(), v1::ERROR_KIND_NONE);
  for (uint64_t id = 2; id < 2 + submits; ++id) {
    std::vector<v1::Op> ops = {Fill(id % 50 == 0 ? 99 : 1, 1.0)};
    if (id % 40 == 0) ops.push_back(Download(1, 0, 256));
    EXPECT_TRUE(raw.Submit(id, std::move(ops)));
  }
  std::vector<Answer> answers;
  std::map<uint64_t, uint64_t> chunk_bytes;
  while (answers.empty() || answers.back().last < 1 + submits) {
    auto m = raw.Read();
    if (!m) {
      ADD_FAILURE() << "the stream ended";
      break;
    }
    if (m->has_download_chunk()) {
      chunk_bytes[m->download_chunk().submit_id()] += m->download_chunk().data().size();
    }
    if (!m->has_completed()) continue;
    const v1::Completed& c = m->completed();
    Answer a;
    a.last = c.submit_id();
    a.first = c.first_submit_id() != 0 ? c.first_submit_id() : c.submit_id();
    a.failed = c.has_error();
    a.chunk_bytes = std::move(chunk_bytes);
    chunk_bytes.clear();
    answers.push_back(a);
  }
  v1::ClientMessage close;
  close.mutable_close();
  raw.Send(close);
  while (auto m = raw.Read()) {
    if (m->has_closed()) break;
  }
  return answers;
}

// The answers cover submits 2 .. 1 + submits exactly once, in order; each failure alone
// with its error; each download's bytes before the Completed that covers it.
void CheckAnswers(const std::vector<Answer>& answers, uint64_t submits) {
  uint64_t next = 2;
  for (const Answer& a : answers) {
    ASSERT_EQ(a.first, next) << "a submit answered twice, late or not at all";
    ASSERT_LE(a.first, a.last);
    EXPECT_EQ(a.failed, a.last % 50 == 0) << "submit " << a.last;
    for (uint64_t id = a.first; id <= a.last; ++id) {
      const bool fails = id % 50 == 0;
      if (fails) EXPECT_EQ(a.first, a.last) << "failed submit " << id << " shares a Completed";
      const uint64_t expected = id % 40 == 0 && !fails ? 256 : 0;
      auto got = a.chunk_bytes.find(id);
      EXPECT_EQ(got == a.chunk_bytes.end() ? 0 : got->second, expected) << "submit " << id;
    }
    for (const auto& [id, bytes] : a.chunk_bytes) {
      EXPECT_TRUE(id >= a.first && id <= a.last) << "chunks of submit " << id << " out of place";
    }
    next = a.last + 1;
  }
  EXPECT_EQ(next, 2 + submits);
}

TEST(CompletedRangesTest, EverySubmitIsAnsweredOnceInOrderWithRanges) {
  FerrydProcess daemon(std::vector<std::string>{});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  constexpr uint64_t kSubmits = 600;
  auto answers = RunPipelined(daemon.unix_target(), /*ranges=*/true, kSubmits);
  CheckAnswers(answers, kSubmits);
  std::cout << "[ MEASURED ] " << kSubmits << " pipelined submits answered by " << answers.size()
            << " Completed messages\n";
}

TEST(CompletedRangesTest, WithoutRangesEverySubmitHasItsOwnCompleted) {
  FerrydProcess daemon(std::vector<std::string>{});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  constexpr uint64_t kSubmits = 300;
  auto answers = RunPipelined(daemon.unix_target(), /*ranges=*/false, kSubmits);
  CheckAnswers(answers, kSubmits);
  EXPECT_EQ(answers.size(), kSubmits);
}

}  // namespace
}  // namespace ferry
