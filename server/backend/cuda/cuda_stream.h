// CudaStream: a session's backend::Stream on a CUDA device (backend.h has the contract).
//
// One non-blocking cudaStream_t (made ahead by the device's StreamMaker, or at Create), one
// cuBLAS handle bound to it, made at its first GEMM (with its own workspace, so GEMMs can be
// captured into graphs), and a small device scratch buffer for the two-pass ReduceSum (both
// in StreamScratch, shared with the graphs captured here). Every entry point first makes the
// device current on the calling thread (cudaSetDevice), so any executor thread may drive a
// stream. Every device range an op touches is checked against the device's live allocations
// at enqueue (CudaDevice::CheckRange), so a client's bad offset is a typed error, not a device
// fault that would take down every session.
//
// The implementation is in three files: cuda_stream.cc (life, memory, copies and ops),
// cuda_stream_capture.cc (graphs, batches and fused elementwise runs) and
// cuda_stream_usage.cc (completions and the usage measurement of stream_usage.h).
//
// Thread-safety: a CudaStream is used by one owner at a time (the session's executor, on
// whichever thread runs it); every member not marked otherwise is the owner's alone, without
// a lock. What completions read on the watcher thread is shared through the atomics of
// CopyRates and UsageCounter, and a Span handed to its completion whole.
// Lifetime: the device (CudaDevice) must outlive the stream. Destroying the stream waits for
// its enqueued work and its pending completions (but from a completion callback, which must
// not wait for itself); the CUDA stream and its cuBLAS handle are then destroyed on the
// device's stream maker thread where there is one (CudaDevice::RetireStream). Graphs captured
// here may outlive the stream.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/completion_watcher.h"
#include "backend/cuda/cuda_access.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/stream_usage.h"
#include "backend/elementwise_run.h"

namespace ferry::backend {

class CudaDevice;

class CudaStream final : public Stream {
 public:
  /// cuBLAS workspace per stream: set explicitly so captured GEMMs never allocate.
  static constexpr size_t kCublasWorkspaceBytes = 8ull << 20;

  /// Make a stream on `device` (which must outlive it): one made ahead, or a new one.
  static Result<std::unique_ptr<CudaStream>> Create(CudaDevice* device);
  ~CudaStream() override;

  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Result<DevicePtr> Allocate(uint64_t bytes) override;
  void Free(DevicePtr ptr) override;

  Status CopyHostToDevice(DevicePtr dst, const void* src, uint64_t bytes) override;
  Status CopyDeviceToHost(void* dst, DevicePtr src, uint64_t bytes) override;
  Status CopyDeviceToDevice(DevicePtr dst, DevicePtr src, uint64_t bytes) override;

  Status Fill(DType dtype, DevicePtr dst, uint64_t count, double value) override;
  Status Binary(BinaryOp bop, DType dtype, DevicePtr a, DevicePtr b, DevicePtr out,
                uint64_t count) override;
  Status Scale(DType dtype, DevicePtr x, double alpha, DevicePtr out, uint64_t count) override;
  Status Relu(DType dtype, DevicePtr x, DevicePtr out, uint64_t count) override;
  Status Axpy(DType dtype, double alpha, DevicePtr x, DevicePtr y, uint64_t count) override;
  Status ReduceSum(DType dtype, DevicePtr in, uint64_t count, DevicePtr out) override;
  Status Gemm(const GemmArgs& args) override;

  Status Launch(const Module& module, std::string_view function, const LaunchConfig& config,
                const std::vector<KernelArg>& args) override;

  Status BeginCapture() override;
  Result<std::unique_ptr<Graph>> EndCapture() override;
  Status AbandonCapture() override;
  Status LaunchGraph(const Graph& graph) override;

  // A batch is a capture whose executable graph the stream keeps, one per node count, and
  // updates in place with the next batch of that count (cudaGraphExecUpdate: new kernel
  // parameters, even new kernels, same topology). Launching updated graphs costs a fraction
  // of launching their kernels one by one (docs/performance.md, changelog, 2026-11-29).
  Status BeginBatch() override;
  Status EndBatch() override;

  void OnComplete(CompletionFn done) override;

  Usage usage() const override { return usage_->Get(); }

 private:
  explicit CudaStream(CudaDevice* device);

  // --- life (cuda_stream.cc) ---

  /// Take a stream made ahead by the device's stream maker, or make a new one.
  Status Init();
  /// Make this stream's cuBLAS handle and workspace unless made (its first GEMM).
  Status EnsureCublas();
  CompletionWatcher& watcher();

  // --- enqueueing (cuda_stream.cc) ---

  /// How an enqueued piece of work is accounted: it opens the stream's span (its start
  /// event) first, or, a host<->device copy, it decides that itself (TimedCopy: a copy whose
  /// time is estimated opens none).
  enum class SpanStart { kOpens, kCopyDecides };
  /// Check `accesses`, make the device current, run `launch` (which enqueues the work and
  /// returns its launch status) and, while capturing, record the accesses for replays.
  template <typename LaunchFn>
  Status Enqueue(std::span<const Access> accesses, LaunchFn&& launch,
                 SpanStart span = SpanStart::kOpens);
  template <typename LaunchFn>
  Status Enqueue(std::initializer_list<Access> accesses, LaunchFn&& launch,
                 SpanStart span = SpanStart::kOpens);
  /// The most ranges an elementwise op touches (Binary's a, b and out).
  static constexpr size_t kMaxElementwiseAccesses = 3;
  /// An elementwise op over `accesses`: added to the open fused run where it Fuses, as `op`,
  /// else enqueued by `launch` (its own kernel).
  template <size_t N, typename LaunchFn>
  Status EnqueueElementwise(DType dtype, const Access (&accesses)[N],
                            const cuda_kernels::FusedOp& op, LaunchFn&& launch);
  /// A copy between `host` memory and `device_range` (to_device: from src to dst on the
  /// device), after the wait a pageable copy needs, timed or estimated (TimedCopy).
  Status EnqueueHostCopy(bool to_device, void* dst, const void* src, uint64_t bytes,
                         const Access& device_range);
  /// Before a copy of `bytes` at `host` that is not registered, wait until the stream's
  /// earlier work has run (see the definition for why).
  Status WaitBeforePageableCopy(const void* host, uint64_t bytes);
  Status CopyDeviceToDeviceChecked(DevicePtr dst, DevicePtr src, uint64_t bytes);
  Status GemmChecked(const GemmArgs& g);

  // --- capture, batches and fused runs (cuda_stream_capture.cc) ---

  /// Whether an elementwise op of `dtype` enqueued now joins a fused run instead of being
  /// launched: while recording a batch or a graph, for f32 and f64, unless the device was
  /// made without fusion.
  bool Fuses(DType dtype) const;
  /// Check `accesses` (kMaxElementwiseAccesses at most) and add `op` to the open fused run,
  /// launching that run first where the op may not join it (ElementwiseRun). The run is
  /// launched, as one kernel recorded where its ops were, by the next op that is not fused,
  /// a graph launch, or the capture's end.
  Status EnqueueFused(DType dtype, std::span<const Access> accesses,
                      const cuda_kernels::FusedOp& op);
  /// Launch the open fused run, if any, as one kernel. A launch that fails makes the capture
  /// invalid (its ops were accepted: none of the capture may run without them).
  Status FlushFused();

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
  Result<EndedCapture> FinishCapture(const std::string& what);
  /// The kept executable for a batch of `nodes` nodes, updated to run `graph`, or a new one.
  /// An executable replaced or evicted while a launch of it is in flight is freed by CUDA
  /// when that launch completes.
  Result<cudaGraphExec_t> BatchExec(cudaGraph_t graph, size_t nodes);
  /// Enqueue the frees deferred during a capture.
  void FreeDeferred();

  // --- usage measurement (cuda_stream_usage.cc; stream_usage.h) ---

  /// Open a span (record its start event) unless one is open or the stream is capturing.
  /// Best effort: without an event the span's work goes unmeasured.
  void StartSpan();
  /// Give the open span's events back, unmeasured.
  void DropSpan();
  /// Enqueue one cudaMemcpyAsync of `bytes` (more than 0) from `src` to `dst`, to the device
  /// or from it, between a pair of timing events when it is sampled; else count its bytes
  /// for an estimate. A copy of kMinTimedCopyBytes or more whose class has been measured,
  /// enqueued while no span is open, opens none: its time, estimated, is its whole account
  /// (so a run of such copies, a stream of pending transfers, records no timing event at all).
  Status TimedCopy(bool to_device, void* dst, const void* src, uint64_t bytes);
  /// Enqueue the copy TimedCopy times.
  Status Copy(bool to_device, void* dst, const void* src, uint64_t bytes);
  /// Close the open span with `done`'s completion: record its end (a timing event where the
  /// span has a start, else a plain one) and watch it, measuring the span before `done`
  /// runs. Return false (nothing done with `done`, the span dropped) when the end cannot be
  /// recorded.
  bool WatchSpan(CompletionFn& done);

  CudaDevice* const device_;
  const std::shared_ptr<CompletionWatcher::Queue> queue_;
  const std::shared_ptr<StreamScratch> scratch_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;  // made by EnsureCublas
  const cuda_internal::CublasApi* cublas_api_ = nullptr;

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
  stream_usage::Span span_;
  // When each direction and size class is next timed with events (TimedCopy; owner only).
  std::array<std::array<std::chrono::steady_clock::time_point, stream_usage::kSizeClasses>, 2>
      next_sample_{};
  const std::shared_ptr<stream_usage::CopyRates> rates_ =
      std::make_shared<stream_usage::CopyRates>();
  // Shared with the completions in flight, which add to it on the watcher thread.
  const std::shared_ptr<UsageCounter> usage_ = std::make_shared<UsageCounter>();
};

}  // namespace ferry::backend
