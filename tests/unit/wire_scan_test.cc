// WireScan (server/rpc/wire_scan.h): a client message's wire bytes are read without parsing
// them: what it is (kind, sequence, submit id, ops), whether protobuf could parse it, and how
// much memory its parse would take, within a small factor, so that a message whose parse
// would cost many times its size is refused before it is parsed.
#include "rpc/wire_scan.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/v1/session.pb.h"
#include "serialized_messages.h"
#include "wire_bytes.h"

namespace ferry::rpc {
namespace {

using testing::LengthField;
using testing::OpBomb;
using testing::Varint;

// A length-delimited field's bytes.
std::string Field(uint32_t number, const std::string& payload) {
  return LengthField(number, payload);
}

v1::ClientMessage ATypicalSubmit() {
  v1::ClientMessage m;
  m.set_sequence(7);
  v1::Submit* s = m.mutable_submit();
  s->set_submit_id(42);
  v1::CreateTensor* c = s->add_ops()->mutable_create_tensor();
  c->set_handle(1);
  c->set_dtype(v1::DTYPE_F32);
  c->add_shape(16);
  c->add_shape(64);
  v1::Upload* u = s->add_ops()->mutable_upload();
  u->set_tensor(1);
  u->set_data(std::string(4096, 'x'));
  s->add_ops()->mutable_fill()->set_tensor(1);
  v1::Launch* l = s->add_ops()->mutable_launch();
  l->set_module(3);
  l->set_function("saxpy");
  l->add_grid(4);
  l->add_block(256);
  for (int i = 0; i < 4; ++i) l->add_args()->set_tensor(1);
  v1::Download* d = s->add_ops()->mutable_download();
  d->set_tensor(1);
  d->set_length(4096);
  return m;
}

TEST(WireScanTest, ReadsWhatTheConnectionNeedsWithoutParsing) {
  const std::string bytes = ATypicalSubmit().SerializeAsString();
  WireScan scan = ScanClientMessage(bytes);
  ASSERT_TRUE(scan.status.ok()) << scan.status.ToString();
  EXPECT_EQ(scan.kind, static_cast<uint32_t>(v1::ClientMessage::kSubmit));
  EXPECT_EQ(scan.sequence, 7u);
  EXPECT_EQ(scan.submit_id, 42u);
  EXPECT_EQ(scan.ops, 5u);
  EXPECT_EQ(scan.op_kinds, (1u << v1::Op::kCreateTensor) | (1u << v1::Op::kUpload) |
                               (1u << v1::Op::kFill) | (1u << v1::Op::kLaunch) |
                               (1u << v1::Op::kDownload));
  EXPECT_EQ(scan.upload_bytes, 4096u);
  EXPECT_EQ(scan.downloads, 1u);
  EXPECT_EQ(scan.download_bytes, 4096u);
  EXPECT_FALSE(scan.over_budget);
}

// The estimate is within a small factor of what the parsed message holds (SpaceUsedLong, which
// counts objects, repeated fields' capacity, strings and unknown fields).
TEST(WireScanTest, EstimatesTheParsedMemoryWithinASmallFactor) {
  // The empty message (zero bytes) parses to a message object and nothing else.
  std::vector<std::string> messages = {ATypicalSubmit().SerializeAsString(), OpBomb(10000, 1, 1),
                                       std::string()};
  v1::ClientMessage open;
  open.mutable_open()->set_client_name(std::string(100, 'n'));
  messages.push_back(open.SerializeAsString());
  v1::ClientMessage launch_args;
  for (int i = 0; i < 5000; ++i) {
    launch_args.mutable_submit()->add_ops()->mutable_launch()->add_args()->set_f32(1.0f);
  }
  messages.push_back(launch_args.SerializeAsString());
  // 10,000 unknown varint fields in a Synchronize.
  std::string unknown;
  for (int i = 0; i < 10000; ++i) unknown += Varint(99 << 3) + Varint(1);
  messages.push_back(Field(3, unknown));
  for (const std::string& bytes : messages) {
    v1::ClientMessage parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes));
    const double held = static_cast<double>(parsed.SpaceUsedLong());
    WireScan scan = ScanClientMessage(bytes);
    ASSERT_TRUE(scan.status.ok()) << scan.status.ToString();
    EXPECT_GE(static_cast<double>(scan.parsed_bytes), 0.5 * held) << bytes.size() << " bytes";
    EXPECT_LE(static_cast<double>(scan.parsed_bytes), 4.0 * held) << bytes.size() << " bytes";
  }
}

TEST(WireScanTest, AnOpBombCostsManyTimesItsSize) {
  const std::string bytes = OpBomb(100000, 5, 9);
  WireScan scan = ScanClientMessage(bytes);
  ASSERT_TRUE(scan.status.ok());
  EXPECT_EQ(scan.ops, 100000u);
  EXPECT_GT(scan.parsed_bytes, 10 * bytes.size());
}

// Past the budget the scan stops counting but still finds the sequence number at the end, so
// the refused submit can be answered in its place.
TEST(WireScanTest, PastItsBudgetTheScanStillReadsTheSequence) {
  const std::string bytes = OpBomb(100000, 5, 9);
  WireScan scan = ScanClientMessage(bytes, 64 << 10);
  ASSERT_TRUE(scan.status.ok());
  EXPECT_TRUE(scan.over_budget);
  EXPECT_GT(scan.parsed_bytes, 64u << 10);
  EXPECT_LT(scan.ops, 100000u);  // counting stopped
  EXPECT_EQ(scan.submit_id, 5u);
  EXPECT_EQ(scan.sequence, 9u);
  EXPECT_EQ(scan.kind, static_cast<uint32_t>(v1::ClientMessage::kSubmit));
}

TEST(WireScanTest, UnknownAndPackedFieldsAreCounted) {
  std::string unknown;
  for (int i = 0; i < 1000; ++i) unknown += Varint(99 << 3) + Varint(1);
  EXPECT_GE(ScanClientMessage(Field(3, unknown)).parsed_bytes, 1000u * 16);
  std::string shape;
  for (int i = 0; i < 1000; ++i) shape += Varint(1);
  // Submit { ops { create_tensor { shape: [1, 1, ...] (packed) } } }
  const std::string packed = Field(2, Field(2, Field(1, Field(3, shape))));
  WireScan scan = ScanClientMessage(packed);
  ASSERT_TRUE(scan.status.ok()) << scan.status.ToString();
  EXPECT_GE(scan.parsed_bytes, 1000u * 8);
}

TEST(WireScanTest, BytesThatAreNotAClientMessageAreAViolation) {
  const std::string good = ATypicalSubmit().SerializeAsString();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"cut short", good.substr(0, good.size() - 3)},
      {"a varint cut short", std::string("\x50\xff", 2)},
      {"a length past the end", Field(2, "") + "\x12\x7f"},
      {"a group", std::string("\x0b\x0c", 2)},
      {"field number 0", std::string("\x00\x01", 2)},
      {"wire type 7", std::string("\x0f", 1)},
      {"a packed varint cut short", Field(2, Field(2, Field(1, Field(3, "\x81"))))},
      // protobuf's parser reads a tag of at most 5 bytes (CodedInputStream::ReadTag would
      // take 10 and drop the high bits).
      {"a tag of 6 bytes", std::string("\xf8\x80\x80\x80\x80\x00\x01", 7)},
      {"a packed varint of 11 bytes",
       Field(4, Field(2, std::string(10, '\xff') + std::string("\x01", 1)))},
      {"a tag past 32 bits", Varint(uint64_t{15} << 35) + Varint(1)},
      // ... and a length of at most 5 bytes, below 2 GiB: these are 0 modulo 2^32.
      {"a length of 6 bytes", std::string("\x12\x80\x80\x80\x80\x80\x00", 7)},
      {"a length of 2^32", std::string("\x12\x80\x80\x80\x80\x10", 6)},
  };
  for (const auto& [what, bytes] : bad) {
    WireScan scan = ScanClientMessage(bytes);
    EXPECT_EQ(scan.status.kind(), ErrorKind::kProtocolViolation) << what;
    // protobuf keeps a group as an unknown field; the protocol has none, so the scan is
    // stricter there. Everything else protobuf refuses too.
    if (what == "a group") continue;
    v1::ClientMessage parsed;
    EXPECT_FALSE(parsed.ParseFromString(bytes)) << what << ": protobuf parses it";
  }
}

// A string field that is not UTF-8 is named (protobuf refuses to parse it, and logs a line per
// message); the scan agrees with protobuf's parse on each of these.
TEST(WireScanTest, AStringThatIsNotUtf8IsNamedAndAgreesWithTheParse) {
  const std::vector<std::pair<std::string, bool>> names = {
      {"plain", true},
      {"\xc3\xa9t\xc3\xa9", true},       // two-byte forms
      {"\xe2\x82\xac", true},            // a three-byte form
      {"\xf0\x9f\x9a\x80", true},        // a four-byte form
      {"\xf4\x8f\xbf\xbf", true},        // U+10FFFF
      {"\xff", false},                   // never a UTF-8 byte
      {"\xc0\x80", false},               // overlong
      {"\xe0\x80\x80", false},           // overlong
      {"\xed\xa0\x80", false},           // a surrogate
      {"\xf4\x90\x80\x80", false},       // past U+10FFFF
      {"\xe2\x82", false},               // cut short
      {std::string("a\x80", 2), false},  // a stray continuation byte
  };
  for (const auto& [name, valid] : names) {
    const std::string bytes = Field(1, Field(2, name));  // Open { client_name: name }
    WireScan scan = ScanClientMessage(bytes);
    v1::ClientMessage parsed;
    EXPECT_EQ(parsed.ParseFromString(bytes), valid) << "protobuf, for " << name;
    if (valid) {
      EXPECT_TRUE(scan.status.ok()) << name;
    } else {
      EXPECT_EQ(scan.status.kind(), ErrorKind::kInvalidArgument) << name;
      EXPECT_NE(scan.status.message().find("ferry.v1.Open.client_name"), std::string::npos)
          << scan.status.message();
    }
  }
}

// A bad string in a submit leaves the scan going: the sequence after it is still read.
TEST(WireScanTest, ABadStringInASubmitStillYieldsItsSequence) {
  WireScan scan = ScanClientMessage(testing::SubmitWithLaunchNamed('\xff', 8, 3));
  EXPECT_EQ(scan.status.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(scan.status.message().find("ferry.v1.Launch.function"), std::string::npos);
  EXPECT_EQ(scan.sequence, 3u);
  EXPECT_EQ(scan.submit_id, 8u);
}

// gRPC hands the scan a message in slices: the same bytes in pieces of 1, 3 and 7 bytes scan
// the same.
TEST(WireScanTest, ScansTheSameOverAStreamOfSmallPieces) {
  const std::string bytes = ATypicalSubmit().SerializeAsString();
  WireScan whole = ScanClientMessage(bytes);
  for (int piece : {1, 3, 7}) {
    google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()),
                                                  piece);
    WireScan scan = ScanClientMessage(stream, bytes.size());
    ASSERT_TRUE(scan.status.ok()) << piece;
    EXPECT_EQ(scan.parsed_bytes, whole.parsed_bytes);
    EXPECT_EQ(scan.ops, whole.ops);
    EXPECT_EQ(scan.upload_bytes, whole.upload_bytes);
    EXPECT_EQ(scan.sequence, whole.sequence);
  }
}

}  // namespace
}  // namespace ferry::rpc
