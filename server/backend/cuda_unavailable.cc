// Stand-in for the CUDA backend in builds without a CUDA compiler (FERRY_CUDA=OFF or no nvcc).
#include "backend/backend.h"

namespace ferry::backend {

int CudaDeviceCount() { return 0; }

Result<std::unique_ptr<Device>> CreateCudaDevice(int /*ordinal*/,
                                                 const CudaDeviceOptions& /*options*/) {
  return Status(ErrorKind::kUnsupported, "this ferryd was built without the CUDA backend");
}

Status ResetCudaContext(int /*ordinal*/) {
  return Status(ErrorKind::kUnsupported, "this ferryd was built without the CUDA backend");
}

}  // namespace ferry::backend
