#include "backend/host/host_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ferry::backend::host_kernels {
namespace {

template <typename T>
T* As(uint64_t address) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(address));
}

template <typename T>
void FillT(void* dst, uint64_t count, double value) {
  T* out = static_cast<T*>(dst);
  const T v = static_cast<T>(value);
  for (uint64_t i = 0; i < count; ++i) out[i] = v;
}

template <typename T>
void BinaryT(BinaryOp op, const T* a, const T* b, T* out, uint64_t count) {
  switch (op) {
    case BinaryOp::kAdd:
      for (uint64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
      break;
    case BinaryOp::kSub:
      for (uint64_t i = 0; i < count; ++i) out[i] = a[i] - b[i];
      break;
    case BinaryOp::kMul:
      for (uint64_t i = 0; i < count; ++i) out[i] = a[i] * b[i];
      break;
    case BinaryOp::kDiv:
      for (uint64_t i = 0; i < count; ++i) out[i] = a[i] / b[i];
      break;
  }
}

template <typename T>
void ScaleT(const T* x, double alpha, T* out, uint64_t count) {
  const T s = static_cast<T>(alpha);
  for (uint64_t i = 0; i < count; ++i) out[i] = s * x[i];
}

// x < 0 ? 0 : x, as the CUDA kernel: NaN and -0 pass through unchanged.
template <typename T>
void ReluT(const T* x, T* out, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) out[i] = x[i] < T(0) ? T(0) : x[i];
}

template <typename T>
void AxpyT(double alpha, const T* x, T* y, uint64_t count) {
  const T s = static_cast<T>(alpha);
  for (uint64_t i = 0; i < count; ++i) y[i] += s * x[i];
}

// Pairwise summation: error grows with log(count) instead of count.
template <typename T>
double PairwiseSum(const T* in, uint64_t count) {
  constexpr uint64_t kBlock = 128;
  if (count <= kBlock) {
    double sum = 0.0;
    for (uint64_t i = 0; i < count; ++i) sum += static_cast<double>(in[i]);
    return sum;
  }
  const uint64_t half = count / 2;
  return PairwiseSum(in, half) + PairwiseSum(in + half, count - half);
}

// Copy a rows x cols row-major matrix into its cols x rows transpose.
template <typename T>
std::vector<T> Transposed(const T* in, uint64_t rows, uint64_t cols) {
  std::vector<T> out(rows * cols);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
  return out;
}

template <typename T>
void GemmT(const GemmArgs& g) {
  const uint64_t m = g.m, n = g.n, k = g.k;
  if (m == 0 || n == 0) return;
  T* c = As<T>(g.c);
  const T beta = static_cast<T>(g.beta);
  if (k == 0 || g.alpha == 0.0) {
    for (uint64_t i = 0; i < m * n; ++i) c[i] = g.beta == 0.0 ? T(0) : beta * c[i];
    return;
  }
  // Bring op(A) to m x k and op(B) to k x n row-major so the inner loop runs over
  // contiguous rows of B and C (i-k-j order).
  std::vector<T> a_packed, b_packed;
  const T* a = As<const T>(g.a);
  const T* b = As<const T>(g.b);
  if (g.trans_a) {
    a_packed = Transposed(a, k, m);
    a = a_packed.data();
  }
  if (g.trans_b) {
    b_packed = Transposed(b, n, k);
    b = b_packed.data();
  }
  std::vector<double> acc(n);
  for (uint64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const T* a_row = a + i * k;
    for (uint64_t p = 0; p < k; ++p) {
      const double a_ip = static_cast<double>(a_row[p]);
      const T* b_row = b + p * n;
      for (uint64_t j = 0; j < n; ++j) acc[j] += a_ip * static_cast<double>(b_row[j]);
    }
    T* c_row = c + i * n;
    for (uint64_t j = 0; j < n; ++j) {
      const double prior = g.beta == 0.0 ? 0.0 : g.beta * static_cast<double>(c_row[j]);
      c_row[j] = static_cast<T>(g.alpha * acc[j] + prior);
    }
  }
}

}  // namespace

void Fill(DType dtype, void* dst, uint64_t count, double value) {
  switch (dtype) {
    case DType::kF32:
      return FillT<float>(dst, count, value);
    case DType::kF64:
      return FillT<double>(dst, count, value);
    case DType::kI32:
      return FillT<int32_t>(dst, count, value);
    case DType::kU8:
      return FillT<uint8_t>(dst, count, value);
    case DType::kInvalid:
      return;
  }
}

void Binary(BinaryOp op, DType dtype, const void* a, const void* b, void* out, uint64_t count) {
  if (dtype == DType::kF32) {
    BinaryT(op, static_cast<const float*>(a), static_cast<const float*>(b),
            static_cast<float*>(out), count);
  } else if (dtype == DType::kF64) {
    BinaryT(op, static_cast<const double*>(a), static_cast<const double*>(b),
            static_cast<double*>(out), count);
  }
}

void Scale(DType dtype, const void* x, double alpha, void* out, uint64_t count) {
  if (dtype == DType::kF32) {
    ScaleT(static_cast<const float*>(x), alpha, static_cast<float*>(out), count);
  } else if (dtype == DType::kF64) {
    ScaleT(static_cast<const double*>(x), alpha, static_cast<double*>(out), count);
  }
}

void Relu(DType dtype, const void* x, void* out, uint64_t count) {
  if (dtype == DType::kF32) {
    ReluT(static_cast<const float*>(x), static_cast<float*>(out), count);
  } else if (dtype == DType::kF64) {
    ReluT(static_cast<const double*>(x), static_cast<double*>(out), count);
  }
}

void Axpy(DType dtype, double alpha, const void* x, void* y, uint64_t count) {
  if (dtype == DType::kF32) {
    AxpyT(alpha, static_cast<const float*>(x), static_cast<float*>(y), count);
  } else if (dtype == DType::kF64) {
    AxpyT(alpha, static_cast<const double*>(x), static_cast<double*>(y), count);
  }
}

void ReduceSum(DType dtype, const void* in, uint64_t count, void* out) {
  if (dtype == DType::kF32) {
    *static_cast<float*>(out) =
        static_cast<float>(PairwiseSum(static_cast<const float*>(in), count));
  } else if (dtype == DType::kF64) {
    *static_cast<double*>(out) = PairwiseSum(static_cast<const double*>(in), count);
  }
}

void Gemm(const GemmArgs& args) {
  if (args.dtype == DType::kF32) {
    GemmT<float>(args);
  } else if (args.dtype == DType::kF64) {
    GemmT<double>(args);
  }
}

}  // namespace ferry::backend::host_kernels
