// Access and Address: how the CUDA backend names the device memory an op touches.
//
// Every op a CudaStream enqueues lists its device ranges as Accesses; CudaDevice::CheckRange
// checks each against the live allocations before the op is enqueued, and a CudaGraph keeps
// those of its nodes to check them again at every replay (memory may have been freed since
// the capture). Plain values: no locking, no ownership.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace ferry::backend {

/// The device address `ptr` as the pointer CUDA's calls take.
inline void* Address(DevicePtr ptr) { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)); }

/// A device range an op touches, checked against the live allocations at enqueue (and
/// again at every replay of a graph that recorded it). `written`: the op writes the range,
/// which decides whether an elementwise op may join a fused run (ElementwiseRun).
struct Access {
  DevicePtr ptr = 0;
  uint64_t bytes = 0;
  const char* what = "";
  bool written = false;
};

}  // namespace ferry::backend
