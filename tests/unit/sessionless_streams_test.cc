// Session streams that have not yet sent Open are bounded per identity and in all, and a
// stream's place comes back exactly once (rpc/sessionless_streams.h).
#include "rpc/sessionless_streams.h"

#include <gtest/gtest.h>

#include <optional>
#include <utility>
#include <vector>

namespace ferry::rpc {
namespace {

TEST(SessionlessStreamsTest, OneIdentityIsBoundedAndAnotherIsNot) {
  SessionlessStreams streams({/*total=*/100, /*per_identity=*/2});
  auto a1 = streams.Admit("uid:1000");
  auto a2 = streams.Admit("uid:1000");
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = streams.Admit("uid:1000");
  ASSERT_FALSE(a3.ok());
  EXPECT_EQ(a3.status().kind(), ErrorKind::kUnavailable);
  EXPECT_NE(a3.status().message().find("uid:1000"), std::string::npos) << a3.status().message();
  EXPECT_NE(a3.status().message().find("max-sessionless-streams-per-uid"), std::string::npos);
  auto b = streams.Admit("uid:1001");
  EXPECT_TRUE(b.ok());
  EXPECT_EQ(streams.count(), 3u);
  EXPECT_EQ(streams.refused_per_identity(), 1u);
  EXPECT_EQ(streams.refused_total_limit(), 0u);
  // A place given back is taken again.
  a1->Release();
  EXPECT_EQ(streams.count(), 2u);
  EXPECT_TRUE(streams.Admit("uid:1000").ok());
}

TEST(SessionlessStreamsTest, TheDaemonWideLimitHoldsAcrossIdentities) {
  SessionlessStreams streams({/*total=*/3, /*per_identity=*/2});
  std::vector<SessionlessStreams::Ticket> held;
  for (const char* who : {"uid:1", "uid:2", "remote"}) {
    auto t = streams.Admit(who);
    ASSERT_TRUE(t.ok()) << who;
    held.push_back(std::move(*t));
  }
  auto more = streams.Admit("uid:3");
  ASSERT_FALSE(more.ok());
  EXPECT_NE(more.status().message().find("max-sessionless-streams)"), std::string::npos)
      << more.status().message();
  EXPECT_EQ(streams.refused_total_limit(), 1u);
  held.pop_back();  // destroying a ticket gives its place back
  EXPECT_TRUE(streams.Admit("uid:3").ok());
}

TEST(SessionlessStreamsTest, APlaceComesBackOnceWhateverHappensToItsTicket) {
  SessionlessStreams streams({/*total=*/0, /*per_identity=*/1});
  {
    auto t = streams.Admit("uid:7");
    ASSERT_TRUE(t.ok());
    SessionlessStreams::Ticket moved = std::move(*t);
    EXPECT_FALSE(t->held());
    EXPECT_TRUE(moved.held());
    EXPECT_EQ(streams.count(), 1u);
    moved.Release();
    moved.Release();  // idempotent
    EXPECT_FALSE(moved.held());
    EXPECT_EQ(streams.count(), 0u);
    auto again = streams.Admit("uid:7");
    ASSERT_TRUE(again.ok());
    moved = std::move(*again);  // assigned over an empty ticket
    EXPECT_EQ(streams.count(), 1u);
    auto other = streams.Admit("uid:8");
    ASSERT_TRUE(other.ok());
    moved = std::move(*other);  // assigned over a held one: uid:7's place comes back
    EXPECT_EQ(streams.count(), 1u);
    EXPECT_TRUE(streams.Admit("uid:7").ok());
  }  // every ticket destroyed
  EXPECT_EQ(streams.count(), 0u);
}

// A finished stream is counted whatever the limits (Hold), and while it is, new streams of
// its identity are refused.
TEST(SessionlessStreamsTest, AHoldIsNeverRefusedAndCountsAgainstTheLimit) {
  SessionlessStreams streams({/*total=*/0, /*per_identity=*/1});
  auto first = streams.Admit("uid:5");
  ASSERT_TRUE(first.ok());
  SessionlessStreams::Ticket held = streams.Hold("uid:5");  // past the limit: still counted
  EXPECT_TRUE(held.held());
  EXPECT_EQ(streams.count(), 2u);
  first->Release();
  EXPECT_FALSE(streams.Admit("uid:5").ok()) << "the hold keeps the identity at its limit";
  held.Release();
  EXPECT_TRUE(streams.Admit("uid:5").ok());
  EXPECT_EQ(streams.refused_per_identity(), 1u);
}

// A kept stream (its session closed, Close.keep_stream) takes a place within the limits like
// a new stream; past them it gets none, and that is not counted as a refused stream.
TEST(SessionlessStreamsTest, AKeptStreamTakesAPlaceWithinTheLimitsAndIsNeverCountedRefused) {
  SessionlessStreams streams({/*total=*/3, /*per_identity=*/1});
  std::optional<SessionlessStreams::Ticket> kept = streams.Keep("uid:5");
  ASSERT_TRUE(kept);
  EXPECT_EQ(streams.count(), 1u);
  EXPECT_FALSE(streams.Keep("uid:5")) << "past the identity's limit";
  EXPECT_FALSE(streams.Admit("uid:5").ok()) << "the kept stream holds the identity's place";
  auto other = streams.Admit("uid:6");
  auto third = streams.Admit("uid:7");
  ASSERT_TRUE(other.ok() && third.ok());
  EXPECT_FALSE(streams.Keep("uid:8")) << "past the daemon-wide limit";
  EXPECT_EQ(streams.refused_per_identity(), 1u) << "only the Admit counts";
  EXPECT_EQ(streams.refused_total_limit(), 0u);
  kept.reset();
  EXPECT_EQ(streams.count(), 2u);
  EXPECT_TRUE(streams.Keep("uid:5"));
}

TEST(SessionlessStreamsTest, ZeroMeansNoLimit) {
  SessionlessStreams streams({/*total=*/0, /*per_identity=*/0});
  std::vector<SessionlessStreams::Ticket> held;
  for (int i = 0; i < 5000; ++i) {
    auto t = streams.Admit("uid:1000");
    ASSERT_TRUE(t.ok()) << i;
    held.push_back(std::move(*t));
  }
  EXPECT_EQ(streams.count(), 5000u);
  held.clear();
  EXPECT_EQ(streams.count(), 0u);
}

}  // namespace
}  // namespace ferry::rpc
