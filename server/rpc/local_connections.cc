#include "rpc/local_connections.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>

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

bool LocalConnections::StillOpen(int fd, const Entry& e) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_dev != e.dev || st.st_ino != e.ino) return false;
  // The client closed its end (or shut down its writes): the kernel says so on the daemon's
  // end at once, while gRPC reads the end of the stream and closes the fd a moment later.
  pollfd p = {fd, POLLRDHUP, 0};
  return !(::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0);
}

void LocalConnections::Forget(std::unordered_map<int, Entry>::iterator it) {
  if (it->second.counted) {
    auto uid = fds_by_uid_.find(it->second.peer.uid);
    if (uid != fds_by_uid_.end()) {
      uid->second.erase(it->first);
      if (uid->second.empty()) fds_by_uid_.erase(uid);
    }
    --counted_;
  }
  by_fd_.erase(it);
}

size_t LocalConnections::HeldLocked(uid_t uid) const {
  auto it = fds_by_uid_.find(uid);
  return it == fds_by_uid_.end() ? 0 : it->second.size();
}

void LocalConnections::SweepLocked(std::optional<uid_t> uid) {
  std::vector<int> closed;
  if (uid) {
    auto fds = fds_by_uid_.find(*uid);
    if (fds == fds_by_uid_.end()) return;
    for (int fd : fds->second) {
      if (!StillOpen(fd, by_fd_.at(fd))) closed.push_back(fd);
    }
  } else {
    for (const auto& [fd, e] : by_fd_) {
      if (!StillOpen(fd, e)) closed.push_back(fd);
    }
  }
  for (int fd : closed) Forget(by_fd_.find(fd));
}

bool LocalConnections::Admit(int fd, std::string endpoint, const systemd::PeerCredentials& peer) {
  Entry e{std::move(endpoint), peer};
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    e.dev = st.st_dev;
    e.ino = st.st_ino;
  }
  e.counted = !(peer.uid == 0 && exempt_root_) && peer.uid != static_cast<uid_t>(exempt_uid_);
  MutexLock lock(&mu_);
  // The fd number was closed by gRPC and reused for this connection: the old one is gone.
  if (auto old = by_fd_.find(fd); old != by_fd_.end()) Forget(old);
  if (e.counted) {
    if (limits_.per_uid != 0 && HeldLocked(peer.uid) >= limits_.per_uid) {
      SweepLocked(peer.uid);
      if (HeldLocked(peer.uid) >= limits_.per_uid) {
        ++refused_per_uid_;
        return false;
      }
    }
    if (limits_.total != 0 && counted_ >= limits_.total) {
      SweepLocked(std::nullopt);
      if (counted_ >= limits_.total) {
        ++refused_total_;
        return false;
      }
    }
    fds_by_uid_[peer.uid].insert(fd);
    ++counted_;
  }
  by_fd_[fd] = std::move(e);
  return true;
}

uint64_t LocalConnections::count() const {
  MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [fd, e] : by_fd_) n += StillOpen(fd, e) ? 1 : 0;
  return n;
}

std::vector<std::pair<uint32_t, uint64_t>> LocalConnections::CountByUid() const {
  MutexLock lock(&mu_);
  std::map<uint32_t, uint64_t> by_uid;
  for (const auto& [fd, e] : by_fd_) {
    if (StillOpen(fd, e)) ++by_uid[static_cast<uint32_t>(e.peer.uid)];
  }
  return {by_uid.begin(), by_uid.end()};
}

uint64_t LocalConnections::refused_per_uid() const {
  MutexLock lock(&mu_);
  return refused_per_uid_;
}

uint64_t LocalConnections::refused_total_limit() const {
  MutexLock lock(&mu_);
  return refused_total_;
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
  // The caller is the connection behind the descriptor: gRPC keeps a call's transport, and
  // with it its descriptor, open for as long as the call lives, so while a stream asks,
  // "fd:N" is its own socket. The record must be of that very socket (its device and inode,
  // which the kernel does not give to another socket while this one is open), not of an
  // earlier connection whose number was reused: a number reused by anything but the
  // connection admitted under it identifies nobody.
  struct stat st {};
  if (::fstat(fd, &st) != 0) return id;
  MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return id;
  const Entry& e = it->second;
  if (e.dev != st.st_dev || e.ino != st.st_ino) return id;
  id.address = e.endpoint;
  if (e.peer.uid != static_cast<uid_t>(-1)) {
    id.uid = static_cast<uint32_t>(e.peer.uid);
    id.pid = static_cast<int32_t>(e.peer.pid);
    id.gid = static_cast<uint32_t>(e.peer.gid);
  }
  return id;
}

LocalConnectionLimits ResolveLocalConnectionLimits(const LocalConnectionSettings& settings,
                                                   uint64_t descriptors) {
  constexpr uint64_t kMostInAll = 4096, kMostPerUid = 1024;
  LocalConnectionLimits l;
  l.total = settings.total.value_or(
      static_cast<uint32_t>(std::clamp<uint64_t>(descriptors / 2, 1, kMostInAll)));
  const uint64_t share = (l.total == 0 ? descriptors / 2 : l.total) / 4;
  l.per_uid =
      settings.per_uid.value_or(static_cast<uint32_t>(std::clamp<uint64_t>(share, 1, kMostPerUid)));
  return l;
}

uint32_t DeriveMaxSessions(uint64_t descriptors) {
  return static_cast<uint32_t>(std::clamp<uint64_t>(descriptors / 8, 1, 1024));
}

DescriptorLimit CurrentDescriptorLimit() {
  DescriptorLimit out;
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return out;
  out.soft_before = out.soft = r.rlim_cur;
  out.hard = r.rlim_max;
  return out;
}

DescriptorLimit RaiseDescriptorLimit() {
  DescriptorLimit out = CurrentDescriptorLimit();
  rlimit r{};
  r.rlim_cur = out.soft;
  r.rlim_max = out.hard;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &r) == 0) out.soft = r.rlim_max;
  }
  return out;
}

bool RefusePassedDescriptors(int fd) {
  constexpr int kSoPassRights = 83;  // SO_PASSRIGHTS, Linux 6.16; not in older headers
  const int pass = 0;
  if (::setsockopt(fd, SOL_SOCKET, kSoPassRights, &pass, sizeof(pass)) == 0) return true;
  static std::once_flag logged;
  const int error = errno;
  std::call_once(logged, [error] {
    spdlog::info(
        "this kernel cannot make a Unix socket refuse passed descriptors (SO_PASSRIGHTS, Linux "
        "6.16): {}; ferryd's own reads take and reset them (docs/operations.md, \"Passed "
        "descriptors\")",
        std::strerror(error));
  });
  return false;
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
  (void)RefusePassedDescriptors(fd);  // before listen: every connection inherits it
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
  // Not through a link swapped in for the socket meanwhile (the directory may be shared).
  if ((needs_chmod && ::fchmodat(AT_FDCWD, path.c_str(), 0660, AT_SYMLINK_NOFOLLOW) < 0) ||
      ::listen(fd, SOMAXCONN) < 0) {
    Status s = SocketError("listen " + path);
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  return fd;
}

}  // namespace ferry::rpc
