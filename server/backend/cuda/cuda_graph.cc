#include "backend/cuda/cuda_graph.h"

namespace ferry::backend {

StreamScratch::~StreamScratch() {
  if (cudaSetDevice(ordinal) == cudaSuccess) {
    if (reduce_partials != nullptr) (void)cudaFreeAsync(reduce_partials, nullptr);
    if (cublas_workspace != nullptr) {
      (void)(workspace_from_pool ? cudaFreeAsync(cublas_workspace, nullptr)
                                 : cudaFree(cublas_workspace));
    }
  }
  (void)cudaGetLastError();
}

CudaGraph::~CudaGraph() {
  if (cudaSetDevice(ordinal_) == cudaSuccess) (void)cudaGraphExecDestroy(exec_);
  (void)cudaGetLastError();
}

}  // namespace ferry::backend
