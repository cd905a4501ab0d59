// The seccomp filter a CUDA C++ compile runs under in ferry-nvrtc (ferry_nvrtc.cc), apart so
// that a test can run probes under the very same filter (tests/unit/nvrtc_sandbox_test.cc).
//
// It is an allow-list: the few syscalls NVRTC 13.0 makes during a compile (measured with
// strace over small and large modules, compile errors, and the memory and CPU limits; the
// table in sandbox.cc says why each is needed). Every other syscall fails with EPERM:
// opening, stat-ing or executing anything, sockets, io_uring, pidfds, signals to any
// process, new processes or threads, new descriptors (dup, fcntl F_DUPFD, memfd, eventfd,
// epoll, ...), ptrace and reading other processes' memory. A syscall of another ABI (i386,
// x32) kills the process. No CUDA here.
#pragma once

#include <cerrno>

namespace ferry::backend::nvrtc_sandbox {

/// The errno every syscall outside the allow-list fails with.
inline constexpr int kRefusedErrno = EPERM;

/// Install the compile filter on the calling process, for good (PR_SET_NO_NEW_PRIVS first,
/// then the filter on every thread). Call it once everything the compile needs is loaded:
/// from then on nothing more can be opened. Return false, with nothing installed, on an
/// architecture the table does not cover (only x86_64 and aarch64) or when the kernel refuses
/// the filter.
bool InstallCompileFilter();

}  // namespace ferry::backend::nvrtc_sandbox
