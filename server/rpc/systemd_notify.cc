#include "rpc/systemd_notify.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace ferry::rpc::systemd {
namespace {

std::string Errno(std::string_view what) { return std::string(what) + ": " + std::strerror(errno); }

// Parse a whole decimal string; nullopt when it is not one.
std::optional<uint64_t> ParseDecimal(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  uint64_t v = 0;
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

bool NotifyEnabled() {
  const char* name = std::getenv("NOTIFY_SOCKET");
  return name != nullptr && *name != '\0';
}

Status Notify(std::string_view state) {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || *env == '\0') return Status::Ok();
  std::string_view name(env);
  if (name[0] != '/' && name[0] != '@') {
    return Status(ErrorKind::kInvalidArgument,
                  "NOTIFY_SOCKET is neither a path nor an abstract socket: " + std::string(name));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.size() >= sizeof(addr.sun_path)) {
    return Status(ErrorKind::kInvalidArgument, "NOTIFY_SOCKET is too long");
  }
  std::memcpy(addr.sun_path, name.data(), name.size());
  if (name[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());

  FdCloser fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status(ErrorKind::kUnavailable, Errno("socket"));
  ssize_t sent = ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL,
                          reinterpret_cast<const sockaddr*>(&addr), len);
  if (sent < 0) {
    return Status(ErrorKind::kUnavailable, Errno("sendto " + std::string(name)));
  }
  if (static_cast<size_t>(sent) != state.size()) {
    return Status(ErrorKind::kUnavailable, "short datagram to " + std::string(name));
  }
  return Status::Ok();
}

std::optional<std::chrono::microseconds> WatchdogInterval() {
  std::optional<uint64_t> usec = ParseDecimal(std::getenv("WATCHDOG_USEC"));
  if (!usec || *usec == 0) return std::nullopt;
  if (const char* pid_text = std::getenv("WATCHDOG_PID"); pid_text != nullptr) {
    std::optional<uint64_t> pid = ParseDecimal(pid_text);
    if (!pid || *pid != static_cast<uint64_t>(::getpid())) return std::nullopt;
  }
  return std::chrono::microseconds(*usec);
}

Result<std::vector<int>> ListenFds() {
  const char* pid_text = std::getenv("LISTEN_PID");
  const char* fds_text = std::getenv("LISTEN_FDS");
  if (pid_text == nullptr || fds_text == nullptr) return std::vector<int>{};
  std::optional<uint64_t> pid = ParseDecimal(pid_text);
  std::optional<uint64_t> count = ParseDecimal(fds_text);
  // The variables are for one process only: never let a child see them.
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (!pid) return Status(ErrorKind::kInvalidArgument, "LISTEN_PID is not a number");
  if (*pid != static_cast<uint64_t>(::getpid())) return std::vector<int>{};  // not for us
  if (!count || *count > 1024) {
    return Status(ErrorKind::kInvalidArgument, "LISTEN_FDS is not a count");
  }
  std::vector<int> fds;
  for (int fd = kListenFdsStart; fd < kListenFdsStart + static_cast<int>(*count); ++fd) {
    int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0) {
      return Status(ErrorKind::kInvalidArgument,
                    "LISTEN_FDS names fd " + std::to_string(fd) + ", which is not open");
    }
    if (::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
      return Status(ErrorKind::kInternal, Errno("fcntl(FD_CLOEXEC)"));
    }
    fds.push_back(fd);
  }
  return fds;
}

std::string SocketEndpoint(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_UNIX) {
      const auto* un = reinterpret_cast<const sockaddr_un*>(&ss);
      size_t path_len =
          len > offsetof(sockaddr_un, sun_path) ? len - offsetof(sockaddr_un, sun_path) : 0;
      if (path_len > 0 && un->sun_path[0] != '\0') {
        return "unix:" + std::string(un->sun_path, strnlen(un->sun_path, path_len));
      }
      if (path_len > 1) return "unix-abstract:" + std::string(un->sun_path + 1, path_len - 1);
    } else if (ss.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
      char host[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
      return "tcp:" + std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
    } else if (ss.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
      char host[INET6_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
      return "tcp:[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
    }
  }
  return "fd:" + std::to_string(fd);
}

// --- SocketAcceptor ------------------------------------------------------------------------

Result<std::unique_ptr<SocketAcceptor>> SocketAcceptor::Start(int listen_fd,
                                                              Handler on_connection) {
  int accepting = 0;
  socklen_t len = sizeof(accepting);
  if (::getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) < 0 || !accepting) {
    return Status(ErrorKind::kInvalidArgument,
                  "fd " + std::to_string(listen_fd) + " is not a listening socket");
  }
  int flags = ::fcntl(listen_fd, F_GETFL);
  if (flags < 0 || ::fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status(ErrorKind::kInternal, Errno("fcntl(O_NONBLOCK)"));
  }
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return Status(ErrorKind::kInternal, Errno("eventfd"));
  std::unique_ptr<SocketAcceptor> a(new SocketAcceptor(listen_fd, wake, std::move(on_connection)));
  a->thread_ = std::thread([p = a.get()] {
    pthread_setname_np(pthread_self(), "ferry-accept");
    p->Run();
  });
  return a;
}

void SocketAcceptor::Run() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("acceptor on {}: {}", SocketEndpoint(listen_fd_), Errno("poll"));
      return;
    }
    if (fds[1].revents != 0) return;  // Stop()
    if (fds[0].revents == 0) continue;
    // A non-blocking fd: gRPC's transport hangs before its SETTINGS frame on a blocking one.
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      const int error = errno;
      WarnAcceptFailed(error);
      if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
        // Out of descriptors: back off instead of spinning on a readable socket.
        pollfd wake = {wake_fd_, POLLIN, 0};
        if (::poll(&wake, 1, 100) > 0) return;
        continue;
      }
      return;
    }
    PeerCredentials peer;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof(cred)) {
      peer.pid = cred.pid;
      peer.uid = cred.uid;
      peer.gid = cred.gid;
    }
    accepted_.fetch_add(1);
    on_connection_(fd, peer);
  }
}

void SocketAcceptor::WarnAcceptFailed(int error) {
  constexpr std::chrono::seconds kWarningInterval{10};
  const auto now = std::chrono::steady_clock::now();
  if (last_warning_ != std::chrono::steady_clock::time_point{} &&
      now - last_warning_ < kWarningInterval) {
    ++unlogged_failures_;
    return;
  }
  std::string more;
  if (unlogged_failures_ > 0) {
    more = " (and " + std::to_string(unlogged_failures_) + " more failures in the last " +
           std::to_string(
               std::chrono::duration_cast<std::chrono::seconds>(now - last_warning_).count()) +
           " s)";
  }
  spdlog::warn("acceptor on {}: accept4: {}{}", SocketEndpoint(listen_fd_), std::strerror(error),
               more);
  last_warning_ = now;
  unlogged_failures_ = 0;
}

void SocketAcceptor::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  ssize_t w = ::write(wake_fd_, &one, sizeof(one));
  (void)w;
  thread_.join();
}

SocketAcceptor::~SocketAcceptor() {
  Stop();
  ::close(wake_fd_);
  ::close(listen_fd_);
}

}  // namespace ferry::rpc::systemd
