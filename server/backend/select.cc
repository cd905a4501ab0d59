#include "backend/select.h"

#include <string>

namespace ferry::backend {

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

}  // namespace ferry::backend
