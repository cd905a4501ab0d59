#include "ferry/dtype.h"

namespace ferry {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kU8:
      return 1;
    case DType::kInvalid:
      return 0;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
    case DType::kInvalid:
      return "invalid";
  }
  return "invalid";
}

bool IsFloatingPoint(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF64; }

Result<uint64_t> Shape::ElementCount(uint64_t limit) const {
  if (dims_.size() > kMaxRank) {
    return Status(ErrorKind::kShapeMismatch, "rank " + std::to_string(dims_.size()) +
                                                 " is above the limit of " +
                                                 std::to_string(kMaxRank));
  }
  uint64_t count = 1;
  for (int64_t d : dims_) {
    if (d < 0) return Status(ErrorKind::kShapeMismatch, "negative dimension in " + ToString());
    if (!CheckedMul(count, static_cast<uint64_t>(d), &count) || count > limit) {
      return Status(ErrorKind::kQuotaExceeded, "shape " + ToString() + " is too large");
    }
  }
  return count;
}

std::string Shape::ToString() const {
  std::string out = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(dims_[i]);
  }
  return out + "]";
}

}  // namespace ferry
