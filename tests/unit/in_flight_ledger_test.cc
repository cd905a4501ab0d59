// InFlightLedger (server/rpc/in_flight_ledger.h): a stream's accepted messages count until
// answered, each submit is charged what it makes the daemon hold, to the session and to the
// daemon and its identity, and everything is given back as answers are written, when the board
// reports a success, or when the stream ends; the charges decide when reading stops.
#include "rpc/in_flight_ledger.h"

#include <gtest/gtest.h>

#include <string>

#include "rpc/session_context.h"

namespace ferry::rpc {
namespace {

class InFlightLedgerTest : public ::testing::Test {
 protected:
  InFlightLedgerTest() : registry_(8ull << 30, 64) {
    registry_.SetInFlightBytesLimit(1 << 20);
    account_ = registry_.AccountFor(session::PeerIdentity{"test"});
  }
  // A submit as the intake takes it: parsed, its parse held for the daemon and the identity.
  std::shared_ptr<IncomingMessage> Submit(uint64_t id, uint64_t ops, bool download = false) {
    v1::ClientMessage m;
    m.mutable_submit()->set_submit_id(id);
    for (uint64_t i = 0; i < ops; ++i) m.mutable_submit()->add_ops()->mutable_fill();
    if (download) m.mutable_submit()->add_ops()->mutable_download()->set_length(1000);
    return TakeClientMessage(m.SerializeAsString(), IntakeBounds{true, 0, 0, &registry_, account_});
  }
  static v1::ServerMessage Completed(uint64_t id, uint64_t first = 0) {
    v1::ServerMessage m;
    m.mutable_completed()->set_submit_id(id);
    m.mutable_completed()->set_first_submit_id(first);
    return m;
  }

  StreamGauges gauges_;
  session::SessionRegistry registry_;
  std::shared_ptr<session::UidAccount> account_;
};

TEST_F(InFlightLedgerTest, ASubmitIsChargedUntilItsCompletedIsWritten) {
  InFlightLedger ledger(&gauges_, &registry_);
  ledger.set_account(account_);
  auto s1 = Submit(1, 10);
  const uint64_t parse = s1->scan.parsed_bytes;
  ASSERT_TRUE(ledger.ChargeSubmit(*s1, 0).ok());
  s1.reset();  // the hold was taken over: dropping the message gives nothing back
  const uint64_t charge = parse + InFlightLedger::kMessageCost;
  EXPECT_EQ(ledger.bytes(), charge);
  EXPECT_EQ(ledger.unanswered(), 1u);
  EXPECT_EQ(registry_.in_flight_bytes(), charge);
  EXPECT_EQ(account_->in_flight_bytes(), charge);
  EXPECT_EQ(gauges_.bytes_in_flight.load(), static_cast<int64_t>(charge));
  EXPECT_EQ(gauges_.unanswered.load(), 1);
  ledger.Answered(Completed(1));
  EXPECT_TRUE(ledger.idle());
  EXPECT_EQ(ledger.bytes(), 0u);
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
  EXPECT_EQ(gauges_.bytes_in_flight.load(), 0);
  EXPECT_EQ(gauges_.unanswered.load(), 0);
}

TEST_F(InFlightLedgerTest, OneCompletedAnswersARunOfSubmits) {
  InFlightLedger ledger(&gauges_, &registry_);
  ledger.set_account(account_);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(ledger.ChargeSubmit(*Submit(id, 1), 0).ok());
  ledger.AddUnanswered(1);  // a Synchronize
  ledger.Answered(Completed(3, 1));
  EXPECT_EQ(ledger.unanswered(), 2u);  // submit 4 and the Synchronize
  v1::ServerMessage synchronized;
  synchronized.mutable_synchronized();
  ledger.Answered(synchronized);
  EXPECT_EQ(ledger.unanswered(), 1u);
  v1::ServerMessage chunk;
  chunk.mutable_download_chunk();
  ledger.Answered(chunk);  // answers nothing
  EXPECT_EQ(ledger.unanswered(), 1u);
  ledger.Answered(Completed(4));
  EXPECT_TRUE(ledger.idle());
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
}

TEST_F(InFlightLedgerTest, TheBoardAnswersASuccessUnlessItHasDownloads) {
  InFlightLedger ledger(&gauges_, &registry_);
  ledger.set_account(account_);
  ASSERT_TRUE(ledger.ChargeSubmit(*Submit(1, 1), 0).ok());
  ASSERT_TRUE(ledger.ChargeSubmit(*Submit(2, 1, /*download=*/true), 0).ok());
  ASSERT_TRUE(ledger.ChargeSubmit(*Submit(3, 1), 0).ok());
  EXPECT_TRUE(ledger.AnsweredOnBoard(3));  // not the oldest
  EXPECT_FALSE(ledger.AnsweredOnBoard(2)) << "its Completed carries the end of its bytes";
  EXPECT_FALSE(ledger.AnsweredOnBoard(9));
  EXPECT_EQ(ledger.unanswered(), 2u);
  ledger.Answered(Completed(2, 1));
  EXPECT_TRUE(ledger.idle());
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
}

TEST_F(InFlightLedgerTest, ARefusedSubmitIsCountedButChargedToTheSessionOnly) {
  InFlightLedger ledger(&gauges_, &registry_);
  ledger.set_account(account_);
  // Over the session's limit on its own.
  auto big = Submit(1, 1000);
  Status s = ledger.ChargeSubmit(*big, /*session_limit=*/1000);
  EXPECT_EQ(s.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_EQ(ledger.unanswered(), 1u);
  EXPECT_GT(ledger.bytes(), 1000u);
  big.reset();  // the refused submit's hold goes with it
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
  // Over what the daemon may hold (1 MiB).
  auto huge = Submit(2, 5000);
  ASSERT_LT(huge->scan.parsed_bytes, 1u << 20) << "its parse alone fits";
  ASSERT_TRUE(huge->refusal.ok());
  registry_.SetInFlightBytesLimit(huge->scan.parsed_bytes + 10);
  EXPECT_EQ(ledger.ChargeSubmit(*huge, 0).kind(), ErrorKind::kQuotaExceeded);
  ledger.Answered(Completed(2, 1));
  huge.reset();
  EXPECT_TRUE(ledger.idle());
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
}

TEST_F(InFlightLedgerTest, BytesStopReadingAtTheSessionsLimitOrNearTheDaemons) {
  InFlightLedger ledger(&gauges_, &registry_);
  ledger.set_account(account_);
  EXPECT_FALSE(ledger.OverBytes(1000, 0, 64));
  EXPECT_TRUE(ledger.OverBytes(1000, 1000, 64)) << "unsent answers count";
  ASSERT_TRUE(ledger.ChargeSubmit(*Submit(1, 1), 0).ok());
  const uint64_t held = ledger.bytes();
  EXPECT_TRUE(ledger.OverBytes(held, 0, 64));
  EXPECT_FALSE(ledger.OverBytes(held + 1, 0, 64));
  // Less than the headroom left of the daemon's limit: stop while holding anything.
  EXPECT_TRUE(ledger.OverBytes(0, 0, (1 << 20) - held + 1));
  EXPECT_EQ(ledger.Room(0), (1u << 20) - held);
  EXPECT_EQ(ledger.Room(held + 5), 5u);
}

TEST_F(InFlightLedgerTest, ClearGivesEverythingBack) {
  {
    InFlightLedger ledger(&gauges_, &registry_);
    ledger.set_account(account_);
    ASSERT_TRUE(ledger.ChargeSubmit(*Submit(1, 3), 0).ok());
    ledger.AddUnanswered(1);
  }  // destroyed: cleared
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
  EXPECT_EQ(account_->in_flight_bytes(), 0u);
  EXPECT_EQ(gauges_.bytes_in_flight.load(), 0);
  EXPECT_EQ(gauges_.unanswered.load(), 0);
}

}  // namespace
}  // namespace ferry::rpc
