// Enqueue-time argument checks shared by the backends, so both reject the same bad
// arguments with the same typed errors (the conformance suite holds them to it).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "ferry/dtype.h"
#include "ferry/status.h"

namespace ferry::backend {

/// Return true for the element types ferry knows (f32, f64, i32, u8).
inline bool IsKnownDType(DType dtype) { return DTypeSize(dtype) != 0; }

/// Check that `op` may do arithmetic on `dtype` (f32 or f64).
inline Status CheckArithmeticDType(DType dtype, std::string_view op) {
  if (IsFloatingPoint(dtype)) return Status::Ok();
  return Status(ErrorKind::kInvalidArgument,
                std::string(op) + " takes f32 or f64, not " +
                    (IsKnownDType(dtype) ? std::string(DTypeName(dtype))
                                         : "dtype " + std::to_string(static_cast<int>(dtype))));
}

/// Return count * size of dtype, or INVALID_ARGUMENT when that overflows.
inline Result<uint64_t> ByteSize(DType dtype, uint64_t count, std::string_view op) {
  uint64_t bytes = 0;
  if (!CheckedMul(count, DTypeSize(dtype), &bytes)) {
    return Status(ErrorKind::kInvalidArgument, std::string(op) + ": " + std::to_string(count) +
                                                   " elements overflow the address space");
  }
  return bytes;
}

/// Return rows * cols elements of dtype in bytes, or INVALID_ARGUMENT when that overflows.
inline Result<uint64_t> MatrixBytes(DType dtype, uint64_t rows, uint64_t cols,
                                    std::string_view what) {
  uint64_t count = 0;
  if (!CheckedMul(rows, cols, &count)) {
    return Status(ErrorKind::kInvalidArgument, std::string(what) + ": " + std::to_string(rows) +
                                                   " x " + std::to_string(cols) +
                                                   " overflows the address space");
  }
  return ByteSize(dtype, count, what);
}

/// Check a Fill of `count` elements of `dtype` with `value` (a known dtype; a value an
/// integer dtype can represent: no NaN or infinity, in range) and return its bytes.
inline Result<uint64_t> CheckFill(DType dtype, uint64_t count, double value) {
  if (!IsKnownDType(dtype)) {
    return Status(ErrorKind::kInvalidArgument,
                  "Fill: unsupported dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (dtype == DType::kI32 || dtype == DType::kU8) {
    const double lo = dtype == DType::kI32 ? std::numeric_limits<int32_t>::min() : 0.0;
    const double hi = dtype == DType::kI32 ? std::numeric_limits<int32_t>::max() : 255.0;
    if (!std::isfinite(value) || value < lo || value > hi) {
      return Status(ErrorKind::kInvalidArgument, "Fill: " + std::to_string(value) +
                                                     " is not representable as " +
                                                     std::string(DTypeName(dtype)));
    }
  }
  return ByteSize(dtype, count, "Fill");
}

}  // namespace ferry::backend
