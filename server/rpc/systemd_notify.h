// The service-manager side of running under systemd, without libsystemd: readiness and
// watchdog notifications (sd_notify's datagram protocol) and socket activation (the
// LISTEN_FDS protocol), plus an acceptor that serves an inherited listening socket.
//
// Everything here reads the process environment; call it from the main thread before other
// threads start (setenv/unsetenv are not thread-safe), except Notify() and SocketAcceptor,
// which are safe from any thread once the environment is settled.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/status.h"

namespace ferry::rpc::systemd {

/// The first file descriptor systemd passes (SD_LISTEN_FDS_START).
inline constexpr int kListenFdsStart = 3;

/// Return true when $NOTIFY_SOCKET names a service manager to notify.
bool NotifyEnabled();

/// Send `state` ("READY=1\nSTATUS=serving", "WATCHDOG=1", "STOPPING=1", ...) as one
/// datagram to $NOTIFY_SOCKET: a filesystem path, or an abstract socket when it starts with
/// '@'. Return Ok without sending when NOTIFY_SOCKET is unset (not under systemd); an error
/// when it is set but the datagram could not be sent. Thread-safe.
Status Notify(std::string_view state);

/// Return how often the service manager expects "WATCHDOG=1": $WATCHDOG_USEC, when set, and
/// $WATCHDOG_PID is unset or names this process. nullopt when no watchdog is armed. Ping at
/// half this interval.
std::optional<std::chrono::microseconds> WatchdogInterval();

/// Return the listening sockets passed by socket activation ($LISTEN_FDS descriptors from
/// fd 3 on, when $LISTEN_PID names this process), each set close-on-exec. Unsets LISTEN_PID,
/// LISTEN_FDS and LISTEN_FDNAMES so children do not inherit them. Empty when not activated;
/// an error when the variables are malformed or a descriptor is not open.
Result<std::vector<int>> ListenFds();

/// Return "unix:PATH" for a Unix socket bound to a path, "tcp:HOST:PORT" for a TCP socket,
/// else "fd:N". For logs and for matching inherited sockets against --listen endpoints.
std::string SocketEndpoint(int fd);

/// Credentials of a connected Unix-socket peer (SO_PEERCRED); all -1 for other sockets.
struct PeerCredentials {
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

/// Accepts connections on a listening socket (an inherited one: gRPC 1.51 cannot adopt a
/// listening fd) on a thread of its own and hands each one, non-blocking and close-on-exec,
/// with its peer's credentials, to `on_connection`, which then owns the fd (the daemon
/// passes it to grpc::AddInsecureChannelFromFd). Takes ownership of the listening fd.
/// `on_connection` runs on the acceptor's thread and must not block for long.
class SocketAcceptor {
 public:
  using Handler = std::function<void(int fd, const PeerCredentials& peer)>;

  /// Start accepting on `listen_fd` (which must be a listening stream socket).
  static Result<std::unique_ptr<SocketAcceptor>> Start(int listen_fd, Handler on_connection);
  /// Stop accepting, join the thread and close the listening socket.
  ~SocketAcceptor();
  SocketAcceptor(const SocketAcceptor&) = delete;
  SocketAcceptor& operator=(const SocketAcceptor&) = delete;

  /// Stop accepting (idempotent); connections already handed over are unaffected.
  void Stop();
  uint64_t accepted() const { return accepted_.load(); }

 private:
  SocketAcceptor(int listen_fd, int wake_fd, Handler on_connection)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), on_connection_(std::move(on_connection)) {}
  void Run();
  // Log a failed accept4 (errno `error`), at most once per kWarningInterval: out of
  // descriptors it fails every time the loop comes round.
  void WarnAcceptFailed(int error);

  int listen_fd_;
  int wake_fd_;  // an eventfd: written once by Stop() to end the poll loop
  Handler on_connection_;
  std::atomic<uint64_t> accepted_{0};
  std::thread thread_;
  // The acceptor thread's: when it last warned, and the failures since then it did not log.
  std::chrono::steady_clock::time_point last_warning_{};
  uint64_t unlogged_failures_ = 0;
};

}  // namespace ferry::rpc::systemd
