#include "backend/cuda/cuda_device.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include "backend/cuda/cuda_stream.h"
#include "backend/module_footprint.h"

namespace ferry::backend {
namespace {

using cuda_internal::CompileError;
using cuda_internal::CublasApi;
using cuda_internal::CudaStatus;
using cuda_internal::InvalidArgument;

/// Format a CUDA UUID the way nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
std::string FormatUuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

/// Return the kernel driver's version ("580.95.05") where the system exposes it, with the
/// CUDA version the driver supports, e.g. "580.95.05 (CUDA 13.0)".
std::string DriverVersionString() {
  int cuda_version = 0;
  if (cudaDriverGetVersion(&cuda_version) != cudaSuccess) (void)cudaGetLastError();
  const std::string cuda = "CUDA " + std::to_string(cuda_version / 1000) + "." +
                           std::to_string((cuda_version % 1000) / 10);
  std::string kernel_driver;
  std::ifstream in("/sys/module/nvidia/version");
  if (in && std::getline(in, kernel_driver) && !kernel_driver.empty()) {
    return kernel_driver + " (" + cuda + ")";
  }
  return cuda;
}

}  // namespace

// --- life --------------------------------------------------------------------------------------

Result<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal,
                                                       const CudaDeviceOptions& options) {
  int count = 0;
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount")
                            .WithContext("CUDA is not usable"));
  if (ordinal < 0 || ordinal >= count) {
    return InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                           std::to_string(count) + " visible)");
  }
  std::unique_ptr<CudaDevice> device(new CudaDevice(ordinal, options));
  FERRY_RETURN_IF_ERROR(device->Init());
  return device;
}

CudaDevice::CudaDevice(int ordinal, const CudaDeviceOptions& options) {
  info_.ordinal = ordinal;
  nvrtc_limits_.timeout = options.nvrtc_timeout;
  nvrtc_limits_.memory_bytes = options.nvrtc_memory;
  nvrtc_limits_.max_concurrent =
      options.nvrtc_concurrency > 0 ? options.nvrtc_concurrency : DefaultNvrtcConcurrency();
  nvrtc_limits_.helper = options.nvrtc_helper;
  fuse_elementwise_ = options.fuse_elementwise;
  streams_ahead_ = options.streams_ahead;
}

CudaDevice::~CudaDevice() {
  stream_maker_.reset();  // joins its thread; destroys the streams it holds
  watcher_.reset();       // runs the callbacks still pending
}

Status CudaDevice::Init() {
  const int ordinal = info_.ordinal;
  FERRY_RETURN_IF_ERROR(MakeCurrent());
  FERRY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props_, ordinal));
  info_.backend = "cuda";
  info_.name = props_.name;
  info_.uuid = FormatUuid(props_.uuid);
  info_.driver_version = DriverVersionString();
  info_.total_memory = props_.totalGlobalMem;
  info_.compute_major = props_.major;
  info_.compute_minor = props_.minor;
  limits_.max_blocks =
      static_cast<uint32_t>(std::clamp(props_.multiProcessorCount * 16, 64, 65535));

  FERRY_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool_, ordinal));
  uint64_t threshold = UINT64_MAX;  // keep freed memory cached in the pool
  FERRY_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));

  // Raw kernels need the driver API; without it the device still serves built-in ops.
  auto api = cuda_internal::GetDriverApi();
  if (api.ok()) {
    driver_api_ = *api;
  } else {
    driver_api_status_ = api.status();
  }
  watcher_ = std::make_unique<CompletionWatcher>(ordinal);
  if (streams_ahead_ > 0) stream_maker_ = std::make_unique<StreamMaker>(ordinal, streams_ahead_);
  if (EagerModuleLoading()) LoadCublasNow();
  return Status::Ok();
}

bool CudaDevice::EagerModuleLoading() {
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  return mode != nullptr && std::string_view(mode) == "EAGER";
}

void CudaDevice::LoadCublasNow() {
  auto api = cuda_internal::GetCublasApi();
  if (!api.ok()) return;
  cublasHandle_t handle = nullptr;
  if ((*api)->Create(&handle) != CUBLAS_STATUS_SUCCESS) return;
  if (stream_maker_) {
    stream_maker_->MakeCublasAhead(*api, handle);
  } else {
    (void)(*api)->Destroy(handle);
  }
}

Status CudaDevice::MakeCurrent() const {
  return CudaStatus(cudaSetDevice(info_.ordinal), "cudaSetDevice");
}

Status CudaDevice::Check(cudaError_t error, std::string_view what) {
  Status status = CudaStatus(error, what);
  if (status.kind() == ErrorKind::kDeviceFault) watcher_->ReportFault(status);
  return status;
}

Status CudaDevice::CheckStatus(Status status) {
  if (status.kind() == ErrorKind::kDeviceFault) watcher_->ReportFault(status);
  return status;
}

// --- streams -----------------------------------------------------------------------------------

Result<std::unique_ptr<Stream>> CudaDevice::CreateStream() {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> stream, CudaStream::Create(this));
  return std::unique_ptr<Stream>(std::move(stream));
}

std::optional<ReadyStream> CudaDevice::TakeReadyStream() {
  return stream_maker_ ? stream_maker_->Take() : std::nullopt;
}

cublasHandle_t CudaDevice::TakeReadyCublas(const CublasApi* api) {
  if (!stream_maker_) return nullptr;
  stream_maker_->MakeCublasAhead(api);
  return stream_maker_->TakeCublas();
}

Result<ReadyStream> CudaDevice::MakeStreamNow() {
  Result<ReadyStream> made = MakeReadyStream();
  if (!made.ok()) return CheckStatus(made.status());
  return made;
}

void CudaDevice::RetireStream(ReadyStream closed) {
  if (stream_maker_) {
    stream_maker_->Retire(closed);
  } else {
    DestroyReadyStream(closed);
  }
}

// --- memory ------------------------------------------------------------------------------------

Status CudaDevice::RegisterHostMemory(void* ptr, uint64_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return InvalidArgument("RegisterHostMemory: null pointer or zero length");
  }
  FERRY_RETURN_IF_ERROR(MakeCurrent());
  FERRY_RETURN_IF_ERROR(
      CudaStatus(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable), "cudaHostRegister"));
  MutexLock lock(&registered_mu_);
  registered_.Add(ptr, bytes);  // CUDA accepted it, so no recorded range starts at ptr
  return Status::Ok();
}

Status CudaDevice::UnregisterHostMemory(void* ptr) {
  if (ptr == nullptr) return InvalidArgument("UnregisterHostMemory: null pointer");
  FERRY_RETURN_IF_ERROR(MakeCurrent());
  {
    MutexLock lock(&registered_mu_);
    registered_.Remove(ptr);
  }
  return CudaStatus(cudaHostUnregister(ptr), "cudaHostUnregister");
}

bool CudaDevice::IsRegisteredHost(const void* ptr, uint64_t bytes) const {
  MutexLock lock(&registered_mu_);
  return registered_.Contains(ptr, bytes);
}

uint64_t CudaDevice::bytes_in_use() const {
  MutexLock lock(&mu_);
  return bytes_in_use_;
}

uint64_t CudaDevice::free_memory() const {
  if (!MakeCurrent().ok()) return 0;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  // Memory the pool holds but no allocation uses is free for this process too.
  uint64_t reserved = 0, used = 0;
  if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess &&
      cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess &&
      reserved > used) {
    free += reserved - used;
  }
  (void)cudaGetLastError();
  return free;
}

Result<DevicePtr> CudaDevice::AllocateMemory(uint64_t bytes, cudaStream_t stream, bool zero) {
  if (bytes == 0) return InvalidArgument("Allocate: bytes must be positive");
  FERRY_RETURN_IF_ERROR(watcher_->fault());
  void* ptr = nullptr;
  cudaError_t error = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
  if (error == cudaErrorMemoryAllocation) {
    // The pool may cache memory freed earlier: give it back to the device and retry.
    (void)cudaGetLastError();
    (void)cudaMemPoolTrimTo(pool_, 0);
    (void)cudaGetLastError();
    error = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
  }
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it
    return Status(ErrorKind::kOutOfDeviceMemory, "Allocate: the device cannot provide " +
                                                     std::to_string(bytes) +
                                                     " bytes (cudaErrorMemoryAllocation)");
  }
  FERRY_RETURN_IF_ERROR(Check(error, "cudaMallocFromPoolAsync"));
  if (zero) {
    Status zeroed = Check(cudaMemsetAsync(ptr, 0, bytes, stream), "cudaMemsetAsync (zeroing)");
    if (!zeroed.ok()) {
      (void)cudaFreeAsync(ptr, stream);
      (void)cudaGetLastError();
      return zeroed;
    }
  }
  const auto base = static_cast<DevicePtr>(reinterpret_cast<uintptr_t>(ptr));
  MutexLock lock(&mu_);
  allocations_.Insert(base, bytes);
  bytes_in_use_ += bytes;
  return base;
}

uint64_t CudaDevice::ForgetAllocation(DevicePtr ptr) {
  MutexLock lock(&mu_);
  const std::optional<uint64_t> bytes = allocations_.Erase(ptr);
  if (!bytes) return 0;
  bytes_in_use_ -= *bytes;
  return *bytes;
}

Status CudaDevice::CheckRange(const Access& access) const {
  if (access.ptr == 0) return InvalidArgument(std::string(access.what) + ": null device pointer");
  if (access.bytes == 0) return Status::Ok();
  MutexLock lock(&mu_);
  // No entry is ever marked free-pending here (the free is enqueued after Forget).
  if (allocations_.Find(access.ptr, access.bytes) == AllocationTable::Range::kInside) {
    return Status::Ok();
  }
  return Status(ErrorKind::kOutOfRange, std::string(access.what) + ": " +
                                            std::to_string(access.bytes) +
                                            " bytes are not inside one live allocation");
}

// --- modules -----------------------------------------------------------------------------------

Result<std::shared_ptr<Module>> CudaDevice::LoadModule(ModuleFormat format,
                                                       std::string_view image) {
  if (format != ModuleFormat::kPtx && format != ModuleFormat::kCubin &&
      format != ModuleFormat::kCudaSource) {
    return InvalidArgument("LoadModule: unknown format " +
                           std::to_string(static_cast<int>(format)));
  }
  if (image.empty()) return CompileError("LoadModule: the module image is empty");
  if (driver_api_ == nullptr) return driver_api_status_;

  std::string key = ModuleCache::Key(format, image);
  if (std::shared_ptr<CudaModule> cached = modules_.Find(key)) {
    return std::shared_ptr<Module>(std::move(cached));
  }
  FERRY_ASSIGN_OR_RETURN(std::string loadable, LoadableImage(format, image, info_.compute_major,
                                                             info_.compute_minor, nvrtc_limits_));
  // Bounded before the driver sees it: what cannot be bounded is never loaded.
  FERRY_ASSIGN_OR_RETURN(const uint64_t device_bytes, ModuleFootprint(format, loadable));
  FERRY_RETURN_IF_ERROR(MakeCurrent());
  FERRY_ASSIGN_OR_RETURN(CUmodule handle, LoadImage(*driver_api_, loadable));
  return std::shared_ptr<Module>(modules_.Keep(
      std::move(key),
      std::make_shared<CudaModule>(info_.ordinal, driver_api_, handle, device_bytes)));
}

// --- the backend's entry points (backend.h) ----------------------------------------------------

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, const CudaDeviceOptions& options) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(ordinal, options));
  return std::unique_ptr<Device>(std::move(device));
}

Status ResetCudaContext(int ordinal) {
  // After a sticky fault most runtime calls, cudaSetDevice among them, report that fault
  // until the context is reset; so select the device, reset, and only then check.
  (void)cudaSetDevice(ordinal);
  (void)cudaGetLastError();
  cudaError_t err = cudaDeviceReset();
  (void)cudaGetLastError();
  FERRY_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice after reset"));
  if (err != cudaSuccess) {
    // The reset may report the fault it cleared; the fresh context is what matters, and
    // the caller checks it by creating a device.
    (void)err;
  }
  int count = 0;
  return CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount after reset");
}

}  // namespace ferry::backend
