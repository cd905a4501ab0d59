#include "backend/cuda/nvrtc_helper/sandbox.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::backend::nvrtc_sandbox {
namespace {

// Which calls of an allowed syscall pass.
enum class When {
  kAlways,
  kOnSelf,  // its first argument, a pid, is 0: this process (another pid fails)
};

struct Allowed {
  long nr;
  When when;
};

// The syscalls a compile makes once NVRTC and its builtins are loaded, measured with
// `strace -f ferry-nvrtc` (NVRTC 13.0, glibc 2.36) over a small kernel (CUBIN and PTX), an
// 800 KiB module, a compile error, nesting 100,000 deep, and template bombs stopped by
// RLIMIT_AS and by RLIMIT_CPU. Each allowed one acts on this process alone. Refused, because
// they ask about the world outside it and NVRTC compiles the same without an answer: openat
// (libcuda.so.1, /etc/localtime, the includes), stat and newfstatat (the source's name, $PWD,
// library directories), getcwd, sysinfo, and lseek on stderr. NVRTC starts no thread,
// sends no signal, and no handler of its returns.
constexpr Allowed kAllowed[] = {
    {__NR_read, When::kAlways},           // the source, from fd 0 (fds 0 to 2 are all it has)
    {__NR_write, When::kAlways},          // the reply, to fd 1
    {__NR_brk, When::kAlways},            // malloc's heap (RLIMIT_AS bounds all memory)
    {__NR_mmap, When::kAlways},           // malloc's large blocks, anonymous
    {__NR_munmap, When::kAlways},         // ... freed
    {__NR_mremap, When::kAlways},         // ... grown (realloc, in the template bombs)
    {__NR_futex, When::kAlways},          // NVRTC's locks and one-time initialisations (a
                                          // successful compile crashes without it)
    {__NR_rt_sigaction, When::kAlways},   // NVRTC ignores SIGXFSZ, and exits on SIGINT and
                                          // SIGTERM (its handler calls exit_group)
    {__NR_clock_gettime, When::kAlways},  // NVRTC's own CPU time (no vDSO path for it)
    {__NR_gettid, When::kAlways},         // NVRTC asks, thousands of times in a large compile
    {__NR_prlimit64, When::kOnSelf},      // NVRTC lifts its stack's soft limit while it
                                          // compiles (deep nesting crashes without it)
    {__NR_exit_group, When::kAlways},     // the end
};

#if defined(__x86_64__)
constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr uint32_t kFirstArgLow = offsetof(struct seccomp_data, args[0]);
#else
constexpr uint32_t kFirstArgLow = offsetof(struct seccomp_data, args[0]) + 4;
#endif

}  // namespace

bool InstallCompileFilter() {
#if !defined(__x86_64__) && !defined(__aarch64__)
  return false;  // a table for another architecture's syscall numbers is not written
#else
  constexpr uint32_t kRefuse = SECCOMP_RET_ERRNO | (kRefusedErrno & SECCOMP_RET_DATA);
  std::vector<sock_filter> f;
  // Another ABI's numbers mean other syscalls: kill rather than judge them by this table.
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)));
#if defined(__x86_64__)
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, __X32_SYSCALL_BIT, 0, 1));  // the x32 ABI
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
#endif
  // One block per allowed syscall, skipped unless the number matches; every block returns,
  // so the number stays in the accumulator from one test to the next.
  for (const Allowed& a : kAllowed) {
    const auto nr = static_cast<uint32_t>(a.nr);
    if (a.when == When::kAlways) {
      f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
      f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    } else {
      // The kernel reads a pid_t argument as the register's low 32 bits; so does this test.
      f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 4));
      f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kFirstArgLow));
      f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1));
      f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
      f.push_back(BPF_STMT(BPF_RET | BPF_K, kRefuse));
    }
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, kRefuse));
  sock_fprog prog = {static_cast<unsigned short>(f.size()), f.data()};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  // TSYNC: every thread of the process, should a library have started one.
  return ::syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) == 0;
#endif
}

}  // namespace ferry::backend::nvrtc_sandbox
