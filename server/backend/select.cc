#include "backend/select.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include "backend/host/host_device.h"

namespace ferry::backend {

int DefaultNvrtcConcurrency() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 4);
}

Result<std::unique_ptr<Device>> CreateDevice(std::string_view kind, int ordinal,
                                             const HostDeviceOptions& host_options,
                                             std::string* why) {
  if (ordinal < 0) return Status(ErrorKind::kInvalidArgument, "device ordinal must be >= 0");
  if (kind == "host") {
    *why = "host backend requested";
    HostDeviceOptions o = host_options;
    o.ordinal = ordinal;
    return CreateHostDevice(o);
  }
  if (kind == "cuda") {
    *why = "cuda backend requested";
    return CreateCudaDevice(ordinal);
  }
  if (kind == "auto") {
    int count = CudaDeviceCount();
    if (count > ordinal) {
      *why = "auto: " + std::to_string(count) + " CUDA device(s) visible";
      return CreateCudaDevice(ordinal);
    }
    *why = count == 0 ? "auto: no CUDA device visible"
                      : "auto: CUDA device " + std::to_string(ordinal) + " not visible (" +
                            std::to_string(count) + " present)";
    HostDeviceOptions o = host_options;
    o.ordinal = ordinal;
    return CreateHostDevice(o);
  }
  return Status(ErrorKind::kInvalidArgument,
                "--backend must be host, cuda or auto, got " + std::string(kind));
}

Result<DeviceFactory> MakeDeviceFactory(std::string_view kind, int ordinal,
                                        const HostDeviceOptions& host_options,
                                        const CudaDeviceOptions& cuda_options,
                                        uint64_t host_fault_after_ops_for_test,
                                        bool host_rebuild_fails_for_test) {
  if (ordinal < 0) return Status(ErrorKind::kInvalidArgument, "device ordinal must be >= 0");
  DeviceFactory f;
  bool cuda = false;
  if (kind == "cuda") {
    cuda = true;
    f.why = "cuda backend requested";
  } else if (kind == "host") {
    f.why = "host backend requested";
  } else if (kind == "auto") {
    int count = CudaDeviceCount();
    cuda = count > ordinal;
    f.why = cuda         ? "auto: " + std::to_string(count) + " CUDA device(s) visible"
            : count == 0 ? "auto: no CUDA device visible"
                         : "auto: CUDA device " + std::to_string(ordinal) + " not visible (" +
                               std::to_string(count) + " present)";
  } else {
    return Status(ErrorKind::kInvalidArgument,
                  "--backend must be host, cuda or auto, got " + std::string(kind));
  }
  if (cuda) {
    f.create = [ordinal, cuda_options] { return CreateCudaDevice(ordinal, cuda_options); };
    f.reset_context = [ordinal] { return ResetCudaContext(ordinal); };
    return f;
  }
  HostDeviceOptions options = host_options;
  options.ordinal = ordinal;
  auto armed = std::make_shared<std::atomic<uint64_t>>(host_fault_after_ops_for_test);
  auto created = std::make_shared<std::atomic<int>>(0);
  f.create = [options, armed, created,
              host_rebuild_fails_for_test]() -> Result<std::unique_ptr<Device>> {
    if (created->fetch_add(1) > 0 && host_rebuild_fails_for_test) {
      return Status(ErrorKind::kUnavailable, "host device rebuild refused (test)");
    }
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<HostDevice> device, HostDevice::Create(options));
    if (uint64_t after = armed->exchange(0)) {
      device->InjectFaultForTest(
          after, Status(ErrorKind::kDeviceFault, "injected host device fault (test)"));
    }
    return std::unique_ptr<Device>(std::move(device));
  };
  return f;
}

}  // namespace ferry::backend
