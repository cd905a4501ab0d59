#include "backend/cuda/cuda_internal.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace ferry::backend::cuda_internal {

bool IsStickyError(int code) {
  switch (code) {
    case cudaErrorECCUncorrectable:     // 214
    case cudaErrorNvlinkUncorrectable:  // 220
    case cudaErrorIllegalAddress:       // 700
    case cudaErrorLaunchTimeout:        // 702
    case cudaErrorAssert:               // 710
    case cudaErrorHardwareStackError:   // 714
    case cudaErrorIllegalInstruction:   // 715
    case cudaErrorMisalignedAddress:    // 716
    case cudaErrorInvalidAddressSpace:  // 717
    case cudaErrorInvalidPc:            // 718
    case cudaErrorLaunchFailure:        // 719
    case cudaErrorTensorMemoryLeak:     // 721
    case cudaErrorMpsClientTerminated:  // 810
    case cudaErrorExternalDevice:       // 911
      return true;
    default:
      return false;
  }
}

static_assert(static_cast<int>(CUDA_ERROR_ILLEGAL_ADDRESS) ==
                      static_cast<int>(cudaErrorIllegalAddress) &&
                  static_cast<int>(CUDA_ERROR_LAUNCH_FAILED) ==
                      static_cast<int>(cudaErrorLaunchFailure) &&
                  static_cast<int>(CUDA_ERROR_ASSERT) == static_cast<int>(cudaErrorAssert) &&
                  static_cast<int>(CUDA_ERROR_ECC_UNCORRECTABLE) ==
                      static_cast<int>(cudaErrorECCUncorrectable),
              "IsStickyError relies on runtime and driver codes being equal");

Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status::Ok();
  std::string message =
      std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
  if (IsStickyError(error)) return Status(ErrorKind::kDeviceFault, std::move(message));
  // Clear the thread's last-error slot: a non-sticky error must not resurface later.
  (void)cudaGetLastError();
  switch (error) {
    case cudaErrorMemoryAllocation:
      return Status(ErrorKind::kOutOfDeviceMemory, std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
      return Status(ErrorKind::kUnavailable, std::move(message));
    case cudaErrorInvalidPtx:
    case cudaErrorInvalidKernelImage:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
      return Status(ErrorKind::kCompileError, std::move(message));
    default:
      return Status(ErrorKind::kInvalidArgument, std::move(message));
  }
}

Status DriverStatus(CUresult result, std::string_view what) {
  if (result == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  auto api = GetDriverApi();
  if (api.ok() && (*api)->GetErrorName != nullptr) (*api)->GetErrorName(result, &name);
  std::string message = std::string(what) + ": " +
                        (name != nullptr ? std::string(name)
                                         : "CUresult " + std::to_string(static_cast<int>(result)));
  if (IsStickyError(result)) return Status(ErrorKind::kDeviceFault, std::move(message));
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return Status(ErrorKind::kOutOfDeviceMemory, std::move(message));
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
    case CUDA_ERROR_INVALID_SOURCE:
    case CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND:
      return Status(ErrorKind::kCompileError, std::move(message));
    default:
      return Status(ErrorKind::kInvalidArgument, std::move(message));
  }
}

Status CublasStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  auto api = GetCublasApi();  // loaded: the status came from it
  std::string message = std::string(what) + ": " +
                        (api.ok() ? std::string((*api)->GetStatusName(status)) + " (" +
                                        (*api)->GetStatusString(status) + ")"
                                  : "cublasStatus_t " + std::to_string(static_cast<int>(status)));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return Status(ErrorKind::kOutOfDeviceMemory, std::move(message));
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return Status(ErrorKind::kInvalidArgument, std::move(message));
    case CUBLAS_STATUS_EXECUTION_FAILED: {
      // A failed kernel launch inside cuBLAS: a sticky error when the context is gone.
      const cudaError_t last = cudaGetLastError();
      if (IsStickyError(last)) {
        return Status(ErrorKind::kDeviceFault, message + "; " + cudaGetErrorName(last));
      }
      return Status(ErrorKind::kInvalidArgument, std::move(message));
    }
    default:
      return Status(ErrorKind::kInternal, std::move(message));
  }
}

Status NvrtcStatus(nvrtcResult result, std::string_view what) {
  if (result == NVRTC_SUCCESS) return Status::Ok();
  auto api = GetNvrtcApi();  // loaded: the result came from it
  return Status(ErrorKind::kInternal,
                std::string(what) + ": " +
                    (api.ok() ? std::string((*api)->GetErrorString(result))
                              : "nvrtcResult " + std::to_string(static_cast<int>(result))));
}

namespace {

// Resolve `symbol` as of the CUDA version these headers declare, so each pointer's ABI
// matches the prototype decltype took from cuda.h.
template <typename Fn>
Status Resolve(const char* symbol, Fn* fn, bool required) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(symbol, &ptr, CUDA_VERSION, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || ptr == nullptr) {
    (void)cudaGetLastError();
    *fn = nullptr;
    if (!required) return Status::Ok();
    return Status(ErrorKind::kUnavailable, std::string("the CUDA driver does not provide ") +
                                               symbol + " (" + cudaGetErrorName(error) +
                                               ", query result " +
                                               std::to_string(static_cast<int>(found)) + ")");
  }
  *fn = reinterpret_cast<Fn>(ptr);
  return Status::Ok();
}

// Fill one process-wide `Api` table with `load` on the first call (thread-safe); every call
// returns that first call's outcome. One table per Api type.
template <typename Api>
Result<const Api*> LoadOnce(Status (*load)(Api*)) {
  static std::once_flag once;
  static Api api;
  static Status status;
  std::call_once(once, [load] { status = load(&api); });
  if (!status.ok()) return status;
  return static_cast<const Api*>(&api);
}

Status LoadDriverApi(DriverApi* api) {
  FERRY_RETURN_IF_ERROR(Resolve("cuGetErrorName", &api->GetErrorName, true));
  FERRY_RETURN_IF_ERROR(Resolve("cuModuleLoadDataEx", &api->ModuleLoadDataEx, true));
  FERRY_RETURN_IF_ERROR(Resolve("cuModuleUnload", &api->ModuleUnload, true));
  FERRY_RETURN_IF_ERROR(Resolve("cuModuleGetFunction", &api->ModuleGetFunction, true));
  FERRY_RETURN_IF_ERROR(Resolve("cuFuncGetAttribute", &api->FuncGetAttribute, true));
  FERRY_RETURN_IF_ERROR(Resolve("cuFuncSetAttribute", &api->FuncSetAttribute, true));
  FERRY_RETURN_IF_ERROR(Resolve("cuFuncGetParamInfo", &api->FuncGetParamInfo, false));
  FERRY_RETURN_IF_ERROR(Resolve("cuLaunchKernel", &api->LaunchKernel, true));
  FERRY_RETURN_IF_ERROR(Resolve("cuModuleGetFunctionCount", &api->ModuleGetFunctionCount, false));
  FERRY_RETURN_IF_ERROR(
      Resolve("cuModuleEnumerateFunctions", &api->ModuleEnumerateFunctions, false));
  FERRY_RETURN_IF_ERROR(Resolve("cuFuncLoad", &api->FuncLoad, false));
  return Status::Ok();
}

}  // namespace

Result<const DriverApi*> GetDriverApi() { return LoadOnce(LoadDriverApi); }

namespace {

// dlopen `soname`, else the same file in the toolkit's library directory of the build.
Result<void*> OpenLibrary(const std::string& soname) {
  void* handle = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  std::string first_error = ::dlerror();
  const std::string fallback = std::string(FERRY_CUDA_LIBRARY_DIR) + "/" + soname;
  handle = ::dlopen(fallback.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  return Status(ErrorKind::kUnsupported,
                "cannot load " + soname + ": " + first_error + "; " + ::dlerror());
}

// Resolve `name` in `handle` into `fn`; when it is absent, add its name to `missing`.
template <typename Fn>
void Resolve(void* handle, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
}

Status LoadCublas(CublasApi* api) {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  FERRY_ASSIGN_OR_RETURN(void* h, OpenLibrary(soname));  // kept for the process's life
  std::string missing;
  Resolve(h, "cublasCreate_v2", &api->Create, &missing);
  Resolve(h, "cublasDestroy_v2", &api->Destroy, &missing);
  Resolve(h, "cublasSetStream_v2", &api->SetStream, &missing);
  Resolve(h, "cublasSetWorkspace_v2", &api->SetWorkspace, &missing);
  Resolve(h, "cublasSetMathMode", &api->SetMathMode, &missing);
  Resolve(h, "cublasSgemm_v2", &api->Sgemm, &missing);
  Resolve(h, "cublasDgemm_v2", &api->Dgemm, &missing);
  Resolve(h, "cublasGetStatusName", &api->GetStatusName, &missing);
  Resolve(h, "cublasGetStatusString", &api->GetStatusString, &missing);
  if (!missing.empty()) {
    return Status(ErrorKind::kUnsupported, soname + " lacks " + missing);
  }
  return Status::Ok();
}

Status LoadNvrtc(NvrtcApi* api) {
  const std::string soname = "libnvrtc.so." + std::to_string(CUDART_VERSION / 1000);
  FERRY_ASSIGN_OR_RETURN(void* h, OpenLibrary(soname));  // kept for the process's life
  std::string missing;
  Resolve(h, "nvrtcGetErrorString", &api->GetErrorString, &missing);
  Resolve(h, "nvrtcGetNumSupportedArchs", &api->GetNumSupportedArchs, &missing);
  Resolve(h, "nvrtcGetSupportedArchs", &api->GetSupportedArchs, &missing);
  Resolve(h, "nvrtcCreateProgram", &api->CreateProgram, &missing);
  Resolve(h, "nvrtcDestroyProgram", &api->DestroyProgram, &missing);
  Resolve(h, "nvrtcCompileProgram", &api->CompileProgram, &missing);
  Resolve(h, "nvrtcGetProgramLogSize", &api->GetProgramLogSize, &missing);
  Resolve(h, "nvrtcGetProgramLog", &api->GetProgramLog, &missing);
  Resolve(h, "nvrtcGetCUBINSize", &api->GetCUBINSize, &missing);
  Resolve(h, "nvrtcGetCUBIN", &api->GetCUBIN, &missing);
  Resolve(h, "nvrtcGetPTXSize", &api->GetPTXSize, &missing);
  Resolve(h, "nvrtcGetPTX", &api->GetPTX, &missing);
  if (!missing.empty()) {
    return Status(ErrorKind::kUnsupported, soname + " lacks " + missing);
  }
  return Status::Ok();
}

}  // namespace

Result<const CublasApi*> GetCublasApi() { return LoadOnce(LoadCublas); }

Result<const NvrtcApi*> GetNvrtcApi() { return LoadOnce(LoadNvrtc); }

}  // namespace ferry::backend::cuda_internal
