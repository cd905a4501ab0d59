// The host backend's built-in ops: plain loops over host memory, run on a stream worker.
//
// Private to server/backend/host. Callers have already checked dtypes (f32/f64 for the
// arithmetic ops; Fill also takes i32/u8), pointer ranges and size overflow; these
// functions only compute. They are reentrant and touch nothing but their arguments.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace ferry::backend::host_kernels {

/// Set count elements at dst to value converted to dtype (integers truncate toward zero;
/// the caller checked that the value is representable).
void Fill(DType dtype, void* dst, uint64_t count, double value);
/// out[i] = a[i] op b[i]; out may alias a or b.
void Binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, uint64_t count);
/// out[i] = alpha * x[i]; out may alias x.
void Scale(DType dtype, const void* x, double alpha, void* out, uint64_t count);
/// out[i] = max(x[i], 0), NaN kept; out may alias x.
void Relu(DType dtype, const void* x, void* out, uint64_t count);
/// y[i] += alpha * x[i].
void Axpy(DType dtype, double alpha, const void* x, void* y, uint64_t count);
/// out[0] = sum of in[0..count), summed pairwise in double (0 for count 0).
void ReduceSum(DType dtype, const void* in, uint64_t count, void* out);
/// Row-major GEMM with BLAS semantics: m or n zero is a no-op; k zero or alpha zero gives
/// C = beta * C; beta zero does not read C (NaNs in C do not propagate). Products are
/// accumulated in double. C must not alias A or B.
void Gemm(const GemmArgs& args);

}  // namespace ferry::backend::host_kernels
