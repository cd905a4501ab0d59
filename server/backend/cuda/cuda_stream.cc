// CudaStream's life, memory, copies and ops (cuda_stream.h).

#include "backend/cuda/cuda_stream.h"

#include <algorithm>
#include <climits>
#include <optional>
#include <utility>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_module.h"
#include "backend/enqueue_checks.h"

namespace ferry::backend {
namespace {

using cuda_internal::CublasApi;
using cuda_internal::CublasStatus;
using cuda_internal::DriverApi;
using cuda_internal::DriverStatus;
using cuda_internal::GetCublasApi;
using cuda_internal::InvalidArgument;

/// Dynamic shared memory a kernel gets without opting in.
constexpr uint32_t kDefaultSharedLimit = 48u << 10;

/// A raw launch's kernel parameters: cuLaunchKernel's array of pointers to each argument's
/// bytes, which point into `pointers` (the device pointers, as 64-bit values) and into the
/// KernelArgs' scalars: valid while those are (moving a KernelParams keeps them valid: a
/// vector's move keeps its buffer).
struct KernelParams {
  std::vector<uint64_t> pointers;
  std::vector<void*> params;
};

/// Pack `args` for `name`, whose parameters `info` describes: count and sizes must match
/// the kernel's parameters where the driver tells them (otherwise it would read past our
/// buffers or pass garbage).
Result<KernelParams> PackKernelArgs(const std::string& name, const CudaModule::FunctionInfo& info,
                                    const std::vector<KernelArg>& args) {
  const std::vector<size_t>& sizes = info.param_sizes;
  if (info.sizes_known && sizes.size() != args.size()) {
    return InvalidArgument("Launch " + name + ": " + std::to_string(args.size()) +
                           " arguments given, the kernel takes " + std::to_string(sizes.size()));
  }
  KernelParams packed;
  packed.pointers.resize(args.size());
  packed.params.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg& arg = args[i];
    size_t given = 0;
    if (arg.kind == KernelArg::Kind::kPointer) {
      packed.pointers[i] = arg.pointer;
      packed.params[i] = &packed.pointers[i];
      given = sizeof(uint64_t);
    } else {
      if (arg.scalar.empty()) {
        return InvalidArgument("Launch " + name + ": argument " + std::to_string(i) +
                               " is an empty scalar");
      }
      packed.params[i] = const_cast<uint8_t*>(arg.scalar.data());
      given = arg.scalar.size();
    }
    if (info.sizes_known && sizes[i] != given) {
      return InvalidArgument("Launch " + name + ": argument " + std::to_string(i) + " has " +
                             std::to_string(given) + " bytes, the kernel's parameter has " +
                             std::to_string(sizes[i]));
    }
  }
  return packed;
}

/// Reject a launch configuration of `func` (named `name`) that the device cannot run, before
/// the driver sees it. Shared memory is checked by the caller.
Status CheckLaunchShape(const std::string& name, const LaunchConfig& config,
                        const cudaDeviceProp& props, const DriverApi& api, CUfunction func) {
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
  int max_threads = props.maxThreadsPerBlock;
  if (api.FuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func) !=
      CUDA_SUCCESS) {
    max_threads = props.maxThreadsPerBlock;
  }
  if (threads > static_cast<uint64_t>(max_threads)) {
    return InvalidArgument("Launch " + name + ": " + std::to_string(threads) +
                           " threads per block, the kernel allows " + std::to_string(max_threads));
  }
  return Status::Ok();
}

}  // namespace

// --- life --------------------------------------------------------------------------------------

Result<std::unique_ptr<CudaStream>> CudaStream::Create(CudaDevice* device) {
  std::unique_ptr<CudaStream> stream(new CudaStream(device));
  FERRY_RETURN_IF_ERROR(stream->Init());
  return stream;
}

CudaStream::CudaStream(CudaDevice* device)
    : device_(device),
      queue_(device->watcher().NewQueue()),
      scratch_(std::make_shared<StreamScratch>()) {
  scratch_->ordinal = device->ordinal();
}

Status CudaStream::Init() {
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

CudaStream::~CudaStream() {
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

CompletionWatcher& CudaStream::watcher() { return device_->watcher(); }

// cuBLAS for this stream, made on its first GEMM: a session that never multiplies matrices
// costs no handle and no workspace. The workspace comes from the pool in stream order, so
// that it goes back without waiting for the device (cudaFree would). A first GEMM inside
// a graph capture makes it there with cudaMalloc instead (the capture is relaxed, so it is
// allowed and not captured; cudaMallocAsync would be captured as the graph's own memory).
Status CudaStream::EnsureCublas() {
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

// --- enqueueing --------------------------------------------------------------------------------

template <typename LaunchFn>
Status CudaStream::Enqueue(std::span<const Access> accesses, LaunchFn&& launch, SpanStart span) {
  for (const Access& access : accesses) FERRY_RETURN_IF_ERROR(device_->CheckRange(access));
  FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
  FERRY_RETURN_IF_ERROR(FlushFused());
  if (span == SpanStart::kOpens) StartSpan();
  FERRY_RETURN_IF_ERROR(launch());
  if (capturing_) captured_.insert(captured_.end(), accesses.begin(), accesses.end());
  return Status::Ok();
}

template <typename LaunchFn>
Status CudaStream::Enqueue(std::initializer_list<Access> accesses, LaunchFn&& launch,
                           SpanStart span) {
  return Enqueue(std::span<const Access>(accesses.begin(), accesses.size()),
                 std::forward<LaunchFn>(launch), span);
}

template <size_t N, typename LaunchFn>
Status CudaStream::EnqueueElementwise(DType dtype, const Access (&accesses)[N],
                                      const cuda_kernels::FusedOp& op, LaunchFn&& launch) {
  static_assert(N <= kMaxElementwiseAccesses);
  if (!Fuses(dtype)) return Enqueue(std::span<const Access>(accesses), launch);
  return EnqueueFused(dtype, std::span<const Access>(accesses), op);
}

Status CudaStream::EnqueueHostCopy(bool to_device, void* dst, const void* src, uint64_t bytes,
                                   const Access& device_range) {
  const void* host = to_device ? src : dst;
  return Enqueue(
      {device_range},
      [&] {
        if (bytes == 0) return Status::Ok();
        FERRY_RETURN_IF_ERROR(WaitBeforePageableCopy(host, bytes));
        return TimedCopy(to_device, dst, src, bytes);
      },
      SpanStart::kCopyDecides);
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
Status CudaStream::WaitBeforePageableCopy(const void* host, uint64_t bytes) {
  if (capturing_ || device_->IsRegisteredHost(host, bytes)) return Status::Ok();
  return device_->Check(cudaStreamSynchronize(stream_),
                        "cudaStreamSynchronize (before a copy of pageable memory)");
}

// --- memory and copies -------------------------------------------------------------------------

Result<DevicePtr> CudaStream::Allocate(uint64_t bytes) {
  if (capturing_) {
    return InvalidArgument("Allocate during graph capture; allocate before BeginCapture");
  }
  FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
  StartSpan();  // the zeroing is work on the device
  return device_->AllocateMemory(bytes, stream_, /*zero=*/true);
}

void CudaStream::Free(DevicePtr ptr) {
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

Status CudaStream::CopyHostToDevice(DevicePtr dst, const void* src, uint64_t bytes) {
  if (src == nullptr) return InvalidArgument("CopyHostToDevice: null host pointer");
  return EnqueueHostCopy(/*to_device=*/true, Address(dst), src, bytes,
                         Access{dst, bytes, "CopyHostToDevice destination", true});
}

Status CudaStream::CopyDeviceToHost(void* dst, DevicePtr src, uint64_t bytes) {
  if (dst == nullptr) return InvalidArgument("CopyDeviceToHost: null host pointer");
  return EnqueueHostCopy(/*to_device=*/false, dst, Address(src), bytes,
                         Access{src, bytes, "CopyDeviceToHost source"});
}

Status CudaStream::CopyDeviceToDevice(DevicePtr dst, DevicePtr src, uint64_t bytes) {
  return Enqueue({Access{dst, bytes, "CopyDeviceToDevice destination", true},
                  Access{src, bytes, "CopyDeviceToDevice source"}},
                 [&] { return CopyDeviceToDeviceChecked(dst, src, bytes); });
}

Status CudaStream::CopyDeviceToDeviceChecked(DevicePtr dst, DevicePtr src, uint64_t bytes) {
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

// --- built-in ops ------------------------------------------------------------------------------

Status CudaStream::Fill(DType dtype, DevicePtr dst, uint64_t count, double value) {
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

Status CudaStream::Binary(BinaryOp bop, DType dtype, DevicePtr a, DevicePtr b, DevicePtr out,
                          uint64_t count) {
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

Status CudaStream::Scale(DType dtype, DevicePtr x, double alpha, DevicePtr out, uint64_t count) {
  FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "Scale"));
  FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "Scale"));
  const cuda_kernels::FusedOp op{.kind = cuda_kernels::FusedOp::kScale,
                                 .scalar = alpha,
                                 .a = Address(x),
                                 .out = Address(out),
                                 .count = count};
  return EnqueueElementwise(
      dtype, {Access{x, bytes, "Scale input"}, Access{out, bytes, "Scale output", true}}, op, [&] {
        return device_->Check(cuda_kernels::Scale(stream_, device_->limits(), dtype, Address(x),
                                                  alpha, Address(out), count),
                              "Scale kernel launch");
      });
}

// Its own kernel, not part of a fused elementwise run (cuda_kernels::FusedOp has no relu).
Status CudaStream::Relu(DType dtype, DevicePtr x, DevicePtr out, uint64_t count) {
  FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "Relu"));
  FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "Relu"));
  return Enqueue({Access{x, bytes, "Relu input"}, Access{out, bytes, "Relu output", true}}, [&] {
    return device_->Check(
        cuda_kernels::Relu(stream_, device_->limits(), dtype, Address(x), Address(out), count),
        "Relu kernel launch");
  });
}

Status CudaStream::Axpy(DType dtype, double alpha, DevicePtr x, DevicePtr y, uint64_t count) {
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

Status CudaStream::ReduceSum(DType dtype, DevicePtr in, uint64_t count, DevicePtr out) {
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

Status CudaStream::Gemm(const GemmArgs& args) {
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
      {Access{args.a, empty ? 0 : a_bytes, "Gemm A"}, Access{args.b, empty ? 0 : b_bytes, "Gemm B"},
       Access{args.c, c_bytes, "Gemm C", true}},
      [&] { return GemmChecked(args); });
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: pass B as cuBLAS's
// first operand and A as its second, with m and n swapped. A row-major r x c matrix is a
// column-major c x r one with leading dimension c.
Status CudaStream::GemmChecked(const GemmArgs& g) {
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

// --- raw kernels -------------------------------------------------------------------------------

Status CudaStream::Launch(const Module& module, std::string_view function,
                          const LaunchConfig& config, const std::vector<KernelArg>& args) {
  const auto* cuda_module = dynamic_cast<const CudaModule*>(&module);
  if (cuda_module == nullptr || cuda_module->ordinal() != device_->ordinal()) {
    return InvalidArgument("Launch: the module was not loaded on this device");
  }
  FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
  FERRY_ASSIGN_OR_RETURN(CudaModule::FunctionInfo info, cuda_module->Lookup(function));
  const CUfunction func = info.function;
  const std::string name(function);
  FERRY_ASSIGN_OR_RETURN(KernelParams packed, PackKernelArgs(name, info, args));

  const cudaDeviceProp& props = device_->props();
  const DriverApi& api = cuda_module->api();
  FERRY_RETURN_IF_ERROR(CheckLaunchShape(name, config, props, api, func));
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
  std::vector<void*>& params = packed.params;
  const CUresult launched =
      api.LaunchKernel(func, config.grid[0], config.grid[1], config.grid[2], config.block[0],
                       config.block[1], config.block[2], config.shared_bytes, stream_,
                       params.empty() ? nullptr : params.data(), nullptr);
  return device_->CheckStatus(DriverStatus(launched, "cuLaunchKernel " + name));
}

}  // namespace ferry::backend
