#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_kernels.h"

namespace ferry::backend::cuda_kernels {
namespace {

// Index arithmetic is 64-bit throughout: counts may exceed 2^32 elements.
__device__ __forceinline__ uint64_t FirstIndex() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t GridStride() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

// Products rounded on their own (no contraction into an FMA), so results match the host
// backend bit for bit.
__device__ __forceinline__ float Mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double Mul(double a, double b) { return __dmul_rn(a, b); }

template <typename T>
__global__ void FillKernel(T* __restrict__ dst, uint64_t count, T value) {
  for (uint64_t i = FirstIndex(); i < count; i += GridStride()) dst[i] = value;
}

template <typename T, BinaryOp kOp>
__global__ void BinaryKernel(const T* a, const T* b, T* out, uint64_t count) {
  // No __restrict__: out may alias a or b (each element is read before it is written).
  for (uint64_t i = FirstIndex(); i < count; i += GridStride()) {
    const T x = a[i];
    const T y = b[i];
    if constexpr (kOp == BinaryOp::kAdd) {
      out[i] = x + y;
    } else if constexpr (kOp == BinaryOp::kSub) {
      out[i] = x - y;
    } else if constexpr (kOp == BinaryOp::kMul) {
      out[i] = Mul(x, y);
    } else {
      out[i] = x / y;
    }
  }
}

template <typename T>
__global__ void ScaleKernel(const T* x, T alpha, T* out, uint64_t count) {
  for (uint64_t i = FirstIndex(); i < count; i += GridStride()) out[i] = Mul(alpha, x[i]);
}

template <typename T>
__global__ void ReluKernel(const T* x, T* out, uint64_t count) {
  for (uint64_t i = FirstIndex(); i < count; i += GridStride()) {
    const T v = x[i];
    out[i] = v < T(0) ? T(0) : v;
  }
}

template <typename T>
__global__ void AxpyKernel(T alpha, const T* __restrict__ x, T* __restrict__ y, uint64_t count) {
  for (uint64_t i = FirstIndex(); i < count; i += GridStride()) y[i] = y[i] + Mul(alpha, x[i]);
}

// Every op of a fused run on each element in turn. The arithmetic of each op is that of
// its own kernel above, so the results match them bit for bit. Each result is stored; the
// thread also keeps the last one in a register, and an op that reads the element the last
// op wrote (same base address: the run's ranges are either the same elements or disjoint,
// backend/elementwise_run.h) takes it from there instead of reloading it.
template <typename T>
__global__ void FusedKernel(const FusedOps ops) {
  for (uint64_t i = FirstIndex(); i < ops.max_count; i += GridStride()) {
    const void* last_out = nullptr;  // base of the range the last op wrote element i of
    T last = T(0);
    auto load = [&](const void* base) {
      return base == last_out ? last : static_cast<const T*>(base)[i];
    };
    for (uint32_t k = 0; k < ops.n; ++k) {
      const FusedOp& op = ops.ops[k];
      if (i >= op.count) continue;
      T value;
      switch (op.kind) {
        case FusedOp::kFill:
          value = static_cast<T>(op.scalar);
          break;
        case FusedOp::kAdd:
          value = load(op.a) + load(op.b);
          break;
        case FusedOp::kSub:
          value = load(op.a) - load(op.b);
          break;
        case FusedOp::kMul:
          value = Mul(load(op.a), load(op.b));
          break;
        case FusedOp::kDiv:
          value = load(op.a) / load(op.b);
          break;
        case FusedOp::kScale:
          value = Mul(static_cast<T>(op.scalar), load(op.a));
          break;
        default:  // kAxpy
          value = load(op.out) + Mul(static_cast<T>(op.scalar), load(op.a));
          break;
      }
      static_cast<T*>(op.out)[i] = value;
      last_out = op.out;
      last = value;
    }
  }
}

// Tree-reduce one value per thread of a kBlockSize block; thread 0 gets the block's sum.
// The order of additions is fixed, so the result is deterministic.
__device__ double BlockSum(double value) {
  __shared__ double shared[kBlockSize];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned stride = kBlockSize / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

// Pass 1: each block sums a grid-strided share of `in` into partials[blockIdx.x].
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    ReducePartialsKernel(const T* __restrict__ in, uint64_t count, double* partials) {
  double sum = 0.0;
  for (uint64_t i = FirstIndex(); i < count; i += GridStride()) sum += static_cast<double>(in[i]);
  sum = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Pass 2: one block sums the `num_partials` partials and writes the result (0 for none).
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    ReduceFinalKernel(const double* partials, unsigned num_partials, T* out) {
  double sum = 0.0;
  for (unsigned i = threadIdx.x; i < num_partials; i += kBlockSize) sum += partials[i];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) *out = static_cast<T>(sum);
}

unsigned Blocks(uint64_t count, uint32_t max_blocks) {
  const uint64_t needed = (count + kBlockSize - 1) / kBlockSize;
  return static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(needed, max_blocks)));
}

// Return the launch error of the kernel just launched (and clear it: launch errors are not
// sticky).
cudaError_t LaunchError() { return cudaGetLastError(); }

template <typename T>
cudaError_t LaunchFill(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                       T value) {
  if (count == 0) return cudaSuccess;
  FillKernel<T><<<Blocks(count, limits.max_blocks), kBlockSize, 0, stream>>>(static_cast<T*>(dst),
                                                                             count, value);
  return LaunchError();
}

template <typename T, BinaryOp kOp>
cudaError_t LaunchBinary(cudaStream_t stream, unsigned blocks, const void* a, const void* b,
                         void* out, uint64_t count) {
  BinaryKernel<T, kOp><<<blocks, kBlockSize, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), count);
  return LaunchError();
}

template <typename T>
cudaError_t LaunchBinaryT(cudaStream_t stream, unsigned blocks, BinaryOp op, const void* a,
                          const void* b, void* out, uint64_t count) {
  switch (op) {
    case BinaryOp::kAdd:
      return LaunchBinary<T, BinaryOp::kAdd>(stream, blocks, a, b, out, count);
    case BinaryOp::kSub:
      return LaunchBinary<T, BinaryOp::kSub>(stream, blocks, a, b, out, count);
    case BinaryOp::kMul:
      return LaunchBinary<T, BinaryOp::kMul>(stream, blocks, a, b, out, count);
    case BinaryOp::kDiv:
      return LaunchBinary<T, BinaryOp::kDiv>(stream, blocks, a, b, out, count);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t LaunchReduce(cudaStream_t stream, const void* in, uint64_t count, void* out,
                         double* partials) {
  unsigned num_partials = 0;
  if (count > 0) {
    num_partials = Blocks(count, kReduceMaxBlocks);
    ReducePartialsKernel<T>
        <<<num_partials, kBlockSize, 0, stream>>>(static_cast<const T*>(in), count, partials);
    if (cudaError_t error = LaunchError(); error != cudaSuccess) return error;
  }
  ReduceFinalKernel<T><<<1, kBlockSize, 0, stream>>>(partials, num_partials, static_cast<T*>(out));
  return LaunchError();
}

}  // namespace

cudaError_t FillF32(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                    float value) {
  return LaunchFill<float>(stream, limits, dst, count, value);
}
cudaError_t FillF64(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                    double value) {
  return LaunchFill<double>(stream, limits, dst, count, value);
}
cudaError_t FillI32(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                    int32_t value) {
  return LaunchFill<int32_t>(stream, limits, dst, count, value);
}
cudaError_t FillU8(cudaStream_t stream, const LaunchLimits& limits, void* dst, uint64_t count,
                   uint8_t value) {
  return LaunchFill<uint8_t>(stream, limits, dst, count, value);
}

cudaError_t Binary(cudaStream_t stream, const LaunchLimits& limits, BinaryOp op, DType dtype,
                   const void* a, const void* b, void* out, uint64_t count) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, limits.max_blocks);
  if (dtype == DType::kF32) return LaunchBinaryT<float>(stream, blocks, op, a, b, out, count);
  if (dtype == DType::kF64) return LaunchBinaryT<double>(stream, blocks, op, a, b, out, count);
  return cudaErrorInvalidValue;
}

cudaError_t Scale(cudaStream_t stream, const LaunchLimits& limits, DType dtype, const void* x,
                  double alpha, void* out, uint64_t count) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, limits.max_blocks);
  if (dtype == DType::kF32) {
    ScaleKernel<float><<<blocks, kBlockSize, 0, stream>>>(
        static_cast<const float*>(x), static_cast<float>(alpha), static_cast<float*>(out), count);
  } else if (dtype == DType::kF64) {
    ScaleKernel<double><<<blocks, kBlockSize, 0, stream>>>(static_cast<const double*>(x), alpha,
                                                           static_cast<double*>(out), count);
  } else {
    return cudaErrorInvalidValue;
  }
  return LaunchError();
}

cudaError_t Relu(cudaStream_t stream, const LaunchLimits& limits, DType dtype, const void* x,
                 void* out, uint64_t count) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, limits.max_blocks);
  if (dtype == DType::kF32) {
    ReluKernel<float><<<blocks, kBlockSize, 0, stream>>>(static_cast<const float*>(x),
                                                         static_cast<float*>(out), count);
  } else if (dtype == DType::kF64) {
    ReluKernel<double><<<blocks, kBlockSize, 0, stream>>>(static_cast<const double*>(x),
                                                          static_cast<double*>(out), count);
  } else {
    return cudaErrorInvalidValue;
  }
  return LaunchError();
}

cudaError_t Axpy(cudaStream_t stream, const LaunchLimits& limits, DType dtype, double alpha,
                 const void* x, void* y, uint64_t count) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, limits.max_blocks);
  if (dtype == DType::kF32) {
    AxpyKernel<float><<<blocks, kBlockSize, 0, stream>>>(
        static_cast<float>(alpha), static_cast<const float*>(x), static_cast<float*>(y), count);
  } else if (dtype == DType::kF64) {
    AxpyKernel<double><<<blocks, kBlockSize, 0, stream>>>(alpha, static_cast<const double*>(x),
                                                          static_cast<double*>(y), count);
  } else {
    return cudaErrorInvalidValue;
  }
  return LaunchError();
}

cudaError_t ReduceSum(cudaStream_t stream, DType dtype, const void* in, uint64_t count, void* out,
                      double* partials) {
  if (dtype == DType::kF32) return LaunchReduce<float>(stream, in, count, out, partials);
  if (dtype == DType::kF64) return LaunchReduce<double>(stream, in, count, out, partials);
  return cudaErrorInvalidValue;
}

cudaError_t Fused(cudaStream_t stream, const LaunchLimits& limits, DType dtype,
                  const FusedOps& ops) {
  if (ops.n == 0 || ops.max_count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(ops.max_count, limits.max_blocks);
  if (dtype == DType::kF32) {
    FusedKernel<float><<<blocks, kBlockSize, 0, stream>>>(ops);
  } else if (dtype == DType::kF64) {
    FusedKernel<double><<<blocks, kBlockSize, 0, stream>>>(ops);
  } else {
    return cudaErrorInvalidValue;
  }
  return LaunchError();
}

}  // namespace ferry::backend::cuda_kernels
