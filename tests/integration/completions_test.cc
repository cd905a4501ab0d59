// Coalesced completions (docs/protocol.md, ordering rule 3) against a real ferryd: a raw client
// pipelines submits, some failing and some with inline downloads, and checks that the
// Completed messages report every submit exactly once, in order, failures each in a message of
// their own, chunks in their submit's place; a client that did not ask gets one Completed per
// submit.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "ferryd_process.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Create;
using testing::Download;
using testing::FerrydProcess;
using testing::Fill;
using testing::RawStream;

struct Seen {
  uint64_t messages = 0;   // Completed messages
  uint64_t coalesced = 0;  // of them, runs of more than one submit
};

// Pipeline `n` submits on a new session (coalesced completions asked for or not) and check
// what comes back against the rules.
Seen PipelineAndCheck(const std::string& target, bool coalesced, uint64_t n) {
  RawStream raw(target);
  v1::ClientMessage open;
  open.mutable_open()->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  open.mutable_open()->set_coalesced_completions(coalesced);
  EXPECT_TRUE(raw.Send(open));
  auto opened = raw.Read();
  EXPECT_TRUE(opened && opened->has_opened());
  auto fails = [](uint64_t id) { return id % 50 == 0; };      // an unknown handle
  auto downloads = [](uint64_t id) { return id % 70 == 0; };  // 4 bytes inline
  std::thread sender([&] {
    (void)raw.SendBuffered([] {
      v1::ClientMessage m;
      m.mutable_submit()->set_submit_id(1);
      *m.mutable_submit()->add_ops() = Create(1, v1::DTYPE_F32, {16});
      return m;
    }());
    for (uint64_t id = 2; id <= n; ++id) {
      v1::ClientMessage m;
      m.mutable_submit()->set_submit_id(id);
      *m.mutable_submit()->add_ops() = Fill(fails(id) ? 999 : 1, static_cast<double>(id));
      if (downloads(id)) *m.mutable_submit()->add_ops() = Download(1, 0, 4);
      if (!(id == n ? raw.Send(m) : raw.SendBuffered(m))) return;
    }
  });
  Seen seen;
  uint64_t next = 1;  // the first submit not yet reported
  std::set<uint64_t> chunks_of;
  while (next <= n) {
    auto m = raw.Read();
    if (!m) {
      ADD_FAILURE() << "the stream ended with submit " << next << " not reported";
      break;
    }
    if (m->has_download_chunk()) {
      EXPECT_EQ(m->download_chunk().submit_id(), next) << "a chunk out of its submit's place";
      chunks_of.insert(m->download_chunk().submit_id());
      continue;
    }
    if (!m->has_completed()) {
      ADD_FAILURE() << "unexpected message " << m->ShortDebugString();
      continue;
    }
    const v1::Completed& c = m->completed();
    ++seen.messages;
    const uint64_t first = c.first_submit_id() ? c.first_submit_id() : c.submit_id();
    EXPECT_EQ(first, next) << "a submit skipped or reported twice";
    EXPECT_GE(c.submit_id(), first);
    if (!coalesced) EXPECT_EQ(c.first_submit_id(), 0u) << "coalesced though not asked for";
    if (c.submit_id() > first) {
      ++seen.coalesced;
      EXPECT_FALSE(c.has_error()) << "a run with an error";
    }
    for (uint64_t id = first; id <= c.submit_id(); ++id) {
      if (fails(id)) {
        EXPECT_EQ(c.submit_id(), first) << "failed submit " << id << " inside a run";
        EXPECT_EQ(c.error().kind(), v1::INVALID_HANDLE) << "submit " << id;
      } else if (c.submit_id() == first) {
        EXPECT_FALSE(c.has_error()) << "submit " << id << ": " << c.error().message();
      }
      if (downloads(id) && !fails(id)) {
        EXPECT_TRUE(chunks_of.count(id)) << "submit " << id << "'s chunk did not come first";
      }
    }
    next = c.submit_id() + 1;
  }
  sender.join();
  raw.Close();
  return seen;
}

TEST(CompletionsTest, CoalescedCompletionsReportEverySubmitOnceInOrder) {
  FerrydProcess daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  constexpr uint64_t kSubmits = 3000;
  Seen seen = PipelineAndCheck(daemon.unix_target(), /*coalesced=*/true, kSubmits);
  // How much was merged depends on timing; what it saved is printed, not asserted.
  std::printf("%llu submits reported by %llu Completed messages (%llu runs)\n",
              static_cast<unsigned long long>(kSubmits),
              static_cast<unsigned long long>(seen.messages),
              static_cast<unsigned long long>(seen.coalesced));
}

TEST(CompletionsTest, WithoutTheFlagEverySubmitHasItsOwnCompleted) {
  FerrydProcess daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  constexpr uint64_t kSubmits = 1000;
  Seen seen = PipelineAndCheck(daemon.unix_target(), /*coalesced=*/false, kSubmits);
  EXPECT_EQ(seen.messages, kSubmits);
}

}  // namespace
}  // namespace ferry
