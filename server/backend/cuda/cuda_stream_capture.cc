// CudaStream's graphs, batches and fused elementwise runs (cuda_stream.h).

#include <array>
#include <utility>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_stream.h"

namespace ferry::backend {

using cuda_internal::InvalidArgument;

Status CudaStream::BeginCapture() {
  if (capturing_) return InvalidArgument("BeginCapture: the stream is already capturing");
  FERRY_RETURN_IF_ERROR(device_->MakeCurrent());
  FERRY_RETURN_IF_ERROR(device_->Check(
      cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture"));
  capturing_ = true;
  captured_.clear();
  capture_error_.clear();
  return Status::Ok();
}

Result<std::unique_ptr<Graph>> CudaStream::EndCapture() {
  if (!capturing_) return InvalidArgument("EndCapture without BeginCapture");
  if (batching_) return InvalidArgument("EndCapture inside a batch; call EndBatch");
  FERRY_ASSIGN_OR_RETURN(EndedCapture ended, FinishCapture("graph capture"));
  cudaGraphExec_t exec = nullptr;
  FERRY_RETURN_IF_ERROR(
      device_->Check(cudaGraphInstantiate(&exec, ended.graph.get(), 0), "cudaGraphInstantiate"));
  return std::unique_ptr<Graph>(std::make_unique<CudaGraph>(
      device_, device_->ordinal(), exec, ended.node_count, std::move(ended.accesses), scratch_));
}

Status CudaStream::AbandonCapture() {
  if (!capturing_) return InvalidArgument("AbandonCapture without BeginCapture");
  if (batching_) return InvalidArgument("AbandonCapture inside a batch; call EndBatch");
  // The recorded graph goes with `ended` (destroyed, never instantiated). A recording
  // already invalid is abandoned all the same: only a device fault is worth reporting.
  Result<EndedCapture> ended = FinishCapture("graph capture");
  if (!ended.ok() && ended.status().kind() == ErrorKind::kDeviceFault) return ended.status();
  return Status::Ok();
}

Status CudaStream::LaunchGraph(const Graph& graph) {
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
    captured_.insert(captured_.end(), cuda_graph->accesses().begin(), cuda_graph->accesses().end());
  }
  return Status::Ok();
}

Status CudaStream::BeginBatch() {
  FERRY_RETURN_IF_ERROR(BeginCapture());
  batching_ = true;
  return Status::Ok();
}

Status CudaStream::EndBatch() {
  if (!batching_) return InvalidArgument("EndBatch without BeginBatch");
  // The accesses are not kept: every op was checked when it was recorded, and runs now.
  FERRY_ASSIGN_OR_RETURN(EndedCapture ended, FinishCapture("batch"));
  if (ended.node_count == 0) return Status::Ok();
  FERRY_ASSIGN_OR_RETURN(cudaGraphExec_t exec, BatchExec(ended.graph.get(), ended.node_count));
  StartSpan();
  return device_->Check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch (batch)");
}

bool CudaStream::Fuses(DType dtype) const {
  return capturing_ && device_->fuse_elementwise() &&
         (dtype == DType::kF32 || dtype == DType::kF64);
}

Status CudaStream::EnqueueFused(DType dtype, std::span<const Access> accesses,
                                const cuda_kernels::FusedOp& op) {
  for (const Access& access : accesses) FERRY_RETURN_IF_ERROR(device_->CheckRange(access));
  if (op.count > 0) {
    std::array<ElementwiseRun::Range, kMaxElementwiseAccesses> touched;
    for (size_t k = 0; k < accesses.size(); ++k) {
      touched[k] = {accesses[k].ptr, accesses[k].bytes, accesses[k].written};
    }
    const std::span<const ElementwiseRun::Range> ranges(touched.data(), accesses.size());
    if (!fused_run_.CanJoin(dtype, op.count, ranges)) FERRY_RETURN_IF_ERROR(FlushFused());
    fused_run_.Add(dtype, op.count, ranges);
    fused_ops_.ops[fused_ops_.n++] = op;
  }
  captured_.insert(captured_.end(), accesses.begin(), accesses.end());
  return Status::Ok();
}

Status CudaStream::FlushFused() {
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

Result<CudaStream::EndedCapture> CudaStream::FinishCapture(const std::string& what) {
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

Result<cudaGraphExec_t> CudaStream::BatchExec(cudaGraph_t graph, size_t nodes) {
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

void CudaStream::FreeDeferred() {
  for (DevicePtr ptr : deferred_frees_) {
    (void)device_->Check(cudaFreeAsync(Address(ptr), stream_), "cudaFreeAsync");
  }
  deferred_frees_.clear();
}

}  // namespace ferry::backend
