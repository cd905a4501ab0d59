// Test harness: a real ferryd process on real sockets in a temp dir, and helpers to reach
// its Admin service.
#pragma once

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/v1/admin.grpc.pb.h"
#include "temp_files.h"

namespace ferry::testing {

/// Start `program` with `args`; return its pid (or -1).
inline pid_t Spawn(const std::string& program, const std::vector<std::string>& args,
                   const std::string& log_path = "") {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  pid_t pid = -1;
  int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

/// Wait for `pid` to exit, up to `timeout`; return its wait status, or -1 on timeout.
inline int WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

/// The backend integration tests run ferryd with: $FERRY_TEST_BACKEND (host, cuda or
/// auto), default host. tests/gpu/run.sh sets cuda to run the same suite on a GPU.
inline std::string TestBackend() {
  const char* b = std::getenv("FERRY_TEST_BACKEND");
  return b && *b ? b : "host";
}

/// Path of a program the tests start: $ENV_NAME when set (tests/gpu/run.sh points these
/// into a bundle), else the path the build baked in.
inline std::string ProgramPath(const char* env_name, const char* built) {
  const char* p = std::getenv(env_name);
  return p && *p ? p : built;
}
inline std::string FerrydPath() { return ProgramPath("FERRY_TEST_FERRYD", FERRYD_PATH); }

/// Whether this build (the tests and the ferryd beside them) runs under AddressSanitizer.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

/// While it lives, a ferryd started (under AddressSanitizer) keeps at most 16 MiB of the
/// memory it freed in quarantine and gives free memory back every 100 ms: ASan's defaults keep
/// up to 256 MiB of freed memory resident and give it back rarely, which tests that bound
/// what the daemon holds would measure. A use after free of what is in quarantine is still
/// caught. Set whenever the build has ASan, not only when ASAN_OPTIONS is (tests/run.sh
/// sets it); nothing changes in other builds.
class ScopedSmallAsanQuarantine {
 public:
  ScopedSmallAsanQuarantine() {
    if (!kAddressSanitizer) return;
    const char* asan = std::getenv("ASAN_OPTIONS");
    had_ = asan != nullptr;
    saved_ = had_ ? asan : "";
    ::setenv("ASAN_OPTIONS",
             (saved_ + ":quarantine_size_mb=16:allocator_release_to_os_interval_ms=100").c_str(),
             1);
  }
  ~ScopedSmallAsanQuarantine() {
    if (!kAddressSanitizer) return;
    if (had_) {
      ::setenv("ASAN_OPTIONS", saved_.c_str(), 1);
    } else {
      ::unsetenv("ASAN_OPTIONS");
    }
  }
  ScopedSmallAsanQuarantine(const ScopedSmallAsanQuarantine&) = delete;
  ScopedSmallAsanQuarantine& operator=(const ScopedSmallAsanQuarantine&) = delete;

 private:
  bool had_ = false;
  std::string saved_;
};

/// A ferryd child process. Starts in the constructor (check ok()); SIGTERM in Stop() and in
/// the destructor.
class FerrydProcess {
 public:
  /// `launcher`: a program and its arguments that run ferryd (its path and arguments
  /// follow), in ferryd's process (it execs it): e.g. prlimit, to start it with other limits.
  explicit FerrydProcess(std::vector<std::string> extra_args = {}, bool tcp = false,
                         std::vector<std::string> launcher = {}) {
    char tmpl[] = "/tmp/ferry-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    socket_ = dir_ + "/ferryd.sock";
    std::vector<std::string> args = {"--backend",       TestBackend(),  "--listen",
                                     "unix:" + socket_, "--ready-file", dir_ + "/ready",
                                     "--log-level",     "info"};
    if (tcp) {
      args.push_back("--listen");
      args.push_back("tcp:127.0.0.1:0");
      // ferryd refuses a TCP endpoint that authenticates no client, loopback included; tests
      // that configure neither a token nor mutual TLS say they mean it.
      bool authenticates = false;
      for (const auto& a : extra_args) {
        if (a.rfind("--token-file", 0) == 0 || a.rfind("--tls-client-ca", 0) == 0) {
          authenticates = true;
        }
      }
      if (!authenticates) args.push_back("--allow-insecure-remote");
    }
    for (auto& a : extra_args) args.push_back(a);
    if (launcher.empty()) {
      pid_ = Spawn(FerrydPath(), args, dir_ + "/ferryd.log");
    } else {
      args.insert(args.begin(), FerrydPath());
      args.insert(args.begin(), launcher.begin() + 1, launcher.end());
      pid_ = Spawn(launcher[0], args, dir_ + "/ferryd.log");
    }
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (pid_ > 0 && std::chrono::steady_clock::now() < until) {
      std::ifstream in(dir_ + "/ready");
      std::string line;
      std::vector<std::string> eps;
      while (std::getline(in, line)) eps.push_back(line);
      if (!eps.empty()) {
        endpoints_ = eps;
        break;
      }
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~FerrydProcess() {
    Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  bool ok() const { return pid_ > 0 && !endpoints_.empty(); }
  pid_t pid() const { return pid_; }
  /// Every line of the ready file ("unix:...", "tcp:...", "metrics:HOST:PORT").
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  std::string unix_target() const { return "unix:" + socket_; }
  std::string tcp_target() const {
    for (const auto& e : endpoints_) {
      if (e.rfind("tcp:", 0) == 0) return e;
    }
    return "";
  }
  std::string log() const {
    std::ifstream in(dir_ + "/ferryd.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  /// SIGTERM and wait; return the exit status (-1 when it did not exit in time).
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return exit_status_;
    kill(pid_, sig);
    exit_status_ = WaitExit(pid_, std::chrono::seconds(30));
    if (exit_status_ == -1) {
      kill(pid_, SIGKILL);
      WaitExit(pid_, std::chrono::seconds(5));
    }
    pid_ = -1;
    return exit_status_;
  }

  /// Fetch the daemon's Admin status.
  v1::StatusReply AdminStatus() const {
    auto channel = grpc::CreateChannel(unix_target(), grpc::InsecureChannelCredentials());
    auto stub = v1::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StatusReply reply;
    grpc::Status s = stub->Status(&ctx, v1::StatusRequest(), &reply);
    if (!s.ok()) reply.set_version("ERROR: " + s.error_message());
    return reply;
  }

  /// Wait until the daemon holds no sessions, tensors or device bytes; return the last
  /// status seen.
  v1::StatusReply WaitIdle(std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    auto until = std::chrono::steady_clock::now() + timeout;
    v1::StatusReply s;
    do {
      s = AdminStatus();
      if (s.sessions_open() == 0 && s.live_tensors() == 0 && s.device_bytes_in_use() == 0 &&
          s.submits_in_flight() == 0) {
        return s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < until);
    return s;
  }

 private:
  std::string dir_;
  std::string socket_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
  std::vector<std::string> endpoints_;
};

/// Whether `done()` became true within `seconds`, looking every 10 ms.
template <typename F>
bool Eventually(F done, int seconds = 30) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// Samples a daemon's submits in flight (Admin Status, as fast as it answers) on a thread of
/// its own, from construction until Stop.
class InFlightSampler {
 public:
  explicit InFlightSampler(const FerrydProcess& daemon)
      : thread_([this, &daemon] {
          while (!done_) {
            uint64_t n = daemon.AdminStatus().submits_in_flight();
            if (n > most_) most_ = n;
          }
        }) {}
  ~InFlightSampler() { Stop(); }
  /// Stop sampling; the most submits in flight seen.
  uint64_t Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    return most_;
  }

 private:
  std::atomic<bool> done_{false};
  std::atomic<uint64_t> most_{0};
  std::thread thread_;  // last: it starts once the flags exist
};

}  // namespace ferry::testing
