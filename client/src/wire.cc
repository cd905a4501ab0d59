// Conversions between ferry.v1 messages and libferry's public types.
#include "wire.h"

namespace ferry::internal {

Status FromProto(const v1::Error& e) {
  return Status::FromWire(e.code(), e.kind(), e.message(), e.op_index());
}

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

SessionStats FromProto(const v1::SessionStats& s) {
  SessionStats out;
  out.submits = s.submits();
  out.failed_submits = s.failed_submits();
  out.ops = s.ops();
  out.kernel_launches = s.kernel_launches();
  out.bytes_uploaded = s.bytes_uploaded();
  out.bytes_downloaded = s.bytes_downloaded();
  out.tensors_created = s.tensors_created();
  out.peak_device_bytes = s.peak_device_bytes();
  out.device_busy_ns = s.device_busy_ns();
  out.graph_launches = s.graph_launches();
  out.kernel_batches = s.kernel_batches();
  return out;
}

}  // namespace ferry::internal
