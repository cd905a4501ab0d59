// Conversions between ferry.v1 messages and libferry's public types. Internal to libferry.
#pragma once

#include "ferry/client.h"
#include "ferry/v1/session.pb.h"

namespace ferry::internal {

Status FromProto(const v1::Error& e);
v1::DType ToProto(DType d);
SessionStats FromProto(const v1::SessionStats& s);

}  // namespace ferry::internal
