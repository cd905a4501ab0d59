// CudaGraph: a graph captured on a CudaStream, instantiated for replay; and StreamScratch,
// the device buffers of a stream that its graphs' nodes point into.
//
// Capture runs in relaxed mode (a session's executor may be a thread pool; in the stricter
// modes an unrelated cudaMalloc on the capturing thread would invalidate the capture), and
// EndCapture instantiates the graph into a cudaGraphExec_t (cuda_stream.h).
//
// Thread-safety: a CudaGraph is immutable once made; any thread may read it. Replay it on
// the stream that captured it, or at least never concurrently with that stream's own
// ReduceSum or Gemm work: both use the scratch the graph shares.
// Ownership and lifetime: a graph owns its executable and holds its stream's scratch, so it
// may outlive the stream (and the device: it is destroyed in the primary context, which
// stays). The scratch goes with the last of the stream and its graphs.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_access.h"

namespace ferry::backend {

/// Device buffers a stream's built-in ops use besides their operands. Shared with the
/// graphs captured on the stream, since their nodes point into them. Written by the
/// stream's owner only (CudaStream); released by the last holder.
struct StreamScratch {
  int ordinal = 0;
  double* reduce_partials = nullptr;  // cuda_kernels::kReduceMaxBlocks doubles, from the pool
  void* cublas_workspace = nullptr;   // CudaStream::kCublasWorkspaceBytes
  bool workspace_from_pool = false;   // cudaMallocAsync'd (else cudaMalloc'd)

  // The last holder goes after the stream (drained when it was destroyed) and every graph
  // captured on it: nothing can use the buffers any more. Pool memory goes back with
  // cudaFreeAsync on the legacy default stream, which waits for no session's stream (they
  // are all non-blocking); cudaFree would wait for the whole device, every session's work
  // included. It fails harmlessly on a dead context.
  ~StreamScratch();
};

/// A captured graph, ready to replay with CudaStream::LaunchGraph.
class CudaGraph final : public Graph {
 public:
  /// Own `exec` (instantiated on device `ordinal`, of the CudaDevice at `device`); its
  /// nodes touch `accesses` and may point into `scratch`.
  CudaGraph(const void* device, int ordinal, cudaGraphExec_t exec, size_t node_count,
            std::vector<Access> accesses, std::shared_ptr<StreamScratch> scratch)
      : device_(device),
        ordinal_(ordinal),
        exec_(exec),
        node_count_(node_count),
        accesses_(std::move(accesses)),
        scratch_(std::move(scratch)) {}
  ~CudaGraph() override;

  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  size_t node_count() const override { return node_count_; }
  /// The CudaDevice it was captured on (compared, never dereferenced).
  const void* device() const { return device_; }
  cudaGraphExec_t exec() const { return exec_; }
  /// The ranges its nodes touch, checked again before every replay.
  const std::vector<Access>& accesses() const { return accesses_; }

 private:
  const void* const device_;
  const int ordinal_;
  const cudaGraphExec_t exec_;
  const size_t node_count_;
  const std::vector<Access> accesses_;
  const std::shared_ptr<StreamScratch> scratch_;  // kept alive for the graph's nodes
};

}  // namespace ferry::backend
