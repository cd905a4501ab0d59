// A session stream's end (server/rpc/stream_end.h): open, finishing once an end is asked
// for, finished once drained; a second end asked for or a drain before any changes nothing,
// so the first status asked for wins and Finish is called once.
#include "rpc/stream_end.h"

#include <gtest/gtest.h>

namespace ferry::rpc {
namespace {

using S = StreamEnd;
using E = StreamEndEvent;

TEST(StreamEndTest, OpenThenFinishingThenFinished) {
  EXPECT_EQ(NextStreamEnd(S::kOpen, E::kFinishAsked), S::kFinishing);
  EXPECT_EQ(NextStreamEnd(S::kFinishing, E::kDrained), S::kFinished);
}

TEST(StreamEndTest, EventsThatDoNotApplyKeepTheState) {
  EXPECT_EQ(NextStreamEnd(S::kOpen, E::kDrained), S::kOpen) << "nothing to finish yet";
  EXPECT_EQ(NextStreamEnd(S::kFinishing, E::kFinishAsked), S::kFinishing) << "first end wins";
  EXPECT_EQ(NextStreamEnd(S::kFinished, E::kFinishAsked), S::kFinished);
  EXPECT_EQ(NextStreamEnd(S::kFinished, E::kDrained), S::kFinished) << "Finish only once";
}

}  // namespace
}  // namespace ferry::rpc
