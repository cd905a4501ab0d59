// Raw kernels on the CUDA backend: modules from CUDA C++ (NVRTC), PTX, argument checks, the
// module cache and device faults, through the Device and Stream interfaces only.
//
// Every test skips, with the reason printed, where no CUDA device is visible (or the build
// has no CUDA backend: CudaDeviceCount() is then 0 too). The fault test breaks the CUDA
// context for good, so it runs in a child process (a gtest death test, re-executed rather
// than forked) and the rest of this binary keeps a healthy device.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ferry::backend {
namespace {

constexpr auto kSyncTimeout = std::chrono::seconds(60);

#define FERRY_SKIP_WITHOUT_CUDA()                                         \
  do {                                                                    \
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

/// Wait for everything enqueued on `stream` so far; return the completion's status.
Status Sync(Stream& stream) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> future = promise->get_future();
  stream.OnComplete([promise](Status status) { promise->set_value(std::move(status)); });
  if (future.wait_for(kSyncTimeout) != std::future_status::ready) {
    std::fprintf(stderr, "OnComplete was not called within the timeout\n");
    std::abort();  // the callback still references the stream; nothing safe is left
  }
  return future.get();
}

template <typename T>
KernelArg Scalar(T value) {
  KernelArg arg;
  arg.kind = KernelArg::Kind::kScalar;
  arg.scalar.resize(sizeof(T));
  std::memcpy(arg.scalar.data(), &value, sizeof(T));
  return arg;
}

KernelArg Pointer(DevicePtr ptr) {
  KernelArg arg;
  arg.kind = KernelArg::Kind::kPointer;
  arg.pointer = ptr;
  return arg;
}

LaunchConfig Config1D(uint32_t grid, uint32_t block) {
  LaunchConfig config;
  config.grid = {grid, 1, 1};
  config.block = {block, 1, 1};
  return config;
}

constexpr char kAxpbSource[] = R"(
extern "C" __global__ void axpb(float* out, const float* in, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b;
}
)";

// Hand-written PTX: out[i] = i for i < n.
constexpr char kIotaPtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry iota(
    .param .u64 iota_param_0,
    .param .u32 iota_param_1
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [iota_param_0];
    ld.param.u32 %r2, [iota_param_1];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r1;
DONE:
    ret;
}
)";

class CudaModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_SKIP_WITHOUT_CUDA();
    auto device = CreateCudaDevice(0);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(device).value();
    auto stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    stream_ = std::move(stream).value();
  }

  void TearDown() override {
    stream_.reset();
    device_.reset();
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(CudaModuleTest, DeviceInfoDescribesTheGpu) {
  const DeviceInfo& info = device_->info();
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_FALSE(info.name.empty());
  EXPECT_EQ(info.uuid.rfind("GPU-", 0), 0u) << info.uuid;
  EXPECT_EQ(info.uuid.size(), 40u) << info.uuid;
  EXPECT_GT(info.total_memory, 0u);
  EXPECT_GE(info.compute_major, 5);
  EXPECT_GT(device_->free_memory(), 0u);
}

TEST_F(CudaModuleTest, CudaSourceKernelWithPointerAndScalarArguments) {
  auto module = device_->LoadModule(ModuleFormat::kCudaSource, kAxpbSource);
  ASSERT_TRUE(module.ok()) << module.status().ToString();

  auto sizes = (*module)->ParameterSizes("axpb");
  ASSERT_TRUE(sizes.ok()) << sizes.status().ToString();
  EXPECT_EQ(*sizes, (std::vector<size_t>{8, 8, 4, 4, 4}));

  constexpr int kN = 1000;
  std::vector<float> in(kN), out(kN, -1.0f);
  for (int i = 0; i < kN; ++i) in[i] = static_cast<float>(i) * 0.5f;
  auto d_in = stream_->Allocate(kN * sizeof(float));
  auto d_out = stream_->Allocate(kN * sizeof(float));
  ASSERT_TRUE(d_in.ok() && d_out.ok());
  ASSERT_TRUE(stream_->CopyHostToDevice(*d_in, in.data(), kN * sizeof(float)).ok());
  const Status launched =
      stream_->Launch(**module, "axpb", Config1D((kN + 127) / 128, 128),
                      {Pointer(*d_out), Pointer(*d_in), Scalar(2.0f), Scalar(1.0f), Scalar(kN)});
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  ASSERT_TRUE(stream_->CopyDeviceToHost(out.data(), *d_out, kN * sizeof(float)).ok());
  const Status done = Sync(*stream_);
  ASSERT_TRUE(done.ok()) << done.ToString();
  for (int i = 0; i < kN; ++i) ASSERT_EQ(out[i], 2.0f * in[i] + 1.0f) << "at " << i;
  stream_->Free(*d_in);
  stream_->Free(*d_out);
  EXPECT_TRUE(Sync(*stream_).ok());
}

TEST_F(CudaModuleTest, CompileErrorCarriesTheNvrtcLog) {
  auto module = device_->LoadModule(ModuleFormat::kCudaSource, R"(
extern "C" __global__ void broken(float* out) { out[0] = undeclared_identifier_xyz; }
)");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().kind(), ErrorKind::kCompileError) << module.status().ToString();
  EXPECT_NE(module.status().message().find("undeclared_identifier_xyz"), std::string::npos)
      << module.status().message();
}

TEST_F(CudaModuleTest, InvalidPtxIsACompileError) {
  auto module = device_->LoadModule(ModuleFormat::kPtx, ".version 7.0\n.target sm_70\nnonsense;\n");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().kind(), ErrorKind::kCompileError) << module.status().ToString();
}

TEST_F(CudaModuleTest, PtxKernelRuns) {
  auto module = device_->LoadModule(ModuleFormat::kPtx, kIotaPtx);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  auto sizes = (*module)->ParameterSizes("iota");
  ASSERT_TRUE(sizes.ok()) << sizes.status().ToString();
  EXPECT_EQ(*sizes, (std::vector<size_t>{8, 4}));

  constexpr uint32_t kN = 5000;
  auto d_out = stream_->Allocate(kN * sizeof(uint32_t));
  ASSERT_TRUE(d_out.ok());
  const Status launched = stream_->Launch(**module, "iota", Config1D((kN + 255) / 256, 256),
                                          {Pointer(*d_out), Scalar(kN)});
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  std::vector<uint32_t> out(kN);
  ASSERT_TRUE(stream_->CopyDeviceToHost(out.data(), *d_out, kN * sizeof(uint32_t)).ok());
  ASSERT_TRUE(Sync(*stream_).ok());
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(out[i], i);
  stream_->Free(*d_out);
}

TEST_F(CudaModuleTest, UnknownFunctionIsInvalidArgument) {
  auto module = device_->LoadModule(ModuleFormat::kPtx, kIotaPtx);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  auto sizes = (*module)->ParameterSizes("no_such_kernel");
  ASSERT_FALSE(sizes.ok());
  EXPECT_EQ(sizes.status().kind(), ErrorKind::kInvalidArgument);
  const Status launched = stream_->Launch(**module, "no_such_kernel", Config1D(1, 1), {});
  EXPECT_EQ(launched.kind(), ErrorKind::kInvalidArgument) << launched.ToString();
}

TEST_F(CudaModuleTest, WrongArgumentsAreInvalidArgument) {
  auto module = device_->LoadModule(ModuleFormat::kPtx, kIotaPtx);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  auto d_out = stream_->Allocate(1024);
  ASSERT_TRUE(d_out.ok());

  // Too few, too many, a scalar of the wrong size, a scalar where a pointer goes.
  Status s = stream_->Launch(**module, "iota", Config1D(1, 32), {Pointer(*d_out)});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << s.ToString();
  s = stream_->Launch(**module, "iota", Config1D(1, 32),
                      {Pointer(*d_out), Scalar(uint32_t{8}), Scalar(uint32_t{8})});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << s.ToString();
  s = stream_->Launch(**module, "iota", Config1D(1, 32), {Pointer(*d_out), Scalar(uint64_t{8})});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << s.ToString();
  s = stream_->Launch(**module, "iota", Config1D(1, 32),
                      {Scalar(uint32_t{1}), Scalar(uint32_t{8})});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << s.ToString();

  // Launch configurations the device cannot run.
  s = stream_->Launch(**module, "iota", Config1D(0, 32), {Pointer(*d_out), Scalar(uint32_t{8})});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << s.ToString();
  s = stream_->Launch(**module, "iota", Config1D(1, 4096), {Pointer(*d_out), Scalar(uint32_t{8})});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << s.ToString();

  // None of that broke the stream.
  s = stream_->Launch(**module, "iota", Config1D(1, 32), {Pointer(*d_out), Scalar(uint32_t{8})});
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Sync(*stream_).ok());
  stream_->Free(*d_out);
}

TEST_F(CudaModuleTest, SameImageReturnsTheCachedModule) {
  auto first = device_->LoadModule(ModuleFormat::kCudaSource, kAxpbSource);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  auto second = device_->LoadModule(ModuleFormat::kCudaSource, kAxpbSource);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(first->get(), second->get());
  // A cache hit does not run NVRTC again (which takes tens of milliseconds at least).
  EXPECT_LT(elapsed, std::chrono::milliseconds(5));

  // The same bytes as another format are another module.
  auto ptx = device_->LoadModule(ModuleFormat::kPtx, kIotaPtx);
  ASSERT_TRUE(ptx.ok());
  EXPECT_NE(ptx->get(), first->get());
}

TEST_F(CudaModuleTest, KernelInGraphReplays) {
  auto module = device_->LoadModule(ModuleFormat::kPtx, kIotaPtx);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  constexpr uint32_t kN = 256;
  auto d_out = stream_->Allocate(kN * sizeof(uint32_t));
  ASSERT_TRUE(d_out.ok());
  ASSERT_TRUE(stream_->BeginCapture().ok());
  ASSERT_TRUE(stream_->Fill(DType::kI32, *d_out, kN, 7.0).ok());
  ASSERT_TRUE(
      stream_->Launch(**module, "iota", Config1D(1, kN / 2), {Pointer(*d_out), Scalar(kN)}).ok());
  auto graph = stream_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  EXPECT_EQ((*graph)->node_count(), 2u);
  ASSERT_TRUE(stream_->LaunchGraph(**graph).ok());
  std::vector<uint32_t> out(kN);
  ASSERT_TRUE(stream_->CopyDeviceToHost(out.data(), *d_out, kN * sizeof(uint32_t)).ok());
  ASSERT_TRUE(Sync(*stream_).ok());
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(out[i], i < kN / 2 ? i : 7u) << "at " << i;
  stream_->Free(*d_out);
}

// Runs in a child process (see the file comment): fault the context with a kernel that
// writes to an invalid address, check that every stream reports DEVICE_FAULT naming the
// CUDA error and that no completion hangs, then exit 0.
void FaultTheDeviceAndExit() {
  auto device = CreateCudaDevice(0);
  if (!device.ok()) {
    std::fprintf(stderr, "CreateCudaDevice: %s\n", device.status().ToString().c_str());
    std::exit(2);
  }
  auto faulting = (*device)->CreateStream();
  auto bystander = (*device)->CreateStream();
  if (!faulting.ok() || !bystander.ok()) std::exit(3);
  auto module = (*device)->LoadModule(ModuleFormat::kCudaSource, R"(
extern "C" __global__ void poke(unsigned long long address) {
  *reinterpret_cast<volatile int*>(address) = 1;
}
)");
  if (!module.ok()) {
    std::fprintf(stderr, "LoadModule: %s\n", module.status().ToString().c_str());
    std::exit(4);
  }
  const Status launched =
      (*faulting)->Launch(**module, "poke", Config1D(1, 1), {Scalar(uint64_t{0x10})});
  if (!launched.ok()) {
    std::fprintf(stderr, "Launch: %s\n", launched.ToString().c_str());
    std::exit(5);
  }
  const Status first = Sync(**faulting);
  if (first.kind() != ErrorKind::kDeviceFault ||
      first.message().find("cudaError") == std::string::npos) {
    std::fprintf(stderr, "faulting stream completed with %s\n", first.ToString().c_str());
    std::exit(6);
  }
  // Later completions, on this stream and on another, report the fault too.
  const Status again = Sync(**faulting);
  const Status other = Sync(**bystander);
  if (again.kind() != ErrorKind::kDeviceFault || other.kind() != ErrorKind::kDeviceFault) {
    std::fprintf(stderr, "later completions: %s / %s\n", again.ToString().c_str(),
                 other.ToString().c_str());
    std::exit(7);
  }
  faulting->reset();
  bystander->reset();
  module->reset();
  device->reset();
  std::fprintf(stderr, "device fault reported: %s\n", first.ToString().c_str());
  std::exit(0);
}

TEST(CudaModuleDeathTest, InvalidAddressIsADeviceFault) {
  FERRY_SKIP_WITHOUT_CUDA();
  // Re-execute the binary for the child: forking a process that uses CUDA is not safe.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(FaultTheDeviceAndExit(), ::testing::ExitedWithCode(0), "device fault reported");
}

}  // namespace
}  // namespace ferry::backend
