#include "backend/cuda/nvrtc_compile.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <vector>

#include "backend/cuda/nvrtc_helper/nvrtc_reply.h"
#include "backend/cuda_source_check.h"

extern char** environ;

namespace ferry::backend {
namespace {

namespace reply = nvrtc_reply;

// The most reply bytes read from the helper: a module's image plus its log.
constexpr uint64_t kMaxReplyBytes = 512ull << 20;

std::string HelperPath(const NvrtcLimits& limits) {
  if (!limits.helper.empty()) return limits.helper;
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string path(self, static_cast<size_t>(n));
    path = path.substr(0, path.rfind('/') + 1) + "ferry-nvrtc";
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
#ifdef FERRY_NVRTC_HELPER_INSTALLED
  return FERRY_NVRTC_HELPER_INSTALLED;
#else
  return "ferry-nvrtc";
#endif
}

Status LimitHit(const NvrtcLimits& limits, const std::string& how) {
  return Status(ErrorKind::kQuotaExceeded,
                "CUDA C++ compile stopped at its compile time/memory limit (nvrtc-timeout " +
                    std::to_string(limits.timeout.count()) + " ms, nvrtc-memory " +
                    std::to_string(limits.memory_bytes) + " bytes): " + how);
}

// Compiles running in this process: each holds its caller's thread (a session executor's),
// a helper process and its address space until it ends, so they are bounded
// (NvrtcLimits::max_concurrent, the daemon's nvrtc-concurrency).
std::atomic<int> compiles_running{0};

// A place among the running compiles, held for one compile.
class CompileSlot {
 public:
  explicit CompileSlot(int max) {
    int n = compiles_running.load();
    do {
      if (n >= max) return;
    } while (!compiles_running.compare_exchange_weak(n, n + 1));
    held_ = true;
  }
  ~CompileSlot() {
    if (held_) compiles_running.fetch_sub(1);
  }
  CompileSlot(const CompileSlot&) = delete;
  CompileSlot& operator=(const CompileSlot&) = delete;
  bool held() const { return held_; }

 private:
  bool held_ = false;
};

// A helper process started for one compile, and the daemon's end of its socket.
struct Helper {
  pid_t pid = -1;
  int sock = -1;
};

// Start `helper` for a compile for major.minor within `limits`: its stdin and stdout are one
// socket both ways (send with MSG_NOSIGNAL: a helper that died gives EPIPE, not SIGPIPE to
// the daemon), its stderr /dev/null; the daemon's end is non-blocking.
Result<Helper> StartHelper(const std::string& helper, int major, int minor,
                           const NvrtcLimits& limits) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status(ErrorKind::kInternal, std::string("socketpair: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  const auto cpu_seconds = std::max<int64_t>(1, (limits.timeout.count() + 999) / 1000);
  std::vector<std::string> args = {helper, std::to_string(major), std::to_string(minor),
                                   std::to_string(limits.memory_bytes),
                                   std::to_string(cpu_seconds)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Helper started;
  const int spawned =
      ::posix_spawn(&started.pid, helper.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(sv[1]);
  if (spawned != 0) {
    ::close(sv[0]);
    return Status(ErrorKind::kUnsupported,
                  "starting the NVRTC helper " + helper + ": " + std::strerror(spawned));
  }
  started.sock = sv[0];
  (void)::fcntl(started.sock, F_SETFL, ::fcntl(started.sock, F_GETFL) | O_NONBLOCK);
  return started;
}

// What the helper answered, and whether reading stopped at the deadline or the size bound.
struct Exchanged {
  std::string out;
  bool timed_out = false;
  bool too_big = false;
};

// Send `source` on `sock` and read the reply, until the helper closes its end or `deadline`.
Exchanged Exchange(int sock, std::string_view source,
                   std::chrono::steady_clock::time_point deadline) {
  Exchanged answer;
  size_t sent = 0;
  bool write_open = true;
  for (;;) {
    if (write_open && sent == source.size()) {
      ::shutdown(sock, SHUT_WR);
      write_open = false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      answer.timed_out = true;
      break;
    }
    pollfd p = {sock, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, INT_MAX)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (r == 0) continue;
    if (write_open && (p.revents & POLLOUT)) {
      const ssize_t w = ::send(sock, source.data() + sent, source.size() - sent, MSG_NOSIGNAL);
      if (w > 0) {
        sent += static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        write_open = false;  // the helper stopped reading; its reply (or death) says why
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      const ssize_t n = ::recv(sock, buf, sizeof(buf), 0);
      if (n > 0) {
        answer.out.append(buf, static_cast<size_t>(n));
        if (answer.out.size() > kMaxReplyBytes) {
          answer.too_big = true;
          break;
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        break;  // the helper is done
      }
    }
  }
  return answer;
}

// The outcome of a compile whose helper answered `out` and ended with wait status `status`.
Result<CompiledSource> ParseReply(const std::string& out, int status, const NvrtcLimits& limits) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return LimitHit(limits, sig == SIGXCPU || sig == SIGKILL
                                ? std::string("CPU time limit")
                                : std::string("the compiler died (signal ") + std::to_string(sig) +
                                      "), most likely out of its memory limit");
  }
  reply::Header h;
  if (out.size() < sizeof(h)) {
    return LimitHit(limits, "the compiler ended without an answer (exit status " +
                                std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                "), most likely out of its memory limit");
  }
  std::memcpy(&h, out.data(), sizeof(h));
  if (std::memcmp(h.magic, reply::kMagic, sizeof(h.magic)) != 0 ||
      h.image_bytes > out.size() - sizeof(h) ||
      h.text_bytes != out.size() - sizeof(h) - h.image_bytes) {
    return Status(ErrorKind::kInternal, "the NVRTC helper's answer is malformed");
  }
  std::string text = out.substr(sizeof(h) + h.image_bytes);
  switch (h.code) {
    case reply::kOk: {
      CompiledSource compiled;
      compiled.image = out.substr(sizeof(h), h.image_bytes);
      compiled.ptx = h.image_kind == reply::kPtx;
      return compiled;
    }
    case reply::kCompileError:
      // NVRTC reports running out of its address space as a compile error.
      if (text.find("catastrophic error: out of memory") != std::string::npos) {
        return LimitHit(limits, "out of memory");
      }
      return Status(ErrorKind::kCompileError, std::move(text));
    case reply::kUnsupported:
      return Status(ErrorKind::kUnsupported, std::move(text));
    default:
      if (text.find("OUT_OF_MEMORY") != std::string::npos ||
          text.find("out of memory") != std::string::npos) {
        return LimitHit(limits, text);
      }
      return Status(ErrorKind::kInternal, "NVRTC: " + text);
  }
}

}  // namespace

int CompilesRunningForTest() { return compiles_running.load(); }

Result<CompiledSource> CompileCudaSource(std::string_view source, int major, int minor,
                                         const NvrtcLimits& limits) {
  FERRY_RETURN_IF_ERROR(CheckCudaSource(source));
  if (source.size() > reply::kMaxSourceBytes) {
    return Status(ErrorKind::kCompileError, "CUDA C++ source larger than " +
                                                std::to_string(reply::kMaxSourceBytes) + " bytes");
  }
  const int max_concurrent = std::max(1, limits.max_concurrent);
  CompileSlot slot(max_concurrent);
  if (!slot.held()) {
    return Status(ErrorKind::kBusy,
                  std::to_string(max_concurrent) +
                      " CUDA C++ compiles are running already (ferryd --nvrtc-concurrency); "
                      "try the load again later");
  }
  const std::string helper = HelperPath(limits);
  if (::access(helper.c_str(), X_OK) != 0) {
    return Status(ErrorKind::kUnsupported,
                  "CUDA C++ modules need the NVRTC helper " + helper + ": " + std::strerror(errno));
  }
  FERRY_ASSIGN_OR_RETURN(Helper started, StartHelper(helper, major, minor, limits));
  const Exchanged answer =
      Exchange(started.sock, source, std::chrono::steady_clock::now() + limits.timeout);
  ::close(started.sock);
  if (answer.timed_out || answer.too_big) ::kill(started.pid, SIGKILL);
  int status = 0;
  while (::waitpid(started.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (answer.timed_out) return LimitHit(limits, "killed after the wall-clock limit");
  if (answer.too_big) return Status(ErrorKind::kCompileError, "the compiled module is too large");
  return ParseReply(answer.out, status, limits);
}

}  // namespace ferry::backend
