// Private helpers of the CUDA backend: the one place CUDA, driver, cuBLAS and NVRTC status
// codes become ferry::Status values, and the driver-API entry points.
//
// Every CUDA call in server/backend/cuda goes through FERRY_CUDA_RETURN_IF_ERROR (or
// CudaStatus when the caller needs the Status value), so the error mapping lives here only:
//  * cudaErrorMemoryAllocation (CUDA_ERROR_OUT_OF_MEMORY)  -> OUT_OF_DEVICE_MEMORY
//  * a sticky error that leaves the context unusable (illegal address, launch failure,
//    assert, ...)                                          -> DEVICE_FAULT
//  * anything else (bad value, bad launch configuration, capture misuse, ...)
//                                                          -> INVALID_ARGUMENT
// The message always names the CUDA error (e.g. "cudaErrorIllegalAddress"). A non-sticky
// runtime error is also cleared from the thread's last-error slot, so it cannot leak into a
// later, unrelated check.
//
// The driver (libcuda) is never linked: ferryd must start on a machine without a GPU driver.
// Driver-API functions (modules, raw launches) are looked up at run time through the static
// runtime's cudaGetDriverEntryPointByVersion; see DriverApi.
#pragma once

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include <string>
#include <string_view>
#include <utility>

#include "ferry/status.h"

namespace ferry::backend::cuda_internal {

/// INVALID_ARGUMENT and COMPILE_ERROR with `message`: what the backend's own checks refuse.
inline Status InvalidArgument(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}
inline Status CompileError(std::string message) {
  return Status(ErrorKind::kCompileError, std::move(message));
}

/// Return true for the CUDA errors after which the context is unusable (every later call
/// in it fails with the same error). The values of these codes are the same for the
/// runtime (cudaError_t) and the driver (CUresult).
bool IsStickyError(int code);

/// Map a runtime error to a Status; OK for cudaSuccess. `what` names the call.
Status CudaStatus(cudaError_t error, std::string_view what);
/// Map a driver-API result to a Status; OK for CUDA_SUCCESS.
Status DriverStatus(CUresult result, std::string_view what);
/// Map a cuBLAS status to a Status; OK for CUBLAS_STATUS_SUCCESS.
Status CublasStatus(cublasStatus_t status, std::string_view what);
/// Map an NVRTC result to a Status (INTERNAL: NVRTC failing other than by the program).
Status NvrtcStatus(nvrtcResult result, std::string_view what);

/// Driver-API functions, resolved once through the runtime (never by linking libcuda).
/// A member is null when the installed driver does not export that function.
struct DriverApi {
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuModuleLoadDataEx) ModuleLoadDataEx = nullptr;
  decltype(&::cuModuleUnload) ModuleUnload = nullptr;
  decltype(&::cuModuleGetFunction) ModuleGetFunction = nullptr;
  decltype(&::cuFuncGetAttribute) FuncGetAttribute = nullptr;
  decltype(&::cuFuncSetAttribute) FuncSetAttribute = nullptr;
  decltype(&::cuFuncGetParamInfo) FuncGetParamInfo = nullptr;  // driver 12.4+
  decltype(&::cuLaunchKernel) LaunchKernel = nullptr;
  // Driver 12.4+, to load a module's every function at its load (LoadImage):
  decltype(&::cuModuleGetFunctionCount) ModuleGetFunctionCount = nullptr;
  decltype(&::cuModuleEnumerateFunctions) ModuleEnumerateFunctions = nullptr;
  decltype(&::cuFuncLoad) FuncLoad = nullptr;
};

/// Return the driver-API table, resolving it on first use (thread-safe). Call only after
/// the runtime has initialized a device (cudaSetDevice succeeded). Fails when a required
/// entry point is missing; FuncGetParamInfo and the three of a module's functions' load are
/// optional.
Result<const DriverApi*> GetDriverApi();

/// cuBLAS and NVRTC are loaded with dlopen on first use, never linked: linked, their
/// libraries' relocated data alone adds ~180 MiB to ferryd's resident memory (libcublasLt
/// 150 MiB, libnvrtc 29 MiB; measured by dlopen of CUDA 13.0's libraries), paid by every
/// daemon whether or not a session multiplies a matrix or compiles CUDA C++. The first GEMM
/// or CUDA C++ module of a daemon's life pays the load instead.
struct CublasApi {
  decltype(&::cublasCreate_v2) Create = nullptr;
  decltype(&::cublasDestroy_v2) Destroy = nullptr;
  decltype(&::cublasSetStream_v2) SetStream = nullptr;
  decltype(&::cublasSetWorkspace_v2) SetWorkspace = nullptr;
  decltype(&::cublasSetMathMode) SetMathMode = nullptr;
  decltype(&::cublasSgemm_v2) Sgemm = nullptr;
  decltype(&::cublasDgemm_v2) Dgemm = nullptr;
  decltype(&::cublasGetStatusName) GetStatusName = nullptr;
  decltype(&::cublasGetStatusString) GetStatusString = nullptr;
};
struct NvrtcApi {
  decltype(&::nvrtcGetErrorString) GetErrorString = nullptr;
  decltype(&::nvrtcGetNumSupportedArchs) GetNumSupportedArchs = nullptr;
  decltype(&::nvrtcGetSupportedArchs) GetSupportedArchs = nullptr;
  decltype(&::nvrtcCreateProgram) CreateProgram = nullptr;
  decltype(&::nvrtcDestroyProgram) DestroyProgram = nullptr;
  decltype(&::nvrtcCompileProgram) CompileProgram = nullptr;
  decltype(&::nvrtcGetProgramLogSize) GetProgramLogSize = nullptr;
  decltype(&::nvrtcGetProgramLog) GetProgramLog = nullptr;
  decltype(&::nvrtcGetCUBINSize) GetCUBINSize = nullptr;
  decltype(&::nvrtcGetCUBIN) GetCUBIN = nullptr;
  decltype(&::nvrtcGetPTXSize) GetPTXSize = nullptr;
  decltype(&::nvrtcGetPTX) GetPTX = nullptr;
};

/// Return the library's table, loading it on first use (thread-safe; later calls are
/// cheap). Fails with UNSUPPORTED, naming the library and dlopen's reason, when it cannot be
/// loaded (looked up by soname, then in the toolkit's library directory of the build).
Result<const CublasApi*> GetCublasApi();
Result<const NvrtcApi*> GetNvrtcApi();

}  // namespace ferry::backend::cuda_internal

/// Evaluate a CUDA runtime call; return its mapped Status from the enclosing function when
/// it fails.
#define FERRY_CUDA_RETURN_IF_ERROR(call) \
  FERRY_RETURN_IF_ERROR(::ferry::backend::cuda_internal::CudaStatus((call), #call))
