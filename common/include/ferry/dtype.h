// Element types and shapes, shared by the client library and the daemon.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

/// Element type of a tensor. Values are stable: they travel on the wire (ferry.v1.DType).
enum class DType : int {
  kInvalid = 0,
  kF32 = 1,
  kF64 = 2,
  kI32 = 3,
  kU8 = 4,
};

/// Return the size of one element, or 0 for kInvalid.
size_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);
/// Return true for element types the built-in arithmetic ops accept (f32, f64).
bool IsFloatingPoint(DType dtype);

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kU8;
}

/// Dimensions of a tensor, outermost first. A rank-0 shape holds one element.
class Shape {
 public:
  static constexpr size_t kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  const std::vector<int64_t>& dims() const { return dims_; }
  size_t rank() const { return dims_.size(); }
  int64_t dim(size_t i) const { return dims_[i]; }

  /// Return the element count, or an error when a dimension is negative, the rank is
  /// above kMaxRank, or the product overflows `limit`.
  Result<uint64_t> ElementCount(uint64_t limit = UINT64_MAX) const;
  std::string ToString() const;

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }

 private:
  std::vector<int64_t> dims_;
};

/// Multiply a by b, returning false instead of overflowing.
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
/// Add a and b, returning false instead of overflowing.
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

}  // namespace ferry
