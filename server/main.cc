// ferryd: composition root. Parses flags, builds the device and the daemon, waits for a
// signal, drains. No logic here that a test would need.
#include <fcntl.h>
#include <grpc/grpc.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/select.h"
#include "config.h"
#include "daemon.h"
#include "ferry/trace_points.h"
#include "ferry/version.h"
#include "rpc/systemd_notify.h"
#include "session/device_supervisor.h"

namespace {

namespace sd = ferry::rpc::systemd;

void Notify(const std::string& state) {
  if (ferry::Status s = sd::Notify(state); !s.ok()) spdlog::warn("sd_notify: {}", s.ToString());
}

// Socket activation: adopt the inherited listening sockets into `config` (before any thread
// starts: this edits the environment); one that matches a --listen endpoint replaces it.
// Returns copies that survive the daemon (which closes the originals), for a re-exec after a
// device fault to inherit in turn: systemd still holds the sockets, and their paths must
// stay theirs. Placed above the numbers they will be moved back to.
ferry::Result<std::vector<int>> AdoptInheritedSockets(ferry::DaemonConfig& config) {
  FERRY_ASSIGN_OR_RETURN(std::vector<int> inherited, sd::ListenFds());
  std::vector<int> reexec_listen_fds;
  for (int fd : inherited) {
    auto& listen = config.daemon.listen;
    listen.erase(std::remove(listen.begin(), listen.end(), sd::SocketEndpoint(fd)), listen.end());
    config.daemon.inherited_listen_fds.push_back(fd);
    int copy =
        ::fcntl(fd, F_DUPFD_CLOEXEC, sd::kListenFdsStart + static_cast<int>(inherited.size()));
    if (copy >= 0) reexec_listen_fds.push_back(copy);
  }
  return reexec_listen_fds;
}

// What the CUDA runtime reads from the environment: before the CUDA context exists, and
// before any thread starts.
void SetCudaEnvironment(const ferry::DaemonConfig& config) {
  if (config.cuda_work_queues > 0) {
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(config.cuda_work_queues).c_str(), 1);
  }
  // A kernel loaded on its first launch (lazy loading, CUDA's default) may wait for the whole
  // device: a session's first fill of a new type, or first GEMM of a new shape, may wait for
  // every other session's queued kernels (docs/operations.md, "Module loading").
  if (config.cuda_module_loading == "eager") ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  if (config.cuda_module_loading == "lazy") ::setenv("CUDA_MODULE_LOADING", "LAZY", 1);
}

// Each CUDA C++ compile holds a long-lane thread while it runs (a submit that loads a
// module starts there; there are as many as executor threads): however many are allowed,
// one stays for the other sessions' long work (large graphs, direct copies).
void BoundNvrtcConcurrency(ferry::DaemonConfig& config) {
  const int executors = ferry::ExecutorThreadCount(config.daemon.executor_threads);
  const int wanted = config.cuda.nvrtc_concurrency > 0 ? config.cuda.nvrtc_concurrency
                                                       : ferry::backend::DefaultNvrtcConcurrency();
  config.cuda.nvrtc_concurrency = std::max(1, std::min(wanted, executors - 1));
}

// The ready file: the daemon's endpoints, one a line, and "metrics:ENDPOINT".
void WriteReadyFile(const std::string& path, const ferry::Daemon& daemon) {
  std::string tmp = path + ".tmp";
  std::string text;
  for (const auto& ep : daemon.endpoints()) text += ep + "\n";
  if (std::string m = daemon.metrics_endpoint(); !m.empty()) text += "metrics:" + m + "\n";
  // Made afresh, never through a link planted at its name (the directory may be shared):
  // written nowhere else, and the rename replaces whatever entry has the ready file's name.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  const bool written =
      fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (fd >= 0) ::close(fd);
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::error("cannot write the ready file {}: {}", path, std::strerror(errno));
    ::unlink(tmp.c_str());
  }
}

// After a device fault this process cannot repair: finish the daemon and execute ferryd
// again on the same flags, the fault history in the environment and systemd's sockets
// handed on. Returns only if the exec fails.
int ReexecAfterFault(std::unique_ptr<ferry::Daemon>& daemon,
                     const std::vector<int>& reexec_listen_fds, char** argv) {
  Notify("STATUS=restarting after a device fault");
  uint64_t resets = daemon->device().resets() + 1;
  std::string fault = daemon->device().last_fault();
  // The sessions already hold their DEVICE_FAULT / DEVICE_RESET completions.
  daemon->Shutdown(std::chrono::milliseconds(200));
  daemon.reset();
  setenv("FERRY_DEVICE_RESETS", std::to_string(resets).c_str(), 1);
  setenv("FERRY_LAST_FAULT", fault.c_str(), 1);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!reexec_listen_fds.empty()) {  // hand systemd's sockets on, as LISTEN_FDS does
    for (size_t i = 0; i < reexec_listen_fds.size(); ++i) {
      ::dup2(reexec_listen_fds[i], sd::kListenFdsStart + static_cast<int>(i));  // no CLOEXEC
    }
    setenv("LISTEN_FDS", std::to_string(reexec_listen_fds.size()).c_str(), 1);
    setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);  // exec keeps the pid
  }
  spdlog::warn("re-executing ferryd (device resets so far: {})", resets);
  spdlog::default_logger()->flush();
  execv("/proc/self/exe", argv);
  spdlog::critical("re-exec failed: {}", std::strerror(errno));
  return 1;
}

void KeepLargeBuffersOnTheHeap() {
  // Remote clients' bytes arrive in messages of up to 64 MiB that are parsed, staged and
  // freed many times a second. glibc's defaults hand such buffers back to the kernel on every
  // free, so each message pays its page faults again (measured: building or serializing an
  // 8 MiB message takes 3 ms that way, 0.9 ms on reused heap). Keep buffers up to 32 MiB on
  // the heap, and up to 128 MiB of free heap before trimming.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
}

void SetUpLogging(const ferry::DaemonConfig& config) {
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ ferryd[%P] %v");
  if (!config.config_path.empty()) spdlog::info("configuration read from {}", config.config_path);
}

// --help, --version or --check-config: print what they ask for.
void PrintAndExit(const ferry::DaemonConfig& config) {
  if (config.show_help) {
    std::cout << ferry::FlagsHelp();
  } else if (config.show_version) {
    std::cout << "ferryd " << ferry::kVersion << " (" << ferry::kGitCommit << ")\n";
  } else {
    std::cout << ferry::FormatConfig(config);
  }
}

// The device of `config` under its supervisor, with the fault history a re-exec after a
// device fault passed in the environment; logs why it cannot be had.
ferry::Result<std::unique_ptr<ferry::session::DeviceSupervisor>> OpenDevice(
    const ferry::DaemonConfig& config) {
  auto factory = ferry::backend::MakeDeviceFactory(
      config.backend, config.device, config.host, config.cuda, config.host_fault_after_ops_for_test,
      config.host_rebuild_fails_for_test);
  if (!factory.ok()) {
    spdlog::critical("cannot open device {}: {}", config.device, factory.status().ToString());
    return factory.status();
  }
  auto device = ferry::session::DeviceSupervisor::Create(factory->create, factory->reset_context);
  if (!device.ok()) {
    spdlog::critical("cannot open device {}: {}", config.device, device.status().ToString());
    return device.status();
  }
  if (const char* resets = std::getenv("FERRY_DEVICE_RESETS")) {
    const char* fault = std::getenv("FERRY_LAST_FAULT");
    (*device)->SetHistory(std::strtoull(resets, nullptr, 10), fault ? fault : "");
    unsetenv("FERRY_DEVICE_RESETS");
    unsetenv("FERRY_LAST_FAULT");
  }
  const auto info = (*device)->info();
  spdlog::info("ferryd {} ({}): device {} '{}' on the {} backend ({})", ferry::kVersion,
               ferry::kGitCommit, info.ordinal, info.name, info.backend, factory->why);
  return device;
}

// Log the endpoints served (and the metrics endpoint); the endpoints, space-separated.
std::string LogEndpoints(const ferry::Daemon& daemon) {
  std::string endpoints;
  for (const auto& ep : daemon.endpoints()) {
    spdlog::info("listening on {}", ep);
    endpoints += (endpoints.empty() ? "" : " ") + ep;
  }
  if (std::string m = daemon.metrics_endpoint(); !m.empty()) {
    spdlog::info("metrics at http://{}/metrics", m);
  }
  return endpoints;
}

// While serving, keeps systemd told (Type=notify): WATCHDOG=1 at half of WatchdogSec with a
// STATUS line of the current load, STATUS alone every 30 s without a watchdog; nothing
// where systemd does not listen. Runs on `io`.
class SystemdTicker {
 public:
  SystemdTicker(boost::asio::io_context& io, const ferry::Daemon& daemon)
      : daemon_(daemon), watchdog_(sd::WatchdogInterval()), timer_(io) {
    if (watchdog_) spdlog::info("systemd watchdog: a ping every {} ms", watchdog_->count() / 2000);
    tick_ = watchdog_ ? *watchdog_ / 2 : std::chrono::seconds(30);
    if (sd::NotifyEnabled()) Arm();
  }

 private:
  void Arm() {
    timer_.expires_after(tick_);
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      auto t = daemon_.registry().Totals();
      Notify(std::string(watchdog_ ? "WATCHDOG=1\n" : "") +
             "STATUS=serving: " + std::to_string(t.sessions_open) + " sessions, " +
             std::to_string(t.submits_in_flight) + " submits in flight");
      Arm();
    });
  }

  const ferry::Daemon& daemon_;
  const std::optional<std::chrono::microseconds> watchdog_;
  std::chrono::microseconds tick_{};
  boost::asio::steady_timer timer_;
};

// Drain (in-flight work finishes within `grace`), stop, and leave.
[[noreturn]] void DrainAndExit(std::unique_ptr<ferry::Daemon>& daemon,
                               std::chrono::milliseconds grace) {
  Notify("STOPPING=1\nSTATUS=draining: finishing in-flight work (up to " +
         std::to_string(grace.count()) + " ms)");
  daemon->Shutdown(grace);
  daemon.reset();  // socket files removed, threads joined, device released
  Notify("STATUS=stopped");
  spdlog::info("stopped");
  // Leave without gRPC's global shutdown (the reference taken at the start is never given
  // back): it joins gRPC's executor threads, and one that runs TCP's backup poller sits in
  // 10 s polls once a write found a socket full, which held ferryd's exit up 9-10 s after
  // TCP sessions had moved tens of MiB (docs/performance.md). Nothing of ferryd's is left
  // to release; the kernel and the driver reclaim the rest.
  spdlog::shutdown();
  ferry::trace::Dump();  // trace points (FERRY_TRACE_POINTS builds): _Exit skips atexit
  std::fflush(nullptr);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  KeepLargeBuffersOnTheHeap();
  std::vector<std::string> args(argv + 1, argv + argc);
  auto parsed = ferry::ParseFlags(args, ferry::kDefaultConfigPath);
  if (!parsed.ok()) {
    std::cerr << "ferryd: " << parsed.status().message() << "\n(see ferryd --help)\n";
    return 2;
  }
  ferry::DaemonConfig config = std::move(*parsed);
  if (config.show_help || config.show_version || config.check_config) {
    PrintAndExit(config);
    return 0;
  }
  auto reexec_listen_fds = AdoptInheritedSockets(config);
  if (!reexec_listen_fds.ok()) {
    std::cerr << "ferryd: socket activation: " << reexec_listen_fds.status().message() << "\n";
    return 1;
  }
  SetCudaEnvironment(config);
  // A reference to gRPC's runtime that is never given back: the exit below skips gRPC's
  // global shutdown (see there).
  grpc_init();
  SetUpLogging(config);

  BoundNvrtcConcurrency(config);
  auto device = OpenDevice(config);
  if (!device.ok()) return 1;
  // After a device fault that cannot be repaired in this process (CUDA refuses a new context
  // in a process whose context took a sticky fault), ferryd drains and re-executes itself
  // on the same flags; the fault history travels in the environment.
  boost::asio::io_context signals_io;
  std::atomic<bool> restart{false};
  (*device)->SetUnrecoverableHandler([&](const ferry::Status& why) {
    spdlog::critical("the device cannot be rebuilt in this process ({}); restarting ferryd",
                     why.ToString());
    restart = true;
    signals_io.stop();
  });
  const auto info = (*device)->info();
  // Every connection, slab, board and ring is a descriptor; the limits derived from it
  // (max-local-connections) use what this leaves.
  const auto descriptors = ferry::rpc::RaiseDescriptorLimit();
  spdlog::info("descriptors: soft limit {} (was {}), hard limit {}", descriptors.soft,
               descriptors.soft_before, descriptors.hard);

  auto daemon = ferry::Daemon::Start(std::move(*device), config.daemon);
  if (!daemon.ok()) {
    spdlog::critical("cannot start: {}", daemon.status().ToString());
    Notify("STATUS=cannot start: " + daemon.status().ToString());
    return 1;
  }
  const std::string endpoints = LogEndpoints(**daemon);
  // Catch SIGINT and SIGTERM before anyone is told ferryd is ready (the ready file, READY=1):
  // one that comes before async_wait waits in the set instead of killing the process.
  boost::asio::signal_set signals(signals_io, SIGINT, SIGTERM);
  if (!config.ready_file.empty()) WriteReadyFile(config.ready_file, **daemon);

  // Serving: tell systemd (Type=notify), then keep it told: WATCHDOG=1 at half of
  // WatchdogSec with a STATUS line of the current load (STATUS alone every 30 s without one).
  Notify("READY=1\nSTATUS=serving device " + std::to_string(info.ordinal) + " (" + info.name +
         ") on " + endpoints);
  SystemdTicker ticker(signals_io, **daemon);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: draining (up to {} ms)", sig, config.drain_timeout.count());
    signals_io.stop();
  });
  (*daemon)->SetDrainHandler([&signals_io] {
    spdlog::info("drain requested through the Admin service");
    signals_io.stop();
  });
  signals_io.run();
  // Draining from here on: a second SIGINT/SIGTERM must not kill the drain or the exit.
  signals.clear();
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  if (restart) return ReexecAfterFault(*daemon, *reexec_listen_fds, argv);
  DrainAndExit(*daemon, config.drain_timeout);
}
