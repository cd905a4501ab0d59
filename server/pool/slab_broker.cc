#include "pool/slab_broker.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "ferry/little_endian.h"

namespace ferry::pool {
namespace {

constexpr size_t kHelloBytes = sizeof(kSlabMagic) + kSlabTokenBytes;
constexpr size_t kRequestBytes = 8;

using le::Get32;
using le::Put32;
using le::Put64;

// Send `bytes` with `fd` attached (when >= 0); false when the peer cannot take it now.
bool SendWithFd(int sock, const char* bytes, size_t n, int fd) {
  struct iovec iov = {const_cast<char*>(bytes), n};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t r = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  return r == static_cast<ssize_t>(n);
}

}  // namespace

SlabMessage ParseSlabMessage(std::string_view in, bool bound) {
  SlabMessage m;
  if (!bound) {
    if (in.size() < kHelloBytes) return m;
    m.bytes = kHelloBytes;
    if (std::memcmp(in.data(), kSlabMagic, sizeof(kSlabMagic)) != 0) {
      m.kind = SlabMessage::Kind::kBadHello;
      return m;
    }
    m.kind = SlabMessage::Kind::kHello;
    m.token = std::string(in.substr(sizeof(kSlabMagic), kSlabTokenBytes));
    return m;
  }
  if (in.size() < kRequestBytes) return m;
  m.bytes = kRequestBytes;
  m.op = Get32(in.data());
  const bool known = m.op == kSlabRequestAcquire || m.op == kSlabRequestCompletionBoard ||
                     m.op == kSlabRequestSubmitRing || m.op == kSlabRequestRingDoorbell;
  m.kind = known ? SlabMessage::Kind::kRequest : SlabMessage::Kind::kBadRequest;
  return m;
}

Result<std::unique_ptr<SlabBroker>> SlabBroker::Start(const std::string& path, int listen_fd) {
  std::unique_ptr<SlabBroker> b(new SlabBroker());
  b->path_ = path;
  b->listen_fd_ = listen_fd;
  int flags = ::fcntl(listen_fd, F_GETFL);
  if (flags < 0 || ::fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Status(ErrorKind::kInternal, std::string("fcntl(O_NONBLOCK): ") + std::strerror(errno));
  }
  if (::pipe2(b->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status(ErrorKind::kInternal, std::string("pipe2: ") + std::strerror(errno));
  }
  b->thread_ = std::thread([raw = b.get()] {
    pthread_setname_np(pthread_self(), "ferry-slabs");
    raw->Run();
  });
  return b;
}

SlabBroker::~SlabBroker() {
  stop_ = true;
  if (wake_[1] >= 0) {
    char c = 1;
    (void)!::write(wake_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(path_.c_str());
  }
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

std::string SlabBroker::IssueToken(std::weak_ptr<SessionSlabs> slabs) {
  unsigned char raw[kSlabTokenBytes / 2];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t r = ::getrandom(raw + got, sizeof(raw) - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
  }
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char c : raw) {
    token += hex[c >> 4];
    token += hex[c & 15];
  }
  std::lock_guard lock(mu_);
  tokens_[token] = std::move(slabs);
  return token;
}

void SlabBroker::RevokeToken(const std::string& token) {
  std::lock_guard lock(mu_);
  tokens_.erase(token);
}

void SlabBroker::Run() {
  std::map<int, Connection> conns;
  std::vector<pollfd> fds;
  while (!stop_) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& [fd, c] : conns) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("slab socket poll: {}", std::strerror(errno));
      return;
    }
    if (stop_) break;
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      auto it = conns.find(fds[i].fd);
      if (!Serve(it->second)) {
        ::close(it->first);
        conns.erase(it);
        connections_ = conns.size();
      }
    }
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        struct ucred cred = {};
        socklen_t len = sizeof(cred);
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
          ::close(fd);
          continue;
        }
        Connection& c = conns[fd];
        c.fd = fd;
        c.uid = cred.uid;
        connections_ = conns.size();
      }
    }
  }
  for (auto& [fd, c] : conns) ::close(fd);
  connections_ = 0;
}

bool SlabBroker::Serve(Connection& c) {
  char buf[256];
  ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c.in.append(buf, static_cast<size_t>(n));
  if (c.in.size() > 4096) return false;  // a peer that does not wait for answers
  for (;;) {
    const SlabMessage m = ParseSlabMessage(c.in, c.bound);
    if (m.kind == SlabMessage::Kind::kNeedMore) return true;
    c.in.erase(0, m.bytes);
    if (!c.bound) {
      char reply[8] = {};
      std::shared_ptr<SessionSlabs> slabs;
      if (m.kind == SlabMessage::Kind::kHello) {
        std::lock_guard lock(mu_);
        auto it = tokens_.find(m.token);
        if (it != tokens_.end()) {
          slabs = it->second.lock();
          tokens_.erase(it);  // one connection per token, whatever happens next
        }
      }
      if (!slabs || !slabs->Bind(c.uid)) {
        Put32(reply, static_cast<uint32_t>(ErrorKind::kInvalidArgument));
        (void)SendWithFd(c.fd, reply, sizeof(reply), -1);
        return false;
      }
      c.slabs = slabs;
      c.bound = true;
      if (!SendWithFd(c.fd, reply, sizeof(reply), -1)) return false;
      continue;
    }
    const uint32_t op = m.op;
    char reply[24] = {};
    if (m.kind != SlabMessage::Kind::kRequest) {
      Put32(reply, static_cast<uint32_t>(ErrorKind::kProtocolViolation));
      (void)SendWithFd(c.fd, reply, sizeof(reply), -1);
      return false;
    }
    auto slabs = c.slabs.lock();
    // A board or ring the session does not have (UNSUPPORTED), or a session gone; no fd.
    auto answer_none = [&] {
      Put32(reply,
            static_cast<uint32_t>(slabs ? ErrorKind::kUnsupported : ErrorKind::kSessionClosed));
      return SendWithFd(c.fd, reply, sizeof(reply), -1);
    };
    if (op == kSlabRequestSubmitRing || op == kSlabRequestRingDoorbell) {
      SubmitRing* ring = slabs ? slabs->ring() : nullptr;
      if (!ring) {
        if (!answer_none()) return false;
        continue;
      }
      const bool memory = op == kSlabRequestSubmitRing;
      Put64(reply + 8, memory ? ring->capacity() : 0);
      Put64(reply + 16, memory ? ring->map_bytes() : 8);
      if (!SendWithFd(c.fd, reply, sizeof(reply), memory ? ring->memfd() : ring->doorbell())) {
        return false;
      }
      continue;
    }
    if (op == kSlabRequestCompletionBoard) {
      CompletionBoard* board = slabs ? slabs->board() : nullptr;
      if (!board) {
        if (!answer_none()) return false;
        continue;
      }
      Put64(reply + 16, CompletionBoard::kBytes);
      if (!SendWithFd(c.fd, reply, sizeof(reply), board->fd())) return false;
      continue;
    }
    Result<SlabRef> ref =
        slabs ? slabs->Acquire() : Result<SlabRef>(Status(ErrorKind::kSessionClosed, "closed"));
    if (!ref.ok()) {
      Put32(reply, static_cast<uint32_t>(ref.status().kind()));
      if (!SendWithFd(c.fd, reply, sizeof(reply), -1)) return false;
      continue;
    }
    Put64(reply + 8, ref->id);
    Put64(reply + 16, ref->size);
    if (!SendWithFd(c.fd, reply, sizeof(reply), ref->fd)) return false;
  }
}

}  // namespace ferry::pool
