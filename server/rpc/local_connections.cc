#include "rpc/local_connections.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace ferry::rpc {
namespace {

Status SocketError(const std::string& what) {
  return Status(ErrorKind::kUnavailable, what + ": " + std::strerror(errno));
}

// Fill `addr` for `path`; false when the path does not fit in sun_path.
bool UnixAddress(const std::string& path, sockaddr_un* addr) {
  *addr = {};
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  return true;
}

}  // namespace

void LocalConnections::Add(int fd, std::string endpoint, const systemd::PeerCredentials& peer) {
  MutexLock lock(&mu_);
  by_fd_[fd] = Entry{std::move(endpoint), peer};
}

session::PeerIdentity LocalConnections::Identify(const std::string& grpc_peer) const {
  session::PeerIdentity id;
  id.address = grpc_peer;
  constexpr std::string_view kFd = "fd:";
  if (grpc_peer.rfind(kFd, 0) != 0) return id;
  int fd = -1;
  const char* first = grpc_peer.data() + kFd.size();
  const char* last = grpc_peer.data() + grpc_peer.size();
  auto [end, ec] = std::from_chars(first, last, fd);
  if (ec != std::errc() || end != last) return id;
  MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return id;
  id.address = it->second.endpoint;
  if (it->second.peer.uid != static_cast<uid_t>(-1)) {
    id.uid = static_cast<uint32_t>(it->second.peer.uid);
    id.pid = static_cast<int32_t>(it->second.peer.pid);
    id.gid = static_cast<uint32_t>(it->second.peer.gid);
  }
  return id;
}

Result<int> ListenUnix(const std::string& path) {
  sockaddr_un addr;
  if (!UnixAddress(path, &addr)) {
    return Status(ErrorKind::kInvalidArgument, "unix socket path is empty or longer than " +
                                                   std::to_string(sizeof(addr.sun_path) - 1) +
                                                   " bytes: " + path);
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status(ErrorKind::kInvalidArgument, path + " exists and is not a socket");
    }
    // A socket file: live if something still accepts on it, stale (left by a daemon that
    // died) otherwise.
    // Non-blocking: a live daemon whose backlog is full answers EAGAIN instead of hanging
    // this start.
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (probe < 0) return SocketError("socket");
    bool live = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 ||
                errno == EAGAIN || errno == EINPROGRESS;
    ::close(probe);
    if (live) {
      return Status(ErrorKind::kUnavailable, "another process is accepting connections on " + path);
    }
    if (::unlink(path.c_str()) < 0 && errno != ENOENT) {
      return SocketError("removing the stale socket " + path);
    }
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketError("socket");
  // bind creates the file with 0777 less the umask: narrow the umask around it, so the file
  // is never, even for an instant, connectable by others (a chmod after bind left a window).
  // The umask is process-wide: it is only ever narrowed (the old one plus no access for
  // others), so another thread creating a file meanwhile never gets a wider mode.
  const mode_t old_umask = ::umask(0177);
  ::umask(old_umask | 0117);
  const int bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound < 0) {
    errno = bind_errno;
    Status s = SocketError("bind " + path);
    ::close(fd);
    return s;
  }
  // Group members reach the daemon; others do not (the runtime directory narrows it more).
  // The file has 0660 already unless the umask took group bits too: only then widen the
  // group's (a chmod never gives others access).
  struct stat made {};
  const bool needs_chmod = ::lstat(path.c_str(), &made) != 0 || (made.st_mode & 0777) != 0660;
  if ((needs_chmod && ::chmod(path.c_str(), 0660) < 0) || ::listen(fd, SOMAXCONN) < 0) {
    Status s = SocketError("listen " + path);
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  return fd;
}

}  // namespace ferry::rpc
