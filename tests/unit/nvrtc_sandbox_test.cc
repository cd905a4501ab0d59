// The seccomp allow-list CUDA C++ compiles run under (server/backend/cuda/nvrtc_helper/
// sandbox.h), with an attacker's syscalls. A child process installs the very filter
// ferry-nvrtc installs (the same function) and tries each: every one must fail with EPERM,
// while what a compile needs still works, and a syscall of another ABI kills it. Then the real
// helper, built with the CUDA toolkit (no GPU needed), compiles under it: a kernel to PTX,
// deep nesting, and a compile error with its log. Where the helper is not built those tests
// skip, saying so.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/nvrtc_helper/nvrtc_reply.h"
#include "backend/cuda/nvrtc_helper/sandbox.h"
#include "sanitizer_build.h"

extern char** environ;

namespace ferry::backend {
namespace {

#if defined(__x86_64__) || defined(__aarch64__)

#ifdef FERRY_UNDER_TSAN
#define FERRY_SKIP_UNDER_TSAN()                                                                 \
  GTEST_SKIP() << "ThreadSanitizer runs a thread of its own in a forked child, whose syscalls " \
                  "the filter refuses (it crashes there); the plain and ASan builds run this"
#else
#define FERRY_SKIP_UNDER_TSAN() \
  do {                          \
  } while (0)
#endif

// What a probe may use, made before the filter is on.
struct ProbeContext {
  pid_t parent = 0;  // the test process: another process
  pid_t self = 0;
  int self_pidfd = -1;
  int pipe_read = -1;            // holds one byte to read
  char* thread_stack = nullptr;  // the top of 64 KiB, zeroed
};

struct Probe {
  const char* name;
  long (*call)(const ProbeContext&);
};

// What a hostile compile would try, each of which the filter must refuse. Without the filter
// most of them succeed here (ProbesReachTheKernelWithoutTheFilter); paths that exist are only
// opened, never written, and the programs and sockets named do not exist. Raw syscalls, with
// every argument the kernel reads as a long passed as one.
const Probe kRefused[] = {
    {"io_uring_setup",
     [](const ProbeContext&) {
       char params[120] = {};  // struct io_uring_params
       return ::syscall(__NR_io_uring_setup, 8, params);
     }},
    {"io_uring_enter",
     [](const ProbeContext&) { return ::syscall(__NR_io_uring_enter, 0, 1, 0, 0, nullptr, 0ul); }},
    {"io_uring_register",
     [](const ProbeContext&) { return ::syscall(__NR_io_uring_register, 0, 0, nullptr, 0); }},
    {"pidfd_open", [](const ProbeContext& c) { return ::syscall(__NR_pidfd_open, c.parent, 0); }},
    {"pidfd_getfd (of its own fd 1)",
     [](const ProbeContext& c) { return ::syscall(__NR_pidfd_getfd, c.self_pidfd, 1, 0); }},
    {"pidfd_send_signal",
     [](const ProbeContext& c) {
       return ::syscall(__NR_pidfd_send_signal, c.self_pidfd, 0, nullptr, 0);
     }},
    {"kill (another process)",
     [](const ProbeContext& c) { return ::syscall(__NR_kill, c.parent, 0); }},
    {"kill (itself)", [](const ProbeContext& c) { return ::syscall(__NR_kill, c.self, 0); }},
    {"tkill", [](const ProbeContext& c) { return ::syscall(__NR_tkill, c.parent, 0); }},
    {"tgkill", [](const ProbeContext& c) { return ::syscall(__NR_tgkill, c.parent, c.parent, 0); }},
#ifdef __NR_fork
    {"fork",
     [](const ProbeContext&) {
       const long r = ::syscall(__NR_fork);
       if (r == 0) ::syscall(__NR_exit_group, 0);
       return r;
     }},
#endif
    {"clone (a process)",
     [](const ProbeContext&) {
       const long r = ::syscall(__NR_clone, static_cast<unsigned long>(SIGCHLD), nullptr, nullptr,
                                nullptr, 0ul);
       if (r == 0) ::syscall(__NR_exit_group, 0);
       return r;
     }},
    {"clone3 (a process)",
     [](const ProbeContext&) {
       uint64_t args[8] = {};  // struct clone_args, its first version
       args[4] = SIGCHLD;      // exit_signal
       const long r = ::syscall(__NR_clone3, args, sizeof(args));
       if (r == 0) ::syscall(__NR_exit_group, 0);
       return r;
     }},
    {"execve",
     [](const ProbeContext&) {
       char* argv[] = {nullptr};
       return ::syscall(__NR_execve, "/nonexistent/ferry-probe", argv, environ);
     }},
    {"execveat",
     [](const ProbeContext&) {
       char* argv[] = {nullptr};
       return ::syscall(__NR_execveat, AT_FDCWD, "/nonexistent/ferry-probe", argv, environ, 0);
     }},
#ifdef __NR_open
    {"open", [](const ProbeContext&) { return ::syscall(__NR_open, "/etc/passwd", O_RDONLY); }},
#endif
#ifdef __NR_creat
    {"creat", [](const ProbeContext&) { return ::syscall(__NR_creat, "/nonexistent/f", 0600); }},
#endif
    {"openat",
     [](const ProbeContext&) { return ::syscall(__NR_openat, AT_FDCWD, "/etc/passwd", O_RDONLY); }},
    {"openat2",
     [](const ProbeContext&) {
       uint64_t how[3] = {O_RDONLY, 0, 0};  // struct open_how
       return ::syscall(__NR_openat2, AT_FDCWD, "/etc/passwd", how, sizeof(how));
     }},
    {"open_by_handle_at",
     [](const ProbeContext&) {
       char handle[64] = {};
       return ::syscall(__NR_open_by_handle_at, AT_FDCWD, handle, O_RDONLY);
     }},
    {"newfstatat (a file's existence)",
     [](const ProbeContext&) {
       char st[256];
       return ::syscall(__NR_newfstatat, AT_FDCWD, "/etc/passwd", st, 0);
     }},
    {"faccessat",
     [](const ProbeContext&) { return ::syscall(__NR_faccessat, AT_FDCWD, "/etc/passwd", R_OK); }},
    {"readlinkat",
     [](const ProbeContext&) {
       char buf[256];
       return ::syscall(__NR_readlinkat, AT_FDCWD, "/proc/self/exe", buf, sizeof(buf));
     }},
    {"socket", [](const ProbeContext&) { return ::syscall(__NR_socket, AF_UNIX, SOCK_STREAM, 0); }},
    {"socketpair",
     [](const ProbeContext&) {
       int sv[2];
       return ::syscall(__NR_socketpair, AF_UNIX, SOCK_STREAM, 0, sv);
     }},
    {"connect",
     [](const ProbeContext&) {
       sockaddr_un a = {};
       a.sun_family = AF_UNIX;
       std::strcpy(a.sun_path, "/nonexistent/ferry.sock");
       return ::syscall(__NR_connect, 1, &a, sizeof(a));
     }},
    {"ptrace",
     [](const ProbeContext& c) {
       return ::syscall(__NR_ptrace, static_cast<long>(PTRACE_PEEKDATA),
                        static_cast<long>(c.parent), 0l, 0l);
     }},
    {"process_vm_readv (its own memory)",
     [](const ProbeContext& c) {
       char from[8] = "secret", to[8];
       iovec local = {to, sizeof(to)}, remote = {from, sizeof(from)};
       return ::syscall(__NR_process_vm_readv, c.self, &local, 1ul, &remote, 1ul, 0ul);
     }},
    {"process_vm_writev (its own memory)",
     [](const ProbeContext& c) {
       char from[8] = "secret", to[8];
       iovec local = {from, sizeof(from)}, remote = {to, sizeof(to)};
       return ::syscall(__NR_process_vm_writev, c.self, &local, 1ul, &remote, 1ul, 0ul);
     }},
    {"dup", [](const ProbeContext&) { return ::syscall(__NR_dup, 1); }},
#ifdef __NR_dup2
    {"dup2", [](const ProbeContext&) { return ::syscall(__NR_dup2, 1, 900); }},
#endif
    {"dup3", [](const ProbeContext&) { return ::syscall(__NR_dup3, 1, 901, 0); }},
    {"fcntl F_DUPFD", [](const ProbeContext&) { return ::syscall(__NR_fcntl, 1, F_DUPFD, 0ul); }},
    {"fcntl F_DUPFD_CLOEXEC",
     [](const ProbeContext&) { return ::syscall(__NR_fcntl, 1, F_DUPFD_CLOEXEC, 0ul); }},
    {"memfd_create", [](const ProbeContext&) { return ::syscall(__NR_memfd_create, "x", 0); }},
    {"eventfd2", [](const ProbeContext&) { return ::syscall(__NR_eventfd2, 0, 0); }},
    {"timerfd_create",
     [](const ProbeContext&) { return ::syscall(__NR_timerfd_create, CLOCK_MONOTONIC, 0); }},
    {"signalfd4",
     [](const ProbeContext&) {
       uint64_t mask = 0;
       return ::syscall(__NR_signalfd4, -1, &mask, sizeof(mask), 0);
     }},
    {"epoll_create1", [](const ProbeContext&) { return ::syscall(__NR_epoll_create1, 0); }},
    {"inotify_init1", [](const ProbeContext&) { return ::syscall(__NR_inotify_init1, 0); }},
    {"userfaultfd", [](const ProbeContext&) { return ::syscall(__NR_userfaultfd, 0); }},
    {"perf_event_open",
     [](const ProbeContext&) {
       uint32_t attr[32] = {};  // struct perf_event_attr: the CPU clock (software) of itself
       attr[0] = 1;             // PERF_TYPE_SOFTWARE
       attr[1] = sizeof(attr);  // its size
       return ::syscall(__NR_perf_event_open, attr, 0, -1, -1, 0ul);
     }},
    {"bpf",
     [](const ProbeContext&) {
       char attr[128] = {};
       return ::syscall(__NR_bpf, 0 /* BPF_MAP_CREATE */, attr, sizeof(attr));
     }},
    {"prlimit64 (another process)",
     [](const ProbeContext& c) {
       rlimit old;
       return ::syscall(__NR_prlimit64, c.parent, RLIMIT_AS, nullptr, &old);
     }},
    {"getcwd",
     [](const ProbeContext&) {
       char buf[256];
       return ::syscall(__NR_getcwd, buf, sizeof(buf));
     }},
};

// A thread, refused too (NVRTC starts none). Not run without the filter: the thread would
// return from syscall() onto a zeroed stack and crash the child, which is how the test fails
// should the filter let it through.
const Probe kThread[] = {
    {"clone (a thread)",
     [](const ProbeContext& c) {
       const unsigned long flags =
           CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
       return ::syscall(__NR_clone, flags, c.thread_stack, nullptr, nullptr, 0ul);
     }},
};

// What a compile needs (sandbox.cc's table), each of which must still work.
const Probe kAllowed[] = {
    {"read",
     [](const ProbeContext& c) {
       char b;
       return ::syscall(__NR_read, c.pipe_read, &b, 1ul);
     }},
    {"mmap, mremap and munmap of anonymous memory",
     [](const ProbeContext&) -> long {
       void* p =
           reinterpret_cast<void*>(::syscall(__NR_mmap, nullptr, 4096ul, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0l));
       if (p == MAP_FAILED) return -1;
       static_cast<char*>(p)[0] = 1;
       void* q = reinterpret_cast<void*>(::syscall(__NR_mremap, p, 4096ul, 8192ul, MREMAP_MAYMOVE));
       if (q == MAP_FAILED) return -1;
       return ::syscall(__NR_munmap, q, 8192ul);
     }},
    {"brk", [](const ProbeContext&) -> long { return ::syscall(__NR_brk, 0ul) > 0 ? 0 : -1; }},
    {"futex",
     [](const ProbeContext&) {
       static int word = 0;
       return ::syscall(__NR_futex, &word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
     }},
    {"clock_gettime (its CPU time)",
     [](const ProbeContext&) {
       timespec t;
       return ::syscall(__NR_clock_gettime, CLOCK_PROCESS_CPUTIME_ID, &t);
     }},
    {"gettid", [](const ProbeContext&) { return ::syscall(__NR_gettid); }},
    {"prlimit64 (its own stack)",
     [](const ProbeContext&) -> long {
       rlimit stack;
       if (::syscall(__NR_prlimit64, 0, RLIMIT_STACK, nullptr, &stack) != 0) return -1;
       return ::syscall(__NR_prlimit64, 0, RLIMIT_STACK, &stack, nullptr);
     }},
    {"rt_sigaction",
     [](const ProbeContext&) {
       char old[64];
       return ::syscall(__NR_rt_sigaction, SIGUSR1, nullptr, old, 8ul);
     }},
};

struct Outcome {
  long result;
  int error;  // errno when result is -1
};

/// Run every probe of `probes` in a child, after installing the compile filter when `filtered`;
/// the outcomes in order. The child writes them to a pipe: under the filter, write is the one
/// syscall the results need. Empty, with a failure recorded, when the child failed. Once the
/// filter is on the child makes raw syscalls only: a sanitizer's interceptors (of _exit,
/// write, getpid) make syscalls of their own that the filter refuses.
std::vector<Outcome> RunProbes(const Probe* probes, size_t n, bool filtered) {
  int results[2], input[2];
  if (::pipe(results) != 0 || ::pipe(input) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  (void)!::write(input[1], "x", 1);
  constexpr size_t kStack = 64 << 10;
  void* stack = ::mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ProbeContext context;
  context.parent = ::getpid();
  context.pipe_read = input[0];
  context.thread_stack = static_cast<char*>(stack) + kStack;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(results[0]);
    context.self = ::getpid();
    context.self_pidfd = static_cast<int>(::syscall(__NR_pidfd_open, context.self, 0));
    if (filtered && !nvrtc_sandbox::InstallCompileFilter()) ::syscall(__NR_exit_group, 2);
    for (size_t i = 0; i < n; ++i) {
      errno = 0;
      Outcome o;
      o.result = probes[i].call(context);
      o.error = o.result == -1 ? errno : 0;
      if (::syscall(__NR_write, results[1], &o, sizeof(o)) != static_cast<long>(sizeof(o))) {
        ::syscall(__NR_exit_group, 3);
      }
    }
    ::syscall(__NR_exit_group, 0);
  }
  ::munmap(stack, kStack);
  ::close(results[1]);
  ::close(input[0]);
  ::close(input[1]);
  std::vector<Outcome> outcomes;
  Outcome o;
  while (::read(results[0], &o, sizeof(o)) == static_cast<ssize_t>(sizeof(o))) {
    outcomes.push_back(o);
  }
  ::close(results[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || outcomes.size() != n) {
    ADD_FAILURE() << "the probe child ended with status " << status << " after " << outcomes.size()
                  << " of " << n << " probes"
                  << (WIFEXITED(status) && WEXITSTATUS(status) == 2 ? " (no filter installed)"
                                                                    : "");
    return {};
  }
  return outcomes;
}

TEST(NvrtcSandboxTest, EverythingButWhatACompileNeedsIsRefused) {
  FERRY_SKIP_UNDER_TSAN();
  const size_t n = sizeof(kRefused) / sizeof(kRefused[0]);
  const std::vector<Outcome> outcomes = RunProbes(kRefused, n, true);
  ASSERT_EQ(outcomes.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(outcomes[i].result, -1) << kRefused[i].name << " ran under the filter";
    EXPECT_EQ(outcomes[i].error, nvrtc_sandbox::kRefusedErrno)
        << kRefused[i].name << ": " << std::strerror(outcomes[i].error);
  }
}

// The refusals above are the filter's: without it, the same probes open the file, make the
// descriptors, signal and start processes here.
TEST(NvrtcSandboxTest, ProbesReachTheKernelWithoutTheFilter) {
  const size_t n = sizeof(kRefused) / sizeof(kRefused[0]);
  const std::vector<Outcome> outcomes = RunProbes(kRefused, n, false);
  ASSERT_EQ(outcomes.size(), n);
  const std::vector<std::string> succeed = {"pidfd_open",
                                            "pidfd_getfd (of its own fd 1)",
                                            "kill (another process)",
                                            "openat",
                                            "newfstatat (a file's existence)",
                                            "socket",
                                            "dup",
                                            "fcntl F_DUPFD",
                                            "memfd_create",
                                            "eventfd2",
                                            "clone (a process)",
                                            "process_vm_readv (its own memory)"};
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& name : succeed) {
      if (name == kRefused[i].name) {
        EXPECT_GE(outcomes[i].result, 0) << name << ": " << std::strerror(outcomes[i].error);
      }
    }
  }
}

TEST(NvrtcSandboxTest, NoThreadStarts) {
  FERRY_SKIP_UNDER_TSAN();
  const std::vector<Outcome> outcomes = RunProbes(kThread, 1, true);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].result, -1) << "a thread started under the filter";
  EXPECT_EQ(outcomes[0].error, nvrtc_sandbox::kRefusedErrno) << std::strerror(outcomes[0].error);
}

TEST(NvrtcSandboxTest, WhatACompileNeedsStillWorks) {
  FERRY_SKIP_UNDER_TSAN();
  const size_t n = sizeof(kAllowed) / sizeof(kAllowed[0]);
  const std::vector<Outcome> outcomes = RunProbes(kAllowed, n, true);
  ASSERT_EQ(outcomes.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_GE(outcomes[i].result, 0)
        << kAllowed[i].name << ": " << std::strerror(outcomes[i].error);
  }
}

/// The signal that ended a child that installed the filter and then ran `call`, or 0 when it
/// exited.
int SignalOfFilteredChild(void (*call)()) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (!nvrtc_sandbox::InstallCompileFilter()) ::syscall(__NR_exit_group, 2);
    call();
    ::syscall(__NR_exit_group, 0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

#if defined(__x86_64__)
// A syscall of the x32 ABI (the same numbers, another table) is not judged by the table: the
// process is killed.
TEST(NvrtcSandboxTest, AnotherAbisSyscallKills) {
  FERRY_SKIP_UNDER_TSAN();
  EXPECT_EQ(SignalOfFilteredChild([] { ::syscall(__X32_SYSCALL_BIT | __NR_getpid); }), SIGSYS);
}
#endif

#endif  // __x86_64__ || __aarch64__

// --- the helper itself -------------------------------------------------------------------

struct HelperRun {
  int status = -1;  // waitpid's
  nvrtc_reply::Header header = {};
  std::string image, text;
};

/// Run ferry-nvrtc on `source` as ferryd does (one socket for stdin and stdout, stderr to
/// /dev/null), for compute capability major.minor.
HelperRun RunHelper(const std::string& helper, const std::string& source, int major, int minor) {
  HelperRun run;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return run;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {helper, std::to_string(major), std::to_string(minor),
                                   std::to_string(4ull << 30), "60"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, helper.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(sv[1]);
  if (spawned != 0) {
    ::close(sv[0]);
    return run;
  }
  // The source fits the socket's buffer or is read as it is sent; the reply comes after.
  size_t sent = 0;
  while (sent < source.size()) {
    const ssize_t w = ::send(sv[0], source.data() + sent, source.size() - sent, MSG_NOSIGNAL);
    if (w <= 0) break;
    sent += static_cast<size_t>(w);
  }
  ::shutdown(sv[0], SHUT_WR);
  std::string out;
  char buf[65536];
  for (ssize_t r; (r = ::recv(sv[0], buf, sizeof(buf), 0)) > 0;) {
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(sv[0]);
  ::waitpid(pid, &run.status, 0);
  if (out.size() >= sizeof(run.header)) {
    std::memcpy(&run.header, out.data(), sizeof(run.header));
    if (run.header.image_bytes <= out.size() - sizeof(run.header)) {
      run.image = out.substr(sizeof(run.header), run.header.image_bytes);
      run.text = out.substr(sizeof(run.header) + run.header.image_bytes);
    }
  }
  return run;
}

std::string HelperPath() {
#ifdef FERRY_NVRTC_HELPER_PATH
  if (::access(FERRY_NVRTC_HELPER_PATH, X_OK) == 0) return FERRY_NVRTC_HELPER_PATH;
#endif
  return "";
}

#define FERRY_SKIP_WITHOUT_HELPER()                                                        \
  do {                                                                                     \
    if (HelperPath().empty()) {                                                            \
      GTEST_SKIP() << "ferry-nvrtc is not built here (it needs the CUDA toolkit's NVRTC)"; \
    }                                                                                      \
  } while (0)

constexpr char kAxpb[] = R"(
extern "C" __global__ void axpb(float* out, const float* in, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b;
}
)";

// Compute capability 9.9 has no CUBIN in NVRTC: PTX for the newest architecture below it.
TEST(NvrtcHelperTest, CompilesAKernelToPtxUnderItsFilter) {
  FERRY_SKIP_WITHOUT_HELPER();
  const HelperRun run = RunHelper(HelperPath(), kAxpb, 9, 9);
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) << run.status;
  ASSERT_EQ(std::string(run.header.magic, 4), "FNV1");
  if (run.header.code == nvrtc_reply::kUnsupported) GTEST_SKIP() << run.text;
  ASSERT_EQ(run.header.code, nvrtc_reply::kOk) << run.text;
  EXPECT_EQ(run.header.image_kind, nvrtc_reply::kPtx);
  EXPECT_NE(run.image.find(".entry axpb"), std::string::npos) << run.image.substr(0, 400);
}

// NVRTC lifts its stack limit for deep nesting (prlimit64 on itself): the filter lets it.
TEST(NvrtcHelperTest, DeepNestingCompilesUnderItsFilter) {
  FERRY_SKIP_WITHOUT_HELPER();
  const int depth = 30000;
  const std::string source = "__device__ int f() { return " + std::string(depth, '(') + "1" +
                             std::string(depth, ')') + "; }\n" + kAxpb;
  const HelperRun run = RunHelper(HelperPath(), source, 9, 9);
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0)
      << "the helper died: " << run.status;
  if (run.header.code == nvrtc_reply::kUnsupported) GTEST_SKIP() << run.text;
  EXPECT_EQ(run.header.code, nvrtc_reply::kOk) << run.text;
}

TEST(NvrtcHelperTest, ACompileErrorStillReturnsItsLog) {
  FERRY_SKIP_WITHOUT_HELPER();
  const HelperRun run =
      RunHelper(HelperPath(), "__global__ void b() { undeclared_identifier_xyz; }\n", 9, 9);
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) << run.status;
  if (run.header.code == nvrtc_reply::kUnsupported) GTEST_SKIP() << run.text;
  EXPECT_EQ(run.header.code, nvrtc_reply::kCompileError) << run.text;
  EXPECT_NE(run.text.find("undeclared_identifier_xyz"), std::string::npos) << run.text;
}

}  // namespace
}  // namespace ferry::backend
