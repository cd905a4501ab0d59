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
#include <thread>
#include <vector>

#include "backend/backend.h"
#if FERRY_HAVE_CUDA
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "backend/cuda/nvrtc_compile.h"
#include "backend/cuda/nvrtc_helper/nvrtc_reply.h"
#endif

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

/// The device's options for these tests: the NVRTC helper of this build when it is there
/// (the build tree), else the default lookup (next to this binary, as in the GPU bundle).
CudaDeviceOptions TestCudaOptions() {
  CudaDeviceOptions options;
#ifdef FERRY_NVRTC_HELPER_PATH
  if (::access(FERRY_NVRTC_HELPER_PATH, X_OK) == 0) options.nvrtc_helper = FERRY_NVRTC_HELPER_PATH;
#endif
  return options;
}

class CudaModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_SKIP_WITHOUT_CUDA();
    auto device = CreateCudaDevice(0, TestCudaOptions());
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

// A module's device memory is bounded from its image before the driver loads it
// (module_footprint.h): a PTX's .global variables and a CUDA C++ module's __device__ arrays
// (counted in the CUBIN NVRTC made) are in the bound, and the bound holds what the device's
// free memory lost to the load.
TEST_F(CudaModuleTest, ModuleDeviceBytesBoundWhatTheLoadTakes) {
  constexpr uint64_t kGlobal = 256ull << 20;
  const std::string ptx =
      ".version 7.0\n.target sm_70\n.address_size 64\n"
      ".visible .global .align 8 .b8 big[" +
      std::to_string(kGlobal) + R"(];
.visible .entry touch()
{
    .reg .b64 %rd<2>;
    .reg .b16 %rs<2>;
    mov.u64 %rd1, big;
    mov.u16 %rs1, 1;
    st.global.u8 [%rd1+)" +
      std::to_string(kGlobal - 1) +
      R"(], %rs1;
    ret;
}
)";
  const uint64_t free_before = device_->free_memory();
  auto module = device_->LoadModule(ModuleFormat::kPtx, ptx);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  const uint64_t free_after = device_->free_memory();
  const uint64_t bound = (*module)->device_bytes();
  EXPECT_GE(bound, kGlobal + ptx.size());
  const uint64_t taken = free_before > free_after ? free_before - free_after : 0;
  std::printf("a PTX module with %llu bytes of .global: bound %llu, free memory down %llu\n",
              static_cast<unsigned long long>(kGlobal), static_cast<unsigned long long>(bound),
              static_cast<unsigned long long>(taken));
  // The driver takes memory in pages of up to 2 MiB: what it took may round the bound up.
  EXPECT_LE(taken, bound + (2u << 20)) << "the bound is below what the load took";
  ASSERT_TRUE(stream_->Launch(**module, "touch", Config1D(1, 1), {}).ok());
  EXPECT_TRUE(Sync(*stream_).ok());

  auto compiled = device_->LoadModule(ModuleFormat::kCudaSource, R"(
__device__ char table[1 << 20];
extern "C" __global__ void set(int i) { table[i] = 1; }
)");
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  EXPECT_GE((*compiled)->device_bytes(), 1u << 20) << "the CUBIN's .nv.global is counted";
}

TEST_F(CudaModuleTest, AModuleWhoseMemoryCannotBeBoundedIsRefusedBeforeLoading) {
  auto module = device_->LoadModule(
      ModuleFormat::kPtx, ".version 7.0\n.target sm_70\n#define N 8\n.global .b8 x[N];\n");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().kind(), ErrorKind::kInvalidArgument) << module.status().ToString();
  auto overflow = device_->LoadModule(
      ModuleFormat::kPtx, ".version 7.0\n.target sm_70\n.global .b64 o[4294967296][4294967296];\n");
  ASSERT_FALSE(overflow.ok());
  EXPECT_EQ(overflow.status().kind(), ErrorKind::kInvalidArgument) << overflow.status().ToString();
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
  auto device = CreateCudaDevice(0, TestCudaOptions());
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

// --- CUDA C++ compiles -----------------------------------------------------------------------
//
// The compile path needs NVRTC, not a GPU: these run wherever the CUDA backend is built and
// NVRTC loads (skipped, with the reason, elsewhere); the device-level ones need a GPU.

#if FERRY_HAVE_CUDA

NvrtcLimits TestLimits() {
  NvrtcLimits limits;
  limits.helper = TestCudaOptions().nvrtc_helper;
  return limits;
}

/// A file only this test knows the contents of (removed at the end of the test).
class SecretFile {
 public:
  SecretFile() {
    std::random_device rd;
    secret_ = "FERRY-SECRET-" + std::to_string(rd()) + std::to_string(rd());
    char tmpl[] = "/tmp/ferry-secret-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    path_ = tmpl;
    const std::string text = "int " + secret_ + " = 1;\n" + secret_ + " this is not C++;\n";
    if (fd >= 0) {
      (void)!::write(fd, text.data(), text.size());
      ::close(fd);
    }
  }
  ~SecretFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  const std::string& secret() const { return secret_; }

 private:
  std::string path_, secret_;
};

#define FERRY_SKIP_WITHOUT_NVRTC()                                                             \
  do {                                                                                         \
    auto probe = CompileCudaSource("extern \"C\" __global__ void f() {}", 9, 0, TestLimits()); \
    if (probe.status().kind() == ErrorKind::kUnsupported) {                                    \
      GTEST_SKIP() << "CUDA C++ compiles are unavailable here: " << probe.status().ToString(); \
    }                                                                                          \
  } while (0)

TEST(NvrtcCompileTest, KernelsCompileInTheHelper) {
  FERRY_SKIP_WITHOUT_NVRTC();
  auto compiled = CompileCudaSource(kAxpbSource, 9, 0, TestLimits());
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  EXPECT_FALSE(compiled->ptx) << "NVRTC knows sm_90: a CUBIN";
  ASSERT_GE(compiled->image.size(), 4u);
  EXPECT_EQ(compiled->image.substr(0, 4), std::string("\x7f"
                                                      "ELF"));
  // An include of a built-in header's name passes the check and reaches NVRTC, which serves
  // it only if it has it built in (NVRTC 13.0 does not, without an include path): either way
  // the helper reads no file.
  auto half =
      CompileCudaSource("#include <cuda_fp16.h>\n__global__ void h() {}\n", 9, 0, TestLimits());
  if (!half.ok()) {
    EXPECT_EQ(half.status().kind(), ErrorKind::kCompileError);
    EXPECT_EQ(half.status().message().find("ferryd compiles without access"), std::string::npos)
        << "refused by the check: " << half.status().message();
  }
  // An architecture NVRTC has no CUBIN for: PTX of the newest one below it.
  auto ptx = CompileCudaSource(kAxpbSource, 9, 9, TestLimits());
  ASSERT_TRUE(ptx.ok()) << ptx.status().ToString();
  EXPECT_TRUE(ptx->ptx);
  // A compile error carries NVRTC's log.
  auto broken =
      CompileCudaSource("__global__ void b() { undeclared_identifier_xyz; }", 9, 0, TestLimits());
  EXPECT_EQ(broken.status().kind(), ErrorKind::kCompileError);
  EXPECT_NE(broken.status().message().find("undeclared_identifier_xyz"), std::string::npos)
      << broken.status().message();
}

TEST(NvrtcCompileTest, IncludesOfFilesAreRefusedAndNeverQuoted) {
  FERRY_SKIP_WITHOUT_NVRTC();
  SecretFile secret;
  const std::vector<std::string> sources = {
      "#include \"" + secret.path() + "\"\n",
      "#include </etc/passwd>\n",
      "#include \"/etc/passwd\"\n",
      "  #  include \"" + secret.path() + "\"\n",
      "%:include \"" + secret.path() + "\"\n",
      "#define F \"" + secret.path() + "\"\n#include F\n",
      "#if __has_include(\"" + secret.path() + "\")\nint x;\n#endif\n",
  };
  for (const std::string& source : sources) {
    auto compiled = CompileCudaSource(source, 9, 0, TestLimits());
    ASSERT_FALSE(compiled.ok()) << source;
    EXPECT_EQ(compiled.status().kind(), ErrorKind::kCompileError) << compiled.status().ToString();
    const std::string& message = compiled.status().message();
    EXPECT_EQ(message.find(secret.secret()), std::string::npos) << message;
    EXPECT_EQ(message.find("root:"), std::string::npos) << message;
    EXPECT_EQ(message.find(secret.path()), std::string::npos) << message;
  }
}

/// The helper started directly (no check in front of it), fed `source`; its pid and the
/// socket to read its reply from (-1 on failure).
struct Helper {
  pid_t pid = -1;
  int sock = -1;
};
Helper StartHelper(const std::string& source) {
  std::string path = TestLimits().helper;
  if (path.empty()) {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return {};
    path = std::string(self, static_cast<size_t>(n));
    path = path.substr(0, path.rfind('/') + 1) + "ferry-nvrtc";
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
  std::vector<std::string> args = {path, "9", "0", std::to_string(4ull << 30), "30"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Helper h;
  if (::posix_spawn(&h.pid, path.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
    h.pid = -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  ::close(sv[1]);
  h.sock = sv[0];
  if (h.pid > 0) {
    (void)::send(h.sock, source.data(), source.size(), MSG_NOSIGNAL);
    ::shutdown(h.sock, SHUT_WR);
  }
  return h;
}

// The second fence: the helper itself, given a source the check would refuse, cannot open
// the file (its seccomp filter fails every open), so its log quotes nothing of it.
TEST(NvrtcCompileTest, TheHelperCannotOpenFilesEvenUnchecked) {
  FERRY_SKIP_WITHOUT_NVRTC();
  SecretFile secret;
  const std::string source = "#include \"" + secret.path() + "\"\n#include \"/etc/passwd\"\n";
  Helper helper = StartHelper(source);
  ASSERT_GT(helper.pid, 0);
  const pid_t pid = helper.pid;
  std::string out;
  char buf[65536];
  for (ssize_t r; (r = ::recv(helper.sock, buf, sizeof(buf), 0)) > 0;) {
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(helper.sock);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  nvrtc_reply::Header h;
  ASSERT_GE(out.size(), sizeof(h));
  std::memcpy(&h, out.data(), sizeof(h));
  EXPECT_EQ(h.code, nvrtc_reply::kCompileError) << out.substr(sizeof(h));
  EXPECT_EQ(out.find(secret.secret()), std::string::npos) << out.substr(sizeof(h));
  EXPECT_EQ(out.find("root:"), std::string::npos) << out.substr(sizeof(h));
}

// Nothing ferryd left open without O_CLOEXEC reaches the compile: here a file the test
// opened that way is not among the helper's fds once its filter is on.
TEST(NvrtcCompileTest, TheHelperKeepsNoInheritedFd) {
  FERRY_SKIP_WITHOUT_NVRTC();
  SecretFile secret;
  const int leaked = ::open(secret.path().c_str(), O_RDONLY);  // no O_CLOEXEC, on purpose
  ASSERT_GE(leaked, 0);
  // Something that compiles for a while, so the helper can be looked at.
  Helper helper = StartHelper(R"(
template <int N, int M> struct Slow {
  static const int value = Slow<N - 1, 2 * M>::value + Slow<N - 1, 2 * M + 1>::value;
};
template <int M> struct Slow<0, M> { static const int value = 1; };
extern "C" __global__ void slow(int* out) { out[0] = Slow<22, 0>::value; }
)");
  ::close(leaked);
  ASSERT_GT(helper.pid, 0);
  const std::string proc = "/proc/" + std::to_string(helper.pid);
  bool filtered = false;
  for (int i = 0; i < 500 && !filtered; ++i) {  // up to 5 s for it to start
    std::ifstream status(proc + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Seccomp:", 0) == 0 && line.find('2') != std::string::npos) filtered = true;
    }
    if (!filtered) ::usleep(10000);
  }
  std::vector<std::string> open_files;
  if (filtered) {
    for (int fd = 0; fd < 1024; ++fd) {
      char target[4096];
      const std::string link = proc + "/fd/" + std::to_string(fd);
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      if (n > 0) open_files.emplace_back(target, static_cast<size_t>(n));
    }
  }
  ::kill(helper.pid, SIGKILL);
  int status = 0;
  ::waitpid(helper.pid, &status, 0);
  ::close(helper.sock);
  ASSERT_TRUE(filtered) << "the helper never installed its seccomp filter";
  for (const std::string& f : open_files) {
    EXPECT_EQ(f.find(secret.path()), std::string::npos) << "the helper kept an inherited fd";
  }
}

// Exponentially many template instantiations: a compile that runs until its bound.
constexpr char kBomb[] = R"(
template <int N, int M> struct Bomb {
  static const int value = Bomb<N - 1, 2 * M>::value + Bomb<N - 1, 2 * M + 1>::value;
};
template <int M> struct Bomb<0, M> { static const int value = 1; };
extern "C" __global__ void boom(int* out) { out[0] = Bomb<29, 0>::value; }
)";

// The compile is stopped at its bound with a typed error, and the next compile works.
TEST(NvrtcCompileTest, ACompileBombStopsAtItsBound) {
  FERRY_SKIP_WITHOUT_NVRTC();
  NvrtcLimits limits = TestLimits();
  limits.timeout = std::chrono::milliseconds(3000);
  limits.memory_bytes = 1ull << 30;
  auto compiled = CompileCudaSource(kBomb, 9, 0, limits);
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.status().kind(), ErrorKind::kQuotaExceeded) << compiled.status().ToString();
  EXPECT_NE(compiled.status().message().find("compile time/memory limit"), std::string::npos)
      << compiled.status().message();
  // The same bomb with room to grow but little time: killed at the wall-clock bound.
  limits.timeout = std::chrono::milliseconds(300);
  limits.memory_bytes = 4ull << 30;
  compiled = CompileCudaSource(kBomb, 9, 0, limits);
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.status().kind(), ErrorKind::kQuotaExceeded) << compiled.status().ToString();
  auto after = CompileCudaSource(kAxpbSource, 9, 0, TestLimits());
  EXPECT_TRUE(after.ok()) << after.status().ToString();
}

// Compiles at once are bounded (nvrtc-concurrency): while one runs at a bound of 1, another is
// refused with BUSY at once, starting nothing; once it ended, the next one compiles.
TEST(NvrtcCompileTest, CompilesPastTheConcurrencyBoundAreBusy) {
  FERRY_SKIP_WITHOUT_NVRTC();
  NvrtcLimits limits = TestLimits();
  limits.max_concurrent = 1;
  NvrtcLimits bomb_limits = limits;
  bomb_limits.timeout = std::chrono::milliseconds(3000);
  bomb_limits.memory_bytes = 4ull << 30;
  Result<CompiledSource> bomb = Status(ErrorKind::kInternal, "not run");
  std::thread running([&] { bomb = CompileCudaSource(kBomb, 9, 0, bomb_limits); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (CompilesRunningForTest() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(CompilesRunningForTest(), 1) << "the first compile never started";
  auto refused = CompileCudaSource(kAxpbSource, 9, 0, limits);
  running.join();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().kind(), ErrorKind::kBusy) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("nvrtc-concurrency"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(bomb.status().kind(), ErrorKind::kQuotaExceeded) << bomb.status().ToString();
  EXPECT_EQ(CompilesRunningForTest(), 0);
  auto after = CompileCudaSource(kAxpbSource, 9, 0, limits);
  EXPECT_TRUE(after.ok()) << after.status().ToString();
}

#endif  // FERRY_HAVE_CUDA

// Through the device: an include of /etc/passwd is refused without quoting it, a compile bomb
// is stopped, and the device still loads and runs a kernel afterwards.
TEST_F(CudaModuleTest, FileIncludesAndCompileBombsLeaveTheDeviceServing) {
  auto passwd = device_->LoadModule(ModuleFormat::kCudaSource, "#include \"/etc/passwd\"\n");
  ASSERT_FALSE(passwd.ok());
  EXPECT_EQ(passwd.status().kind(), ErrorKind::kCompileError);
  EXPECT_EQ(passwd.status().message().find("root:"), std::string::npos)
      << passwd.status().message();
  CudaDeviceOptions options = TestCudaOptions();
  options.nvrtc_timeout = std::chrono::milliseconds(3000);
  options.nvrtc_memory = 1ull << 30;
  auto bounded = CreateCudaDevice(0, options);
  ASSERT_TRUE(bounded.ok()) << bounded.status().ToString();
  auto bomb = (*bounded)->LoadModule(ModuleFormat::kCudaSource, R"(
template <int N, int M> struct Bomb {
  static const int value = Bomb<N - 1, 2 * M>::value + Bomb<N - 1, 2 * M + 1>::value;
};
template <int M> struct Bomb<0, M> { static const int value = 1; };
extern "C" __global__ void boom(int* out) { out[0] = Bomb<29, 0>::value; }
)");
  ASSERT_FALSE(bomb.ok());
  EXPECT_EQ(bomb.status().kind(), ErrorKind::kQuotaExceeded) << bomb.status().ToString();
  bounded->reset();
  auto module = device_->LoadModule(ModuleFormat::kCudaSource, kAxpbSource);
  ASSERT_TRUE(module.ok()) << module.status().ToString();
  auto d_out = stream_->Allocate(4 * sizeof(float));
  auto d_in = stream_->Allocate(4 * sizeof(float));
  ASSERT_TRUE(d_out.ok() && d_in.ok());
  ASSERT_TRUE(stream_
                  ->Launch(**module, "axpb", Config1D(1, 32),
                           {Pointer(*d_out), Pointer(*d_in), Scalar(0.0f), Scalar(5.0f), Scalar(4)})
                  .ok());
  std::vector<float> out(4);
  ASSERT_TRUE(stream_->CopyDeviceToHost(out.data(), *d_out, out.size() * sizeof(float)).ok());
  ASSERT_TRUE(Sync(*stream_).ok());
  for (float v : out) EXPECT_EQ(v, 5.0f);
  stream_->Free(*d_out);
  stream_->Free(*d_in);
}

}  // namespace
}  // namespace ferry::backend
