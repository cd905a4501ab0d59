// The CUDA backend: one CudaDevice per GPU ordinal, on the device's primary context.
//
// Private to server/backend/cuda; the rest of ferryd sees it only as backend::Device,
// through CreateCudaDevice. Semantics are those of backend.h, on these CUDA mechanisms, each
// in a file of its own:
//  * Stream (cuda_stream.h): one non-blocking cudaStream_t per session, made ahead by the
//    device's StreamMaker (stream_maker.h), with a cuBLAS handle and scratch of its own.
//  * Memory: stream-ordered (cudaMallocFromPoolAsync / cudaFreeAsync) from the device's
//    default pool, whose release threshold is raised so freed memory stays cached. The pool
//    is shared by every session, so a new allocation may hold another session's freed
//    bytes: AllocateMemory enqueues a cudaMemsetAsync to 0 on the same stream before it
//    returns, and every later use of the memory is ordered behind it. Every device range an
//    op touches is checked against the live allocations (CheckRange: OUT_OF_RANGE
//    otherwise, as on the host backend), so a client's bad offset is a typed error, not a
//    device fault that would take down every session.
//  * Completion: OnComplete records a pooled event; the device's CompletionWatcher polls it
//    and runs the callback (no cudaLaunchHostFunc; see completion_watcher.h).
//  * Errors: see cuda_internal.h. A sticky fault breaks the whole context; from then on
//    every completion of every stream of the device reports DEVICE_FAULT. Rebuilding the
//    context (cudaDeviceReset) is the owner's job, after destroying this device.
//  * Raw kernels (cuda_module.h): modules loaded into the primary context with the driver
//    API, CUDA C++ compiled by NVRTC in a bounded helper process (nvrtc_compile.h); modules
//    are cached by content (format + bytes) while some caller still holds them.
//  * Graphs (cuda_graph.h): stream capture in relaxed mode, instantiated into a
//    cudaGraphExec_t that keeps its capturing stream's scratch alive.
//  * Usage (stream_usage.h): one pair of timing events per span of work between
//    completions, copies sampled by direction and size class; read on the watcher thread.
//
// Thread-safety: a CudaDevice is safe for concurrent use from many threads (backend.h): the
// live allocations, the registered host ranges and the module cache each have a lock of
// their own, never held across a CUDA call; usage is atomic; what Init sets is not changed
// after. Lifetime: a CudaDevice must outlive its
// streams; modules and graphs may outlive it (they unload from the primary context, which
// stays). A completion callback must not destroy the device.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "backend/allocation_table.h"
#include "backend/backend.h"
#include "backend/cuda/completion_watcher.h"
#include "backend/cuda/cuda_access.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_module.h"
#include "backend/cuda/nvrtc_compile.h"
#include "backend/cuda/stream_maker.h"
#include "backend/registered_ranges.h"
#include "ferry/mutex.h"

namespace ferry::backend {

class CudaDevice final : public Device {
 public:
  /// Open device `ordinal` (INVALID_ARGUMENT when it does not exist) and start its
  /// completion watcher and, with options.streams_ahead, its stream maker.
  static Result<std::unique_ptr<CudaDevice>> Create(int ordinal, const CudaDeviceOptions& options);
  /// Stops the stream maker (destroying the streams it holds), then the watcher (running the
  /// callbacks still pending). Every stream must be gone.
  ~CudaDevice() override;

  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const DeviceInfo& info() const override { return info_; }
  Result<std::unique_ptr<Stream>> CreateStream() override;

  Status RegisterHostMemory(void* ptr, uint64_t bytes) override;
  Status UnregisterHostMemory(void* ptr) override;
  /// True where [ptr, ptr + bytes) lies within one range registered with RegisterHostMemory.
  bool IsRegisteredHost(const void* ptr, uint64_t bytes) const;

  Result<std::shared_ptr<Module>> LoadModule(ModuleFormat format, std::string_view image) override;

  Usage usage() const override { return usage_.Get(); }
  /// Count a stream's measured usage in the device's total (watcher thread).
  void AddUsage(const Usage& used) { usage_.Add(used); }

  uint64_t bytes_in_use() const override;
  uint64_t free_memory() const override;

  // --- for CudaStream ---

  /// A fresh stream made ahead for a session, or nothing (the session makes its own).
  std::optional<ReadyStream> TakeReadyStream();
  /// A cuBLAS handle of `api` made ahead, or null (the stream makes its own). The first call
  /// starts the making, for the sessions after.
  cublasHandle_t TakeReadyCublas(const cuda_internal::CublasApi* api);
  /// Make a stream for a session on the calling thread, its faults reported.
  Result<ReadyStream> MakeStreamNow();
  /// Destroy a closed session's drained stream (and release its scratch, unless null),
  /// on the stream maker's thread where there is one.
  void RetireStream(ReadyStream closed);

  int ordinal() const { return info_.ordinal; }
  CompletionWatcher& watcher() { return *watcher_; }
  const cuda_kernels::LaunchLimits& limits() const { return limits_; }
  /// Whether batches and graphs run their runs of elementwise ops as one kernel each.
  bool fuse_elementwise() const { return fuse_elementwise_; }
  const cudaDeviceProp& props() const { return props_; }

  /// Make this device's primary context current on the calling thread.
  Status MakeCurrent() const;

  /// Map a CUDA error of an enqueue and remember it when it broke the context.
  Status Check(cudaError_t error, std::string_view what);
  Status CheckStatus(Status status);

  /// Allocate `bytes` stream-ordered on `stream`. `zero`: a memset to 0 is enqueued on the
  /// same stream right behind the allocation, so nothing enqueued later (the only way to
  /// reach the memory) can read what an earlier owner left in the shared pool. Tensors a
  /// session can read are always zeroed; only scratch that is fully written before it is
  /// read (the temporary of an overlapping copy) skips it.
  Result<DevicePtr> AllocateMemory(uint64_t bytes, cudaStream_t stream, bool zero);
  /// Forget the live allocation at `ptr` (no new work may use it) and return its size, or
  /// 0 when `ptr` is not a live allocation of this device. The memory itself is released
  /// by the cudaFreeAsync the caller enqueues next: bytes_in_use drops at enqueue, which
  /// is safe because the stream orders the release after all earlier work.
  uint64_t ForgetAllocation(DevicePtr ptr);
  /// Return OK when [ptr, ptr+bytes) lies inside one live allocation (or bytes is 0 and
  /// ptr is not null).
  Status CheckRange(const Access& access) const;

 private:
  CudaDevice(int ordinal, const CudaDeviceOptions& options);

  Status Init();
  // Whether CUDA loads every kernel when its module is (CUDA_MODULE_LOADING=EAGER, which
  // ferryd's cuda-module-loading = eager sets).
  static bool EagerModuleLoading();
  // cuBLAS is opened on the daemon's first GEMM (cuda_internal.h). With eager loading, open
  // it and make one handle now instead, so that its kernels are loaded before any session
  // runs, not by a session's first GEMM while other sessions' kernels run; the handle is the
  // first the stream maker keeps ahead (without one, it is destroyed). A failure is left to
  // the first GEMM, which reports it as it always did.
  void LoadCublasNow();

  // Set by the constructor and Init, read-only after.
  DeviceInfo info_;
  NvrtcLimits nvrtc_limits_;  // for CUDA C++ modules; see nvrtc_compile.h
  cudaDeviceProp props_{};
  cuda_kernels::LaunchLimits limits_;
  bool fuse_elementwise_ = true;  // CudaDeviceOptions::fuse_elementwise
  cudaMemPool_t pool_ = nullptr;
  const cuda_internal::DriverApi* driver_api_ = nullptr;
  Status driver_api_status_;

  mutable Mutex mu_;
  AllocationTable allocations_ ABSL_GUARDED_BY(mu_);  // live allocations
  uint64_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;

  // Host ranges registered with RegisterHostMemory, by their first byte (IsRegisteredHost).
  mutable Mutex registered_mu_;
  RegisteredRanges registered_ ABSL_GUARDED_BY(registered_mu_);

  ModuleCache modules_;  // thread-safe

  UsageCounter usage_;  // every stream's, added on the watcher thread
  std::unique_ptr<CompletionWatcher> watcher_;

  size_t streams_ahead_ = 0;                   // CudaDeviceOptions::streams_ahead
  std::unique_ptr<StreamMaker> stream_maker_;  // when streams_ahead_ > 0
};

}  // namespace ferry::backend
