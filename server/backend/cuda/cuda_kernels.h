// The CUDA backend's built-in ops: grid-stride kernels and their launchers.
//
// Private to server/backend/cuda. Callers have already checked dtypes, pointer ranges and
// size overflow. Each launcher enqueues its kernel(s) on `stream` and returns the launch
// error (cudaGetLastError after the launch), never waiting for the device. Counts are
// 64-bit; a count of zero launches nothing (except ReduceSum, which writes 0).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"

namespace ferry::backend::cuda_kernels {

/// Threads per block of every built-in kernel.
inline constexpr int kBlockSize = 256;
/// Blocks of the first ReduceSum pass at most; the size of ReduceScratch::partials.
inline constexpr int kReduceMaxBlocks = 1024;

/// Launch geometry shared by the launchers: the most blocks a grid-stride kernel gets.
struct LaunchLimits {
  uint32_t max_blocks = 4096;
};

/// Set count elements at dst to the value (already converted by the caller).
cudaError_t FillF32(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                    float value);
cudaError_t FillF64(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                    double value);
cudaError_t FillI32(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                    int32_t value);
cudaError_t FillU8(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                   uint8_t value);

/// out[i] = a[i] op b[i] (dtype f32 or f64); out may alias a or b.
cudaError_t Binary(cudaStream_t stream, const LaunchLimits& limits, BinaryOp op, DType dtype,
                   const void* a, const void* b, void* out, uint64_t count);
/// out[i] = T(alpha) * x[i]; out may alias x.
cudaError_t Scale(cudaStream_t stream, const LaunchLimits& limits, DType dtype, const void* x,
                  double alpha, void* out, uint64_t count);
/// out[i] = x[i] < 0 ? 0 : x[i] (NaN and -0 pass through, as on the host); out may alias x.
cudaError_t Relu(cudaStream_t stream, const LaunchLimits& limits, DType dtype, const void* x,
                 void* out, uint64_t count);
/// y[i] = y[i] + T(alpha) * x[i] (the product is rounded before the add, as on the host).
cudaError_t Axpy(cudaStream_t stream, const LaunchLimits& limits, DType dtype, double alpha,
                 const void* x, void* y, uint64_t count);
/// out[0] = sum of in[0..count), accumulated in double, in an order that depends on count
/// only (deterministic). `partials` is device scratch of kReduceMaxBlocks doubles that
/// no other work on another stream uses concurrently.
cudaError_t ReduceSum(cudaStream_t stream, DType dtype, const void* in, uint64_t count, void* out,
                      double* partials);

/// One elementwise op of a fused run, with the arithmetic of its own launcher above.
struct FusedOp {
  enum Kind : uint32_t { kFill, kAdd, kSub, kMul, kDiv, kScale, kAxpy };
  uint32_t kind = kFill;
  double scalar = 0;        // Fill's value, Scale's and Axpy's alpha (converted to T in the kernel)
  const void* a = nullptr;  // Binary's a, Scale's x, Axpy's x
  const void* b = nullptr;  // Binary's b
  void* out = nullptr;      // Fill's dst, Binary's and Scale's out, Axpy's y
  uint64_t count = 0;       // > 0
};

/// The most ops of one fused launch: the run travels as the kernel's parameter (48 bytes an
/// op, within the 4 KiB every CUDA version takes).
inline constexpr int kMaxFusedOps = 64;

struct FusedOps {
  FusedOp ops[kMaxFusedOps];
  uint32_t n = 0;
  uint64_t max_count = 0;  // the largest count of the n ops
};

/// Run ops[0..n) (dtype f32 or f64) as one kernel: each thread takes element indices and runs
/// every op on each in turn (see backend/elementwise_run.h for when that equals running them
/// one after another). Results are bit for bit those of the ops' own launchers.
cudaError_t Fused(cudaStream_t stream, const LaunchLimits& limits, DType dtype,
                  const FusedOps& ops);

}  // namespace ferry::backend::cuda_kernels
