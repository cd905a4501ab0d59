// Message intake (server/rpc/message_intake.h): a message is held to its session's bounds
// before it is parsed. A submit over them is refused unparsed (the answer still names its id
// and number); a submit's parse is charged to its identity and the daemon until the session
// takes the charge over or the message is dropped; what is not a ClientMessage, or a large
// message that is not a submit, ends the stream.
#include "rpc/message_intake.h"

#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/v1/session.pb.h"
#include "serialized_messages.h"

namespace ferry::rpc {
namespace {

std::string OpBomb(uint64_t ops, uint64_t submit_id, uint64_t sequence) {
  return testing::SubmitOfFills(ops, submit_id, sequence);
}

class MessageIntakeTest : public ::testing::Test {
 protected:
  MessageIntakeTest() : registry_(8ull << 30, 64) {
    registry_.SetInFlightBytesLimit(64ull << 20);
    session::PeerIdentity peer{"test"};
    account_ = registry_.AccountFor(peer);
  }
  IntakeBounds Bounds(uint64_t max_ops = 1 << 20, uint64_t max_parsed = 256ull << 20) {
    return IntakeBounds{true, max_ops, max_parsed, &registry_, account_};
  }

  session::SessionRegistry registry_;
  std::shared_ptr<session::UidAccount> account_;
};

TEST_F(MessageIntakeTest, ASubmitIsParsedAndItsParseChargedUntilTheMessageGoes) {
  const std::string bytes = OpBomb(100, 4, 2);
  {
    auto in = TakeClientMessage(bytes, Bounds());
    ASSERT_TRUE(in->violation.ok());
    ASSERT_TRUE(in->refusal.ok());
    ASSERT_NE(in->message, nullptr);
    EXPECT_EQ(in->message->submit().ops_size(), 100);
    EXPECT_EQ(in->sequence(), 2u);
    EXPECT_EQ(in->hold.bytes(), in->scan.parsed_bytes);
    EXPECT_EQ(registry_.in_flight_bytes(), in->scan.parsed_bytes);
    EXPECT_EQ(account_->in_flight_bytes(), in->scan.parsed_bytes);
  }
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);  // dropped: refunded
  EXPECT_EQ(account_->in_flight_bytes(), 0u);
}

TEST_F(MessageIntakeTest, AHoldReleasedIsTheCallersToRefund) {
  auto in = TakeClientMessage(OpBomb(10, 1, 0), Bounds());
  const uint64_t bytes = in->hold.Release();
  in.reset();
  EXPECT_EQ(registry_.in_flight_bytes(), bytes);
  registry_.RefundInFlightBytes(account_.get(), bytes);
}

TEST_F(MessageIntakeTest, ASubmitOfTooManyOpsIsRefusedUnparsed) {
  auto in = TakeClientMessage(OpBomb(1000, 6, 3), Bounds(/*max_ops=*/999));
  ASSERT_TRUE(in->violation.ok());
  EXPECT_EQ(in->refusal.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(in->refusal.message().find("at most 999 ops"), std::string::npos);
  ASSERT_NE(in->message, nullptr);
  EXPECT_EQ(in->message->submit().submit_id(), 6u);
  EXPECT_EQ(in->message->submit().ops_size(), 0);  // never parsed
  EXPECT_EQ(in->sequence(), 3u);
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
}

TEST_F(MessageIntakeTest, ASubmitWhoseParseWouldPassTheSessionsBytesIsRefusedUnparsed) {
  auto in = TakeClientMessage(OpBomb(100000, 6, 0), Bounds(1 << 20, /*max_parsed=*/1 << 20));
  EXPECT_EQ(in->refusal.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(in->refusal.message().find("before it was parsed"), std::string::npos);
  EXPECT_EQ(in->message->submit().ops_size(), 0);
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
}

TEST_F(MessageIntakeTest, ASubmitTheDaemonCannotHoldIsRefusedUnparsed) {
  registry_.SetInFlightBytesLimit(1 << 20);
  auto in = TakeClientMessage(OpBomb(100000, 6, 0), Bounds());
  EXPECT_EQ(in->refusal.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(in->refusal.message().find("in-flight-bytes"), std::string::npos);
  EXPECT_EQ(in->message->submit().ops_size(), 0);
  EXPECT_EQ(registry_.in_flight_bytes(), 0u);
}

TEST_F(MessageIntakeTest, AStringThatIsNotUtf8RefusesItsSubmitAndEndsAnOpen) {
  std::string bytes = testing::SubmitWithLaunchNamed('\xc0', 2, 5);
  auto in = TakeClientMessage(bytes, Bounds());
  EXPECT_TRUE(in->violation.ok());
  EXPECT_EQ(in->refusal.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(in->message->submit().submit_id(), 2u);
  EXPECT_EQ(in->sequence(), 5u);

  v1::ClientMessage open;
  open.mutable_open()->set_client_name("n");
  bytes = open.SerializeAsString();
  bytes[bytes.find('n')] = '\xff';
  in = TakeClientMessage(bytes, IntakeBounds{});
  EXPECT_EQ(in->violation.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(in->violation.message().find("ferry.v1.Open.client_name"), std::string::npos);
  EXPECT_EQ(in->message, nullptr);
}

TEST_F(MessageIntakeTest, ALargeMessageThatIsNotASubmitEndsTheStream) {
  v1::ClientMessage close;
  for (int i = 0; i < 1000000; ++i) close.mutable_close()->add_keep_slabs(1);
  auto in = TakeClientMessage(close.SerializeAsString(), Bounds());
  EXPECT_EQ(in->violation.kind(), ErrorKind::kProtocolViolation);
  EXPECT_EQ(in->message, nullptr);
  // Before Open, a large submit too: there is no session to refuse it to.
  in = TakeClientMessage(OpBomb(100000, 1, 0), IntakeBounds{});
  EXPECT_EQ(in->violation.kind(), ErrorKind::kProtocolViolation);
  // A small one is parsed: the connection answers it (a Submit before Open).
  in = TakeClientMessage(OpBomb(1, 1, 0), IntakeBounds{});
  ASSERT_TRUE(in->violation.ok());
  EXPECT_TRUE(in->message->has_submit());
  EXPECT_EQ(in->hold.bytes(), 0u);
}

TEST_F(MessageIntakeTest, BytesThatAreNotAClientMessageEndTheStream) {
  auto in = TakeClientMessage(std::string("\x12\x7f", 2), Bounds());
  EXPECT_EQ(in->violation.kind(), ErrorKind::kProtocolViolation);
  EXPECT_EQ(in->message, nullptr);
}

// A message whose parse fits every bound whatever it holds is parsed at once, without a scan:
// what the connection reads of it is what a scan finds, and it is charged what its parse took.
TEST_F(MessageIntakeTest, ASmallSubmitIsParsedWithoutAScanAndChargedWhatItsParseTook) {
  v1::ClientMessage m;
  m.set_sequence(11);
  v1::Submit* submit = m.mutable_submit();
  submit->set_submit_id(21);
  submit->add_ops()->mutable_upload()->set_data(std::string(300, 'u'));
  submit->add_ops()->mutable_download()->set_length(4096);
  submit->add_ops()->mutable_download()->set_length(10);
  submit->add_ops()->mutable_fill()->set_tensor(3);
  submit->add_ops()->mutable_launch()->set_function("k");
  const std::string bytes = m.SerializeAsString();
  ASSERT_LE(MostParsedBytes(bytes.size()), kMaxControlBytes);
  auto in = TakeClientMessage(bytes, Bounds());
  ASSERT_TRUE(in->violation.ok());
  ASSERT_TRUE(in->refusal.ok());
  ASSERT_NE(in->message, nullptr);
  EXPECT_EQ(in->message->submit().ops_size(), 5);
  const WireScan scan = ScanClientMessage(bytes);
  EXPECT_EQ(in->scan.kind, scan.kind);
  EXPECT_EQ(in->scan.sequence, 11u);
  EXPECT_EQ(in->scan.submit_id, 21u);
  EXPECT_EQ(in->scan.ops, scan.ops);
  EXPECT_EQ(in->scan.op_kinds, scan.op_kinds);
  EXPECT_EQ(in->scan.upload_bytes, 300u);
  EXPECT_EQ(in->scan.downloads, 2u);
  EXPECT_EQ(in->scan.download_bytes, 4106u);
  EXPECT_EQ(in->scan.parsed_bytes, static_cast<uint64_t>(in->arena.SpaceUsed()));
  EXPECT_LE(in->scan.parsed_bytes, MostParsedBytes(bytes.size()));
  EXPECT_EQ(in->hold.bytes(), in->scan.parsed_bytes);
  EXPECT_EQ(registry_.in_flight_bytes(), in->scan.parsed_bytes);
  // The submit's summary is made as for a scanned one.
  EXPECT_EQ(in->summary.ops(), 5u);
  EXPECT_EQ(in->summary.to_device_bytes(), 300u);
  EXPECT_EQ(in->summary.to_host_bytes(), 4106u);
}

// Where the most its parse could take does not fit what its identity may still hold, a small
// submit is scanned and held to its estimate before it is parsed.
TEST_F(MessageIntakeTest, ASmallSubmitIsScannedWhereItsMostParseWouldNotFit) {
  const std::string bytes = OpBomb(1000, 7, 1);
  const uint64_t estimate = ScanClientMessage(bytes).parsed_bytes;
  ASSERT_LT(estimate, MostParsedBytes(bytes.size()));
  registry_.SetInFlightBytesLimit(estimate);  // room for the estimate, not for the most
  auto in = TakeClientMessage(bytes, Bounds());
  ASSERT_TRUE(in->refusal.ok()) << in->refusal.ToString();
  EXPECT_EQ(in->message->submit().ops_size(), 1000);
  EXPECT_EQ(in->scan.parsed_bytes, estimate);
  EXPECT_EQ(registry_.in_flight_bytes(), estimate);
  EXPECT_EQ(in->summary.ops(), 1000u);
}

// gRPC's bytes come in slices; the message is the same.
TEST_F(MessageIntakeTest, AMessageInSlicesIsTakenLikeOneInMemory) {
  const std::string bytes = OpBomb(1000, 9, 4);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += 100) {
    slices.emplace_back(bytes.substr(at, 100));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  auto in = TakeClientMessage(buffer, Bounds());
  ASSERT_TRUE(in->violation.ok());
  ASSERT_TRUE(in->refusal.ok());
  EXPECT_EQ(in->message->submit().ops_size(), 1000);
  EXPECT_EQ(in->message->submit().submit_id(), 9u);
  EXPECT_EQ(in->sequence(), 4u);
}

}  // namespace
}  // namespace ferry::rpc
