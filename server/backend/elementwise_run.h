// ElementwiseRun: which consecutive elementwise ops recorded into a batch or a graph may run
// as one kernel (the CUDA backend's fused kernel, cuda_kernels::Fused).
//
// The fused kernel hands each thread element indices and, for each index, runs every op of
// the run on that element in turn. Op k on element i thus runs before op k + 1 on element i,
// but in no order against any op on another element. That gives exactly the results of the
// ops run one after another when no element one op of the run writes is an element another
// op touches at another index: so two ranges of the run, one of them written, must either
// not overlap or start at the same address, and every op of the run has one dtype (element
// i is then the same bytes in both). Ranges of zero bytes touch nothing.
//
// Every thread looks at every op of the run for each of its elements, so a run whose ops
// differ much in length would make a long op pay for the short ones: the longest op of a
// run has at most kMaxCountRatio times the elements of the shortest.
//
// Thread-safety: none; owned by one stream, used by its owner.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "ferry/dtype.h"

namespace ferry::backend {

class ElementwiseRun {
 public:
  /// The most ops one run holds (the fused kernel's parameter block has room for this many).
  static constexpr size_t kMaxOps = 64;

  /// Bytes an op reads or writes: [start, start + bytes).
  struct Range {
    DevicePtr start = 0;
    uint64_t bytes = 0;
    bool written = false;
  };

  /// The longest op of a run over the shortest, at most.
  static constexpr uint64_t kMaxCountRatio = 4;

  /// Whether an op of `dtype` over `count` (> 0) elements touching `ranges` may join the
  /// run (see the file comment). Always true for an empty run.
  bool CanJoin(DType dtype, uint64_t count, std::span<const Range> ranges) const {
    if (ops_ == 0) return true;
    if (dtype != dtype_ || ops_ >= kMaxOps) return false;
    const uint64_t shortest = std::min(min_count_, count);
    const uint64_t longest = std::max(max_count_, count);
    if (longest > shortest * kMaxCountRatio) return false;
    for (const Range& r : ranges) {
      if (r.bytes == 0) continue;
      for (const Range& e : ranges_) {
        if (!r.written && !e.written) continue;
        if (r.start == e.start) continue;
        const bool overlap = r.start < e.start + e.bytes && e.start < r.start + r.bytes;
        if (overlap) return false;
      }
    }
    return true;
  }

  /// Add an op that CanJoin allowed.
  void Add(DType dtype, uint64_t count, std::span<const Range> ranges) {
    dtype_ = dtype;
    min_count_ = ops_ == 0 ? count : std::min(min_count_, count);
    max_count_ = ops_ == 0 ? count : std::max(max_count_, count);
    ++ops_;
    for (const Range& r : ranges) {
      if (r.bytes > 0) ranges_.push_back(r);
    }
  }

  bool CanJoin(DType dtype, uint64_t count, std::initializer_list<Range> ranges) const {
    return CanJoin(dtype, count, std::span<const Range>(ranges.begin(), ranges.size()));
  }
  void Add(DType dtype, uint64_t count, std::initializer_list<Range> ranges) {
    Add(dtype, count, std::span<const Range>(ranges.begin(), ranges.size()));
  }

  void Clear() {
    ops_ = 0;
    ranges_.clear();
  }

  size_t ops() const { return ops_; }
  bool empty() const { return ops_ == 0; }
  /// The dtype of the run's ops, and the elements of its longest op; only while not empty.
  DType dtype() const { return dtype_; }
  uint64_t max_count() const { return max_count_; }

 private:
  DType dtype_ = DType::kF32;
  size_t ops_ = 0;
  uint64_t min_count_ = 0, max_count_ = 0;  // elements of the run's shortest and longest op
  std::vector<Range> ranges_;               // of every op in the run
};

}  // namespace ferry::backend
