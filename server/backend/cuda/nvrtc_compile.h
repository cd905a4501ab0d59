// Compiling a client's CUDA C++ module without letting it read a file or stall the daemon.
//
// CompileCudaSource checks the source (backend/cuda_source_check.h), then runs NVRTC in a
// helper process, ferry-nvrtc (cuda/nvrtc_helper/ferry_nvrtc.cc), started per compile with
// posix_spawn: an address-space limit (memory), a CPU-time limit and a wall-clock deadline
// (timeout) after which ferryd kills it, and a seccomp allow-list under which it can open,
// probe or start nothing (cuda/nvrtc_helper/sandbox.h). The daemon only pays a process start
// per compile (modules are cached by content), and never loads NVRTC itself.
//
// No CUDA types here; tests call it without a device (tests/conformance/cuda_module_test.cc).
// Thread-safe: every call has its own process and pipes.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::backend {

struct NvrtcLimits {
  std::chrono::milliseconds timeout{30000};  // wall clock; the CPU limit is the same, rounded up
  uint64_t memory_bytes = 4ull << 30;        // the helper's address space (RLIMIT_AS)
  // Compiles running at once in this process, whatever their limits (each holds the calling
  // thread, a helper process and up to memory_bytes); one more is refused with BUSY.
  int max_concurrent = 4;
  std::string helper;  // ferry-nvrtc; empty: next to this executable, else the installed one
};

struct CompiledSource {
  std::string image;  // a CUBIN, or PTX (NUL-terminated) for the driver to JIT
  bool ptx = false;
};

/// Compile `source` for compute capability major.minor. COMPILE_ERROR with NVRTC's log (cut
/// at 64 KiB) when it does not build, or with the reason when the source names a file;
/// QUOTA_EXCEEDED ("compile time/memory limit") when the compile ran past `limits`;
/// UNSUPPORTED when NVRTC or the helper is missing; BUSY when limits.max_concurrent compiles
/// are running already (nothing is started; the caller may retry); INTERNAL when the helper
/// failed otherwise.
Result<CompiledSource> CompileCudaSource(std::string_view source, int major, int minor,
                                         const NvrtcLimits& limits);

/// Compiles running now in this process (for tests).
int CompilesRunningForTest();

}  // namespace ferry::backend
