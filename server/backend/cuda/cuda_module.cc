#include "backend/cuda/cuda_module.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

namespace ferry::backend {
namespace {

using cuda_internal::CompileError;
using cuda_internal::DriverApi;
using cuda_internal::DriverStatus;
using cuda_internal::InvalidArgument;

/// Size of the buffer the JIT writes its error log into.
constexpr size_t kJitLogBytes = 64u << 10;

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

}  // namespace

CudaModule::~CudaModule() {
  if (cudaSetDevice(ordinal_) == cudaSuccess) (void)api_->ModuleUnload(module_);
  (void)cudaGetLastError();
}

Result<CudaModule::FunctionInfo> CudaModule::Lookup(std::string_view name) const {
  MutexLock lock(&mu_);
  FERRY_ASSIGN_OR_RETURN(const FunctionInfo* info, InfoLocked(name));
  return *info;
}

Result<std::vector<size_t>> CudaModule::ParameterSizes(std::string_view function) const {
  FERRY_ASSIGN_OR_RETURN(FunctionInfo info, Lookup(function));
  return std::move(info.param_sizes);
}

Result<CudaModule::FunctionInfo*> CudaModule::InfoLocked(std::string_view name) const {
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

Result<std::string> LoadableImage(ModuleFormat format, std::string_view image, int major, int minor,
                                  const NvrtcLimits& limits) {
  switch (format) {
    case ModuleFormat::kCudaSource: {
      // In a bounded helper process that cannot open files, after a check that the source
      // names none (nvrtc_compile.h).
      FERRY_ASSIGN_OR_RETURN(CompiledSource compiled,
                             CompileCudaSource(image, major, minor, limits));
      return std::move(compiled.image);
    }
    case ModuleFormat::kCubin: {
      // An ELF cubin or a fatbin; anything else is refused before the driver parses it.
      static constexpr char kElf[] = {'\x7f', 'E', 'L', 'F'};
      static constexpr char kFatbin[] = {'\x50', '\xed', '\x55', '\xba'};
      const bool elf = image.size() >= 4 && std::memcmp(image.data(), kElf, 4) == 0;
      const bool fatbin = image.size() >= 4 && std::memcmp(image.data(), kFatbin, 4) == 0;
      if (!elf && !fatbin) return CompileError("LoadModule: the image is not a CUBIN or fatbin");
      return std::string(image);
    }
    default:
      return std::string(image);  // PTX: std::string adds the NUL the driver needs
  }
}

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

std::string ModuleCache::Key(ModuleFormat format, std::string_view image) {
  std::string key;
  key.reserve(image.size() + 1);
  key.push_back(static_cast<char>('0' + static_cast<int>(format)));
  key.append(image);
  return key;
}

std::shared_ptr<CudaModule> ModuleCache::Find(const std::string& key) const {
  MutexLock lock(&mu_);
  if (auto it = modules_.find(key); it != modules_.end()) return it->second.lock();
  return nullptr;
}

std::shared_ptr<CudaModule> ModuleCache::Keep(std::string key, std::shared_ptr<CudaModule> module) {
  MutexLock lock(&mu_);
  // Drop entries whose modules are gone, so the cache holds only live modules' keys.
  for (auto it = modules_.begin(); it != modules_.end();) {
    it = it->second.expired() ? modules_.erase(it) : std::next(it);
  }
  auto [it, inserted] = modules_.try_emplace(std::move(key), module);
  if (!inserted) {
    // Another caller loaded the same image meanwhile: share theirs, drop ours.
    if (std::shared_ptr<CudaModule> existing = it->second.lock()) return existing;
    it->second = module;
  }
  return module;
}

}  // namespace ferry::backend
