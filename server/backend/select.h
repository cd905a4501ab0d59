// Backend selection: which Device ferryd serves, from the --backend flag.
#pragma once

#include <memory>
#include <string_view>

#include "backend/backend.h"

namespace ferry::backend {

/// Create the device for `kind`: "host", "cuda", or "auto" (CUDA when a CUDA device is
/// visible, else the host backend). `*why` receives a one-line reason for the choice.
Result<std::unique_ptr<Device>> CreateDevice(std::string_view kind, int ordinal,
                                             const HostDeviceOptions& host_options,
                                             std::string* why);

}  // namespace ferry::backend
