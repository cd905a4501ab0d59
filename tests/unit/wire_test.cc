// ferry/wire.h, the conversions the daemon and libferry share: DTypes and Statuses survive a
// round trip through ferry.v1; an error kind this build does not know keeps its number (from a
// message's Error and from the slab socket's bare kind); every session counter travels.
#include "ferry/wire.h"

#include <gtest/gtest.h>

#include "ferry/session.h"
#include "session/session.h"

namespace ferry {
namespace {

TEST(WireTest, DTypesRoundTripAndUnknownOnesAreInvalid) {
  for (DType d : {DType::kF32, DType::kF64, DType::kI32, DType::kU8}) {
    EXPECT_NE(wire::ToProto(d), v1::DTYPE_INVALID) << DTypeName(d);
    EXPECT_EQ(wire::FromProto(wire::ToProto(d)), d) << DTypeName(d);
  }
  EXPECT_EQ(wire::ToProto(DType::kInvalid), v1::DTYPE_INVALID);
  EXPECT_EQ(wire::FromProto(static_cast<v1::DType>(77)), DType::kInvalid);
}

TEST(WireTest, StatusRoundTripsThroughError) {
  for (int k = 1; k <= static_cast<int>(kLastErrorKind); ++k) {
    Status s(static_cast<ErrorKind>(k), "kind " + std::to_string(k), k % 3 - 1);
    v1::Error e;
    wire::ToProto(s, &e);
    EXPECT_EQ(wire::FromProto(e), s) << s.ToString();
  }
}

TEST(WireTest, AnUnknownKindInAnErrorKeepsItsNumberAndCode) {
  v1::Error e;
  e.set_code(static_cast<int>(Code::kFailedPrecondition));
  e.set_kind(static_cast<v1::ErrorKind>(42));
  e.set_message("from a newer daemon");
  Status s = wire::FromProto(e);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "unknown error kind 42: from a newer daemon");
}

TEST(WireTest, ABareKindFromTheSlabSocketDecodes) {
  Status quota = wire::FromWireKind(static_cast<uint32_t>(ErrorKind::kQuotaExceeded), "no slab");
  EXPECT_EQ(quota.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_EQ(quota.code(), Code::kResourceExhausted);
  EXPECT_EQ(quota.message(), "no slab");
  // A kind past the last one this build knows, small or huge: its number stays visible.
  Status newer = wire::FromWireKind(static_cast<uint32_t>(kLastErrorKind) + 1, "no slab");
  EXPECT_EQ(newer.code(), Code::kInternal);
  EXPECT_EQ(
      newer.message(),
      "unknown error kind " + std::to_string(static_cast<int>(kLastErrorKind) + 1) + ": no slab");
  Status huge = wire::FromWireKind(0xFFFFFFF0u, "no slab");
  EXPECT_NE(huge.message().find("unknown error kind"), std::string::npos) << huge.ToString();
}

TEST(WireTest, EverySessionCounterTravelsFromDaemonToClient) {
  session::SessionStatsSnapshot d;
  d.submits = 1, d.failed_submits = 2, d.ops = 3, d.kernel_launches = 4;
  d.bytes_uploaded = 5, d.bytes_downloaded = 6, d.tensors_created = 7;
  d.peak_device_bytes = 8, d.device_busy_ns = 9, d.graph_launches = 10, d.kernel_batches = 11;
  d.h2d_bytes = 12, d.h2d_ns = 13, d.d2h_bytes = 14, d.d2h_ns = 15;
  v1::SessionStats p;
  wire::StatsToProto(d, &p);
  SessionStats c = wire::StatsFromProto<SessionStats>(p);
  EXPECT_EQ(c.submits, 1u);
  EXPECT_EQ(c.failed_submits, 2u);
  EXPECT_EQ(c.ops, 3u);
  EXPECT_EQ(c.kernel_launches, 4u);
  EXPECT_EQ(c.bytes_uploaded, 5u);
  EXPECT_EQ(c.bytes_downloaded, 6u);
  EXPECT_EQ(c.tensors_created, 7u);
  EXPECT_EQ(c.peak_device_bytes, 8u);
  EXPECT_EQ(c.device_busy_ns, 9u);
  EXPECT_EQ(c.graph_launches, 10u);
  EXPECT_EQ(c.kernel_batches, 11u);
  EXPECT_EQ(c.h2d_bytes, 12u);
  EXPECT_EQ(c.h2d_ns, 13u);
  EXPECT_EQ(c.d2h_bytes, 14u);
  EXPECT_EQ(c.d2h_ns, 15u);
}

}  // namespace
}  // namespace ferry
