// The error kinds peers exchange: every kind this build knows decodes as itself, and a
// kind it does not know (a newer daemon's) is named in the message, never silently INTERNAL.
#include <gtest/gtest.h>

#include "ferry/status.h"

namespace ferry {
namespace {

TEST(StatusWireTest, PermissionDeniedTravelsAsItself) {
  EXPECT_EQ(CanonicalCode(ErrorKind::kPermissionDenied), Code::kPermissionDenied);
  EXPECT_EQ(ErrorKindName(ErrorKind::kPermissionDenied), "PERMISSION_DENIED");
  Status s = Status::FromWire(7, 17, "no raw kernels", 2);
  EXPECT_EQ(s.kind(), ErrorKind::kPermissionDenied);
  EXPECT_EQ(s.code(), Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "no raw kernels");
  EXPECT_EQ(s.op_index(), 2);
  // Every kind up to the last one this build knows decodes as itself.
  for (int k = 0; k <= static_cast<int>(kLastErrorKind); ++k) {
    Status d = Status::FromWire(static_cast<int>(CanonicalCode(static_cast<ErrorKind>(k))), k, "m");
    EXPECT_EQ(static_cast<int>(d.kind()), k);
    EXPECT_EQ(d.message(), "m");
  }
}

TEST(StatusWireTest, AnUnknownKindIsNamedNotSilentlyInternal) {
  Status s = Status::FromWire(7, 99, "from a newer daemon");
  EXPECT_EQ(s.kind(), ErrorKind::kInternal);
  EXPECT_EQ(s.code(), Code::kPermissionDenied) << "the daemon's code is kept";
  EXPECT_EQ(s.message(), "unknown error kind 99: from a newer daemon");
  EXPECT_EQ(Status::FromWire(3, -1, "x").message(), "unknown error kind -1: x");
  EXPECT_EQ(Status::FromWire(99, 3, "x").code(), Code::kUnknown);
}

}  // namespace
}  // namespace ferry
