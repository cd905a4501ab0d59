// Backend selection: which Device ferryd serves, from the --backend flag.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "backend/backend.h"

namespace ferry::backend {

/// Create the device for `kind`: "host", "cuda", or "auto" (CUDA when a CUDA device is
/// visible, else the host backend). `*why` receives a one-line reason for the choice.
Result<std::unique_ptr<Device>> CreateDevice(std::string_view kind, int ordinal,
                                             const HostDeviceOptions& host_options,
                                             std::string* why);

/// How to (re)create the daemon's device, and how to reset its context after a fault.
struct DeviceFactory {
  std::function<Result<std::unique_ptr<Device>>()> create;
  std::function<Status()> reset_context;  // empty for the host backend
  std::string why;                        // which backend was picked, and why
};

/// Decide the backend once (for "auto": CUDA if visible) and return a factory for it.
/// `host_fault_after_ops_for_test` > 0 arms a device fault on the first host device only
/// (tests of fault recovery through a real ferryd).
Result<DeviceFactory> MakeDeviceFactory(std::string_view kind, int ordinal,
                                        const HostDeviceOptions& host_options,
                                        const CudaDeviceOptions& cuda_options = {},
                                        uint64_t host_fault_after_ops_for_test = 0,
                                        bool host_rebuild_fails_for_test = false);

}  // namespace ferry::backend
