// AbsorbCompletion (server/rpc/convert.h): which Completed messages the daemon may send as one
// (docs/protocol.md, ordering rule 3, "Coalesced completions").
#include <gtest/gtest.h>

#include "rpc/convert.h"

namespace ferry::rpc {
namespace {

v1::ServerMessage Completed(uint64_t id, bool failed = false) {
  v1::ServerMessage m;
  m.mutable_completed()->set_submit_id(id);
  if (failed) m.mutable_completed()->mutable_error()->set_kind(v1::INVALID_HANDLE);
  return m;
}

TEST(CoalescedCompletionsTest, ConsecutiveSuccessesBecomeOneRun) {
  v1::Completed run = Completed(7).completed();
  EXPECT_TRUE(AbsorbCompletion(&run, Completed(8)));
  EXPECT_TRUE(AbsorbCompletion(&run, Completed(9)));
  EXPECT_EQ(run.first_submit_id(), 7u);
  EXPECT_EQ(run.submit_id(), 9u);
  EXPECT_FALSE(run.has_error());
}

TEST(CoalescedCompletionsTest, AFailureIsNeverPartOfARun) {
  v1::Completed run = Completed(7).completed();
  EXPECT_FALSE(AbsorbCompletion(&run, Completed(8, /*failed=*/true)));
  EXPECT_EQ(run.first_submit_id(), 0u);  // left as it was: one submit
  EXPECT_EQ(run.submit_id(), 7u);
  v1::Completed failed = Completed(8, /*failed=*/true).completed();
  EXPECT_FALSE(AbsorbCompletion(&failed, Completed(9)));
  EXPECT_EQ(failed.submit_id(), 8u);
}

TEST(CoalescedCompletionsTest, GapsAndOtherMessagesEndARun) {
  v1::Completed run = Completed(7).completed();
  EXPECT_FALSE(AbsorbCompletion(&run, Completed(9)));  // 8 is not reported by 9's message
  EXPECT_FALSE(AbsorbCompletion(&run, Completed(7)));
  v1::ServerMessage chunk;
  chunk.mutable_download_chunk()->set_submit_id(8);
  EXPECT_FALSE(AbsorbCompletion(&run, chunk));  // chunks stay between their neighbours
  v1::ServerMessage synchronized;
  synchronized.mutable_synchronized()->set_sync_id(1);
  EXPECT_FALSE(AbsorbCompletion(&run, synchronized));
  v1::ServerMessage already_a_run = Completed(8);
  already_a_run.mutable_completed()->set_first_submit_id(8);
  EXPECT_FALSE(AbsorbCompletion(&run, already_a_run));
  EXPECT_EQ(run.submit_id(), 7u);
  EXPECT_EQ(run.first_submit_id(), 0u);
}

}  // namespace
}  // namespace ferry::rpc
