// CudaModule: a module of device code loaded into a device's primary context, and what
// loads one (LoadableImage, LoadImage) and shares it (ModuleCache).
//
// Modules are loaded with the driver API (cuModuleLoadDataEx, through the entry points of
// cuda_internal.h's DriverApi; libcuda is never linked). CUDA C++ source is checked to name no
// file and compiled by NVRTC to a CUBIN for the device's architecture in a bounded helper
// process (nvrtc_compile.h) before it is loaded.
//
// Thread-safety: a CudaModule and a ModuleCache are safe for concurrent use (each has a lock
// of its own, held only for its own maps, never across a driver call that loads code).
// Lifetime: a CudaModule unloads itself when the last holder lets it go; it may outlive the
// CudaDevice that loaded it (it unloads from the primary context, which stays).
#pragma once

#include <cuda.h>

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/nvrtc_compile.h"
#include "ferry/mutex.h"

namespace ferry::backend {

/// A module loaded into the primary context of device `ordinal`. Thread-safe.
class CudaModule final : public Module {
 public:
  /// Own `module` (loaded with `api` on device `ordinal`), which takes at most
  /// `device_bytes` of device memory (ModuleFootprint); unload it when destroyed.
  CudaModule(int ordinal, const cuda_internal::DriverApi* api, CUmodule module,
             uint64_t device_bytes)
      : ordinal_(ordinal), api_(api), module_(module), device_bytes_(device_bytes) {}
  ~CudaModule() override;

  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  int ordinal() const { return ordinal_; }
  const cuda_internal::DriverApi& api() const { return *api_; }

  /// A function of the module and what the driver says about its parameters.
  struct FunctionInfo {
    CUfunction function = nullptr;
    bool sizes_known = false;         // the driver reported the parameters
    std::vector<size_t> param_sizes;  // in order; empty when unknown or none
  };

  /// Return the named function (cached), INVALID_ARGUMENT when the module has none.
  Result<FunctionInfo> Lookup(std::string_view name) const;

  Result<std::vector<size_t>> ParameterSizes(std::string_view function) const override;
  uint64_t device_bytes() const override { return device_bytes_; }

 private:
  Result<FunctionInfo*> InfoLocked(std::string_view name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int ordinal_;
  const cuda_internal::DriverApi* const api_;
  const CUmodule module_;
  const uint64_t device_bytes_;
  mutable Mutex mu_;
  mutable std::unordered_map<std::string, FunctionInfo> functions_ ABSL_GUARDED_BY(mu_);
};

/// Return the bytes the driver loads for `image` of `format` (kPtx, kCubin or kCudaSource):
/// CUDA C++ compiled for compute capability major.minor within `limits` (in a helper process
/// that cannot open files, after a check that the source names none), a CUBIN or fatbin
/// checked by its magic number, PTX as given. COMPILE_ERROR for what cannot be loaded.
Result<std::string> LoadableImage(ModuleFormat format, std::string_view image, int major, int minor,
                                  const NvrtcLimits& limits);

/// Load a PTX or CUBIN/fatbin image into the current context, with the JIT's error log in
/// the COMPILE_ERROR message when it fails, and every function of it loaded (a function
/// loaded lazily, at its first launch, would wait for every kernel then running).
Result<CUmodule> LoadImage(const cuda_internal::DriverApi& api, const std::string& image);

/// A device's loaded modules by format + image bytes (the full key, so no hash collision can
/// hand a session another's code); an entry expires when no caller holds its module any
/// more. Thread-safe; the lock is held to look up or keep a module, never while one loads,
/// so two callers may load the same image at once: the second to keep it gets the first's.
class ModuleCache {
 public:
  /// The key of `image` of `format`.
  static std::string Key(ModuleFormat format, std::string_view image);

  /// Return the live module kept under `key`, or null.
  std::shared_ptr<CudaModule> Find(const std::string& key) const;
  /// Keep `module` under `key` and return it, or the live module another caller kept under
  /// `key` meanwhile (then `module` is dropped). Drops the entries whose modules are gone.
  std::shared_ptr<CudaModule> Keep(std::string key, std::shared_ptr<CudaModule> module);

 private:
  mutable Mutex mu_;
  std::unordered_map<std::string, std::weak_ptr<CudaModule>> modules_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::backend
