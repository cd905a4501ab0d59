// The backend conformance suite: the contract of server/backend/backend.h, checked through
// the Device and Stream interfaces only, against every backend ("host", "cuda"). The CUDA
// run is skipped, with the reason printed, where no CUDA device is visible.
//
// Numeric checks compare against references computed here in long double on random inputs.
// Bounds: elementwise ops within a few units in the last place (relative 1e-6 for f32,
// 1e-15 for f64, against max(|ref|, 1) with inputs of magnitude about 1); ReduceSum within
// 4 * eps * (log2(n) + 2) * sum|x| plus one rounding of the result; GEMM within
// (k + 4) * eps * (|alpha| * sum_p |a_ip * b_pj| + |beta * c_ij|) per element.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/host/host_device.h"
#include "stream_sync.h"

namespace ferry::backend {
namespace {

constexpr auto kSyncTimeout = std::chrono::seconds(120);

/// Wait for everything enqueued on `stream` so far; return the completion's status.
Status Sync(Stream& stream) { return testing::SyncStream(stream, kSyncTimeout); }

/// Device memory freed (stream-ordered) on the owning stream when it goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Stream* stream, DevicePtr ptr) : stream_(stream), ptr_(ptr) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : stream_(other.stream_), ptr_(std::exchange(other.ptr_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    Reset();
    stream_ = other.stream_;
    ptr_ = std::exchange(other.ptr_, 0);
    return *this;
  }
  ~DeviceBuffer() { Reset(); }

  DevicePtr ptr() const { return ptr_; }
  DevicePtr at(uint64_t byte_offset) const { return ptr_ + byte_offset; }
  /// Give up ownership: the caller frees the memory.
  DevicePtr release() { return std::exchange(ptr_, 0); }

 private:
  void Reset() {
    if (ptr_ != 0) stream_->Free(ptr_);
    ptr_ = 0;
  }
  Stream* stream_ = nullptr;
  DevicePtr ptr_ = 0;
};

DeviceBuffer MustAllocate(Stream& stream, uint64_t bytes) {
  Result<DevicePtr> ptr = stream.Allocate(bytes);
  EXPECT_TRUE(ptr.ok()) << ptr.status().ToString();
  return ptr.ok() ? DeviceBuffer(&stream, *ptr) : DeviceBuffer();
}

/// Allocate room for `count` elements of T (at least one, so the pointer is never null).
template <typename T>
DeviceBuffer AllocateElements(Stream& stream, uint64_t count) {
  return MustAllocate(stream, std::max<uint64_t>(count, 1) * sizeof(T));
}

template <typename T>
void Upload(Stream& stream, const DeviceBuffer& dst, const std::vector<T>& src) {
  if (src.empty()) return;  // data() may be null
  ASSERT_TRUE(stream.CopyHostToDevice(dst.ptr(), src.data(), src.size() * sizeof(T)).ok());
  ASSERT_TRUE(Sync(stream).ok());  // src must stay valid until the copy's completion
}

template <typename T>
std::vector<T> Download(Stream& stream, DevicePtr src, uint64_t count) {
  std::vector<T> out(std::max<uint64_t>(count, 1));
  Status status = stream.CopyDeviceToHost(out.data(), src, count * sizeof(T));
  EXPECT_TRUE(status.ok()) << status.ToString();
  status = Sync(stream);
  EXPECT_TRUE(status.ok()) << status.ToString();
  out.resize(count);
  return out;
}

template <typename T>
std::vector<T> RandomVector(std::mt19937_64& rng, uint64_t count, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> out(count);
  for (T& v : out) v = static_cast<T>(dist(rng));
  return out;
}

/// Divisors: magnitude in [0.5, 2], random sign.
template <typename T>
std::vector<T> RandomDivisors(std::mt19937_64& rng, uint64_t count) {
  std::vector<T> out = RandomVector<T>(rng, count, 0.5, 2.0);
  std::bernoulli_distribution negative(0.5);
  for (T& v : out) v = negative(rng) ? -v : v;
  return out;
}

template <typename T>
constexpr DType kDType = DTypeOf<T>();

template <typename T>
double ElementwiseTolerance() {
  return std::is_same_v<T, float> ? 1e-6 : 1e-15;
}

/// Check got[i] against ref[i] with a relative bound against max(|ref|, 1).
template <typename T>
void ExpectNear(const std::vector<T>& got, const std::vector<long double>& ref, double rel,
                const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    const long double bound = rel * std::max<long double>(std::fabs(ref[i]), 1.0L);
    if (!(std::fabs(static_cast<long double>(got[i]) - ref[i]) <= bound)) {
      ++failures;
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected "
                    << static_cast<double>(ref[i]) << " (bound " << static_cast<double>(bound)
                    << ")";
    }
  }
}

class BackendConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "host") {
      HostDeviceOptions options;
      options.memory_bytes = 1ull << 30;
      Result<std::unique_ptr<Device>> device = CreateHostDevice(options);
      ASSERT_TRUE(device.ok()) << device.status().ToString();
      device_ = std::move(device).value();
    } else {
      if (CudaDeviceCount() == 0) {
        Result<std::unique_ptr<Device>> attempt = CreateCudaDevice(0);
        GTEST_SKIP() << "no CUDA device visible: CudaDeviceCount() is 0"
                     << (attempt.ok() ? std::string() : " (" + attempt.status().ToString() + ")");
      }
      Result<std::unique_ptr<Device>> device = CreateCudaDevice(0);
      ASSERT_TRUE(device.ok()) << device.status().ToString();
      device_ = std::move(device).value();
    }
    Result<std::unique_ptr<Stream>> stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    stream_ = std::move(stream).value();
  }

  void TearDown() override {
    stream_.reset();  // waits for its work, so memory it frees is released before the device
    device_.reset();
  }

  Stream& stream() { return *stream_; }
  Device& device() { return *device_; }

  template <typename T>
  void CheckElementwise(uint64_t count, uint64_t seed);
  template <typename T>
  void CheckReduceSum(uint64_t count, uint64_t seed);
  template <typename T>
  void CheckGemm(bool trans_a, bool trans_b, uint64_t m, uint64_t n, uint64_t k, double alpha,
                 double beta, uint64_t seed);
  // CheckGemm over every transpose pair, every kGemmShapes shape and every kAlphaBeta pair,
  // with seeds from first_seed + 1 on.
  template <typename T>
  void CheckGemmAllTransposes(uint64_t first_seed);

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

const std::vector<uint64_t> kSizes = {0, 1, 7, 255, 256, 257, 1000, 4099, 1u << 20};

TEST_P(BackendConformanceTest, InfoDescribesTheDevice) {
  const DeviceInfo& info = device().info();
  EXPECT_EQ(info.backend, GetParam());
  EXPECT_GT(info.total_memory, 0u);
  EXPECT_FALSE(info.name.empty());
  EXPECT_LE(device().free_memory(), info.total_memory);
}

TEST_P(BackendConformanceTest, FifoFillCopyDownload) {
  constexpr uint64_t kCount = 100003;
  DeviceBuffer a = AllocateElements<float>(stream(), kCount);
  DeviceBuffer b = AllocateElements<float>(stream(), kCount);
  // No synchronization between the steps: FIFO order alone makes the result right.
  ASSERT_TRUE(stream().Fill(DType::kF32, a.ptr(), kCount, 3.5).ok());
  ASSERT_TRUE(stream().CopyDeviceToDevice(b.ptr(), a.ptr(), kCount * sizeof(float)).ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, a.ptr(), kCount, -1.0).ok());
  std::vector<float> host_b(kCount, 0.0f), host_a(kCount, 0.0f);
  ASSERT_TRUE(stream().CopyDeviceToHost(host_b.data(), b.ptr(), kCount * sizeof(float)).ok());
  ASSERT_TRUE(stream().CopyDeviceToHost(host_a.data(), a.ptr(), kCount * sizeof(float)).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  EXPECT_EQ(std::count(host_b.begin(), host_b.end(), 3.5f), static_cast<long>(kCount));
  EXPECT_EQ(std::count(host_a.begin(), host_a.end(), -1.0f), static_cast<long>(kCount));
}

TEST_P(BackendConformanceTest, FillEveryDType) {
  constexpr uint64_t kCount = 1001;
  DeviceBuffer buf = MustAllocate(stream(), kCount * 8);
  ASSERT_TRUE(stream().Fill(DType::kF64, buf.ptr(), kCount, -2.25).ok());
  for (double v : Download<double>(stream(), buf.ptr(), kCount)) ASSERT_EQ(v, -2.25);
  ASSERT_TRUE(stream().Fill(DType::kI32, buf.ptr(), kCount, -123456).ok());
  for (int32_t v : Download<int32_t>(stream(), buf.ptr(), kCount)) ASSERT_EQ(v, -123456);
  ASSERT_TRUE(stream().Fill(DType::kU8, buf.ptr(), kCount, 200).ok());
  for (uint8_t v : Download<uint8_t>(stream(), buf.ptr(), kCount)) ASSERT_EQ(v, 200);
  // Count 0 touches nothing.
  ASSERT_TRUE(stream().Fill(DType::kU8, buf.ptr(), 0, 7).ok());
  EXPECT_EQ(Download<uint8_t>(stream(), buf.ptr(), 1)[0], 200);
}

TEST_P(BackendConformanceTest, CopiesAtOffsetsAndSizes) {
  std::mt19937_64 rng(7);
  for (uint64_t bytes : {uint64_t{1}, uint64_t{3}, uint64_t{255}, uint64_t{257}, uint64_t{65537},
                         uint64_t{4} << 20}) {
    std::vector<uint8_t> src(bytes);
    for (uint8_t& v : src) v = static_cast<uint8_t>(rng());
    DeviceBuffer a = MustAllocate(stream(), bytes + 64);
    DeviceBuffer b = MustAllocate(stream(), bytes + 64);
    ASSERT_TRUE(stream().CopyHostToDevice(a.at(3), src.data(), bytes).ok());
    ASSERT_TRUE(stream().CopyDeviceToDevice(b.at(17), a.at(3), bytes).ok());
    std::vector<uint8_t> out(bytes, 0);
    ASSERT_TRUE(stream().CopyDeviceToHost(out.data(), b.at(17), bytes).ok());
    ASSERT_TRUE(Sync(stream()).ok());
    EXPECT_EQ(out, src) << bytes << " bytes";
  }
}

TEST_P(BackendConformanceTest, ZeroByteCopiesSucceed) {
  DeviceBuffer a = MustAllocate(stream(), 16);
  uint8_t host = 9;
  EXPECT_TRUE(stream().CopyHostToDevice(a.ptr(), &host, 0).ok());
  EXPECT_TRUE(stream().CopyDeviceToHost(&host, a.ptr(), 0).ok());
  EXPECT_TRUE(stream().CopyDeviceToDevice(a.ptr(), a.ptr(), 0).ok());
  EXPECT_TRUE(Sync(stream()).ok());
  EXPECT_EQ(host, 9);
}

TEST_P(BackendConformanceTest, OnCompleteComesAfterTheWork) {
  constexpr uint64_t kCount = 1u << 22;
  DeviceBuffer buf = AllocateElements<float>(stream(), kCount);
  std::vector<float> host(kCount, 0.0f);
  ASSERT_TRUE(stream().Fill(DType::kF32, buf.ptr(), kCount, 1.5).ok());
  ASSERT_TRUE(stream().CopyDeviceToHost(host.data(), buf.ptr(), kCount * sizeof(float)).ok());
  auto promise = std::make_shared<std::promise<std::pair<bool, std::thread::id>>>();
  auto future = promise->get_future();
  const std::thread::id caller = std::this_thread::get_id();
  stream().OnComplete([promise, &host](Status status) {
    // The download is complete when the callback runs.
    const bool all =
        status.ok() && std::all_of(host.begin(), host.end(), [](float v) { return v == 1.5f; });
    promise->set_value({all, std::this_thread::get_id()});
  });
  ASSERT_EQ(future.wait_for(kSyncTimeout), std::future_status::ready);
  auto [all_done, thread] = future.get();
  EXPECT_TRUE(all_done);
  EXPECT_NE(thread, caller) << "callbacks run on a backend-owned thread";
}

TEST_P(BackendConformanceTest, CompletionsExactlyOnceInOrder) {
  constexpr int kCompletions = 2000;
  DeviceBuffer buf = AllocateElements<float>(stream(), 1024);
  std::mutex mu;
  std::vector<int> order;  // guarded by mu
  const std::thread::id self = std::this_thread::get_id();
  for (int i = 0; i < kCompletions; ++i) {
    if (i % 3 == 0) {
      ASSERT_TRUE(stream().Fill(DType::kF32, buf.ptr(), 1024, i).ok());
    }
    stream().OnComplete([i, &mu, &order, self](Status status) {
      EXPECT_TRUE(status.ok()) << status.ToString();
      EXPECT_NE(std::this_thread::get_id(), self);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  ASSERT_TRUE(Sync(stream()).ok());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), static_cast<size_t>(kCompletions));
  for (int i = 0; i < kCompletions; ++i) ASSERT_EQ(order[i], i);
}

template <typename T>
void BackendConformanceTest::CheckElementwise(uint64_t count, uint64_t seed) {
  SCOPED_TRACE(std::string(DTypeName(kDType<T>)) + " count " + std::to_string(count));
  std::mt19937_64 rng(seed);
  const std::vector<T> a = RandomVector<T>(rng, count, -4.0, 4.0);
  const std::vector<T> b = RandomDivisors<T>(rng, count);
  DeviceBuffer da = AllocateElements<T>(stream(), count);
  DeviceBuffer db = AllocateElements<T>(stream(), count);
  DeviceBuffer dout = AllocateElements<T>(stream(), count);
  Upload(stream(), da, a);
  Upload(stream(), db, b);
  const double rel = ElementwiseTolerance<T>();
  const DType dt = kDType<T>;

  struct Case {
    BinaryOp op;
    const char* name;
  };
  for (Case c : {Case{BinaryOp::kAdd, "add"}, Case{BinaryOp::kSub, "sub"},
                 Case{BinaryOp::kMul, "mul"}, Case{BinaryOp::kDiv, "div"}}) {
    ASSERT_TRUE(stream().Binary(c.op, dt, da.ptr(), db.ptr(), dout.ptr(), count).ok());
    std::vector<long double> ref(count);
    for (uint64_t i = 0; i < count; ++i) {
      const long double x = a[i], y = b[i];
      switch (c.op) {
        case BinaryOp::kAdd:
          ref[i] = x + y;
          break;
        case BinaryOp::kSub:
          ref[i] = x - y;
          break;
        case BinaryOp::kMul:
          ref[i] = x * y;
          break;
        case BinaryOp::kDiv:
          ref[i] = x / y;
          break;
      }
    }
    ExpectNear(Download<T>(stream(), dout.ptr(), count), ref, rel, c.name);
  }

  // Scale, and Scale in place (out aliases x).
  ASSERT_TRUE(stream().Scale(dt, da.ptr(), -1.75, dout.ptr(), count).ok());
  std::vector<long double> ref(count);
  for (uint64_t i = 0; i < count; ++i) ref[i] = -1.75L * a[i];
  ExpectNear(Download<T>(stream(), dout.ptr(), count), ref, rel, "scale");
  ASSERT_TRUE(stream().Scale(dt, dout.ptr(), 0.5, dout.ptr(), count).ok());
  for (uint64_t i = 0; i < count; ++i) ref[i] *= 0.5L;
  ExpectNear(Download<T>(stream(), dout.ptr(), count), ref, rel, "scale in place");

  // Relu, exact: each element is x or 0.
  ASSERT_TRUE(stream().Relu(dt, da.ptr(), dout.ptr(), count).ok());
  const std::vector<T> relu = Download<T>(stream(), dout.ptr(), count);
  for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(relu[i], a[i] < 0 ? T(0) : a[i]) << "relu " << i;

  // Axpy: dout = b; dout += 0.3 * a.
  ASSERT_TRUE(stream().CopyDeviceToDevice(dout.ptr(), db.ptr(), count * sizeof(T)).ok());
  ASSERT_TRUE(stream().Axpy(dt, 0.3, da.ptr(), dout.ptr(), count).ok());
  for (uint64_t i = 0; i < count; ++i) {
    ref[i] = static_cast<long double>(b[i]) + static_cast<long double>(static_cast<T>(0.3)) * a[i];
  }
  ExpectNear(Download<T>(stream(), dout.ptr(), count), ref, rel, "axpy");

  // Binary with out aliasing a: a = a * b.
  ASSERT_TRUE(stream().Binary(BinaryOp::kMul, dt, da.ptr(), db.ptr(), da.ptr(), count).ok());
  for (uint64_t i = 0; i < count; ++i) ref[i] = static_cast<long double>(a[i]) * b[i];
  ExpectNear(Download<T>(stream(), da.ptr(), count), ref, rel, "mul in place");
}

TEST_P(BackendConformanceTest, ElementwiseOpsF32) {
  for (uint64_t count : kSizes) CheckElementwise<float>(count, 100 + count);
}

TEST_P(BackendConformanceTest, ElementwiseOpsF64) {
  for (uint64_t count : kSizes) CheckElementwise<double>(count, 200 + count);
}

// Relu keeps NaN, -0 and infinities of the right sign as the host loop does, in place too,
// bit for bit on every backend.
TEST_P(BackendConformanceTest, ReluSpecialValuesInPlace) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {
      -1.5f, 2.5f, 0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), -3e-30f};
  DeviceBuffer buf = AllocateElements<float>(stream(), in.size());
  Upload(stream(), buf, in);
  ASSERT_TRUE(stream().Relu(DType::kF32, buf.ptr(), buf.ptr(), in.size()).ok());
  const std::vector<float> out = Download<float>(stream(), buf.ptr(), in.size());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 2.5f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_TRUE(out[3] == 0.0f && std::signbit(out[3])) << "-0 passes through";
  EXPECT_EQ(out[4], inf);
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_TRUE(std::isnan(out[6]));
  EXPECT_EQ(out[7], 0.0f);
  ASSERT_TRUE(stream().Relu(DType::kF32, buf.ptr(), buf.ptr(), 0).ok()) << "count 0";
}

template <typename T>
void BackendConformanceTest::CheckReduceSum(uint64_t count, uint64_t seed) {
  SCOPED_TRACE(std::string(DTypeName(kDType<T>)) + " count " + std::to_string(count));
  std::mt19937_64 rng(seed);
  // An offset so the sum does not cancel to nothing.
  const std::vector<T> x = RandomVector<T>(rng, count, -1.0, 1.5);
  DeviceBuffer dx = AllocateElements<T>(stream(), count);
  DeviceBuffer dsum = AllocateElements<T>(stream(), 1);
  Upload(stream(), dx, x);
  ASSERT_TRUE(stream().Fill(kDType<T>, dsum.ptr(), 1, 12345.0).ok());
  ASSERT_TRUE(stream().ReduceSum(kDType<T>, dx.ptr(), count, dsum.ptr()).ok());
  const T got = Download<T>(stream(), dsum.ptr(), 1)[0];
  long double ref = 0, abs_sum = 0;
  for (T v : x) {
    ref += v;
    abs_sum += std::fabs(static_cast<long double>(v));
  }
  const long double eps = std::numeric_limits<T>::epsilon();
  const long double bound =
      4 * eps * (std::log2(static_cast<long double>(count) + 1) + 2) * abs_sum +
      eps * std::fabs(ref);
  EXPECT_LE(std::fabs(static_cast<long double>(got) - ref), bound)
      << "got " << got << ", expected " << static_cast<double>(ref);
}

TEST_P(BackendConformanceTest, ReduceSumF32) {
  for (uint64_t count : kSizes) CheckReduceSum<float>(count, 300 + count);
}

TEST_P(BackendConformanceTest, ReduceSumF64) {
  for (uint64_t count : kSizes) CheckReduceSum<double>(count, 400 + count);
}

template <typename T>
void BackendConformanceTest::CheckGemm(bool trans_a, bool trans_b, uint64_t m, uint64_t n,
                                       uint64_t k, double alpha, double beta, uint64_t seed) {
  SCOPED_TRACE(std::string(DTypeName(kDType<T>)) + (trans_a ? " A^T" : " A") +
               (trans_b ? " B^T" : " B") + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
               " k=" + std::to_string(k) + " alpha=" + std::to_string(alpha) +
               " beta=" + std::to_string(beta));
  std::mt19937_64 rng(seed);
  const std::vector<T> a = RandomVector<T>(rng, m * k, -1.0, 1.0);
  const std::vector<T> b = RandomVector<T>(rng, k * n, -1.0, 1.0);
  const std::vector<T> c0 = RandomVector<T>(rng, m * n, -1.0, 1.0);
  DeviceBuffer da = AllocateElements<T>(stream(), m * k);
  DeviceBuffer db = AllocateElements<T>(stream(), k * n);
  DeviceBuffer dc = AllocateElements<T>(stream(), m * n);
  Upload(stream(), da, a);
  Upload(stream(), db, b);
  Upload(stream(), dc, c0);

  GemmArgs args;
  args.dtype = kDType<T>;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.m = m;
  args.n = n;
  args.k = k;
  args.alpha = alpha;
  args.beta = beta;
  args.a = da.ptr();
  args.b = db.ptr();
  args.c = dc.ptr();
  Status status = stream().Gemm(args);
  ASSERT_TRUE(status.ok()) << status.ToString();
  const std::vector<T> got = Download<T>(stream(), dc.ptr(), m * n);

  // op(A)[i][p]: A is m x k, or k x m when transposed; op(B)[p][j]: B is k x n or n x k.
  auto op_a = [&](uint64_t i, uint64_t p) { return trans_a ? a[p * m + i] : a[i * k + p]; };
  auto op_b = [&](uint64_t p, uint64_t j) { return trans_b ? b[j * k + p] : b[p * n + j]; };
  const long double eps = std::numeric_limits<T>::epsilon();
  size_t failures = 0;
  for (uint64_t i = 0; i < m && failures < 5; ++i) {
    for (uint64_t j = 0; j < n && failures < 5; ++j) {
      long double dot = 0, dot_abs = 0;
      for (uint64_t p = 0; p < k; ++p) {
        const long double prod = static_cast<long double>(op_a(i, p)) * op_b(p, j);
        dot += prod;
        dot_abs += std::fabs(prod);
      }
      const long double c = c0[i * n + j];
      const long double ref = alpha * dot + beta * c;
      const long double bound =
          (k + 4) * eps * (std::fabs(alpha) * dot_abs + std::fabs(beta * c)) + 1e-300L;
      const long double err = std::fabs(static_cast<long double>(got[i * n + j]) - ref);
      if (!(err <= bound)) {
        ++failures;
        ADD_FAILURE() << "C[" << i << "][" << j << "] is " << got[i * n + j] << ", expected "
                      << static_cast<double>(ref) << " (bound " << static_cast<double>(bound)
                      << ")";
      }
    }
  }
}

struct GemmShape {
  uint64_t m, n, k;
};
const std::vector<GemmShape> kGemmShapes = {{0, 3, 4},   {3, 0, 4},     {3, 4, 0},
                                            {1, 1, 1},   {1, 7, 5},     {6, 1, 9},
                                            {17, 33, 9}, {64, 65, 257}, {130, 257, 31}};
const std::vector<std::pair<double, double>> kAlphaBeta = {{1, 0}, {0.5, 2}, {-1.25, 1}, {0, 0.5}};

template <typename T>
void BackendConformanceTest::CheckGemmAllTransposes(uint64_t first_seed) {
  uint64_t seed = first_seed;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (const GemmShape& s : kGemmShapes) {
        for (auto [alpha, beta] : kAlphaBeta)
          CheckGemm<T>(ta, tb, s.m, s.n, s.k, alpha, beta, ++seed);
      }
    }
  }
}

TEST_P(BackendConformanceTest, GemmF32AllTransposes) { CheckGemmAllTransposes<float>(500); }

TEST_P(BackendConformanceTest, GemmF64AllTransposes) { CheckGemmAllTransposes<double>(900); }

TEST_P(BackendConformanceTest, GemmWithBetaZeroDoesNotReadC) {
  constexpr uint64_t kM = 5, kN = 6, kK = 7;
  DeviceBuffer a = AllocateElements<double>(stream(), kM * kK);
  DeviceBuffer b = AllocateElements<double>(stream(), kK * kN);
  DeviceBuffer c = AllocateElements<double>(stream(), kM * kN);
  ASSERT_TRUE(stream().Fill(DType::kF64, a.ptr(), kM * kK, 1.0).ok());
  ASSERT_TRUE(stream().Fill(DType::kF64, b.ptr(), kK * kN, 2.0).ok());
  ASSERT_TRUE(
      stream().Fill(DType::kF64, c.ptr(), kM * kN, std::numeric_limits<double>::quiet_NaN()).ok());
  GemmArgs args;
  args.dtype = DType::kF64;
  args.m = kM;
  args.n = kN;
  args.k = kK;
  args.alpha = 1.0;
  args.beta = 0.0;
  args.a = a.ptr();
  args.b = b.ptr();
  args.c = c.ptr();
  ASSERT_TRUE(stream().Gemm(args).ok());
  for (double v : Download<double>(stream(), c.ptr(), kM * kN)) ASSERT_EQ(v, 2.0 * kK);
}

TEST_P(BackendConformanceTest, StreamOrderedFreeReleasesMemory) {
  const uint64_t start = device().bytes_in_use();
  constexpr uint64_t kBytes = 64ull << 20;
  Result<DevicePtr> ptr = stream().Allocate(kBytes);
  ASSERT_TRUE(ptr.ok()) << ptr.status().ToString();
  EXPECT_GE(device().bytes_in_use(), start + kBytes);
  // Work in flight, then the Free: the work finishes before the memory is released.
  ASSERT_TRUE(stream().Fill(DType::kF32, *ptr, kBytes / 4, 1.0).ok());
  std::vector<float> tail(16);
  ASSERT_TRUE(stream().CopyDeviceToHost(tail.data(), *ptr + kBytes - 64, tail.size() * 4).ok());
  stream().Free(*ptr);
  ASSERT_TRUE(Sync(stream()).ok());
  EXPECT_EQ(device().bytes_in_use(), start);
  for (float v : tail) EXPECT_EQ(v, 1.0f);
}

TEST_P(BackendConformanceTest, OutOfMemoryIsATypedError) {
  const uint64_t start = device().bytes_in_use();
  Result<DevicePtr> ptr = stream().Allocate(device().info().total_memory * 2);
  ASSERT_FALSE(ptr.ok());
  EXPECT_EQ(ptr.status().kind(), ErrorKind::kOutOfDeviceMemory) << ptr.status().ToString();
  EXPECT_EQ(ptr.status().code(), CanonicalCode(ErrorKind::kOutOfDeviceMemory));
  EXPECT_EQ(device().bytes_in_use(), start);
  // Not sticky: the stream still works.
  DeviceBuffer buf = MustAllocate(stream(), 1024);
  EXPECT_TRUE(stream().Fill(DType::kU8, buf.ptr(), 1024, 1).ok());
  EXPECT_TRUE(Sync(stream()).ok());
}

TEST_P(BackendConformanceTest, AllocateZeroIsInvalid) {
  Result<DevicePtr> ptr = stream().Allocate(0);
  ASSERT_FALSE(ptr.ok());
  EXPECT_EQ(ptr.status().code(), Code::kInvalidArgument) << ptr.status().ToString();
}

TEST_P(BackendConformanceTest, InvalidArgumentsAreRejectedAtEnqueue) {
  constexpr uint64_t kCount = 64;
  DeviceBuffer a = AllocateElements<float>(stream(), kCount);
  DeviceBuffer b = AllocateElements<float>(stream(), kCount);
  ASSERT_TRUE(stream().Fill(DType::kF32, a.ptr(), kCount, 1.0).ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, b.ptr(), kCount, 2.0).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  std::vector<float> host(kCount, 0.0f);

  auto expect_invalid = [](const Status& status, const char* what) {
    EXPECT_FALSE(status.ok()) << what;
    EXPECT_EQ(status.code(), Code::kInvalidArgument) << what << ": " << status.ToString();
  };
  const DType f32 = DType::kF32;
  expect_invalid(stream().CopyHostToDevice(0, host.data(), 4), "H2D null dst");
  expect_invalid(stream().CopyHostToDevice(a.ptr(), nullptr, 4), "H2D null src");
  expect_invalid(stream().CopyDeviceToHost(host.data(), 0, 4), "D2H null src");
  expect_invalid(stream().CopyDeviceToHost(nullptr, a.ptr(), 4), "D2H null dst");
  expect_invalid(stream().CopyDeviceToDevice(0, a.ptr(), 4), "D2D null dst");
  expect_invalid(stream().CopyDeviceToDevice(a.ptr(), 0, 4), "D2D null src");
  expect_invalid(stream().Fill(f32, 0, kCount, 1.0), "fill null");
  expect_invalid(stream().Fill(DType::kInvalid, a.ptr(), kCount, 1.0), "fill bad dtype");
  expect_invalid(stream().Binary(BinaryOp::kAdd, f32, 0, b.ptr(), a.ptr(), kCount), "a null");
  expect_invalid(stream().Binary(BinaryOp::kAdd, f32, a.ptr(), 0, a.ptr(), kCount), "b null");
  expect_invalid(stream().Binary(BinaryOp::kAdd, f32, a.ptr(), b.ptr(), 0, kCount), "out null");
  expect_invalid(stream().Binary(BinaryOp::kAdd, DType::kI32, a.ptr(), b.ptr(), a.ptr(), kCount),
                 "binary i32");
  expect_invalid(stream().Binary(BinaryOp::kAdd, DType::kU8, a.ptr(), b.ptr(), a.ptr(), kCount),
                 "binary u8");
  expect_invalid(stream().Scale(f32, 0, 2.0, a.ptr(), kCount), "scale null x");
  expect_invalid(stream().Scale(DType::kI32, a.ptr(), 2.0, a.ptr(), kCount), "scale i32");
  expect_invalid(stream().Relu(f32, 0, a.ptr(), kCount), "relu null x");
  expect_invalid(stream().Relu(f32, a.ptr(), 0, kCount), "relu null out");
  expect_invalid(stream().Relu(DType::kI32, a.ptr(), a.ptr(), kCount), "relu i32");
  expect_invalid(stream().Axpy(f32, 2.0, a.ptr(), 0, kCount), "axpy null y");
  expect_invalid(stream().Axpy(DType::kU8, 2.0, a.ptr(), b.ptr(), kCount), "axpy u8");
  expect_invalid(stream().ReduceSum(f32, 0, kCount, a.ptr()), "reduce null in");
  expect_invalid(stream().ReduceSum(f32, a.ptr(), kCount, 0), "reduce null out");
  expect_invalid(stream().ReduceSum(DType::kI32, a.ptr(), kCount, b.ptr()), "reduce i32");
  GemmArgs args;
  args.dtype = f32;
  args.m = args.n = args.k = 8;
  args.a = a.ptr();
  args.b = b.ptr();
  args.c = 0;
  expect_invalid(stream().Gemm(args), "gemm null c");
  args.c = a.ptr();
  args.dtype = DType::kI32;
  expect_invalid(stream().Gemm(args), "gemm i32");
  args.dtype = f32;
  args.m = args.n = args.k = 0;
  args.a = 0;
  expect_invalid(stream().Gemm(args), "empty gemm with null a");

  // Nothing was enqueued and nothing is sticky: the buffers are untouched.
  ASSERT_TRUE(Sync(stream()).ok());
  for (float v : Download<float>(stream(), a.ptr(), kCount)) ASSERT_EQ(v, 1.0f);
  for (float v : Download<float>(stream(), b.ptr(), kCount)) ASSERT_EQ(v, 2.0f);
}

TEST_P(BackendConformanceTest, GraphCaptureAndReplay) {
  constexpr uint64_t kCount = 1000;
  DeviceBuffer x = AllocateElements<float>(stream(), kCount);
  DeviceBuffer y = AllocateElements<float>(stream(), kCount);
  ASSERT_TRUE(stream().Fill(DType::kF32, x.ptr(), kCount, 0.0).ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, y.ptr(), kCount, 1.0).ok());
  ASSERT_TRUE(Sync(stream()).ok());

  ASSERT_TRUE(stream().BeginCapture().ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, x.ptr(), kCount, 2.0).ok());
  ASSERT_TRUE(stream().Axpy(DType::kF32, 1.5, x.ptr(), y.ptr(), kCount).ok());
  Result<std::unique_ptr<Graph>> graph = stream().EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  if (GetParam() == "host") {
    EXPECT_EQ((*graph)->node_count(), 2u);
  } else {  // the fill and the axpy may be one fused kernel (see elementwise_run.h)
    EXPECT_GE((*graph)->node_count(), 1u);
  }
  // Capturing recorded the work without running it.
  for (float v : Download<float>(stream(), x.ptr(), kCount)) ASSERT_EQ(v, 0.0f);
  for (float v : Download<float>(stream(), y.ptr(), kCount)) ASSERT_EQ(v, 1.0f);

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(stream().LaunchGraph(**graph).ok());
  for (float v : Download<float>(stream(), x.ptr(), kCount)) ASSERT_EQ(v, 2.0f);
  for (float v : Download<float>(stream(), y.ptr(), kCount)) ASSERT_EQ(v, 1.0f + 3 * 3.0f);

  // The graph can be replayed on another stream of the same device.
  Result<std::unique_ptr<Stream>> other = device().CreateStream();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->LaunchGraph(**graph).ok());
  ASSERT_TRUE(Sync(**other).ok());
  for (float v : Download<float>(stream(), y.ptr(), kCount)) ASSERT_EQ(v, 1.0f + 4 * 3.0f);
}

// A stream's first GEMM may come inside a capture (the CUDA backend then makes its cuBLAS
// state during the capture); the graph replays it.
TEST_P(BackendConformanceTest, FirstGemmOfAStreamInsideAGraph) {
  Result<std::unique_ptr<Stream>> fresh = device().CreateStream();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  Stream& s = **fresh;
  constexpr uint64_t kN = 4;
  DeviceBuffer a = AllocateElements<float>(s, kN * kN);
  DeviceBuffer b = AllocateElements<float>(s, kN * kN);
  DeviceBuffer c = AllocateElements<float>(s, kN * kN);
  std::vector<float> a_host(kN * kN, 0.0f), b_host(kN * kN);
  for (uint64_t i = 0; i < kN; ++i) a_host[i * kN + i] = 2.0f;  // A = 2 I
  for (uint64_t i = 0; i < kN * kN; ++i) b_host[i] = static_cast<float>(i);
  Upload(s, a, a_host);
  Upload(s, b, b_host);
  ASSERT_TRUE(s.Fill(DType::kF32, c.ptr(), kN * kN, -1.0).ok());
  ASSERT_TRUE(Sync(s).ok());

  ASSERT_TRUE(s.BeginCapture().ok());
  GemmArgs g;
  g.dtype = DType::kF32;
  g.m = g.n = g.k = kN;
  g.alpha = 1.0;
  g.beta = 0.0;
  g.a = a.ptr();
  g.b = b.ptr();
  g.c = c.ptr();
  Status gemm = s.Gemm(g);
  Result<std::unique_ptr<Graph>> graph = s.EndCapture();
  ASSERT_TRUE(gemm.ok()) << gemm.ToString();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  for (float v : Download<float>(s, c.ptr(), kN * kN)) ASSERT_EQ(v, -1.0f) << "ran at capture";

  ASSERT_TRUE(s.LaunchGraph(**graph).ok());
  std::vector<float> got = Download<float>(s, c.ptr(), kN * kN);
  for (uint64_t i = 0; i < kN * kN; ++i) ASSERT_EQ(got[i], 2.0f * b_host[i]) << "element " << i;
}

TEST_P(BackendConformanceTest, CaptureMisuseIsRejected) {
  EXPECT_FALSE(stream().EndCapture().ok()) << "EndCapture without BeginCapture";
  ASSERT_TRUE(stream().BeginCapture().ok());
  EXPECT_FALSE(stream().BeginCapture().ok()) << "BeginCapture twice";
  Result<DevicePtr> ptr = stream().Allocate(256);
  EXPECT_FALSE(ptr.ok()) << "Allocate during capture";
  if (ptr.ok()) stream().Free(*ptr);
  Result<std::unique_ptr<Graph>> graph = stream().EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  EXPECT_EQ((*graph)->node_count(), 0u);
  EXPECT_FALSE(stream().EndCapture().ok()) << "EndCapture twice";
  // The stream works normally afterwards.
  DeviceBuffer buf = AllocateElements<double>(stream(), 4);
  ASSERT_TRUE(stream().Fill(DType::kF64, buf.ptr(), 4, 8.0).ok());
  for (double v : Download<double>(stream(), buf.ptr(), 4)) EXPECT_EQ(v, 8.0);
}

// An abandoned recording runs nothing and builds no graph; memory freed during it is released
// all the same, and the stream records and runs as before.
TEST_P(BackendConformanceTest, AnAbandonedCaptureRunsNothingAndReleasesItsFrees) {
  EXPECT_FALSE(stream().AbandonCapture().ok()) << "AbandonCapture without BeginCapture";
  constexpr uint64_t kCount = 1000;
  DeviceBuffer x = AllocateElements<float>(stream(), kCount);
  DeviceBuffer y = AllocateElements<float>(stream(), kCount);
  ASSERT_TRUE(stream().Fill(DType::kF32, x.ptr(), kCount, 1.0).ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, y.ptr(), kCount, 2.0).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  const uint64_t before = device().bytes_in_use();
  constexpr uint64_t kFreedBytes = 64ull << 20;
  Result<DevicePtr> freed = stream().Allocate(kFreedBytes);
  ASSERT_TRUE(freed.ok()) << freed.status().ToString();

  ASSERT_TRUE(stream().BeginCapture().ok());
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(stream().Fill(DType::kF32, x.ptr(), kCount, 5.0).ok());
    ASSERT_TRUE(stream().Axpy(DType::kF32, 3.0, x.ptr(), y.ptr(), kCount).ok());
  }
  stream().Free(*freed);  // invalidates the recording: abandoned all the same
  ASSERT_TRUE(stream().AbandonCapture().ok());
  EXPECT_FALSE(stream().AbandonCapture().ok()) << "AbandonCapture twice";
  EXPECT_FALSE(stream().EndCapture().ok()) << "EndCapture after AbandonCapture";

  ASSERT_TRUE(Sync(stream()).ok());
  EXPECT_EQ(device().bytes_in_use(), before) << "the Free during the recording released nothing";
  for (float v : Download<float>(stream(), x.ptr(), kCount)) ASSERT_EQ(v, 1.0f);
  for (float v : Download<float>(stream(), y.ptr(), kCount)) ASSERT_EQ(v, 2.0f);

  // The stream records and runs as before.
  ASSERT_TRUE(stream().BeginCapture().ok());
  ASSERT_TRUE(stream().Axpy(DType::kF32, 3.0, x.ptr(), y.ptr(), kCount).ok());
  Result<std::unique_ptr<Graph>> graph = stream().EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  ASSERT_TRUE(stream().LaunchGraph(**graph).ok());
  for (float v : Download<float>(stream(), y.ptr(), kCount)) ASSERT_EQ(v, 5.0f);
}

// Batches: many small ops handed over at once run as if enqueued one by one at EndBatch.
// Batches of one shape follow each other without waiting, each with other values (on CUDA
// the kept graph is updated while earlier launches of it may still run); then batches of
// another shape with the same op count (other kernels) and of another op count.
TEST_P(BackendConformanceTest, BatchesRunInOrderWithTheirOwnValues) {
  constexpr uint64_t kCount = 4096;
  constexpr int kOps = 16;
  DeviceBuffer x = AllocateElements<float>(stream(), kCount);
  DeviceBuffer y = AllocateElements<float>(stream(), kCount);
  DeviceBuffer z = AllocateElements<float>(stream(), kCount);
  ASSERT_TRUE(stream().Fill(DType::kF32, x.ptr(), kCount, 1.0).ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, y.ptr(), kCount, 0.0).ok());
  ASSERT_TRUE(Sync(stream()).ok());

  // 20 batches of 16 axpy, batch j adding 16 (j + 1): y = 16 * (1 + ... + 20) = 3360.
  for (int j = 0; j < 20; ++j) {
    ASSERT_TRUE(stream().BeginBatch().ok());
    for (int k = 0; k < kOps; ++k) {
      ASSERT_TRUE(stream().Axpy(DType::kF32, j + 1, x.ptr(), y.ptr(), kCount).ok());
    }
    ASSERT_TRUE(stream().EndBatch().ok()) << "batch " << j;
  }
  for (float v : Download<float>(stream(), y.ptr(), kCount)) ASSERT_EQ(v, 3360.0f);

  // Same op count, other kernels: z = 3360 * 2, then 15 times z += x; z = 6735.
  ASSERT_TRUE(stream().BeginBatch().ok());
  ASSERT_TRUE(stream().Scale(DType::kF32, y.ptr(), 2.0, z.ptr(), kCount).ok());
  for (int k = 1; k < kOps; ++k) {
    ASSERT_TRUE(
        stream().Binary(BinaryOp::kAdd, DType::kF32, z.ptr(), x.ptr(), z.ptr(), kCount).ok());
  }
  ASSERT_TRUE(stream().EndBatch().ok());
  // Another op count: 3 ops. A fill before it (outside any batch) runs first.
  ASSERT_TRUE(stream().Fill(DType::kF32, y.ptr(), kCount, 5.0).ok());
  ASSERT_TRUE(stream().BeginBatch().ok());
  ASSERT_TRUE(stream().Axpy(DType::kF32, 1.0, z.ptr(), y.ptr(), kCount).ok());  // 6740
  ASSERT_TRUE(stream()
                  .Binary(BinaryOp::kSub, DType::kF32, y.ptr(), x.ptr(), y.ptr(), kCount)
                  .ok());                                                        // 6739
  ASSERT_TRUE(stream().Scale(DType::kF32, y.ptr(), 0.5, y.ptr(), kCount).ok());  // 3369.5
  ASSERT_TRUE(stream().EndBatch().ok());
  for (float v : Download<float>(stream(), z.ptr(), kCount)) ASSERT_EQ(v, 6735.0f);
  for (float v : Download<float>(stream(), y.ptr(), kCount)) ASSERT_EQ(v, 3369.5f);

  // An empty batch enqueues nothing and is fine.
  ASSERT_TRUE(stream().BeginBatch().ok());
  ASSERT_TRUE(stream().EndBatch().ok());
  ASSERT_TRUE(Sync(stream()).ok());
}

// A stream made after another was destroyed runs its own work only: a batch of the same
// shape writes the new stream's tensors, not those the first stream's batch wrote, and a
// reduction is right (on CUDA its scratch comes from the pool the first stream's scratch
// went back to, in stream order).
TEST_P(BackendConformanceTest, AStreamMadeAfterAnotherRunsOnlyItsOwnWork) {
  constexpr uint64_t kCount = 1024;
  constexpr int kOps = 16;
  // Allocated through the fixture's stream, so that they outlive the streams below.
  DeviceBuffer x = AllocateElements<float>(stream(), kCount);
  DeviceBuffer first_y = AllocateElements<float>(stream(), kCount);
  DeviceBuffer second_y = AllocateElements<float>(stream(), kCount);
  DeviceBuffer sum = AllocateElements<float>(stream(), 1);
  ASSERT_TRUE(stream().Fill(DType::kF32, x.ptr(), kCount, 1.0).ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, first_y.ptr(), kCount, 0.0).ok());
  ASSERT_TRUE(stream().Fill(DType::kF32, second_y.ptr(), kCount, 0.0).ok());
  ASSERT_TRUE(Sync(stream()).ok());

  auto run = [&](DevicePtr y, double alpha) {
    Result<std::unique_ptr<Stream>> made = device().CreateStream();
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    Stream& s = **made;
    ASSERT_TRUE(s.BeginBatch().ok());
    for (int k = 0; k < kOps; ++k) ASSERT_TRUE(s.Axpy(DType::kF32, alpha, x.ptr(), y, kCount).ok());
    ASSERT_TRUE(s.EndBatch().ok());
    ASSERT_TRUE(s.ReduceSum(DType::kF32, y, kCount, sum.ptr()).ok());
    ASSERT_TRUE(Sync(s).ok());
  };
  run(first_y.ptr(), 1.0);  // first_y = 16
  for (float v : Download<float>(stream(), sum.ptr(), 1)) EXPECT_EQ(v, 16.0f * kCount);
  run(second_y.ptr(), 2.0);  // second_y = 32; first_y untouched
  for (float v : Download<float>(stream(), sum.ptr(), 1)) EXPECT_EQ(v, 32.0f * kCount);
  for (float v : Download<float>(stream(), first_y.ptr(), kCount)) ASSERT_EQ(v, 16.0f);
  for (float v : Download<float>(stream(), second_y.ptr(), kCount)) ASSERT_EQ(v, 32.0f);
}

// Nothing of a batch runs before EndBatch; an op refused inside it is left out and the
// others run; a batch made invalid (a Free inside it) enqueues nothing; misuse is refused.
TEST_P(BackendConformanceTest, BatchRulesAndRefusals) {
  constexpr uint64_t kCount = 256;
  DeviceBuffer x = AllocateElements<double>(stream(), kCount);
  ASSERT_TRUE(stream().Fill(DType::kF64, x.ptr(), kCount, 1.0).ok());
  ASSERT_TRUE(Sync(stream()).ok());

  EXPECT_FALSE(stream().EndBatch().ok()) << "EndBatch without BeginBatch";
  ASSERT_TRUE(stream().BeginBatch().ok());
  EXPECT_FALSE(stream().BeginBatch().ok()) << "BeginBatch twice";
  EXPECT_FALSE(stream().BeginCapture().ok()) << "BeginCapture inside a batch";
  EXPECT_FALSE(stream().EndCapture().ok()) << "EndCapture inside a batch";
  Result<DevicePtr> ptr = stream().Allocate(256);
  EXPECT_FALSE(ptr.ok()) << "Allocate inside a batch";
  ASSERT_TRUE(stream().Scale(DType::kF64, x.ptr(), 3.0, x.ptr(), kCount).ok());
  // Past the allocation's end: refused, not recorded.
  EXPECT_EQ(stream().Fill(DType::kF64, x.ptr(), kCount + 1, 0.0).kind(), ErrorKind::kOutOfRange);
  ASSERT_TRUE(stream().Scale(DType::kF64, x.ptr(), 2.0, x.ptr(), kCount).ok());
  // Recorded, not run: a copy on another stream sees the old values.
  Result<std::unique_ptr<Stream>> other = device().CreateStream();
  ASSERT_TRUE(other.ok());
  for (double v : Download<double>(**other, x.ptr(), kCount)) ASSERT_EQ(v, 1.0);
  ASSERT_TRUE(stream().EndBatch().ok());
  for (double v : Download<double>(stream(), x.ptr(), kCount)) ASSERT_EQ(v, 6.0);

  // A batch with a Free inside is invalid: none of it runs; the memory is still released.
  DeviceBuffer doomed = AllocateElements<double>(stream(), kCount);
  ASSERT_TRUE(stream().BeginBatch().ok());
  ASSERT_TRUE(stream().Scale(DType::kF64, x.ptr(), 10.0, x.ptr(), kCount).ok());
  stream().Free(doomed.release());
  EXPECT_EQ(stream().EndBatch().kind(), ErrorKind::kInvalidArgument);
  for (double v : Download<double>(stream(), x.ptr(), kCount)) ASSERT_EQ(v, 6.0);

  // A capture is not a batch.
  ASSERT_TRUE(stream().BeginCapture().ok());
  EXPECT_FALSE(stream().EndBatch().ok()) << "EndBatch inside a capture";
  EXPECT_FALSE(stream().BeginBatch().ok()) << "BeginBatch inside a capture";
  ASSERT_TRUE(stream().EndCapture().ok());
  ASSERT_TRUE(stream().Fill(DType::kF64, x.ptr(), kCount, 4.0).ok());
  for (double v : Download<double>(stream(), x.ptr(), kCount)) ASSERT_EQ(v, 4.0);
}

// A random script of elementwise ops (f32 and f64) on two arenas, whose ranges overlap
// from op to op at the same and at other starts (never within one op, where the order of
// elements is not defined), mixed with ops of other kinds (a sum, an i32 fill, a copy).
// Enqueued op by op, in a batch or into a graph, it must leave the same bytes: on CUDA,
// batches and graphs run runs of these ops as one kernel where that is the same
// (backend/elementwise_run.h), and split them where it is not.
struct ElementwiseScript {
  static constexpr uint64_t kArenaElements = 1024;
  struct Arenas {
    DevicePtr f32 = 0, f64 = 0, i32 = 0, sums = 0;  // the sums: 64 doubles
  };

  explicit ElementwiseScript(uint64_t seed) : seed(seed) {}

  /// Enqueue the script; every op must be accepted.
  void Enqueue(Stream& s, const Arenas& arenas) const {
    std::mt19937_64 rng(seed);
    auto pick = [&](uint64_t lo, uint64_t hi) {
      return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
    };
    for (int op = 0; op < kOps; ++op) {
      const bool f64 = pick(0, 3) == 0;
      const DType dtype = f64 ? DType::kF64 : DType::kF32;
      const uint64_t size = f64 ? 8 : 4;
      const DevicePtr arena = f64 ? arenas.f64 : arenas.f32;
      const uint64_t count = pick(1, 300);
      auto start = [&] { return arena + pick(0, kArenaElements - count) * size; };
      // A range of `count` elements that is `other` itself or does not overlap it.
      auto beside = [&](DevicePtr other) {
        for (;;) {
          const DevicePtr p = start();
          if (p == other || p + count * size <= other || other + count * size <= p) return p;
        }
      };
      const DevicePtr out = start();
      Status status;
      switch (pick(0, 9)) {
        case 0:
          status = s.Fill(dtype, out, count, static_cast<double>(pick(1, 8)) / 4);
          break;
        case 1:
        case 2:
        case 3: {
          const BinaryOp bop = static_cast<BinaryOp>(pick(0, 3));
          const DevicePtr a = beside(out);
          const DevicePtr b = beside(out);
          status = s.Binary(bop, dtype, a, b, out, count);
          break;
        }
        case 4:
        case 5: {
          const DevicePtr x = beside(out);
          status = s.Scale(dtype, x, 0.5 + static_cast<double>(pick(0, 8)) / 8, out, count);
          break;
        }
        case 6:
        case 7: {
          DevicePtr x = beside(out);
          while (x == out) x = beside(out);  // Axpy's x and y do not alias
          status = s.Axpy(dtype, static_cast<double>(pick(1, 4)) / 8, x, out, count);
          break;
        }
        case 8: {  // the sum is written as dtype: an f32 sum fills half of a slot
          const DevicePtr in = start();
          status = s.ReduceSum(dtype, in, count, arenas.sums + pick(0, 63) * 8);
          break;
        }
        default:
          if (pick(0, 1) == 0) {
            status = s.Fill(DType::kI32, arenas.i32, pick(1, 64), 7.0);
          } else {
            status = s.CopyDeviceToDevice(out, beside(out), count * size);
          }
          break;
      }
      ASSERT_TRUE(status.ok()) << "op " << op << ": " << status.ToString();
    }
  }

  static constexpr int kOps = 300;
  uint64_t seed;
};

TEST_P(BackendConformanceTest, BatchesAndGraphsOfElementwiseOpsLeaveTheBytesOfOpByOp) {
  using Script = ElementwiseScript;
  std::mt19937_64 rng(42);
  const std::vector<float> f32 = RandomDivisors<float>(rng, Script::kArenaElements);
  const std::vector<double> f64 = RandomDivisors<double>(rng, Script::kArenaElements);
  struct Run {
    DeviceBuffer f32, f64, i32, sums;
    Script::Arenas arenas() const { return {f32.ptr(), f64.ptr(), i32.ptr(), sums.ptr()}; }
  };
  auto fresh = [&] {
    Run r{AllocateElements<float>(stream(), Script::kArenaElements),
          AllocateElements<double>(stream(), Script::kArenaElements),
          AllocateElements<int32_t>(stream(), 64), AllocateElements<double>(stream(), 64)};
    Upload(stream(), r.f32, f32);
    Upload(stream(), r.f64, f64);
    return r;
  };
  auto bytes = [&](const Run& r) {
    std::vector<char> out;
    for (auto [ptr, n] :
         {std::pair{r.f32.ptr(), Script::kArenaElements * 4},
          std::pair{r.f64.ptr(), Script::kArenaElements * 8},
          std::pair{r.i32.ptr(), uint64_t{64 * 4}}, std::pair{r.sums.ptr(), uint64_t{64 * 8}}}) {
      std::vector<char> part = Download<char>(stream(), ptr, n);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  };

  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("script seed " + std::to_string(seed));
    const Script script(seed);
    Run op_by_op = fresh(), batched = fresh(), graphed = fresh();
    script.Enqueue(stream(), op_by_op.arenas());
    ASSERT_TRUE(Sync(stream()).ok());

    ASSERT_TRUE(stream().BeginBatch().ok());
    script.Enqueue(stream(), batched.arenas());
    ASSERT_TRUE(stream().EndBatch().ok());

    ASSERT_TRUE(stream().BeginCapture().ok());
    script.Enqueue(stream(), graphed.arenas());
    Result<std::unique_ptr<Graph>> graph = stream().EndCapture();
    ASSERT_TRUE(graph.ok()) << graph.status().ToString();
    ASSERT_TRUE(stream().LaunchGraph(**graph).ok());
    ASSERT_TRUE(Sync(stream()).ok());

    const std::vector<char> expected = bytes(op_by_op);
    EXPECT_TRUE(bytes(batched) == expected) << "the batch left other bytes";
    EXPECT_TRUE(bytes(graphed) == expected) << "the graph left other bytes";
  }
}

// On CUDA a graph's runs of elementwise ops are one kernel node each, cut where fusing would
// change the results or cost a long op (backend/elementwise_run.h); the host backend records
// one node per op. CudaDeviceOptions::fuse_elementwise = false gives one node per op.
TEST_P(BackendConformanceTest, ElementwiseRunsOfAGraphAreOneNodeEachOnCuda) {
  const bool cuda = GetParam() == "cuda";
  constexpr uint64_t kCount = 1024;
  DeviceBuffer x = AllocateElements<float>(stream(), kCount);
  DeviceBuffer y = AllocateElements<float>(stream(), kCount);
  DeviceBuffer z = AllocateElements<double>(stream(), kCount);
  auto nodes = [&](Stream& s, auto&& record) -> size_t {
    EXPECT_TRUE(s.BeginCapture().ok());
    record(s);
    Result<std::unique_ptr<Graph>> graph = s.EndCapture();
    EXPECT_TRUE(graph.ok()) << graph.status().ToString();
    return graph.ok() ? (*graph)->node_count() : 0;
  };
  auto axpys = [&](int n) {
    return [&, n](Stream& s) {
      for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(s.Axpy(DType::kF32, 0.5, x.ptr(), y.ptr(), kCount).ok());
      }
    };
  };
  EXPECT_EQ(nodes(stream(), axpys(64)), cuda ? 1u : 64u) << "64 axpy on the same y";
  EXPECT_EQ(nodes(stream(), axpys(65)), cuda ? 2u : 65u) << "at most 64 ops a run";
  // y written, then read one element further on: the second op starts a new run.
  EXPECT_EQ(nodes(stream(),
                  [&](Stream& s) {
                    ASSERT_TRUE(s.Fill(DType::kF32, y.ptr(), kCount, 1.0).ok());
                    ASSERT_TRUE(s.Scale(DType::kF32, y.at(4), 2.0, x.ptr(), kCount - 1).ok());
                  }),
            2u);
  // Another dtype, and an op 8 times longer than the run's: new runs.
  EXPECT_EQ(nodes(stream(),
                  [&](Stream& s) {
                    ASSERT_TRUE(s.Fill(DType::kF32, y.ptr(), kCount, 1.0).ok());
                    ASSERT_TRUE(s.Fill(DType::kF64, z.ptr(), kCount, 1.0).ok());
                    ASSERT_TRUE(s.Fill(DType::kF64, z.ptr(), kCount / 8, 2.0).ok());
                  }),
            3u);
}

TEST_P(BackendConformanceTest, WithoutFusionEachElementwiseOpOfAGraphIsANode) {
  if (GetParam() != "cuda") GTEST_SKIP() << "the host backend fuses nothing";
  stream_.reset();  // one CUDA device of ordinal 0 at a time, as in ferryd
  device_.reset();
  CudaDeviceOptions options;
  options.fuse_elementwise = false;
  Result<std::unique_ptr<Device>> device = CreateCudaDevice(0, options);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  Result<std::unique_ptr<Stream>> s = (*device)->CreateStream();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  constexpr uint64_t kCount = 1024;
  {
    DeviceBuffer x = AllocateElements<float>(**s, kCount);
    DeviceBuffer y = AllocateElements<float>(**s, kCount);
    ASSERT_TRUE((*s)->BeginCapture().ok());
    for (int i = 0; i < 64; ++i) {
      ASSERT_TRUE((*s)->Axpy(DType::kF32, 0.5, x.ptr(), y.ptr(), kCount).ok());
    }
    Result<std::unique_ptr<Graph>> graph = (*s)->EndCapture();
    ASSERT_TRUE(graph.ok()) << graph.status().ToString();
    EXPECT_EQ((*graph)->node_count(), 64u);
  }
  ASSERT_TRUE(Sync(**s).ok());
  s->reset();  // before its device
}

TEST_P(BackendConformanceTest, ManyStreamsFromManyThreads) {
  constexpr int kThreads = 16;
  constexpr int kRounds = 10;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t, &failures] {
      Result<std::unique_ptr<Stream>> created = device().CreateStream();
      if (!created.ok()) {
        ++failures;
        return;
      }
      Stream& s = **created;
      const uint64_t count = 4096 + 37 * t;
      for (int round = 0; round < kRounds; ++round) {
        DeviceBuffer x = AllocateElements<double>(s, count);
        DeviceBuffer y = AllocateElements<double>(s, count);
        DeviceBuffer sum = AllocateElements<double>(s, 1);
        bool ok = s.Fill(DType::kF64, x.ptr(), count, t + 1).ok() &&
                  s.Fill(DType::kF64, y.ptr(), count, round).ok() &&
                  s.Axpy(DType::kF64, 2.0, x.ptr(), y.ptr(), count).ok() &&
                  s.ReduceSum(DType::kF64, y.ptr(), count, sum.ptr()).ok();
        std::vector<double> host_y(count), host_sum(1);
        ok = ok && s.CopyDeviceToHost(host_y.data(), y.ptr(), count * 8).ok() &&
             s.CopyDeviceToHost(host_sum.data(), sum.ptr(), 8).ok();
        ok = ok && Sync(s).ok();
        const double expect = round + 2.0 * (t + 1);
        ok = ok &&
             std::all_of(host_y.begin(), host_y.end(), [expect](double v) { return v == expect; });
        ok = ok && host_sum[0] == expect * count;
        if (!ok) ++failures;
      }
      // Completions of this stream are delivered before its destructor returns.
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(BackendConformanceTest, DestroyingAStreamWaitsForItsWork) {
  Result<std::unique_ptr<Stream>> created = device().CreateStream();
  ASSERT_TRUE(created.ok());
  std::unique_ptr<Stream> s = std::move(created).value();
  constexpr uint64_t kCount = 1u << 22;
  Result<DevicePtr> buf = s->Allocate(kCount * 4);
  ASSERT_TRUE(buf.ok());
  std::vector<float> host(kCount, 0.0f);
  std::atomic<int> called{0};
  ASSERT_TRUE(s->Fill(DType::kF32, *buf, kCount, 4.0).ok());
  ASSERT_TRUE(s->CopyDeviceToHost(host.data(), *buf, kCount * 4).ok());
  s->Free(*buf);
  s->OnComplete([&called](Status status) {
    EXPECT_TRUE(status.ok());
    ++called;
  });
  s.reset();
  EXPECT_EQ(called.load(), 1);
  EXPECT_EQ(host[0], 4.0f);
  EXPECT_EQ(host[kCount - 1], 4.0f);
}

TEST_P(BackendConformanceTest, BusyTimeNeverDecreases) {
  const uint64_t before = stream().busy_ns();
  DeviceBuffer buf = AllocateElements<float>(stream(), 1u << 20);
  ASSERT_TRUE(stream().Fill(DType::kF32, buf.ptr(), 1u << 20, 1.0).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  EXPECT_GE(stream().busy_ns(), before);
}

// --- usage (backend.h, Usage) ----------------------------------------------------------

// Hand-written PTX: spin until the device's global timer has advanced `ns` nanoseconds, so
// the kernel runs at least that long whatever the device's speed.
constexpr char kSpinPtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(
    .param .u64 spin_param_0
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<6>;

    ld.param.u64 %rd1, [spin_param_0];
    mov.u64 %rd2, %globaltimer;
LOOP:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra LOOP;
    ret;
}
)";

/// Enqueue work on `stream` that keeps the device busy for at least `duration`: on the host
/// backend an op delayed by that much (the worker sleeps inside the op), on CUDA a kernel
/// that spins on the device's global timer.
void EnqueueWorkOfAtLeast(Device& device, Stream& stream, std::chrono::milliseconds duration) {
  if (auto* host = dynamic_cast<HostDevice*>(&device)) {
    Result<DevicePtr> ptr = stream.Allocate(256);
    ASSERT_TRUE(ptr.ok()) << ptr.status().ToString();
    host->SetOpDelayForTest(duration);
    Status filled = stream.Fill(DType::kF32, *ptr, 64, 1.0);
    ASSERT_TRUE(filled.ok()) << filled.ToString();
    ASSERT_TRUE(Sync(stream).ok());  // the delay applies when the op runs
    host->SetOpDelayForTest(std::chrono::microseconds(0));
    stream.Free(*ptr);
    return;
  }
  Result<std::shared_ptr<Module>> module = device.LoadModule(ModuleFormat::kPtx, kSpinPtx);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  KernelArg ns;
  const uint64_t value =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count());
  ns.scalar.resize(sizeof value);
  std::memcpy(ns.scalar.data(), &value, sizeof value);
  Status launched = stream.Launch(**module, "spin", LaunchConfig{}, {ns});
  ASSERT_TRUE(launched.ok()) << launched.ToString();
}

/// Host memory registered with a device (pinned on CUDA) for as long as it lives: `bytes`
/// bytes, each `fill`. Check registered() before using it.
class RegisteredHostBytes {
 public:
  RegisteredHostBytes(Device& device, uint64_t bytes, uint8_t fill)
      : device_(device), bytes_(bytes, fill) {
    registered_ = device_.RegisterHostMemory(bytes_.data(), bytes);
  }
  ~RegisteredHostBytes() {
    if (registered_.ok()) (void)device_.UnregisterHostMemory(bytes_.data());
  }
  RegisteredHostBytes(const RegisteredHostBytes&) = delete;
  RegisteredHostBytes& operator=(const RegisteredHostBytes&) = delete;
  const Status& registered() const { return registered_; }
  uint8_t* data() { return bytes_.data(); }

 private:
  Device& device_;
  std::vector<uint8_t> bytes_;
  Status registered_;
};

// Copy `bytes` between `buf` and `host` on `stream`: host to device where `to_device`, else
// device to host.
Status CopyOneWay(Stream& stream, const DeviceBuffer& buf, RegisteredHostBytes& host,
                  uint64_t bytes, bool to_device) {
  return to_device ? stream.CopyHostToDevice(buf.ptr(), host.data(), bytes)
                   : stream.CopyDeviceToHost(host.data(), buf.ptr(), bytes);
}

// One copy of `bytes` each way between `buf` and `host`, waited for: the CUDA backend then
// knows both rates.
void CopyEachWayAndWait(Stream& stream, const DeviceBuffer& buf, RegisteredHostBytes& host,
                        uint64_t bytes) {
  ASSERT_TRUE(CopyOneWay(stream, buf, host, bytes, /*to_device=*/true).ok());
  ASSERT_TRUE(CopyOneWay(stream, buf, host, bytes, /*to_device=*/false).ok());
  ASSERT_TRUE(Sync(stream).ok());
}

Usage Minus(const Usage& a, const Usage& b) {
  Usage d;
  d.busy_ns = a.busy_ns - b.busy_ns;
  d.h2d_bytes = a.h2d_bytes - b.h2d_bytes;
  d.h2d_ns = a.h2d_ns - b.h2d_ns;
  d.d2h_bytes = a.d2h_bytes - b.d2h_bytes;
  d.d2h_ns = a.d2h_ns - b.d2h_ns;
  return d;
}

std::string Describe(const Usage& u) {
  return "busy_ns=" + std::to_string(u.busy_ns) + " h2d=" + std::to_string(u.h2d_bytes) + "B/" +
         std::to_string(u.h2d_ns) + "ns d2h=" + std::to_string(u.d2h_bytes) + "B/" +
         std::to_string(u.d2h_ns) + "ns";
}

/// `submits` submits back to back on `stream`: `enqueue(i)` enqueues the i-th one's work, and
/// a completion is watched after each while the device still runs the ones before. Waits for
/// them all (Sync): how that went, how many completed OK, and the wall-clock time from the
/// first enqueue. Stops enqueueing at the first fatal failure of `enqueue`.
struct BackToBack {
  Status synced;
  int completed = 0;
  std::chrono::nanoseconds wall{0};
};
template <typename EnqueueFn>
BackToBack RunBackToBack(Stream& stream, int submits, EnqueueFn&& enqueue) {
  const auto start = std::chrono::steady_clock::now();
  auto completed = std::make_shared<std::atomic<int>>(0);
  for (int i = 0; i < submits && !::testing::Test::HasFatalFailure(); ++i) {
    enqueue(i);
    stream.OnComplete([completed](Status status) {
      if (status.ok()) ++*completed;
    });
  }
  Status synced = Sync(stream);
  return {std::move(synced), completed->load(),
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                               start)};
}

// Streams closed in every state (work still running, a capture left open, idle) leave
// nothing to the streams made after them: each new stream starts with zero usage, not
// capturing, runs its own work (a reduction through the stream's scratch is right) and
// counts only that. On CUDA a thread makes streams ahead and destroys closed ones.
void ExpectStreamsMadeAfterOthersClosedStartClean(Device& device) {
  constexpr uint64_t kCount = 4096;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Result<std::unique_ptr<Stream>> made = device.CreateStream();
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    std::unique_ptr<Stream> s = std::move(made).value();
    EXPECT_EQ(s->usage(), Usage{}) << Describe(s->usage());
    Result<DevicePtr> x = s->Allocate(kCount * sizeof(float));
    Result<DevicePtr> sum = s->Allocate(sizeof(float));
    ASSERT_TRUE(x.ok() && sum.ok());
    const float value = 1.0f + static_cast<float>(round);
    std::vector<float> values(kCount, value);
    ASSERT_TRUE(s->CopyHostToDevice(*x, values.data(), kCount * sizeof(float)).ok());
    ASSERT_TRUE(s->ReduceSum(DType::kF32, *x, kCount, *sum).ok());
    for (float v : Download<float>(*s, *sum, 1)) EXPECT_EQ(v, value * kCount);
    EXPECT_EQ(s->usage().h2d_bytes, kCount * sizeof(float)) << Describe(s->usage());
    s->Free(*x);
    s->Free(*sum);
    switch (round % 3) {
      case 0:  // closed with work still running
        EnqueueWorkOfAtLeast(device, *s, std::chrono::milliseconds(5));
        break;
      case 1:  // closed inside a capture
        ASSERT_TRUE(s->BeginCapture().ok());
        break;
      default:  // closed idle
        ASSERT_TRUE(Sync(*s).ok());
        break;
    }
    s.reset();
  }
}

TEST_P(BackendConformanceTest, AStreamMadeAfterOthersClosedStartsClean) {
  ExpectStreamsMadeAfterOthersClosedStartClean(device());
}

TEST_P(BackendConformanceTest, AStreamMadeAtItsOpenAfterOthersClosedStartsClean) {
  if (GetParam() != "cuda") GTEST_SKIP() << "the host backend makes no streams ahead";
  stream_.reset();  // one CUDA device of ordinal 0 at a time, as in ferryd
  device_.reset();
  CudaDeviceOptions options;
  options.streams_ahead = 0;
  Result<std::unique_ptr<Device>> made = CreateCudaDevice(0, options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ExpectStreamsMadeAfterOthersClosedStartClean(**made);
}

TEST_P(BackendConformanceTest, UsageCountsTenMillisecondsOfWork) {
  const Usage before = stream().usage();
  EnqueueWorkOfAtLeast(device(), stream(), std::chrono::milliseconds(10));
  ASSERT_TRUE(Sync(stream()).ok());
  // Counted by the time the completion's callback ran: no waiting, no polling.
  const Usage used = Minus(stream().usage(), before);
  EXPECT_GE(used.busy_ns, 10'000'000u) << Describe(used);
  EXPECT_EQ(used.h2d_bytes, 0u) << "no copies ran";
  EXPECT_EQ(used.d2h_bytes, 0u) << "no copies ran";
}

// Submits back to back, a completion watched after each while the device still runs the
// ones before: each submit's device time is counted once, so together they are at least the
// work and at most the wall-clock time it all took (spans that overlapped would count some
// of it twice).
TEST_P(BackendConformanceTest, UsageOfBackToBackSubmitsCountsEachOnce) {
  const Usage before = stream().usage();
  const BackToBack run = RunBackToBack(stream(), 5, [&](int) {
    EnqueueWorkOfAtLeast(device(), stream(), std::chrono::milliseconds(2));
  });
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(run.synced.ok()) << run.synced.ToString();
  const Usage used = Minus(stream().usage(), before);
  EXPECT_EQ(run.completed, 5);
  EXPECT_GE(used.busy_ns, 10'000'000u) << Describe(used);
  EXPECT_LE(used.busy_ns, static_cast<uint64_t>(run.wall.count())) << Describe(used);
}

TEST_P(BackendConformanceTest, UsageCountsCopiesByDirection) {
  constexpr uint64_t kBytes = 1u << 20;
  DeviceBuffer buf = MustAllocate(stream(), kBytes);
  std::vector<uint8_t> host(kBytes, 7);
  ASSERT_TRUE(Sync(stream()).ok());
  const Usage before = stream().usage();
  ASSERT_TRUE(stream().CopyHostToDevice(buf.ptr(), host.data(), kBytes).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  ASSERT_TRUE(stream().CopyDeviceToHost(host.data(), buf.ptr(), kBytes / 2).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  const Usage used = Minus(stream().usage(), before);
  EXPECT_EQ(used.h2d_bytes, kBytes) << Describe(used);
  EXPECT_EQ(used.d2h_bytes, kBytes / 2) << Describe(used);
  EXPECT_GT(used.h2d_ns, 0u) << Describe(used);
  EXPECT_GT(used.d2h_ns, 0u) << Describe(used);
  EXPECT_LE(used.h2d_ns + used.d2h_ns, used.busy_ns)
      << "copies are part of the busy time; " << Describe(used);
}

// Small copies (a 4-byte result, a 16-byte upload) count their bytes exactly; their time is
// in busy_ns at least (the CUDA backend times only copies of 64 KiB or more with events).
TEST_P(BackendConformanceTest, UsageCountsSmallCopiesBytesExactly) {
  constexpr uint64_t kBytes = 16;
  DeviceBuffer buf = MustAllocate(stream(), kBytes);
  std::vector<uint8_t> host(kBytes, 9);
  ASSERT_TRUE(Sync(stream()).ok());
  const Usage before = stream().usage();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(stream().CopyHostToDevice(buf.ptr(), host.data(), kBytes).ok());
    ASSERT_TRUE(stream().CopyDeviceToHost(host.data(), buf.ptr(), 4).ok());
    ASSERT_TRUE(Sync(stream()).ok());
  }
  const Usage used = Minus(stream().usage(), before);
  EXPECT_EQ(used.h2d_bytes, 3 * kBytes) << Describe(used);
  EXPECT_EQ(used.d2h_bytes, 3 * 4u) << Describe(used);
  EXPECT_GT(used.busy_ns, 0u) << Describe(used);
  EXPECT_LE(used.h2d_ns + used.d2h_ns, used.busy_ns)
      << "copies are part of the busy time; " << Describe(used);
}

// Submits that only copy, back to back, a completion watched after each (a stream of pending
// transfers): every copy's bytes count, and their time is in the busy time, which stays
// within the wall-clock time. (The CUDA backend times few of them with events and estimates
// the rest, with no timing event for the others' submits.)
TEST_P(BackendConformanceTest, UsageOfSubmitsThatOnlyCopyCountsEveryCopy) {
  constexpr uint64_t kBytes = 256u << 10;
  constexpr int kSubmits = 16;
  DeviceBuffer buf = MustAllocate(stream(), kBytes);
  RegisteredHostBytes host(device(), kBytes, 5);
  ASSERT_TRUE(host.registered().ok()) << host.registered().ToString();
  ASSERT_NO_FATAL_FAILURE(CopyEachWayAndWait(stream(), buf, host, kBytes));
  const Usage before = stream().usage();
  const BackToBack run = RunBackToBack(stream(), kSubmits, [&](int i) {
    Status copied = CopyOneWay(stream(), buf, host, kBytes, /*to_device=*/i % 2 == 0);
    ASSERT_TRUE(copied.ok()) << copied.ToString();
  });
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(run.synced.ok()) << run.synced.ToString();
  const Usage used = Minus(stream().usage(), before);
  EXPECT_EQ(run.completed, kSubmits);
  EXPECT_EQ(used.h2d_bytes, kSubmits / 2 * kBytes) << Describe(used);
  EXPECT_EQ(used.d2h_bytes, kSubmits / 2 * kBytes) << Describe(used);
  EXPECT_GT(used.h2d_ns, 0u) << Describe(used);
  EXPECT_GT(used.d2h_ns, 0u) << Describe(used);
  EXPECT_LE(used.h2d_ns + used.d2h_ns, used.busy_ns)
      << "copies are part of the busy time; " << Describe(used);
  EXPECT_LE(used.busy_ns, static_cast<uint64_t>(run.wall.count())) << Describe(used);
}

// A submit that only copies is accounted as its copies' time (operations.md, "Device time and
// usage"): the host backend times each op; the CUDA backend, once the copies' direction and
// size class are measured and none of them is sampled, records no timing event for such a
// submit and gives it its copies' estimate as its device time. Either way its busy time is
// exactly its copy time. (On CUDA a sampled submit is measured by events instead: a class's
// first sample is taken again at its next copy, then one every 10 ms, so a few of these
// submits at most.)
TEST_P(BackendConformanceTest, UsageOfASubmitThatOnlyCopiesIsItsCopiesTime) {
  constexpr uint64_t kBytes = 256u << 10;
  constexpr int kSubmits = 12;
  DeviceBuffer buf = MustAllocate(stream(), kBytes);
  RegisteredHostBytes host(device(), kBytes, 7);
  ASSERT_TRUE(host.registered().ok()) << host.registered().ToString();
  ASSERT_NO_FATAL_FAILURE(CopyEachWayAndWait(stream(), buf, host, kBytes));
  int copy_time_only = 0;
  std::string seen;
  for (int i = 0; i < kSubmits; ++i) {
    const Usage before = stream().usage();
    Status copied = CopyOneWay(stream(), buf, host, kBytes, /*to_device=*/i % 2 == 0);
    ASSERT_TRUE(copied.ok()) << copied.ToString();
    ASSERT_TRUE(Sync(stream()).ok());
    const Usage used = Minus(stream().usage(), before);
    EXPECT_EQ(used.h2d_bytes + used.d2h_bytes, kBytes) << Describe(used);
    if (used.busy_ns > 0 && used.busy_ns == used.h2d_ns + used.d2h_ns) ++copy_time_only;
    seen += "\n  " + Describe(used);
  }
  EXPECT_GE(copy_time_only, kSubmits - 4)
      << "submits whose busy time is their copies' time:" << seen;
}

// A copy's rate is one sample, and a sample can be far off: here it is taken while another
// stream's large copies load the copy engines (on the H200 a first copy alone once took 1 ms
// for 256 KiB). Copies estimated at that rate are still charged no more device time than
// has passed: a tenant is never billed beyond the wall clock (operations.md, "Device time
// and usage").
TEST_P(BackendConformanceTest, UsageOfCopiesEstimatedFromASlowSampleStaysWithinTheWallClock) {
  constexpr uint64_t kBytes = 256u << 10;
  constexpr uint64_t kLoadBytes = 64u << 20;
  constexpr int kSubmits = 16;
  Result<std::unique_ptr<Stream>> loader = device().CreateStream();
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  DeviceBuffer load_buf = MustAllocate(**loader, kLoadBytes);
  RegisteredHostBytes load_host(device(), kLoadBytes, 1);
  ASSERT_TRUE(load_host.registered().ok()) << load_host.registered().ToString();
  DeviceBuffer buf = MustAllocate(stream(), kBytes);
  RegisteredHostBytes host(device(), kBytes, 2);
  ASSERT_TRUE(host.registered().ok()) << host.registered().ToString();
  ASSERT_TRUE(Sync(**loader).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  const Usage before = stream().usage();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) {  // the load: about 5 ms of copies on the H200
    ASSERT_TRUE((*loader)->CopyHostToDevice(load_buf.ptr(), load_host.data(), kLoadBytes).ok());
  }
  // This stream's first copy of its size class, sampled under the load.
  ASSERT_TRUE(stream().CopyHostToDevice(buf.ptr(), host.data(), kBytes).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  ASSERT_TRUE(Sync(**loader).ok());
  // Copies of the same class right after, the load gone: estimated at the sampled rate.
  const BackToBack run = RunBackToBack(stream(), kSubmits, [&](int) {
    Status copied = stream().CopyHostToDevice(buf.ptr(), host.data(), kBytes);
    ASSERT_TRUE(copied.ok()) << copied.ToString();
  });
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(run.synced.ok()) << run.synced.ToString();
  const auto wall = std::chrono::steady_clock::now() - start;
  const Usage used = Minus(stream().usage(), before);
  EXPECT_EQ(run.completed, kSubmits);
  EXPECT_EQ(used.h2d_bytes, (kSubmits + 1) * kBytes) << Describe(used);
  EXPECT_LE(used.h2d_ns + used.d2h_ns, used.busy_ns) << Describe(used);
  EXPECT_LE(used.busy_ns, static_cast<uint64_t>(
                              std::chrono::duration_cast<std::chrono::nanoseconds>(wall).count()))
      << Describe(used);
}

TEST_P(BackendConformanceTest, UsageOfCopiesReplayedFromAGraphIsBusyTimeOnly) {
  constexpr uint64_t kBytes = 64u << 10;
  DeviceBuffer buf = MustAllocate(stream(), kBytes);
  // Registered (pinned on CUDA): a capture cannot hold a copy from pageable memory.
  RegisteredHostBytes host(device(), kBytes, 3);
  ASSERT_TRUE(host.registered().ok()) << host.registered().ToString();
  ASSERT_TRUE(Sync(stream()).ok());
  ASSERT_TRUE(stream().BeginCapture().ok());
  ASSERT_TRUE(stream().CopyHostToDevice(buf.ptr(), host.data(), kBytes).ok());
  Result<std::unique_ptr<Graph>> graph = stream().EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  const Usage before = stream().usage();
  ASSERT_TRUE(stream().LaunchGraph(**graph).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  const Usage used = Minus(stream().usage(), before);
  EXPECT_EQ(used.h2d_bytes, 0u) << Describe(used);
  EXPECT_EQ(used.h2d_ns, 0u) << Describe(used);
  EXPECT_GT(used.busy_ns, 0u) << Describe(used);
}

TEST_P(BackendConformanceTest, TwoStreamsUsageSumsToTheDevicesTotal) {
  const Usage device_before = device().usage();
  Result<std::unique_ptr<Stream>> a = device().CreateStream();
  Result<std::unique_ptr<Stream>> b = device().CreateStream();
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr uint64_t kBytes = 256u << 10;
  std::vector<uint8_t> host(kBytes, 1);
  {
    DeviceBuffer buf_a = MustAllocate(**a, kBytes);
    DeviceBuffer buf_b = MustAllocate(**b, kBytes);
    EnqueueWorkOfAtLeast(device(), **a, std::chrono::milliseconds(10));
    EnqueueWorkOfAtLeast(device(), **b, std::chrono::milliseconds(5));
    ASSERT_TRUE((*a)->CopyHostToDevice(buf_a.ptr(), host.data(), kBytes).ok());
    ASSERT_TRUE((*b)->CopyDeviceToHost(host.data(), buf_b.ptr(), kBytes).ok());
    ASSERT_TRUE(Sync(**a).ok());
    ASSERT_TRUE(Sync(**b).ok());
  }
  ASSERT_TRUE(Sync(**a).ok());  // the frees
  ASSERT_TRUE(Sync(**b).ok());
  Usage sum = (*a)->usage();
  sum += (*b)->usage();
  EXPECT_GE((*a)->usage().busy_ns, 10'000'000u) << Describe((*a)->usage());
  EXPECT_GE((*b)->usage().busy_ns, 5'000'000u) << Describe((*b)->usage());
  EXPECT_EQ(sum.h2d_bytes, kBytes);
  EXPECT_EQ(sum.d2h_bytes, kBytes);
  EXPECT_EQ(Minus(device().usage(), device_before), sum)
      << "device " << Describe(Minus(device().usage(), device_before)) << " vs streams "
      << Describe(sum);
  // A destroyed stream's usage stays in the device's total.
  a->reset();
  b->reset();
  EXPECT_EQ(Minus(device().usage(), device_before), sum);
}

TEST_P(BackendConformanceTest, RegisterHostMemory) {
  std::vector<float> host(4096, 5.0f);
  ASSERT_TRUE(device().RegisterHostMemory(host.data(), host.size() * 4).ok());
  DeviceBuffer buf = AllocateElements<float>(stream(), host.size());
  ASSERT_TRUE(stream().CopyHostToDevice(buf.ptr(), host.data(), host.size() * 4).ok());
  ASSERT_TRUE(stream().Scale(DType::kF32, buf.ptr(), 2.0, buf.ptr(), host.size()).ok());
  ASSERT_TRUE(stream().CopyDeviceToHost(host.data(), buf.ptr(), host.size() * 4).ok());
  ASSERT_TRUE(Sync(stream()).ok());
  for (float v : host) ASSERT_EQ(v, 10.0f);
  EXPECT_TRUE(device().UnregisterHostMemory(host.data()).ok());
  EXPECT_FALSE(device().UnregisterHostMemory(host.data()).ok()) << "not registered any more";
  EXPECT_FALSE(device().RegisterHostMemory(nullptr, 64).ok());
  EXPECT_FALSE(device().RegisterHostMemory(host.data(), 0).ok());
}

// Memory is shared by every session (one pool on CUDA, one heap on the
// host), so a tensor must not show what the previous owner of its bytes wrote. Stream A plays
// one session: it fills tensors with a pattern and frees them. Stream B plays the next
// session: it allocates the same sizes and reads them back without writing a byte.
TEST_P(BackendConformanceTest, NewAllocationsNeverShowAnotherStreamsBytes) {
  const std::vector<uint64_t> sizes = {4ull << 10, 1ull << 20, 64ull << 20};
  Result<std::unique_ptr<Stream>> other = device().CreateStream();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  Stream& b = **other;
  // A few rounds: an allocator may hand freed memory back only on a later request.
  for (int round = 0; round < 3; ++round) {
    {
      std::vector<DeviceBuffer> written;
      for (uint64_t bytes : sizes) {
        written.push_back(MustAllocate(stream(), bytes));
        ASSERT_NE(written.back().ptr(), 0u);
        std::vector<uint8_t> pattern(bytes, static_cast<uint8_t>(0xA5 + round));
        Upload(stream(), written.back(), pattern);
      }
    }                                  // freed, stream-ordered on A
    ASSERT_TRUE(Sync(stream()).ok());  // A's frees are done: the memory is back in the pool

    std::vector<DeviceBuffer> fresh;
    for (uint64_t bytes : sizes) {
      fresh.push_back(MustAllocate(b, bytes));
      ASSERT_NE(fresh.back().ptr(), 0u);
      std::vector<uint8_t> seen = Download<uint8_t>(b, fresh.back().ptr(), bytes);
      const uint64_t nonzero = static_cast<uint64_t>(
          std::count_if(seen.begin(), seen.end(), [](uint8_t v) { return v != 0; }));
      EXPECT_EQ(nonzero, 0u) << "round " << round << ": " << nonzero << " of " << bytes
                             << " bytes of a new allocation were not zero";
    }
    fresh.clear();
    ASSERT_TRUE(Sync(b).ok());
  }
}

/// A module the host backend never produced, to call Launch with.
class FakeModule final : public Module {
 public:
  Result<std::vector<size_t>> ParameterSizes(std::string_view) const override {
    return std::vector<size_t>{};
  }
  uint64_t device_bytes() const override { return 0; }
};

TEST_P(BackendConformanceTest, RawKernelsAreUnsupportedOnHost) {
  if (GetParam() != "host") {
    GTEST_SKIP() << "modules and launches on CUDA are covered by the CUDA backend's module "
                    "tests, not by this host-only check";
  }
  Result<std::shared_ptr<Module>> module =
      device().LoadModule(ModuleFormat::kCudaSource, "__global__ void f() {}");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().kind(), ErrorKind::kUnsupported);
  FakeModule fake;
  Status status = stream().Launch(fake, "f", LaunchConfig{}, {});
  EXPECT_EQ(status.kind(), ErrorKind::kUnsupported) << status.ToString();
  EXPECT_TRUE(Sync(stream()).ok()) << "an enqueue-time error is not sticky";
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformanceTest, ::testing::Values("host", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ferry::backend
