// InputSequencer (server/rpc/input_sequencer.h): messages that arrive by the stream and the
// submit ring are delivered in the client's order, each once; a path's message waits for a
// lower number from the other path; what breaks the numbering is a protocol violation.
#include "rpc/input_sequencer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/v1/session.pb.h"

namespace ferry::rpc {
namespace {

using Sequencer = InputSequencer<v1::ClientMessage>;

// `s` is a protocol violation whose message holds `says`.
void ExpectViolation(const Status& s, const std::string& says) {
  EXPECT_EQ(s.kind(), ErrorKind::kProtocolViolation);
  EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
}

class InputSequencerTest : public ::testing::Test {
 protected:
  Status Accept(uint64_t sequence, Sequencer::Source from) {
    auto m = std::make_shared<v1::ClientMessage>();
    m->set_sequence(sequence);
    return sequencer_.Accept(
        std::move(m), from, [this] { return running_; },
        [this](std::shared_ptr<v1::ClientMessage> m, Sequencer::Source source) {
          delivered_.push_back({m->sequence(), source});
        });
  }

  Sequencer sequencer_;
  bool running_ = true;
  std::vector<std::pair<uint64_t, Sequencer::Source>> delivered_;
};

using Delivered = std::vector<std::pair<uint64_t, Sequencer::Source>>;
constexpr auto kStream = Sequencer::kStream;
constexpr auto kRing = Sequencer::kRing;

TEST_F(InputSequencerTest, UnnumberedMessagesAreDeliveredAtOnce) {
  EXPECT_TRUE(Accept(0, kStream).ok());
  EXPECT_TRUE(Accept(0, kStream).ok());
  EXPECT_EQ(delivered_, (Delivered{{0, kStream}, {0, kStream}}));
}

TEST_F(InputSequencerTest, APathWaitsForTheLowerNumberOnTheOther) {
  EXPECT_TRUE(Accept(1, kRing).ok());
  EXPECT_TRUE(Accept(3, kRing).ok());  // 2 has not come: held
  EXPECT_TRUE(sequencer_.holds(kRing));
  EXPECT_EQ(delivered_, (Delivered{{1, kRing}}));
  EXPECT_TRUE(Accept(2, kStream).ok());  // 2, then the held 3
  EXPECT_EQ(delivered_, (Delivered{{1, kRing}, {2, kStream}, {3, kRing}}));
  EXPECT_FALSE(sequencer_.holds(kRing));
  EXPECT_FALSE(sequencer_.holds(kStream));
  EXPECT_EQ(sequencer_.next_sequence(), 4u);
}

TEST_F(InputSequencerTest, ANumberThatComesAgainOrLateIsAViolation) {
  EXPECT_TRUE(Accept(1, kStream).ok());
  ExpectViolation(Accept(1, kRing), "comes again or late");
  EXPECT_EQ(delivered_.size(), 1u) << "delivered once";
}

TEST_F(InputSequencerTest, AnUnnumberedMessageAfterNumberedOnesIsAViolation) {
  EXPECT_TRUE(Accept(1, kRing).ok());
  EXPECT_EQ(Accept(0, kStream).kind(), ErrorKind::kProtocolViolation);
  EXPECT_EQ(delivered_.size(), 1u);
}

TEST_F(InputSequencerTest, BothPathsWaitingOnAMissingNumberIsAViolation) {
  EXPECT_TRUE(Accept(2, kStream).ok());
  ExpectViolation(Accept(3, kRing), "sequence number 1 is missing");
  EXPECT_TRUE(delivered_.empty());
}

TEST_F(InputSequencerTest, NothingIsDeliveredWhileNotRunning) {
  running_ = false;  // the connection is finishing
  EXPECT_TRUE(Accept(1, kStream).ok());
  EXPECT_TRUE(delivered_.empty());
  EXPECT_TRUE(sequencer_.holds(kStream));
  EXPECT_TRUE(Accept(2, kRing).ok()) << "no violation reported while finishing";
}

}  // namespace
}  // namespace ferry::rpc
