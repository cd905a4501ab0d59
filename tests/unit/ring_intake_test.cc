// RingIntake (server/rpc/ring_intake.h): what the ring poller hands over reaches the session in
// ring order while it may take it; parsing what was left unparsed is a turn's slice at most,
// a record too large for a shared thread goes to the long lane, and a broken ring is told only
// after every message before the break; the messages it holds are counted in hand until
// handled or dropped.
#include "rpc/ring_intake.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rpc/session_context.h"
#include "serialized_messages.h"
#include "transport/submit_ring.h"

namespace ferry::rpc {
namespace {

class FakeHost : public RingIntake::Host {
 public:
  bool MayTakeRingMessage() const override { return may_take; }
  std::shared_ptr<session::Session> ring_session() const override { return nullptr; }
  bool AcceptRingMessage(std::shared_ptr<IncomingMessage> m) override {
    accepted.push_back(m->scan.submit_id);
    return m->violation.ok();
  }
  void YieldRingDrain() override { ++yields; }
  void PostLongRecord(std::string record) override { long_records.push_back(std::move(record)); }
  void RingBroken(const std::string& what) override { broken.push_back(what); }

  bool may_take = true;
  std::vector<uint64_t> accepted;
  int yields = 0;
  std::vector<std::string> long_records;
  std::vector<std::string> broken;
};

std::string SubmitBytes(uint64_t id, size_t ops = 1) { return testing::SubmitOfFills(ops, id, id); }

class RingIntakeTest : public ::testing::Test {
 protected:
  RingIntakeTest() : gate_(std::make_shared<IntakeGate>()), intake_(&gauges_, gate_) {
    gate_->Set(IntakeBounds{true, 0, 0, nullptr, nullptr});
    auto poller = transport::RingPoller::Start(std::chrono::microseconds(0));
    EXPECT_TRUE(poller.ok());
    if (poller.ok()) poller_ = std::move(*poller);
  }
  // A ring registered with a poller that is never armed: the intake's own state is tested.
  std::shared_ptr<transport::RingPoller::Registration> Registration() {
    auto ring = transport::SubmitRing::Create(transport::SubmitRing::kMinCapacity);
    EXPECT_TRUE(ring.ok());
    return poller_->Add(std::move(*ring), [](transport::RingPoller::Taken) {});
  }
  // A parsed record, as the poller's thread leaves one.
  RingIntake::Record Parsed(uint64_t id) {
    return RingIntake::Record{TakeClientMessage(SubmitBytes(id), gate_->Get()), ""};
  }
  // A hand-over of `records`, counted in hand as the poller's handler counts them.
  bool Hand(std::vector<RingIntake::Record> records, std::string broken = "") {
    gauges_.messages_in_hand += static_cast<int64_t>(records.size());
    return intake_.Take(std::move(records), std::move(broken));
  }

  StreamGauges gauges_;
  std::unique_ptr<transport::RingPoller> poller_;
  std::shared_ptr<IntakeGate> gate_;
  RingIntake intake_;
};

TEST_F(RingIntakeTest, AHandOverIsDrainedInRingOrderWhileTheSessionMayTakeIt) {
  intake_.Attach(Registration());
  std::vector<RingIntake::Record> records;
  for (uint64_t id = 1; id <= 3; ++id) records.push_back(Parsed(id));
  ASSERT_TRUE(Hand(std::move(records)));
  EXPECT_EQ(intake_.incoming(), 3u);
  EXPECT_FALSE(intake_.ready_to_arm());
  FakeHost host;
  host.may_take = false;
  intake_.Drain(host);
  EXPECT_TRUE(host.accepted.empty());
  host.may_take = true;
  intake_.Drain(host);
  EXPECT_EQ(host.accepted, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(gauges_.messages_in_hand.load(), 0);
  EXPECT_TRUE(intake_.ready_to_arm());
}

TEST_F(RingIntakeTest, UnparsedRecordsWaitForATurnAndLargeOnesGoToTheLongLane) {
  intake_.Attach(Registration());
  std::vector<RingIntake::Record> records;
  records.push_back(Parsed(1));
  records.push_back(RingIntake::Record{nullptr, SubmitBytes(2)});
  ASSERT_TRUE(Hand(std::move(records)));
  FakeHost host;
  // Not on an io thread's turn (this test's thread): the drain stops at the record to parse.
  intake_.Drain(host);
  EXPECT_EQ(host.accepted, (std::vector<uint64_t>{1}));
  EXPECT_EQ(host.yields, 1);
  EXPECT_EQ(intake_.incoming(), 1u);

  RingIntake long_intake(&gauges_, gate_);
  long_intake.Attach(Registration());
  const std::string large = SubmitBytes(7, RingIntake::kLongLaneRecordBytes / 2);
  ASSERT_GT(large.size(), RingIntake::kLongLaneRecordBytes);
  std::vector<RingIntake::Record> more;
  more.push_back(RingIntake::Record{nullptr, large});
  more.push_back(Parsed(8));
  gauges_.messages_in_hand += 2;
  ASSERT_TRUE(long_intake.Take(std::move(more), ""));
  FakeHost long_host;
  long_intake.Drain(long_host);
  ASSERT_EQ(long_host.long_records.size(), 1u);
  EXPECT_EQ(long_host.long_records[0], large);
  EXPECT_TRUE(long_host.accepted.empty()) << "what comes after it waits";
  long_intake.LongRecordDone();
  long_intake.Drain(long_host);
  EXPECT_EQ(long_host.accepted, (std::vector<uint64_t>{8}));
}

TEST_F(RingIntakeTest, ABrokenRingIsToldAfterItsMessages) {
  intake_.Attach(Registration());
  std::vector<RingIntake::Record> records;
  records.push_back(Parsed(1));
  ASSERT_TRUE(Hand(std::move(records), "a bad head"));
  FakeHost host;
  host.may_take = false;
  intake_.Drain(host);
  EXPECT_TRUE(host.broken.empty());
  host.may_take = true;
  intake_.Drain(host);
  EXPECT_EQ(host.accepted, (std::vector<uint64_t>{1}));
  EXPECT_EQ(host.broken, (std::vector<std::string>{"a bad head"}));
}

TEST_F(RingIntakeTest, WhatIsDroppedIsNoLongerInHand) {
  ASSERT_FALSE(Hand({Parsed(1)})) << "no ring: the stream is ending";
  EXPECT_EQ(gauges_.messages_in_hand.load(), 0);
  intake_.Attach(Registration());
  std::vector<RingIntake::Record> records;
  records.push_back(Parsed(1));
  records.push_back(Parsed(2));
  ASSERT_TRUE(Hand(std::move(records)));
  intake_.ClearBacklog();  // a kept stream's next session starts afresh
  EXPECT_TRUE(intake_.attached());
  EXPECT_EQ(gauges_.messages_in_hand.load(), 0);
}

}  // namespace
}  // namespace ferry::rpc
