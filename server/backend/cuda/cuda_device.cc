// The CUDA backend: one CudaDevice per GPU ordinal, on the device's primary context.
//
// Private to server/backend/cuda; the rest of ferryd sees it only as backend::Device,
// through CreateCudaDevice. Semantics are those of backend.h, on these CUDA mechanisms:
//  * Stream: one non-blocking cudaStream_t, one cuBLAS handle bound to it (own workspace,
//    so GEMMs can be captured into graphs), and a small device scratch buffer for the
//    two-pass ReduceSum. Every entry point first makes the device current on the calling
//    thread (cudaSetDevice), so any executor thread may drive a stream.
//  * Memory: stream-ordered (cudaMallocFromPoolAsync / cudaFreeAsync) from the device's
//    default pool, whose release threshold is raised so freed memory stays cached. The pool
//    is shared by every session, so a new allocation may hold another session's freed
//    bytes: Allocate enqueues a cudaMemsetAsync to 0 on the same stream before it returns,
//    and every later use of the memory is ordered behind it. Every
//    device range an op touches is checked against the live allocations (OUT_OF_RANGE
//    otherwise, as on the host backend), so a client's bad offset is a typed error, not a
//    device fault that would take down every session.
//  * Completion: OnComplete records a pooled event; the device's CompletionWatcher polls it
//    and runs the callback (no cudaLaunchHostFunc; see completion_watcher.h).
//  * Errors: see cuda_internal.h. A sticky fault breaks the whole context; from then on
//    every completion of every stream of the device reports DEVICE_FAULT. Rebuilding the
//    context (cudaDeviceReset) is the owner's job, after destroying this device.
//  * Raw kernels: modules are loaded into the primary context with the driver API
//    (cuModuleLoadDataEx, through entry points; libcuda is never linked); CUDA C++ source
//    is checked to name no file and compiled by NVRTC to a CUBIN for the device's
//    architecture in a bounded helper process (nvrtc_compile.h). Modules are cached by
//    content (format + bytes) while some caller still holds them.
//  * Graphs: stream capture in relaxed mode (a session's executor may be a thread pool; in
//    the stricter modes an unrelated cudaMalloc on the capturing thread would invalidate
//    the capture), instantiated into a cudaGraphExec_t. A graph keeps its capturing
//    stream's scratch and cuBLAS workspace alive; replay it on the stream that captured it,
//    or at least never concurrently with that stream's own ReduceSum or Gemm work.
//  * Usage (backend.h): one pair of timing events per span of work between completions:
//    the first work enqueued after a completion (outside a capture) records a start event,
//    and the next OnComplete watches a timing event instead of a plain one, which is the
//    span's end. Copies are sampled: a host<->device copy of kMinTimedCopyBytes or more enqueued
//    outside a capture gets its own pair of events, from the same pool, when its direction and size
//    class (a power of two of bytes) was last timed kCopySampleInterval ago or never, or at its
//    next copy after a class's first sample or one kResampleSlowdown times slower than the last
//    (and at most kMaxTimedCopies per direction and span). Every other copy's bytes are counted and
//    its time is estimated at the rate last measured for its direction and class (or the nearest
//    class measured), never past the span's busy time. Timing every copy cost a streamed 64 KiB
//    transfer about 4 us of its 14 and kept the copy engine from running back-to-back copies as one
//    stream (docs/performance.md). A copy of kMinTimedCopyBytes or more, not sampled, whose class
//    has been measured, opens no span: enqueued while none is open, its estimate is its whole
//    account (busy time included; never more than the wall clock from its enqueue to its completion
//    seen), and a completion after only such copies watches a plain event; so pending transfers
//    streamed back to back record no timing event but a sample's. Elapsed times are read on the
//    watcher thread, before the completion's callback runs. Cost: one extra cudaEventRecord per
//    submit with other work, two per sampled copy, and a cudaEventElapsedTime each.
//
// Lifetime: a CudaDevice must outlive its streams; modules and graphs may outlive it (they
// unload from the primary context, which stays). A callback must not destroy the device.

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/allocation_table.h"
#include "backend/backend.h"
#include "backend/cuda/completion_watcher.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/nvrtc_compile.h"
#include "backend/elementwise_run.h"
#include "backend/enqueue_checks.h"
#include "backend/registered_ranges.h"
#include "ferry/mutex.h"

namespace ferry::backend {
namespace {

using cuda_internal::CublasApi;
using cuda_internal::CublasStatus;
using cuda_internal::CudaStatus;
using cuda_internal::DriverApi;
using cuda_internal::DriverStatus;
using cuda_internal::GetCublasApi;

/// cuBLAS workspace per stream: set explicitly so captured GEMMs never allocate.
constexpr size_t kCublasWorkspaceBytes = 8ull << 20;
/// Dynamic shared memory a kernel gets without opting in.
constexpr uint32_t kDefaultSharedLimit = 48u << 10;
/// Size of the buffer the JIT writes its error log into.
constexpr size_t kJitLogBytes = 64u << 10;

Status InvalidArgument(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}

Status CompileError(std::string message) {
  return Status(ErrorKind::kCompileError, std::move(message));
}

void* Address(DevicePtr ptr) { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)); }

/// A device range an op touches, checked against the live allocations at enqueue (and
/// again at every replay of a graph that recorded it). `written`: the op writes the range,
/// which decides whether an elementwise op may join a fused run (ElementwiseRun).
struct Access {
  DevicePtr ptr = 0;
  uint64_t bytes = 0;
  const char* what = "";
  bool written = false;
};

/// Format a CUDA UUID the way nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
std::string FormatUuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

/// Return the kernel driver's version ("580.95.05") where the system exposes it, with the
/// CUDA version the driver supports, e.g. "580.95.05 (CUDA 13.0)".
std::string DriverVersionString() {
  int cuda_version = 0;
  if (cudaDriverGetVersion(&cuda_version) != cudaSuccess) (void)cudaGetLastError();
  const std::string cuda = "CUDA " + std::to_string(cuda_version / 1000) + "." +
                           std::to_string((cuda_version % 1000) / 10);
  std::string kernel_driver;
  std::ifstream in("/sys/module/nvidia/version");
  if (in && std::getline(in, kernel_driver) && !kernel_driver.empty()) {
    return kernel_driver + " (" + cuda + ")";
  }
  return cuda;
}

// --- modules ---------------------------------------------------------------------------------

/// A module loaded into the device's primary context. Thread-safe.
class CudaModule final : public Module {
 public:
  CudaModule(int ordinal, const DriverApi* api, CUmodule module)
      : ordinal_(ordinal), api_(api), module_(module) {}

  ~CudaModule() override {
    if (cudaSetDevice(ordinal_) == cudaSuccess) (void)api_->ModuleUnload(module_);
    (void)cudaGetLastError();
  }

  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  int ordinal() const { return ordinal_; }
  const DriverApi& api() const { return *api_; }

  /// A function of the module and what the driver says about its parameters.
  struct FunctionInfo {
    CUfunction function = nullptr;
    bool sizes_known = false;         // the driver reported the parameters
    std::vector<size_t> param_sizes;  // in order; empty when unknown or none
  };

  /// Return the named function (cached), INVALID_ARGUMENT when the module has none.
  Result<FunctionInfo> Lookup(std::string_view name) const {
    MutexLock lock(&mu_);
    FERRY_ASSIGN_OR_RETURN(const FunctionInfo* info, InfoLocked(name));
    return *info;
  }

  Result<std::vector<size_t>> ParameterSizes(std::string_view function) const override {
    FERRY_ASSIGN_OR_RETURN(FunctionInfo info, Lookup(function));
    return std::move(info.param_sizes);
  }

 private:
  Result<FunctionInfo*> InfoLocked(std::string_view name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string key(name);
    if (auto it = functions_.find(key); it != functions_.end()) return &it->second;
    FERRY_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    FunctionInfo info;
    const CUresult found = api_->ModuleGetFunction(&info.function, module_, key.c_str());
    if (found == CUDA_ERROR_NOT_FOUND || found == CUDA_ERROR_INVALID_VALUE) {
      return InvalidArgument("the module has no function named '" + key +
                             "' (CUDA C++ kernels need extern \"C\" for unmangled names)");
    }
    FERRY_RETURN_IF_ERROR(DriverStatus(found, "cuModuleGetFunction"));
    if (api_->FuncGetParamInfo != nullptr) {
      // Parameters are numbered from 0; the first index past the last one answers
      // CUDA_ERROR_INVALID_VALUE. Any other error (or a driver that never stops) means the
      // sizes are unknown, which does not fail the lookup.
      constexpr size_t kMaxParams = 4096;
      for (size_t index = 0; index < kMaxParams; ++index) {
        size_t offset = 0, size = 0;
        const CUresult result = api_->FuncGetParamInfo(info.function, index, &offset, &size);
        if (result == CUDA_ERROR_INVALID_VALUE) {
          info.sizes_known = true;
          break;
        }
        if (result != CUDA_SUCCESS) break;
        info.param_sizes.push_back(size);
      }
      if (!info.sizes_known) info.param_sizes.clear();
    }
    auto [it, inserted] = functions_.emplace(key, std::move(info));
    return &it->second;
  }

  const int ordinal_;
  const DriverApi* const api_;
  const CUmodule module_;
  mutable Mutex mu_;
  mutable std::unordered_map<std::string, FunctionInfo> functions_ ABSL_GUARDED_BY(mu_);
};

/// Load every function of `module` now. With lazy loading (CUDA_MODULE_LOADING=LAZY, CUDA's
/// default) a function is otherwise loaded at its first cuModuleGetFunction, and one loaded
/// while other streams' kernels run does not start until they have all ended (on the H100 a
/// 1-thread kernel waited 0.9 s for another stream's running kernel; docs/performance.md,
/// changelog, 2026-12-05): a session's first launch of a raw kernel would wait for every other
/// session's running kernels. Loading the module itself waits for them already, in both
/// modes, on the long lane; the functions loaded here, right after it, load while the device
/// is as idle as it gets, and no later launch loads code. Drivers without cuFuncLoad (before
/// 12.4) load lazily as before.
Status LoadEveryFunction(const DriverApi& api, CUmodule module) {
  if (api.ModuleGetFunctionCount == nullptr || api.ModuleEnumerateFunctions == nullptr ||
      api.FuncLoad == nullptr) {
    return Status::Ok();
  }
  unsigned count = 0;
  FERRY_RETURN_IF_ERROR(
      DriverStatus(api.ModuleGetFunctionCount(&count, module), "counting the module's functions"));
  std::vector<CUfunction> functions(count);
  if (count > 0) {
    FERRY_RETURN_IF_ERROR(
        DriverStatus(api.ModuleEnumerateFunctions(functions.data(), count, module),
                     "listing the module's functions"));
  }
  for (CUfunction f : functions) {
    FERRY_RETURN_IF_ERROR(DriverStatus(api.FuncLoad(f), "loading the module's functions"));
  }
  return Status::Ok();
}

/// Load a PTX or CUBIN/fatbin image into the current context, with the JIT's error log in
/// the COMPILE_ERROR message when it fails, and every function of it loaded
/// (LoadEveryFunction).
Result<CUmodule> LoadImage(const DriverApi& api, const std::string& image) {
  std::string error_log(kJitLogBytes, '\0');
  std::array<CUjit_option, 2> options = {CU_JIT_ERROR_LOG_BUFFER,
                                         CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  std::array<void*, 2> values = {error_log.data(),
                                 reinterpret_cast<void*>(static_cast<uintptr_t>(kJitLogBytes))};
  CUmodule module = nullptr;
  const CUresult result = api.ModuleLoadDataEx(
      &module, image.c_str(), static_cast<unsigned>(options.size()), options.data(), values.data());
  if (result == CUDA_SUCCESS) {
    if (Status loaded = LoadEveryFunction(api, module); !loaded.ok()) {
      (void)api.ModuleUnload(module);
      return loaded;
    }
    return module;
  }
  error_log.resize(std::strlen(error_log.c_str()));
  Status status = DriverStatus(result, "loading the module");
  if (status.kind() == ErrorKind::kDeviceFault) return status;
  return CompileError(status.message() + (error_log.empty() ? "" : ":\n" + error_log));
}

// --- graphs ----------------------------------------------------------------------------------

/// Device buffers a stream's built-in ops use besides their operands. Shared with the
/// graphs captured on the stream, since their nodes point into them.
struct StreamScratch {
  int ordinal = 0;
  double* reduce_partials = nullptr;  // cuda_kernels::kReduceMaxBlocks doubles, from the pool
  void* cublas_workspace = nullptr;   // kCublasWorkspaceBytes
  bool workspace_from_pool = false;   // cudaMallocAsync'd (else cudaMalloc'd)

  // The last holder goes after the stream (drained when it was destroyed) and every graph
  // captured on it: nothing can use the buffers any more. Pool memory goes back with
  // cudaFreeAsync on the legacy default stream, which waits for no session's stream (they
  // are all non-blocking); cudaFree would wait for the whole device, every session's work
  // included. It fails harmlessly on a dead context.
  ~StreamScratch() {
    if (cudaSetDevice(ordinal) == cudaSuccess) {
      if (reduce_partials != nullptr) (void)cudaFreeAsync(reduce_partials, nullptr);
      if (cublas_workspace != nullptr) {
        (void)(workspace_from_pool ? cudaFreeAsync(cublas_workspace, nullptr)
                                   : cudaFree(cublas_workspace));
      }
    }
    (void)cudaGetLastError();
  }
};

class CudaGraph final : public Graph {
 public:
  CudaGraph(const void* device, int ordinal, cudaGraphExec_t exec, size_t node_count,
            std::vector<Access> accesses, std::shared_ptr<StreamScratch> scratch)
      : device_(device),
        ordinal_(ordinal),
        exec_(exec),
        node_count_(node_count),
        accesses_(std::move(accesses)),
        scratch_(std::move(scratch)) {}

  ~CudaGraph() override {
    if (cudaSetDevice(ordinal_) == cudaSuccess) (void)cudaGraphExecDestroy(exec_);
    (void)cudaGetLastError();
  }

  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  size_t node_count() const override { return node_count_; }
  const void* device() const { return device_; }
  cudaGraphExec_t exec() const { return exec_; }
  const std::vector<Access>& accesses() const { return accesses_; }

 private:
  const void* const device_;
  const int ordinal_;
  const cudaGraphExec_t exec_;
  const size_t node_count_;
  const std::vector<Access> accesses_;
  const std::shared_ptr<StreamScratch> scratch_;  // kept alive for the graph's nodes
};

class CudaStream;

// --- streams made ahead ------------------------------------------------------------------------

/// A session's CUDA stream and its reduction scratch (cuda_kernels::kReduceMaxBlocks doubles,
/// allocated on it): what a session's open would otherwise make with
/// cudaStreamCreateWithFlags and cudaMallocAsync, most of a session's creation
/// (docs/performance.md).
struct ReadyStream {
  cudaStream_t stream = nullptr;
  double* reduce_partials = nullptr;
  // A closed session's cuBLAS handle and workspace, when it ran a GEMM (DestroyReadyStream):
  // cublasDestroy waits for the whole device, and so does cudaFree of a workspace made with
  // cudaMalloc (one made inside a graph capture), so neither is left for a closing thread.
  cublasHandle_t cublas = nullptr;
  const CublasApi* cublas_api = nullptr;
  void* cublas_workspace = nullptr;
  bool workspace_from_pool = false;
};

/// Make a non-blocking stream and its scratch on the current device.
Result<ReadyStream> MakeReadyStream() {
  ReadyStream ready;
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&ready.stream, cudaStreamNonBlocking),
                                   "cudaStreamCreateWithFlags"));
  // Stream-ordered, from the device's pool: cudaMalloc may wait for the whole device.
  Status allocated =
      CudaStatus(cudaMallocAsync(reinterpret_cast<void**>(&ready.reduce_partials),
                                 cuda_kernels::kReduceMaxBlocks * sizeof(double), ready.stream),
                 "cudaMallocAsync (reduction scratch)");
  if (!allocated.ok()) {
    (void)cudaStreamDestroy(ready.stream);
    (void)cudaGetLastError();
    return allocated;
  }
  return ready;
}

/// Release a stream's scratch (in its order, unless null) and destroy the stream; on the
/// current device. Harmless on a dead context.
void DestroyReadyStream(ReadyStream ready) {
  if (ready.stream == nullptr) return;
  if (ready.cublas != nullptr) (void)ready.cublas_api->Destroy(ready.cublas);
  if (ready.cublas_workspace != nullptr) {
    (void)(ready.workspace_from_pool ? cudaFreeAsync(ready.cublas_workspace, ready.stream)
                                     : cudaFree(ready.cublas_workspace));
  }
  if (ready.reduce_partials != nullptr) (void)cudaFreeAsync(ready.reduce_partials, ready.stream);
  (void)cudaStreamDestroy(ready.stream);
  (void)cudaGetLastError();
}

/// Makes streams ahead for the next sessions and destroys closed sessions' streams, on a
/// thread of its own, so that neither is on an open's or a close's path. Once cuBLAS is open
/// (MakeCublasAhead), it also keeps kCublasAhead cuBLAS handles made for sessions' first
/// GEMMs: cublasCreate allocates device memory, which CUDA may make wait for the whole
/// device, and a session's first GEMM was seen waiting for another session's work on the
/// H200 (docs/architecture.md, "Streams made ahead"). Only fresh
/// streams are handed out, in the order they were made, never one another session used:
/// CUDA gives a stream its hardware work queue when the stream is made (round robin), so a
/// session gets the queue a stream made at its open would have had (reused streams of
/// earlier sessions were tried and shared queues: docs/architecture.md).
class StreamMaker {
 public:
  StreamMaker(int ordinal, size_t ahead) : ordinal_(ordinal), ahead_(ahead) {
    thread_ = std::thread([this] { Run(); });
  }

  /// Joins the thread; destroys the streams made and not taken, and those retired.
  ~StreamMaker() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
    if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
    MutexLock lock(&mu_);  // the thread is gone: for the analysis
    for (const ReadyStream& ready : ready_) DestroyReadyStream(ready);
    for (const ReadyStream& closed : retired_) DestroyReadyStream(closed);
    for (cublasHandle_t handle : cublas_ready_) (void)cublas_api_->Destroy(handle);
    (void)cudaGetLastError();
  }

  StreamMaker(const StreamMaker&) = delete;
  StreamMaker& operator=(const StreamMaker&) = delete;

  /// The oldest stream made ahead, or nothing when none is ready (or making failed).
  std::optional<ReadyStream> Take() {
    std::optional<ReadyStream> taken;
    {
      MutexLock lock(&mu_);
      if (ready_.empty()) return std::nullopt;
      taken = ready_.front();
      ready_.pop_front();
    }
    cv_.NotifyOne();
    return taken;
  }

  /// From now on keep kCublasAhead handles of `api` made (idempotent). `made`, when not
  /// null, is a handle of `api` made by the caller, kept as the first of them (else
  /// destroyed).
  void MakeCublasAhead(const CublasApi* api, cublasHandle_t made = nullptr) {
    {
      MutexLock lock(&mu_);
      if (cublas_api_ == nullptr) cublas_api_ = api;
      if (made != nullptr && cublas_api_ == api && cublas_ready_.size() < kCublasAhead) {
        cublas_ready_.push_back(made);
        made = nullptr;
      }
    }
    if (made != nullptr) (void)api->Destroy(made);
    cv_.NotifyOne();
  }

  /// A cuBLAS handle made ahead (on this device, no stream set), or null when none is ready.
  cublasHandle_t TakeCublas() {
    cublasHandle_t taken = nullptr;
    {
      MutexLock lock(&mu_);
      if (cublas_ready_.empty()) return nullptr;
      taken = cublas_ready_.front();
      cublas_ready_.pop_front();
    }
    cv_.NotifyOne();
    return taken;
  }

  /// Destroy `closed` (drained: nothing enqueued on it) on the maker's thread; at once on
  /// the caller's when kMaxRetired are already waiting.
  void Retire(ReadyStream closed) {
    {
      MutexLock lock(&mu_);
      if (retired_.size() < kMaxRetired) {
        retired_.push_back(closed);
        cv_.NotifyOne();
        return;
      }
    }
    DestroyReadyStream(closed);
  }

 private:
  static constexpr size_t kMaxRetired = 64;
  static constexpr size_t kCublasAhead = 2;

  // What the loop makes next: streams first, then cuBLAS handles.
  bool StreamWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !failed_ && ready_.size() < ahead_;
  }
  bool CublasWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cublas_api_ != nullptr && !cublas_failed_ && cublas_ready_.size() < kCublasAhead;
  }

  void Run() {
    pthread_setname_np(pthread_self(), "ferry-streams");
    if (cudaSetDevice(ordinal_) != cudaSuccess) {
      (void)cudaGetLastError();
      return;  // nothing made ahead: sessions make their own streams
    }
    MutexLock lock(&mu_);
    while (true) {
      cv_.Wait(&mu_, [&] {
        mu_.AssertHeld();
        return stopping_ || !retired_.empty() || StreamWanted() || CublasWanted();
      });
      if (stopping_) return;
      if (!retired_.empty()) {
        std::vector<ReadyStream> closed;
        closed.swap(retired_);
        lock.Unlock();
        for (const ReadyStream& c : closed) DestroyReadyStream(c);
        lock.Lock();
        continue;
      }
      if (!StreamWanted()) {  // then a cuBLAS handle is wanted
        const CublasApi* api = cublas_api_;
        lock.Unlock();
        cublasHandle_t handle = nullptr;
        const bool created = api->Create(&handle) == CUBLAS_STATUS_SUCCESS;
        lock.Lock();
        if (created) {
          cublas_ready_.push_back(handle);
        } else {
          (void)cudaGetLastError();
          cublas_failed_ = true;  // sessions make their own and see the error
        }
        continue;
      }
      lock.Unlock();
      Result<ReadyStream> made = MakeReadyStream();
      lock.Lock();
      if (!made.ok()) {
        // A broken context: sessions make their own streams and see the error.
        failed_ = true;
        continue;
      }
      ready_.push_back(*made);
    }
  }

  const int ordinal_;
  const size_t ahead_;
  Mutex mu_;
  CondVar cv_;
  std::deque<ReadyStream> ready_ ABSL_GUARDED_BY(mu_);     // made, oldest first
  std::vector<ReadyStream> retired_ ABSL_GUARDED_BY(mu_);  // closed, to destroy
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  const CublasApi* cublas_api_ ABSL_GUARDED_BY(mu_) = nullptr;    // set once cuBLAS is open
  std::deque<cublasHandle_t> cublas_ready_ ABSL_GUARDED_BY(mu_);  // made, oldest first
  bool cublas_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// --- device ----------------------------------------------------------------------------------

class CudaDevice final : public Device {
 public:
  static Result<std::unique_ptr<CudaDevice>> Create(int ordinal, const CudaDeviceOptions& options) {
    int count = 0;
    FERRY_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount")
                              .WithContext("CUDA is not usable"));
    if (ordinal < 0 || ordinal >= count) {
      return InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                             std::to_string(count) + " visible)");
    }
    std::unique_ptr<CudaDevice> device(new CudaDevice(ordinal, options));
    FERRY_RETURN_IF_ERROR(device->Init());
    return device;
  }

  ~CudaDevice() override {
    stream_maker_.reset();  // joins its thread; destroys the streams it holds
    watcher_.reset();       // runs the callbacks still pending
  }

  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const DeviceInfo& info() const override { return info_; }
  Result<std::unique_ptr<Stream>> CreateStream() override;

  Status RegisterHostMemory(void* ptr, uint64_t bytes) override {
    if (ptr == nullptr || bytes == 0) {
      return InvalidArgument("RegisterHostMemory: null pointer or zero length");
    }
    FERRY_RETURN_IF_ERROR(MakeCurrent());
    FERRY_RETURN_IF_ERROR(
        CudaStatus(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable), "cudaHostRegister"));
    MutexLock lock(&registered_mu_);
    registered_.Add(ptr, bytes);  // CUDA accepted it, so no recorded range starts at ptr
    return Status::Ok();
  }

  Status UnregisterHostMemory(void* ptr) override {
    if (ptr == nullptr) return InvalidArgument("UnregisterHostMemory: null pointer");
    FERRY_RETURN_IF_ERROR(MakeCurrent());
    {
      MutexLock lock(&registered_mu_);
      registered_.Remove(ptr);
    }
    return CudaStatus(cudaHostUnregister(ptr), "cudaHostUnregister");
  }

  /// True where [ptr, ptr + bytes) lies within one range registered with RegisterHostMemory.
  bool IsRegisteredHost(const void* ptr, uint64_t bytes) const {
    MutexLock lock(&registered_mu_);
    return registered_.Contains(ptr, bytes);
  }

  Result<std::shared_ptr<Module>> LoadModule(ModuleFormat format, std::string_view image) override;

  Usage usage() const override { return usage_.Get(); }
  /// Count a stream's measured usage in the device's total (watcher thread).
  void AddUsage(const Usage& used) { usage_.Add(used); }

  uint64_t bytes_in_use() const override {
    MutexLock lock(&mu_);
    return bytes_in_use_;
  }

  uint64_t free_memory() const override {
    if (!MakeCurrent().ok()) return 0;
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    // Memory the pool holds but no allocation uses is free for this process too.
    uint64_t reserved = 0, used = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
            cudaSuccess &&
        cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess &&
        reserved > used) {
      free += reserved - used;
    }
    (void)cudaGetLastError();
    return free;
  }

  // --- for CudaStream ---

  /// A fresh stream made ahead for a session, or nothing (the session makes its own).
  std::optional<ReadyStream> TakeReadyStream() {
    return stream_maker_ ? stream_maker_->Take() : std::nullopt;
  }

  /// A cuBLAS handle of `api` made ahead, or null (the stream makes its own). The first call
  /// starts the making, for the sessions after.
  cublasHandle_t TakeReadyCublas(const CublasApi* api) {
    if (!stream_maker_) return nullptr;
    stream_maker_->MakeCublasAhead(api);
    return stream_maker_->TakeCublas();
  }

  /// Make a stream for a session on the calling thread, its faults reported.
  Result<ReadyStream> MakeStreamNow() {
    Result<ReadyStream> made = MakeReadyStream();
    if (!made.ok()) return CheckStatus(made.status());
    return made;
  }

  /// Destroy a closed session's drained stream (and release its scratch, unless null),
  /// on the stream maker's thread where there is one.
  void RetireStream(ReadyStream closed) {
    if (stream_maker_) {
      stream_maker_->Retire(closed);
    } else {
      DestroyReadyStream(closed);
    }
  }

  int ordinal() const { return info_.ordinal; }
  CompletionWatcher& watcher() { return *watcher_; }
  const cuda_kernels::LaunchLimits& limits() const { return limits_; }
  /// Whether batches and graphs run their runs of elementwise ops as one kernel each.
  bool fuse_elementwise() const { return fuse_elementwise_; }
  const cudaDeviceProp& props() const { return props_; }

  /// Make this device's primary context current on the calling thread.
  Status MakeCurrent() const { return CudaStatus(cudaSetDevice(info_.ordinal), "cudaSetDevice"); }

  /// Map a CUDA error of an enqueue and remember it when it broke the context.
  Status Check(cudaError_t error, std::string_view what) {
    Status status = CudaStatus(error, what);
    if (status.kind() == ErrorKind::kDeviceFault) watcher_->ReportFault(status);
    return status;
  }
  Status CheckStatus(Status status) {
    if (status.kind() == ErrorKind::kDeviceFault) watcher_->ReportFault(status);
    return status;
  }

  /// Allocate `bytes` stream-ordered on `stream`. `zero`: a memset to 0 is enqueued on the
  /// same stream right behind the allocation, so nothing enqueued later (the only way to
  /// reach the memory) can read what an earlier owner left in the shared pool. Tensors a
  /// session can read are always zeroed; only scratch that is fully written before it is
  /// read (the temporary of an overlapping copy) skips it.
  Result<DevicePtr> AllocateMemory(uint64_t bytes, cudaStream_t stream, bool zero) {
    if (bytes == 0) return InvalidArgument("Allocate: bytes must be positive");
    FERRY_RETURN_IF_ERROR(watcher_->fault());
    void* ptr = nullptr;
    cudaError_t error = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
    if (error == cudaErrorMemoryAllocation) {
      // The pool may cache memory freed earlier: give it back to the device and retry.
      (void)cudaGetLastError();
      (void)cudaMemPoolTrimTo(pool_, 0);
      (void)cudaGetLastError();
      error = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
    }
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it
      return Status(ErrorKind::kOutOfDeviceMemory, "Allocate: the device cannot provide " +
                                                       std::to_string(bytes) +
                                                       " bytes (cudaErrorMemoryAllocation)");
    }
    FERRY_RETURN_IF_ERROR(Check(error, "cudaMallocFromPoolAsync"));
    if (zero) {
      Status zeroed = Check(cudaMemsetAsync(ptr, 0, bytes, stream), "cudaMemsetAsync (zeroing)");
      if (!zeroed.ok()) {
        (void)cudaFreeAsync(ptr, stream);
        (void)cudaGetLastError();
        return zeroed;
      }
    }
    const auto base = static_cast<DevicePtr>(reinterpret_cast<uintptr_t>(ptr));
    MutexLock lock(&mu_);
    allocations_.Insert(base, bytes);
    bytes_in_use_ += bytes;
    return base;
  }

  /// Forget the live allocation at `ptr` (no new work may use it) and return its size, or
  /// 0 when `ptr` is not a live allocation of this device. The memory itself is released
  /// by the cudaFreeAsync the caller enqueues next: bytes_in_use drops at enqueue, which
  /// is safe because the stream orders the release after all earlier work.
  uint64_t ForgetAllocation(DevicePtr ptr) {
    MutexLock lock(&mu_);
    const std::optional<uint64_t> bytes = allocations_.Erase(ptr);
    if (!bytes) return 0;
    bytes_in_use_ -= *bytes;
    return *bytes;
  }

  /// Return OK when [ptr, ptr+bytes) lies inside one live allocation (or bytes is 0 and
  /// ptr is not null).
  Status CheckRange(const Access& access) const {
    if (access.ptr == 0) return InvalidArgument(std::string(access.what) + ": null device pointer");
    if (access.bytes == 0) return Status::Ok();
    MutexLock lock(&mu_);
    // No entry is ever marked free-pending here (the free is enqueued after Forget).
    if (allocations_.Find(access.ptr, access.bytes) == AllocationTable::Range::kInside) {
      return Status::Ok();
    }
    return Status(ErrorKind::kOutOfRange, std::string(access.what) + ": " +
                                              std::to_string(access.bytes) +
                                              " bytes are not inside one live allocation");
  }

 private:
  friend class CudaStream;

  CudaDevice(int ordinal, const CudaDeviceOptions& options) {
    info_.ordinal = ordinal;
    nvrtc_limits_.timeout = options.nvrtc_timeout;
    nvrtc_limits_.memory_bytes = options.nvrtc_memory;
    nvrtc_limits_.max_concurrent =
        options.nvrtc_concurrency > 0 ? options.nvrtc_concurrency : DefaultNvrtcConcurrency();
    nvrtc_limits_.helper = options.nvrtc_helper;
    fuse_elementwise_ = options.fuse_elementwise;
    streams_ahead_ = options.streams_ahead;
  }

  Status Init() {
    const int ordinal = info_.ordinal;
    FERRY_RETURN_IF_ERROR(MakeCurrent());
    FERRY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props_, ordinal));
    info_.backend = "cuda";
    info_.name = props_.name;
    info_.uuid = FormatUuid(props_.uuid);
    info_.driver_version = DriverVersionString();
    info_.total_memory = props_.totalGlobalMem;
    info_.compute_major = props_.major;
    info_.compute_minor = props_.minor;
    limits_.max_blocks =
        static_cast<uint32_t>(std::clamp(props_.multiProcessorCount * 16, 64, 65535));

    FERRY_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool_, ordinal));
    uint64_t threshold = UINT64_MAX;  // keep freed memory cached in the pool
    FERRY_CUDA_RETURN_IF_ERROR(
        cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));

    // Raw kernels need the driver API; without it the device still serves built-in ops.
    auto api = cuda_internal::GetDriverApi();
    if (api.ok()) {
      driver_api_ = *api;
    } else {
      driver_api_status_ = api.status();
    }
    watcher_ = std::make_unique<CompletionWatcher>(ordinal);
    if (streams_ahead_ > 0) stream_maker_ = std::make_unique<StreamMaker>(ordinal, streams_ahead_);
    if (EagerModuleLoading()) LoadCublasNow();
    return Status::Ok();
  }

  // Whether CUDA loads every kernel when its module is (CUDA_MODULE_LOADING=EAGER, which
  // ferryd's cuda-module-loading = eager sets).
  static bool EagerModuleLoading() {
    const char* mode = std::getenv("CUDA_MODULE_LOADING");
    return mode != nullptr && std::string_view(mode) == "EAGER";
  }

  // cuBLAS is opened on the daemon's first GEMM (cuda_internal.h). With eager loading, open
  // it and make one handle now instead, so that its kernels are loaded before any session
  // runs, not by a session's first GEMM while other sessions' kernels run; the handle is the
  // first the stream maker keeps ahead (without one, it is destroyed). A failure is left to
  // the first GEMM, which reports it as it always did.
  void LoadCublasNow() {
    auto api = cuda_internal::GetCublasApi();
    if (!api.ok()) return;
    cublasHandle_t handle = nullptr;
    if ((*api)->Create(&handle) != CUBLAS_STATUS_SUCCESS) return;
    if (stream_maker_) {
      stream_maker_->MakeCublasAhead(*api, handle);
    } else {
      (void)(*api)->Destroy(handle);
    }
  }

  DeviceInfo info_;
  NvrtcLimits nvrtc_limits_;  // for CUDA C++ modules; see nvrtc_compile.h
  cudaDeviceProp props_{};
  cuda_kernels::LaunchLimits limits_;
  bool fuse_elementwise_ = true;  // CudaDeviceOptions::fuse_elementwise
  cudaMemPool_t pool_ = nullptr;
  const DriverApi* driver_api_ = nullptr;
  Status driver_api_status_;

  mutable Mutex mu_;
  AllocationTable allocations_ ABSL_GUARDED_BY(mu_);  // live allocations
  uint64_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;

  // Host ranges registered with RegisterHostMemory, by their first byte (IsRegisteredHost).
  mutable Mutex registered_mu_;
  RegisteredRanges registered_ ABSL_GUARDED_BY(registered_mu_);

  Mutex modules_mu_;
  // Loaded modules by format + image bytes (the full key, so no hash collision can hand a
  // session another's code); entries expire when no caller holds the module any more.
  std::unordered_map<std::string, std::weak_ptr<CudaModule>> modules_ ABSL_GUARDED_BY(modules_mu_);

  UsageCounter usage_;  // every stream's, added on the watcher thread
  std::unique_ptr<CompletionWatcher> watcher_;

  size_t streams_ahead_ = 0;                   // CudaDeviceOptions::streams_ahead
  std::unique_ptr<StreamMaker> stream_maker_;  // when streams_ahead_ > 0
};

// --- stream ----------------------------------------------------------------------------------

class CudaStream final : public Stream {
 public:
  static Result<std::unique_ptr<CudaStream>> Create(CudaDevice* device) {
    std::unique_ptr<CudaStream> stream(new CudaStream(device));
    FERRY_RETURN_IF_ERROR(stream->Init());
    return stream;
  }

  ~CudaStream() override {
    (void)device_->MakeCurrent();
    if (capturing_) {
      cudaGraph_t graph = nullptr;
      if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) {
        (void)cudaGraphDestroy(graph);
      }
      capturing_ = false;
      FreeDeferred();
    }
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (auto& [nodes, exec] : batch_execs_) (void)cudaGraphExecDestroy(exec);
    if (!watcher().OnWatcherThread()) watcher().WaitForQueue(queue_);
    DropSpan();
    (void)cudaGetLastError();
    // The stream is destroyed off the closing thread (the stream maker's), with its cuBLAS
    // handle (cublasDestroy waits for the whole device, every other session's kernels
    // included, and a close would wait for them). Its reduction scratch and cuBLAS workspace
    // go back with it, in stream order, when no graph captured here holds them; else the
    // scratch frees them when the last graph goes (StreamScratch, without waiting).
    if (stream_ != nullptr) {
      ReadyStream closed;
      closed.stream = stream_;
      closed.cublas = cublas_;
      closed.cublas_api = cublas_api_;
      if (scratch_.use_count() == 1) {
        std::swap(closed.reduce_partials, scratch_->reduce_partials);
        std::swap(closed.cublas_workspace, scratch_->cublas_workspace);
        closed.workspace_from_pool = scratch_->workspace_from_pool;
      }
      device_->RetireStream(closed);
    } else if (cublas_ != nullptr) {
      (void)cublas_api_->Destroy(cublas_);
    }
    // scratch_ goes last: graphs captured here may still hold it (then it frees itself).
  }

  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Result<DevicePtr> Allocate(uint64_t bytes) override {
    if (capturing_) {
      return InvalidArgument("Allocate during graph capture; allocate before BeginCapture");
    }
    FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
    StartSpan();  // the zeroing is work on the device
    return device_->AllocateMemory(bytes, stream_, /*zero=*/true);
  }

  void Free(DevicePtr ptr) override {
    if (device_->ForgetAllocation(ptr) == 0) return;  // not a live allocation: nothing to do
    if (capturing_) {
      // Not recorded: released once the capture ends, and the capture is invalid.
      if (capture_error_.empty()) {
        capture_error_ = "Free during graph capture (the memory is released, not recorded)";
      }
      deferred_frees_.push_back(ptr);
      return;
    }
    if (!device_->MakeCurrent().ok()) return;
    // On a broken context this fails; the memory goes with the context.
    (void)device_->Check(cudaFreeAsync(Address(ptr), stream_), "cudaFreeAsync");
  }

  Status CopyHostToDevice(DevicePtr dst, const void* src, uint64_t bytes) override {
    if (src == nullptr) return InvalidArgument("CopyHostToDevice: null host pointer");
    return Enqueue(
        {Access{dst, bytes, "CopyHostToDevice destination", true}},
        [&] {
          if (bytes == 0) return Status::Ok();
          FERRY_RETURN_IF_ERROR(WaitBeforePageableCopy(src, bytes));
          return TimedCopy(/*to_device=*/true, bytes, [&] {
            return device_->Check(
                cudaMemcpyAsync(Address(dst), src, bytes, cudaMemcpyHostToDevice, stream_),
                "cudaMemcpyAsync (host to device)");
          });
        },
        SpanStart::kCopyDecides);
  }

  Status CopyDeviceToHost(void* dst, DevicePtr src, uint64_t bytes) override {
    if (dst == nullptr) return InvalidArgument("CopyDeviceToHost: null host pointer");
    return Enqueue(
        {Access{src, bytes, "CopyDeviceToHost source"}},
        [&] {
          if (bytes == 0) return Status::Ok();
          FERRY_RETURN_IF_ERROR(WaitBeforePageableCopy(dst, bytes));
          return TimedCopy(/*to_device=*/false, bytes, [&] {
            return device_->Check(
                cudaMemcpyAsync(dst, Address(src), bytes, cudaMemcpyDeviceToHost, stream_),
                "cudaMemcpyAsync (device to host)");
          });
        },
        SpanStart::kCopyDecides);
  }

  Status CopyDeviceToDevice(DevicePtr dst, DevicePtr src, uint64_t bytes) override {
    return Enqueue({Access{dst, bytes, "CopyDeviceToDevice destination", true},
                    Access{src, bytes, "CopyDeviceToDevice source"}},
                   [&] { return CopyDeviceToDeviceChecked(dst, src, bytes); });
  }

  Status Fill(DType dtype, DevicePtr dst, uint64_t count, double value) override {
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, CheckFill(dtype, count, value));
    const cuda_kernels::FusedOp op{
        .kind = cuda_kernels::FusedOp::kFill, .scalar = value, .out = Address(dst), .count = count};
    return EnqueueElementwise(dtype, {Access{dst, bytes, "Fill destination", true}}, op, [&] {
      void* d = Address(dst);
      const auto& limits = device_->limits();
      cudaError_t error = cudaSuccess;
      switch (dtype) {
        case DType::kF32:
          error = cuda_kernels::FillF32(stream_, limits, d, count, static_cast<float>(value));
          break;
        case DType::kF64:
          error = cuda_kernels::FillF64(stream_, limits, d, count, value);
          break;
        case DType::kI32:
          error = cuda_kernels::FillI32(stream_, limits, d, count, static_cast<int32_t>(value));
          break;
        default:
          error = cuda_kernels::FillU8(stream_, limits, d, count, static_cast<uint8_t>(value));
          break;
      }
      return device_->Check(error, "Fill kernel launch");
    });
  }

  Status Binary(BinaryOp bop, DType dtype, DevicePtr a, DevicePtr b, DevicePtr out,
                uint64_t count) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "Binary"));
    if (bop != BinaryOp::kAdd && bop != BinaryOp::kSub && bop != BinaryOp::kMul &&
        bop != BinaryOp::kDiv) {
      return InvalidArgument("Binary: unknown op " + std::to_string(static_cast<int>(bop)));
    }
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "Binary"));
    const cuda_kernels::FusedOp op{.kind = bop == BinaryOp::kAdd   ? cuda_kernels::FusedOp::kAdd
                                           : bop == BinaryOp::kSub ? cuda_kernels::FusedOp::kSub
                                           : bop == BinaryOp::kMul ? cuda_kernels::FusedOp::kMul
                                                                   : cuda_kernels::FusedOp::kDiv,
                                   .a = Address(a),
                                   .b = Address(b),
                                   .out = Address(out),
                                   .count = count};
    return EnqueueElementwise(
        dtype,
        {Access{a, bytes, "Binary operand a"}, Access{b, bytes, "Binary operand b"},
         Access{out, bytes, "Binary output", true}},
        op, [&] {
          return device_->Check(cuda_kernels::Binary(stream_, device_->limits(), bop, dtype,
                                                     Address(a), Address(b), Address(out), count),
                                "Binary kernel launch");
        });
  }

  Status Scale(DType dtype, DevicePtr x, double alpha, DevicePtr out, uint64_t count) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "Scale"));
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "Scale"));
    const cuda_kernels::FusedOp op{.kind = cuda_kernels::FusedOp::kScale,
                                   .scalar = alpha,
                                   .a = Address(x),
                                   .out = Address(out),
                                   .count = count};
    return EnqueueElementwise(
        dtype, {Access{x, bytes, "Scale input"}, Access{out, bytes, "Scale output", true}}, op,
        [&] {
          return device_->Check(cuda_kernels::Scale(stream_, device_->limits(), dtype, Address(x),
                                                    alpha, Address(out), count),
                                "Scale kernel launch");
        });
  }

  Status Axpy(DType dtype, double alpha, DevicePtr x, DevicePtr y, uint64_t count) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "Axpy"));
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "Axpy"));
    const cuda_kernels::FusedOp op{.kind = cuda_kernels::FusedOp::kAxpy,
                                   .scalar = alpha,
                                   .a = Address(x),
                                   .out = Address(y),
                                   .count = count};
    return EnqueueElementwise(
        dtype, {Access{x, bytes, "Axpy x"}, Access{y, bytes, "Axpy y", true}}, op, [&] {
          return device_->Check(cuda_kernels::Axpy(stream_, device_->limits(), dtype, alpha,
                                                   Address(x), Address(y), count),
                                "Axpy kernel launch");
        });
  }

  Status ReduceSum(DType dtype, DevicePtr in, uint64_t count, DevicePtr out) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "ReduceSum"));
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "ReduceSum"));
    return Enqueue({Access{in, bytes, "ReduceSum input"},
                    Access{out, DTypeSize(dtype), "ReduceSum output", true}},
                   [&] {
                     return device_->Check(
                         cuda_kernels::ReduceSum(stream_, dtype, Address(in), count, Address(out),
                                                 scratch_->reduce_partials),
                         "ReduceSum kernel launch");
                   });
  }

  Status Gemm(const GemmArgs& args) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(args.dtype, "Gemm"));
    FERRY_ASSIGN_OR_RETURN(uint64_t a_bytes, MatrixBytes(args.dtype, args.m, args.k, "Gemm A"));
    FERRY_ASSIGN_OR_RETURN(uint64_t b_bytes, MatrixBytes(args.dtype, args.k, args.n, "Gemm B"));
    FERRY_ASSIGN_OR_RETURN(uint64_t c_bytes, MatrixBytes(args.dtype, args.m, args.n, "Gemm C"));
    constexpr uint64_t kMaxDim = static_cast<uint64_t>(INT_MAX);
    if (args.m > kMaxDim || args.n > kMaxDim || args.k > kMaxDim) {
      return InvalidArgument("Gemm: dimensions above 2^31-1 are not supported");
    }
    // With m or n zero nothing is read; with k zero A and B are not read (C = beta * C).
    const bool empty = args.m == 0 || args.n == 0;
    return Enqueue(
        {Access{args.a, empty ? 0 : a_bytes, "Gemm A"},
         Access{args.b, empty ? 0 : b_bytes, "Gemm B"}, Access{args.c, c_bytes, "Gemm C", true}},
        [&] { return GemmChecked(args); });
  }

  Status Launch(const Module& module, std::string_view function, const LaunchConfig& config,
                const std::vector<KernelArg>& args) override;

  Status BeginCapture() override {
    if (capturing_) return InvalidArgument("BeginCapture: the stream is already capturing");
    FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
    FERRY_RETURN_IF_ERROR(device_->Check(
        cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture"));
    capturing_ = true;
    captured_.clear();
    capture_error_.clear();
    return Status::Ok();
  }

  Result<std::unique_ptr<Graph>> EndCapture() override {
    if (!capturing_) return InvalidArgument("EndCapture without BeginCapture");
    if (batching_) return InvalidArgument("EndCapture inside a batch; call EndBatch");
    FERRY_ASSIGN_OR_RETURN(EndedCapture ended, FinishCapture("graph capture"));
    cudaGraphExec_t exec = nullptr;
    FERRY_RETURN_IF_ERROR(
        device_->Check(cudaGraphInstantiate(&exec, ended.graph.get(), 0), "cudaGraphInstantiate"));
    return std::unique_ptr<Graph>(std::make_unique<CudaGraph>(
        device_, device_->ordinal(), exec, ended.node_count, std::move(ended.accesses), scratch_));
  }

  Status AbandonCapture() override {
    if (!capturing_) return InvalidArgument("AbandonCapture without BeginCapture");
    if (batching_) return InvalidArgument("AbandonCapture inside a batch; call EndBatch");
    // The recorded graph goes with `ended` (destroyed, never instantiated). A recording
    // already invalid is abandoned all the same: only a device fault is worth reporting.
    Result<EndedCapture> ended = FinishCapture("graph capture");
    if (!ended.ok() && ended.status().kind() == ErrorKind::kDeviceFault) return ended.status();
    return Status::Ok();
  }

  Status LaunchGraph(const Graph& graph) override {
    const auto* cuda_graph = dynamic_cast<const CudaGraph*>(&graph);
    if (cuda_graph == nullptr || cuda_graph->device() != device_) {
      return InvalidArgument("LaunchGraph: the graph was not captured on this device");
    }
    // Memory may have been freed since the capture: check everything before enqueueing.
    for (const Access& access : cuda_graph->accesses()) {
      FERRY_RETURN_IF_ERROR(device_->CheckRange(access));
    }
    FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
    FERRY_RETURN_IF_ERROR(FlushFused());
    StartSpan();
    FERRY_RETURN_IF_ERROR(
        device_->Check(cudaGraphLaunch(cuda_graph->exec(), stream_), "cudaGraphLaunch"));
    if (capturing_) {
      captured_.insert(captured_.end(), cuda_graph->accesses().begin(),
                       cuda_graph->accesses().end());
    }
    return Status::Ok();
  }

  // A batch is a capture whose executable graph the stream keeps, one per node count, and
  // updates in place with the next batch of that count (cudaGraphExecUpdate: new kernel
  // parameters, even new kernels, same topology). Launching updated graphs costs a fraction
  // of launching their kernels one by one (docs/performance.md, changelog, 2026-11-29).
  Status BeginBatch() override {
    FERRY_RETURN_IF_ERROR(BeginCapture());
    batching_ = true;
    return Status::Ok();
  }

  Status EndBatch() override {
    if (!batching_) return InvalidArgument("EndBatch without BeginBatch");
    // The accesses are not kept: every op was checked when it was recorded, and runs now.
    FERRY_ASSIGN_OR_RETURN(EndedCapture ended, FinishCapture("batch"));
    if (ended.node_count == 0) return Status::Ok();
    FERRY_ASSIGN_OR_RETURN(cudaGraphExec_t exec, BatchExec(ended.graph.get(), ended.node_count));
    StartSpan();
    return device_->Check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch (batch)");
  }

  void OnComplete(CompletionFn done) override {
    if (!capturing_ && span_.open()) {
      if (WatchSpan(done)) return;  // else `done` is untouched: complete it as usual
    }
    if (capturing_) {
      watcher().WatchResolved(
          queue_,
          InvalidArgument("OnComplete during graph capture is not recorded; call it after "
                          "EndCapture"),
          std::move(done));
      return;
    }
    Status fault = watcher().fault();
    if (!fault.ok()) {
      DropSpan();
      watcher().WatchResolved(queue_, std::move(fault), std::move(done));
      return;
    }
    Status current = device_->MakeCurrent();
    if (!current.ok()) {
      watcher().WatchResolved(queue_, device_->CheckStatus(std::move(current)), std::move(done));
      return;
    }
    Result<cudaEvent_t> event = watcher().AcquireEvent();
    if (!event.ok()) {
      watcher().WatchResolved(queue_, device_->CheckStatus(event.status()), std::move(done));
      return;
    }
    Status recorded = device_->Check(cudaEventRecord(*event, stream_), "cudaEventRecord");
    if (!recorded.ok()) {
      watcher().ReleaseEvent(*event);
      watcher().WatchResolved(queue_, std::move(recorded), std::move(done));
      return;
    }
    watcher().Watch(queue_, *event, std::move(done));
  }

  Usage usage() const override { return usage_->Get(); }

 private:
  explicit CudaStream(CudaDevice* device)
      : device_(device),
        queue_(device->watcher().NewQueue()),
        scratch_(std::make_shared<StreamScratch>()) {
    scratch_->ordinal = device->ordinal();
  }

  // A stream made ahead by the device's stream maker, or a new one.
  Status Init() {
    FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
    FERRY_RETURN_IF_ERROR(watcher().fault());
    std::optional<ReadyStream> ready = device_->TakeReadyStream();
    if (!ready) {
      FERRY_ASSIGN_OR_RETURN(ready, device_->MakeStreamNow());
    }
    stream_ = ready->stream;
    scratch_->reduce_partials = ready->reduce_partials;
    return Status::Ok();
  }

  // cuBLAS for this stream, made on its first GEMM: a session that never multiplies matrices
  // costs no handle and no workspace. The workspace comes from the pool in stream order, so
  // that it goes back without waiting for the device (cudaFree would). A first GEMM inside
  // a graph capture makes it there with cudaMalloc instead (the capture is relaxed, so it is
  // allowed and not captured; cudaMallocAsync would be captured as the graph's own memory).
  Status EnsureCublas() {
    if (cublas_ != nullptr) return Status::Ok();
    if (scratch_->cublas_workspace == nullptr) {
      if (capturing_) {
        FERRY_RETURN_IF_ERROR(
            device_->Check(cudaMalloc(&scratch_->cublas_workspace, kCublasWorkspaceBytes),
                           "cudaMalloc (cuBLAS workspace)"));
        scratch_->workspace_from_pool = false;
      } else {
        FERRY_RETURN_IF_ERROR(device_->Check(
            cudaMallocAsync(&scratch_->cublas_workspace, kCublasWorkspaceBytes, stream_),
            "cudaMallocAsync (cuBLAS workspace)"));
        scratch_->workspace_from_pool = true;
      }
    }
    FERRY_ASSIGN_OR_RETURN(const CublasApi* api, GetCublasApi());
    cublasHandle_t handle = device_->TakeReadyCublas(api);
    if (handle == nullptr) {
      FERRY_RETURN_IF_ERROR(CublasStatus(api->Create(&handle), "cublasCreate"));
    }
    auto configure = [&]() -> Status {
      FERRY_RETURN_IF_ERROR(CublasStatus(api->SetStream(handle, stream_), "cublasSetStream"));
      // After cublasSetStream, which resets the workspace to the library's default.
      FERRY_RETURN_IF_ERROR(
          CublasStatus(api->SetWorkspace(handle, scratch_->cublas_workspace, kCublasWorkspaceBytes),
                       "cublasSetWorkspace"));
      // Plain FP32/FP64 arithmetic: no TF32 tensor-core shortcuts for f32 GEMMs.
      return CublasStatus(api->SetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    };
    if (Status s = configure(); !s.ok()) {
      (void)api->Destroy(handle);
      return s;
    }
    cublas_api_ = api;
    cublas_ = handle;
    return Status::Ok();
  }

  CompletionWatcher& watcher() { return device_->watcher(); }

  // --- usage measurement (file comment; backend.h, Usage) ---

  /// A host<->device copy timed with its own pair of events.
  struct TimedCopyEvents {
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
    bool to_device = false;
    uint64_t bytes = 0;
  };
  /// Copies are timed by size class: [0, 128 KiB), [128 KiB, 256 KiB), ..., [128 MiB, inf).
  static constexpr int kSizeClasses = 12;
  static int SizeClass(uint64_t bytes) {
    int c = 0;
    for (uint64_t b = bytes >> 17; b != 0 && c < kSizeClasses - 1; b >>= 1) ++c;
    return c;
  }
  using PerClass = std::array<std::array<uint64_t, kSizeClasses>, 2>;  // [to_device][class]
  /// The time per byte last measured for each direction and size class (0: not yet), for the
  /// copies not timed with their own events. Written on the watcher thread; read there and,
  /// to know whether a class has been measured, by the stream's owner.
  struct CopyRates {
    std::array<std::array<std::atomic<double>, kSizeClasses>, 2> ns_per_byte{};
    double Get(bool to_device, int size_class) const {
      return ns_per_byte[to_device][size_class].load(std::memory_order_relaxed);
    }
    // Set where the last sample was a class's first, or more than kResampleSlowdown times
    // slower than the one before: the class is timed again at its next copy, not
    // kCopySampleInterval later, so that one outlier (a first copy, a burst of contention)
    // does not set the estimates for long. Written on the watcher thread, cleared by the owner.
    std::array<std::array<std::atomic<bool>, kSizeClasses>, 2> resample{};
    // Watcher thread only: when the stream's last span was seen complete, where the next
    // span's estimates may begin (MeasureSpan).
    std::chrono::steady_clock::time_point last_span_seen{};
  };
  /// What one span hands to its completion.
  struct Span {
    cudaEvent_t start = nullptr;
    std::vector<TimedCopyEvents> copies;
    PerClass untimed{};    // bytes of copies not timed with events, after start
    PerClass estimated{};  // bytes of copies enqueued while no start was open
    // When the first of `estimated` was enqueued: none of it ran on the device before.
    std::chrono::steady_clock::time_point first_estimated{};
    size_t timed_h2d = 0, timed_d2h = 0;  // copies timed, per direction
    /// Work to account for at the next completion: a start event, or estimated copies.
    bool open() const {
      if (start != nullptr) return true;
      for (const auto& per_class : estimated) {
        for (uint64_t bytes : per_class) {
          if (bytes != 0) return true;
        }
      }
      return false;
    }
  };
  // Per direction. Few: a span's events are held until its completion, and a session may
  // have 64 submits in flight; most submits copy once or twice.
  static constexpr size_t kMaxTimedCopies = 4;
  // Copies below this are not timed with their own events (see the file comment).
  static constexpr uint64_t kMinTimedCopyBytes = 64u << 10;
  // A direction and size class is timed with events again once this long has passed since
  // it last was: two timing events around every copy cost a small copy more than the copy
  // (and keep the copy engine from running back-to-back copies as one stream).
  static constexpr std::chrono::milliseconds kCopySampleInterval{10};
  static constexpr double kResampleSlowdown = 2.0;

  /// Open a span (record its start event) unless one is open or the stream is capturing.
  /// Best effort: without an event the span's work goes unmeasured.
  void StartSpan() {
    if (capturing_ || span_.start != nullptr) return;
    Result<cudaEvent_t> event = watcher().AcquireTimingEvent();
    if (!event.ok()) return;
    if (cudaEventRecord(*event, stream_) != cudaSuccess) {
      (void)cudaGetLastError();
      watcher().ReleaseTimingEvent(*event);
      return;
    }
    span_.start = *event;
  }

  /// Give the open span's events back, unmeasured.
  void DropSpan() {
    ReleaseSpan(&watcher(), span_);
    span_ = Span();
  }
  static void ReleaseSpan(CompletionWatcher* watcher, const Span& span) {
    if (span.start != nullptr) watcher->ReleaseTimingEvent(span.start);
    for (const TimedCopyEvents& c : span.copies) {
      watcher->ReleaseTimingEvent(c.start);
      watcher->ReleaseTimingEvent(c.end);
    }
  }

  /// Before a copy of `bytes` at `host` that is not registered (ordinary, pageable memory):
  /// wait on this thread until the stream's earlier work has run. CUDA copies pageable memory
  /// through staging buffers that every stream of the context shares; a pageable copy queued
  /// behind its stream's earlier work holds them until that work has run, and every other
  /// stream's pageable copy waits meanwhile (on the H100 a 4 KiB upload of another session
  /// waited 2 s for a download queued behind a 2 s kernel; docs/performance.md, changelog,
  /// 2026-12-05). A stream synchronize holds nothing another stream needs, so the copy is made
  /// on an idle stream and holds the staging for its own time only. The caller runs it where
  /// waiting holds no other session's work (backend.h). Not inside a capture (nothing runs).
  Status WaitBeforePageableCopy(const void* host, uint64_t bytes) {
    if (capturing_ || device_->IsRegisteredHost(host, bytes)) return Status::Ok();
    return device_->Check(cudaStreamSynchronize(stream_),
                          "cudaStreamSynchronize (before a copy of pageable memory)");
  }

  /// Run `copy` (which enqueues one cudaMemcpyAsync of `bytes`, more than 0) between a pair
  /// of timing events when it is sampled; else count its bytes for an estimate. A copy of
  /// kMinTimedCopyBytes or more whose class has been measured, enqueued while no span is
  /// open, opens none: its time, estimated, is its whole account (so a run of such copies,
  /// a stream of pending transfers, records no timing event at all).
  template <typename CopyFn>
  Status TimedCopy(bool to_device, uint64_t bytes, CopyFn&& copy) {
    if (capturing_) return copy();  // inside a graph: counted in busy_ns only
    size_t& timed_so_far = to_device ? span_.timed_h2d : span_.timed_d2h;
    const int size_class = SizeClass(bytes);
    std::chrono::steady_clock::time_point& next_sample = next_sample_[to_device][size_class];
    const auto now = std::chrono::steady_clock::now();
    std::atomic<bool>& resample = rates_->resample[to_device][size_class];
    const bool sample = timed_so_far < kMaxTimedCopies && bytes >= kMinTimedCopyBytes &&
                        (now >= next_sample || resample.load(std::memory_order_relaxed));
    if (!sample && span_.start == nullptr && bytes >= kMinTimedCopyBytes &&
        rates_->Get(to_device, size_class) > 0) {
      if (!span_.open()) span_.first_estimated = now;
      Status status = copy();
      if (status.ok()) span_.estimated[to_device][size_class] += bytes;
      return status;
    }
    StartSpan();
    TimedCopyEvents timed;
    timed.to_device = to_device;
    timed.bytes = bytes;
    if (span_.start != nullptr && sample) {
      Result<cudaEvent_t> start = watcher().AcquireTimingEvent();
      Result<cudaEvent_t> end = watcher().AcquireTimingEvent();
      if (start.ok()) timed.start = *start;
      if (end.ok()) timed.end = *end;
    }
    const bool have_events = timed.start != nullptr && timed.end != nullptr;
    if (!have_events || cudaEventRecord(timed.start, stream_) != cudaSuccess) {
      if (have_events) (void)cudaGetLastError();  // the failed record's error, not a copy's
      if (timed.start != nullptr) watcher().ReleaseTimingEvent(timed.start);
      if (timed.end != nullptr) watcher().ReleaseTimingEvent(timed.end);
      Status status = copy();
      if (status.ok() && span_.start != nullptr) span_.untimed[to_device][size_class] += bytes;
      return status;
    }
    Status status = copy();
    if (status.ok() && cudaEventRecord(timed.end, stream_) == cudaSuccess) {
      span_.copies.push_back(timed);
      ++timed_so_far;
      next_sample = now + kCopySampleInterval;
      resample.store(false, std::memory_order_relaxed);
      return status;
    }
    (void)cudaGetLastError();
    // The start event may already be recorded: it completes with the stream, harmlessly.
    watcher().ReleaseTimingEvent(timed.start);
    watcher().ReleaseTimingEvent(timed.end);
    if (status.ok()) span_.untimed[to_device][size_class] += bytes;
    return status;
  }

  /// Close the open span with `done`'s completion: record its end (a timing event where the
  /// span has a start, else a plain one) and watch it, measuring the span before `done`
  /// runs. Return false (nothing done with `done`, the span dropped) when the end cannot be
  /// recorded.
  bool WatchSpan(CompletionFn& done) {
    if (!watcher().fault().ok() || !device_->MakeCurrent().ok()) {
      DropSpan();
      return false;
    }
    const bool timing = span_.start != nullptr;
    Result<cudaEvent_t> end = timing ? watcher().AcquireTimingEvent() : watcher().AcquireEvent();
    if (!end.ok()) {
      DropSpan();
      return false;
    }
    if (!device_->Check(cudaEventRecord(*end, stream_), "cudaEventRecord").ok()) {
      if (timing) {
        watcher().ReleaseTimingEvent(*end);
      } else {
        watcher().ReleaseEvent(*end);
      }
      DropSpan();
      return false;
    }
    Span span = std::move(span_);
    span_ = Span();
    watcher().Watch(
        queue_, *end,
        [span = std::move(span), end = *end, usage = usage_, rates = rates_, device = device_,
         watcher = &watcher(), done = std::move(done)](Status status) mutable {
          // Every event of the span precedes `end` on the stream: all have completed.
          if (status.ok()) {
            const Usage used =
                MeasureSpan(span, end, std::chrono::steady_clock::now(), rates.get());
            usage->Add(used);
            device->AddUsage(used);
          }
          ReleaseSpan(watcher, span);
          done(std::move(status));
        },
        timing);
    return true;
  }

  static uint64_t ElapsedNs(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess || !(ms > 0)) {
      (void)cudaGetLastError();
      return 0;
    }
    return static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
  }

  /// The time of `bytes` of copies of a direction and size class, at the rate last measured
  /// for it or the nearest class measured (0 where none is).
  static uint64_t EstimateNs(const CopyRates& rates, bool to_device, int size_class,
                             uint64_t bytes) {
    double rate = 0;
    for (int d = 0; d < kSizeClasses && rate == 0; ++d) {
      if (size_class - d >= 0) rate = rates.Get(to_device, size_class - d);
      if (rate == 0 && size_class + d < kSizeClasses) rate = rates.Get(to_device, size_class + d);
    }
    return static_cast<uint64_t>(static_cast<double>(bytes) * rate);
  }

  /// Scale `estimated` (ns per direction) down so that together they fit in `room`.
  static void FitEstimates(uint64_t (&estimated)[2], uint64_t room) {
    const uint64_t wanted = estimated[0] + estimated[1];
    if (wanted <= room) return;
    const double scale = static_cast<double>(room) / static_cast<double>(wanted);
    estimated[0] = static_cast<uint64_t>(static_cast<double>(estimated[0]) * scale);
    estimated[1] = static_cast<uint64_t>(static_cast<double>(estimated[1]) * scale);
  }

  /// The usage of `span`, whose end event completed and was seen at `seen`. Estimates never
  /// take a span past what was measured of it with events, nor past the wall-clock time
  /// its estimated copies could have run in: from the first one's enqueue (or the stream's
  /// last span seen complete, if later) until `seen`. A rate is one sample, and one sample
  /// can be far off (a first copy on the H200 took 1 ms for 256 KiB): a tenant is never
  /// charged more device time than has passed.
  static Usage MeasureSpan(const Span& span, cudaEvent_t end,
                           std::chrono::steady_clock::time_point seen, CopyRates* rates) {
    Usage used;
    if (span.start != nullptr) used.busy_ns = ElapsedNs(span.start, end);
    for (const TimedCopyEvents& c : span.copies) {
      const uint64_t ns = ElapsedNs(c.start, c.end);
      if (c.to_device) {
        used.h2d_bytes += c.bytes;
        used.h2d_ns += ns;
      } else {
        used.d2h_bytes += c.bytes;
        used.d2h_ns += ns;
      }
      if (c.bytes > 0 && ns > 0) {
        const int size_class = SizeClass(c.bytes);
        const double rate = static_cast<double>(ns) / static_cast<double>(c.bytes);
        const double last = rates->Get(c.to_device, size_class);
        rates->ns_per_byte[c.to_device][size_class].store(rate, std::memory_order_relaxed);
        if (last == 0 || rate > kResampleSlowdown * last) {
          rates->resample[c.to_device][size_class].store(true, std::memory_order_relaxed);
        }
      }
    }
    // Copies not timed (small ones, those between samples, those past kMaxTimedCopies): their
    // time at the rate last measured for their direction and size class, or the nearest class
    // measured (none measured yet: in busy_ns only). Estimates never take the copies' time
    // past the span's.
    uint64_t estimated[2] = {0, 0};
    for (int to_device = 0; to_device < 2; ++to_device) {
      for (int c = 0; c < kSizeClasses; ++c) {
        const uint64_t bytes = span.untimed[to_device][c];
        if (bytes == 0) continue;
        estimated[to_device] += EstimateNs(*rates, to_device, c, bytes);
        (to_device ? used.h2d_bytes : used.d2h_bytes) += bytes;
      }
    }
    const uint64_t timed_ns = used.h2d_ns + used.d2h_ns;
    FitEstimates(estimated, used.busy_ns > timed_ns ? used.busy_ns - timed_ns : 0);
    used.d2h_ns += estimated[0];
    used.h2d_ns += estimated[1];
    // Copies enqueued while no start was open ran before the span's start (or the span has
    // none): outside its measured time, their estimate adds to it, within the wall clock.
    uint64_t before_start[2] = {0, 0};
    for (int to_device = 0; to_device < 2; ++to_device) {
      for (int c = 0; c < kSizeClasses; ++c) {
        const uint64_t bytes = span.estimated[to_device][c];
        if (bytes == 0) continue;
        before_start[to_device] += EstimateNs(*rates, to_device, c, bytes);
        (to_device ? used.h2d_bytes : used.d2h_bytes) += bytes;
      }
    }
    // (No such copy: both estimates are 0, and so is what this adds.)
    const auto from = std::max(span.first_estimated, rates->last_span_seen);
    const uint64_t wall =
        seen > from ? static_cast<uint64_t>(std::chrono::nanoseconds(seen - from).count()) : 0;
    FitEstimates(before_start, wall > used.busy_ns ? wall - used.busy_ns : 0);
    used.busy_ns += before_start[0] + before_start[1];
    used.d2h_ns += before_start[0];
    used.h2d_ns += before_start[1];
    rates->last_span_seen = seen;
    return used;
  }

  /// How an enqueued piece of work is accounted: it opens the stream's span (its start
  /// event) first, or, a host<->device copy, it decides that itself (TimedCopy: a copy whose
  /// time is estimated opens none).
  enum class SpanStart { kOpens, kCopyDecides };
  /// Check `accesses`, make the device current, run `launch` (which enqueues the work and
  /// returns its launch status) and, while capturing, record the accesses for replays.
  template <typename LaunchFn>
  Status Enqueue(std::span<const Access> accesses, LaunchFn&& launch,
                 SpanStart span = SpanStart::kOpens) {
    for (const Access& access : accesses) FERRY_RETURN_IF_ERROR(device_->CheckRange(access));
    FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
    FERRY_RETURN_IF_ERROR(FlushFused());
    if (span == SpanStart::kOpens) StartSpan();
    FERRY_RETURN_IF_ERROR(launch());
    if (capturing_) captured_.insert(captured_.end(), accesses.begin(), accesses.end());
    return Status::Ok();
  }
  template <typename LaunchFn>
  Status Enqueue(std::initializer_list<Access> accesses, LaunchFn&& launch,
                 SpanStart span = SpanStart::kOpens) {
    return Enqueue(std::span<const Access>(accesses.begin(), accesses.size()),
                   std::forward<LaunchFn>(launch), span);
  }

  /// Whether an elementwise op of `dtype` enqueued now joins a fused run instead of being
  /// launched: while recording a batch or a graph, for f32 and f64, unless the device was
  /// made without fusion.
  bool Fuses(DType dtype) const {
    return capturing_ && device_->fuse_elementwise() &&
           (dtype == DType::kF32 || dtype == DType::kF64);
  }

  /// An elementwise op over `accesses`: added to the open fused run where it Fuses, as `op`,
  /// else enqueued by `launch` (its own kernel).
  template <size_t N, typename LaunchFn>
  Status EnqueueElementwise(DType dtype, const Access (&accesses)[N],
                            const cuda_kernels::FusedOp& op, LaunchFn&& launch) {
    if (!Fuses(dtype)) return Enqueue(std::span<const Access>(accesses), launch);
    return EnqueueFused(dtype, accesses, op);
  }

  /// Check `accesses` and add `op` to the open fused run, launching that run first where
  /// the op may not join it (ElementwiseRun). The run is launched, as one kernel recorded
  /// where its ops were, by the next op that is not fused, a graph launch, or the capture's
  /// end.
  template <size_t N>
  Status EnqueueFused(DType dtype, const Access (&accesses)[N], const cuda_kernels::FusedOp& op) {
    for (const Access& access : accesses) FERRY_RETURN_IF_ERROR(device_->CheckRange(access));
    if (op.count > 0) {
      std::array<ElementwiseRun::Range, N> touched;
      for (size_t k = 0; k < N; ++k) {
        touched[k] = {accesses[k].ptr, accesses[k].bytes, accesses[k].written};
      }
      if (!fused_run_.CanJoin(dtype, op.count, touched)) FERRY_RETURN_IF_ERROR(FlushFused());
      fused_run_.Add(dtype, op.count, touched);
      fused_ops_.ops[fused_ops_.n++] = op;
    }
    captured_.insert(captured_.end(), std::begin(accesses), std::end(accesses));
    return Status::Ok();
  }

  /// Launch the open fused run, if any, as one kernel. A launch that fails makes the capture
  /// invalid (its ops were accepted: none of the capture may run without them).
  Status FlushFused() {
    if (fused_run_.empty()) return Status::Ok();
    fused_ops_.max_count = fused_run_.max_count();
    Status launched = device_->MakeCurrent();
    if (launched.ok()) {
      launched = device_->Check(
          cuda_kernels::Fused(stream_, device_->limits(), fused_run_.dtype(), fused_ops_),
          "fused elementwise kernel launch");
    }
    fused_run_.Clear();
    fused_ops_.n = 0;
    if (!launched.ok() && capture_error_.empty()) capture_error_ = launched.ToString();
    return launched;
  }

  Status CopyDeviceToDeviceChecked(DevicePtr dst, DevicePtr src, uint64_t bytes) {
    if (bytes == 0 || dst == src) return Status::Ok();
    const bool overlap = dst < src ? dst + bytes > src : src + bytes > dst;
    if (!overlap) {
      return device_->Check(
          cudaMemcpyAsync(Address(dst), Address(src), bytes, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync (device to device)");
    }
    // Overlapping ranges (memmove semantics): move in chunks no longer than the distance
    // between the ranges, in the direction that never overwrites unread source bytes. At
    // most 64 chunks; a closer overlap goes through a temporary buffer.
    const uint64_t distance = dst < src ? src - dst : dst - src;
    if (bytes / distance < 64) {
      for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = std::min(distance, bytes - done);
        const uint64_t offset = dst < src ? done : bytes - done - n;
        FERRY_RETURN_IF_ERROR(
            device_->Check(cudaMemcpyAsync(Address(dst + offset), Address(src + offset), n,
                                           cudaMemcpyDeviceToDevice, stream_),
                           "cudaMemcpyAsync (device to device)"));
        done += n;
      }
      return Status::Ok();
    }
    if (capturing_) {
      return InvalidArgument("CopyDeviceToDevice: closely overlapping ranges during capture");
    }
    FERRY_ASSIGN_OR_RETURN(DevicePtr temp, device_->AllocateMemory(bytes, stream_, /*zero=*/false));
    Status status = device_->Check(
        cudaMemcpyAsync(Address(temp), Address(src), bytes, cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync (device to device)");
    if (status.ok()) {
      status = device_->Check(
          cudaMemcpyAsync(Address(dst), Address(temp), bytes, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync (device to device)");
    }
    device_->ForgetAllocation(temp);
    (void)device_->Check(cudaFreeAsync(Address(temp), stream_), "cudaFreeAsync");
    return status;
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: pass B as cuBLAS's
  // first operand and A as its second, with m and n swapped. A row-major r x c matrix is a
  // column-major c x r one with leading dimension c.
  Status GemmChecked(const GemmArgs& g) {
    if (g.m == 0 || g.n == 0) return Status::Ok();
    FERRY_RETURN_IF_ERROR(EnsureCublas());
    const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
    const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int ld_b = std::max(1, g.trans_b ? k : n);  // B is n x k (trans) or k x n
    const int ld_a = std::max(1, g.trans_a ? m : k);  // A is k x m (trans) or m x k
    const int ld_c = std::max(1, n);
    cublasStatus_t status;
    if (g.dtype == DType::kF32) {
      const float alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
      status = cublas_api_->Sgemm(cublas_, op_first, op_second, n, m, k, &alpha,
                                  static_cast<const float*>(Address(g.b)), ld_b,
                                  static_cast<const float*>(Address(g.a)), ld_a, &beta,
                                  static_cast<float*>(Address(g.c)), ld_c);
    } else {
      const double alpha = g.alpha, beta = g.beta;
      status = cublas_api_->Dgemm(cublas_, op_first, op_second, n, m, k, &alpha,
                                  static_cast<const double*>(Address(g.b)), ld_b,
                                  static_cast<const double*>(Address(g.a)), ld_a, &beta,
                                  static_cast<double*>(Address(g.c)), ld_c);
    }
    return device_->CheckStatus(CublasStatus(status, "cuBLAS gemm"));
  }

  struct GraphDeleter {
    void operator()(cudaGraph_t graph) const { (void)cudaGraphDestroy(graph); }
  };
  /// What a capture recorded: the graph and the ranges its work touches.
  struct EndedCapture {
    std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter> graph;
    size_t node_count = 0;
    std::vector<Access> accesses;
  };

  /// End the capture (a graph's or a batch's, named `what` in errors) and return what it
  /// recorded, or why it is invalid. The frees deferred during it are enqueued after it.
  Result<EndedCapture> FinishCapture(const std::string& what) {
    FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
    (void)FlushFused();  // a failed launch is in capture_error_
    capturing_ = false;
    batching_ = false;
    EndedCapture out;
    out.accesses = std::move(captured_);
    captured_.clear();
    std::string capture_error = std::move(capture_error_);
    capture_error_.clear();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    out.graph.reset(graph);
    FreeDeferred();  // after the capture ended, so the frees are enqueued, not recorded
    FERRY_RETURN_IF_ERROR(
        device_->Check(ended, "cudaStreamEndCapture").WithContext(what + " invalidated"));
    if (!capture_error.empty()) return InvalidArgument(what + " invalidated: " + capture_error);
    if (graph == nullptr) return Status(ErrorKind::kInternal, "cudaStreamEndCapture: no graph");
    FERRY_RETURN_IF_ERROR(
        device_->Check(cudaGraphGetNodes(graph, nullptr, &out.node_count), "cudaGraphGetNodes"));
    return out;
  }

  /// The kept executable for a batch of `nodes` nodes, updated to run `graph`, or a new one.
  /// An executable replaced or evicted while a launch of it is in flight is freed by CUDA
  /// when that launch completes.
  Result<cudaGraphExec_t> BatchExec(cudaGraph_t graph, size_t nodes) {
    if (auto it = batch_execs_.find(nodes); it != batch_execs_.end()) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(it->second, graph, &info) == cudaSuccess) return it->second;
      (void)cudaGetLastError();  // not updatable to this graph (another topology): replace it
      (void)cudaGraphExecDestroy(it->second);
      batch_execs_.erase(it);
    }
    cudaGraphExec_t exec = nullptr;
    FERRY_RETURN_IF_ERROR(
        device_->Check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate (batch)"));
    if (batch_execs_.size() >= kMaxBatchExecs) {
      (void)cudaGraphExecDestroy(batch_execs_.begin()->second);
      batch_execs_.erase(batch_execs_.begin());
    }
    batch_execs_.emplace(nodes, exec);
    return exec;
  }

  void FreeDeferred() {
    for (DevicePtr ptr : deferred_frees_) {
      (void)device_->Check(cudaFreeAsync(Address(ptr), stream_), "cudaFreeAsync");
    }
    deferred_frees_.clear();
  }

  CudaDevice* const device_;
  const std::shared_ptr<CompletionWatcher::Queue> queue_;
  const std::shared_ptr<StreamScratch> scratch_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;  // made by EnsureCublas
  const CublasApi* cublas_api_ = nullptr;

  // Owner-only capture state.
  bool capturing_ = false;
  std::vector<Access> captured_;           // ranges the captured work touches
  std::string capture_error_;              // why EndCapture must fail; empty while valid
  std::vector<DevicePtr> deferred_frees_;  // freed during capture, released after it
  bool batching_ = false;                  // the capture is a batch (BeginBatch)
  // The elementwise ops recorded since the last other work, waiting to be launched as one
  // kernel (FlushFused); empty outside a capture.
  ElementwiseRun fused_run_;
  cuda_kernels::FusedOps fused_ops_;  // the run's ops; n and max_count set as fused_run_'s
  static_assert(ElementwiseRun::kMaxOps == cuda_kernels::kMaxFusedOps);
  // Executable graphs of past batches by node count (at most kMaxBatchExecs).
  static constexpr size_t kMaxBatchExecs = 8;
  std::map<size_t, cudaGraphExec_t> batch_execs_;

  // Owner-only: the work since the last completion (Span::open).
  Span span_;
  // When each direction and size class is next timed with events (TimedCopy; executor side).
  std::array<std::array<std::chrono::steady_clock::time_point, kSizeClasses>, 2> next_sample_{};
  const std::shared_ptr<CopyRates> rates_ = std::make_shared<CopyRates>();
  // Shared with the completions in flight, which add to it on the watcher thread.
  const std::shared_ptr<UsageCounter> usage_ = std::make_shared<UsageCounter>();
};

Status CudaStream::Launch(const Module& module, std::string_view function,
                          const LaunchConfig& config, const std::vector<KernelArg>& args) {
  const auto* cuda_module = dynamic_cast<const CudaModule*>(&module);
  if (cuda_module == nullptr || cuda_module->ordinal() != device_->ordinal()) {
    return InvalidArgument("Launch: the module was not loaded on this device");
  }
  FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
  FERRY_ASSIGN_OR_RETURN(CudaModule::FunctionInfo info, cuda_module->Lookup(function));
  const CUfunction func = info.function;
  const std::vector<size_t>& sizes = info.param_sizes;
  const std::string name(function);

  // Arguments: count and sizes must match the kernel's parameters where the driver tells
  // them (otherwise it would read past our buffers or pass garbage).
  if (info.sizes_known) {
    if (sizes.size() != args.size()) {
      return InvalidArgument("Launch " + name + ": " + std::to_string(args.size()) +
                             " arguments given, the kernel takes " + std::to_string(sizes.size()));
    }
  }
  std::vector<uint64_t> pointers(args.size());
  std::vector<void*> params(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg& arg = args[i];
    size_t given = 0;
    if (arg.kind == KernelArg::Kind::kPointer) {
      pointers[i] = arg.pointer;
      params[i] = &pointers[i];
      given = sizeof(uint64_t);
    } else {
      if (arg.scalar.empty()) {
        return InvalidArgument("Launch " + name + ": argument " + std::to_string(i) +
                               " is an empty scalar");
      }
      params[i] = const_cast<uint8_t*>(arg.scalar.data());
      given = arg.scalar.size();
    }
    if (info.sizes_known && sizes[i] != given) {
      return InvalidArgument("Launch " + name + ": argument " + std::to_string(i) + " has " +
                             std::to_string(given) + " bytes, the kernel's parameter has " +
                             std::to_string(sizes[i]));
    }
  }

  // Launch configuration: reject what the device cannot run before the driver sees it.
  const cudaDeviceProp& props = device_->props();
  uint64_t threads = 1;
  for (int d = 0; d < 3; ++d) {
    if (config.grid[d] == 0 || config.block[d] == 0) {
      return InvalidArgument("Launch " + name + ": grid and block dimensions must be positive");
    }
    if (config.block[d] > static_cast<uint32_t>(props.maxThreadsDim[d]) ||
        config.grid[d] > static_cast<uint32_t>(props.maxGridSize[d])) {
      return InvalidArgument("Launch " + name + ": grid or block dimension " + std::to_string(d) +
                             " exceeds the device's limit");
    }
    threads *= config.block[d];
  }
  const DriverApi& api = cuda_module->api();
  int max_threads = props.maxThreadsPerBlock;
  if (api.FuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func) !=
      CUDA_SUCCESS) {
    max_threads = props.maxThreadsPerBlock;
  }
  if (threads > static_cast<uint64_t>(max_threads)) {
    return InvalidArgument("Launch " + name + ": " + std::to_string(threads) +
                           " threads per block, the kernel allows " + std::to_string(max_threads));
  }
  if (config.shared_bytes > kDefaultSharedLimit) {
    if (config.shared_bytes > props.sharedMemPerBlockOptin) {
      return InvalidArgument("Launch " + name + ": " + std::to_string(config.shared_bytes) +
                             " bytes of shared memory, the device allows " +
                             std::to_string(props.sharedMemPerBlockOptin));
    }
    FERRY_RETURN_IF_ERROR(device_->CheckStatus(
        DriverStatus(api.FuncSetAttribute(func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          static_cast<int>(config.shared_bytes)),
                     "cuFuncSetAttribute (dynamic shared memory)")));
  }

  FERRY_RETURN_IF_ERROR(FlushFused());
  StartSpan();
  const CUresult launched =
      api.LaunchKernel(func, config.grid[0], config.grid[1], config.grid[2], config.block[0],
                       config.block[1], config.block[2], config.shared_bytes, stream_,
                       params.empty() ? nullptr : params.data(), nullptr);
  return device_->CheckStatus(DriverStatus(launched, "cuLaunchKernel " + name));
}

Result<std::unique_ptr<Stream>> CudaDevice::CreateStream() {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> stream, CudaStream::Create(this));
  return std::unique_ptr<Stream>(std::move(stream));
}

Result<std::shared_ptr<Module>> CudaDevice::LoadModule(ModuleFormat format,
                                                       std::string_view image) {
  if (format != ModuleFormat::kPtx && format != ModuleFormat::kCubin &&
      format != ModuleFormat::kCudaSource) {
    return InvalidArgument("LoadModule: unknown format " +
                           std::to_string(static_cast<int>(format)));
  }
  if (image.empty()) return CompileError("LoadModule: the module image is empty");
  if (driver_api_ == nullptr) return driver_api_status_;

  std::string key;
  key.reserve(image.size() + 1);
  key.push_back(static_cast<char>('0' + static_cast<int>(format)));
  key.append(image);
  {
    MutexLock lock(&modules_mu_);
    if (auto it = modules_.find(key); it != modules_.end()) {
      if (std::shared_ptr<CudaModule> module = it->second.lock()) {
        return std::shared_ptr<Module>(std::move(module));
      }
    }
  }

  std::string loadable;
  switch (format) {
    case ModuleFormat::kCudaSource: {
      // In a bounded helper process that cannot open files, after a check that the source
      // names none (nvrtc_compile.h).
      FERRY_ASSIGN_OR_RETURN(
          CompiledSource compiled,
          CompileCudaSource(image, info_.compute_major, info_.compute_minor, nvrtc_limits_));
      loadable = std::move(compiled.image);
      break;
    }
    case ModuleFormat::kCubin: {
      // An ELF cubin or a fatbin; anything else is refused before the driver parses it.
      static constexpr char kElf[] = {'\x7f', 'E', 'L', 'F'};
      static constexpr char kFatbin[] = {'\x50', '\xed', '\x55', '\xba'};
      const bool elf = image.size() >= 4 && std::memcmp(image.data(), kElf, 4) == 0;
      const bool fatbin = image.size() >= 4 && std::memcmp(image.data(), kFatbin, 4) == 0;
      if (!elf && !fatbin) return CompileError("LoadModule: the image is not a CUBIN or fatbin");
      loadable.assign(image);
      break;
    }
    default:
      loadable.assign(image);  // PTX: std::string adds the NUL the driver needs
      break;
  }

  FERRY_RETURN_IF_ERROR(MakeCurrent());
  FERRY_ASSIGN_OR_RETURN(CUmodule handle, LoadImage(*driver_api_, loadable));
  auto module = std::make_shared<CudaModule>(info_.ordinal, driver_api_, handle);

  MutexLock lock(&modules_mu_);
  // Drop entries whose modules are gone, so the cache holds only live modules' keys.
  for (auto it = modules_.begin(); it != modules_.end();) {
    it = it->second.expired() ? modules_.erase(it) : std::next(it);
  }
  auto [it, inserted] = modules_.try_emplace(std::move(key), module);
  if (!inserted) {
    // Another caller loaded the same image meanwhile: share theirs, drop ours.
    if (std::shared_ptr<CudaModule> existing = it->second.lock()) {
      return std::shared_ptr<Module>(std::move(existing));
    }
    it->second = module;
  }
  return std::shared_ptr<Module>(std::move(module));
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, const CudaDeviceOptions& options) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(ordinal, options));
  return std::unique_ptr<Device>(std::move(device));
}

Status ResetCudaContext(int ordinal) {
  // After a sticky fault most runtime calls, cudaSetDevice among them, report that fault
  // until the context is reset; so select the device, reset, and only then check.
  (void)cudaSetDevice(ordinal);
  (void)cudaGetLastError();
  cudaError_t err = cudaDeviceReset();
  (void)cudaGetLastError();
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice after reset"));
  if (err != cudaSuccess) {
    // The reset may report the fault it cleared; the fresh context is what matters, and
    // the caller checks it by creating a device.
    (void)err;
  }
  int count = 0;
  return CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount after reset");
}

}  // namespace ferry::backend
