#include "ferry/wire.h"

namespace ferry::wire {

v1::DType ToProto(DType d) {
  switch (d) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kF64:
      return v1::DTYPE_F64;
    case DType::kI32:
      return v1::DTYPE_I32;
    case DType::kU8:
      return v1::DTYPE_U8;
    default:
      return v1::DTYPE_INVALID;
  }
}

DType FromProto(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_F64:
      return DType::kF64;
    case v1::DTYPE_I32:
      return DType::kI32;
    case v1::DTYPE_U8:
      return DType::kU8;
    default:
      return DType::kInvalid;
  }
}

void ToProto(const Status& status, v1::Error* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_kind(static_cast<v1::ErrorKind>(status.kind()));
  out->set_message(status.message());
  out->set_op_index(status.op_index());
}

Status FromProto(const v1::Error& e) {
  return Status::FromWire(e.code(), e.kind(), e.message(), e.op_index());
}

Status FromWireKind(uint32_t kind, std::string message) {
  const ErrorKind known = kind > static_cast<uint32_t>(kLastErrorKind)
                              ? ErrorKind::kInternal
                              : static_cast<ErrorKind>(kind);
  return Status::FromWire(static_cast<int>(CanonicalCode(known)), static_cast<int>(kind),
                          std::move(message));
}

}  // namespace ferry::wire
