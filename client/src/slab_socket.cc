#include "slab_socket.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ferry/little_endian.h"
#include "ferry/wire.h"

namespace ferry::internal {

void SlabSocket::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status SlabSocket::Error(const std::string& what) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return Status(ErrorKind::kUnavailable, "slab socket " + path_ + ": " + what);
}

namespace {

std::string RequestBytes(uint32_t op) {
  char request[8] = {};
  le::Put32(request, op);
  return std::string(request, sizeof(request));
}

}  // namespace

Status SlabSocket::SendRequests(const std::string& requests) {
  std::string out;
  const bool connecting = fd_ < 0;
  if (connecting) {
    if (token_used_) return Error("the connection was lost");
    token_used_ = true;
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    const std::string& path = path_;
    if (fd_ < 0 || path.size() >= sizeof(addr.sun_path)) return Error("bad path");
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return Error(std::strerror(errno));
    }
    out = "FSL1" + token_;
  }
  out += requests;
  if (::send(fd_, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
    return Error(connecting ? "no answer to the token" : "send failed");
  }
  if (connecting) {
    char answer[8];
    if (::recv(fd_, answer, sizeof(answer), MSG_WAITALL) != sizeof(answer)) {
      return Error("no answer to the token");
    }
    if (le::Get32(answer) != 0) return Error("the daemon refused the token");
  }
  return Status::Ok();
}

Status SlabSocket::ReadAnswer(char (&reply)[24], int* fd) {
  *fd = -1;
  iovec iov = {reply, sizeof(reply)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(fd_, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(fd, CMSG_DATA(c), sizeof(int));
    }
  }
  if (n != sizeof(reply)) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
    return Error("short answer");
  }
  return Status::Ok();
}

Status SlabSocket::Request(uint32_t op, char (&reply)[24], int* fd) {
  *fd = -1;
  FERRY_RETURN_IF_ERROR(SendRequests(RequestBytes(op)));
  return ReadAnswer(reply, fd);
}

Result<std::shared_ptr<SlabMapping>> SlabSocket::AcquireSlab() {
  char reply[24];
  int fd = -1;
  FERRY_RETURN_IF_ERROR(Request(1, reply, &fd));
  uint32_t kind = le::Get32(reply);
  if (kind != 0) {
    if (fd >= 0) ::close(fd);
    const ErrorKind known = kind > static_cast<uint32_t>(kLastErrorKind)
                                ? ErrorKind::kInternal
                                : static_cast<ErrorKind>(kind);
    return wire::FromWireKind(
        kind, "the daemon gave no slab (" + std::string(ErrorKindName(known)) +
                  (known == ErrorKind::kQuotaExceeded
                       ? ": the session's --session-pinned-quota is reached, or the "
                         "daemon's --pinned-budget is held by slabs in use)"
                       : ")"));
  }
  if (fd < 0) return Error("no fd came with the slab");
  auto m = std::make_shared<SlabMapping>();
  m->id = le::Get64(reply + 8);
  m->size = le::Get64(reply + 16);
  void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Status(ErrorKind::kInternal, "mmap of a slab failed");
  m->base = static_cast<char*>(p);
  return m;
}

SlabSocket::SessionChannels SlabSocket::MapSessionChannels(bool board, bool ring) {
  SessionChannels out;
  if (!board && !ring) return out;
  std::string requests;
  if (board) requests += RequestBytes(2);
  if (ring) requests += RequestBytes(3) + RequestBytes(4);
  if (!SendRequests(requests).ok()) return out;
  char reply[24];
  int fd = -1;
  if (board) {
    if (!ReadAnswer(reply, &fd).ok()) return out;
    const uint64_t size = le::Get64(reply + 16);
    if (le::Get32(reply) == 0 && fd >= 0 && size >= 16) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) out.board = std::make_unique<CompletionBoard>(p, size);
    }
    if (fd >= 0) ::close(fd);
  }
  if (!ring) return out;
  // Both answers are read whatever the first says, so the connection stays in step.
  if (!ReadAnswer(reply, &fd).ok()) return out;
  const uint64_t capacity = le::Get64(reply + 8), size = le::Get64(reply + 16);
  void* p = MAP_FAILED;
  if (le::Get32(reply) == 0 && fd >= 0 && capacity >= 4096 && (capacity & (capacity - 1)) == 0 &&
      size == RingWriter::kHeaderBytes + capacity) {
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (fd >= 0) ::close(fd);
  int doorbell = -1;
  if (!ReadAnswer(reply, &doorbell).ok() || le::Get32(reply) != 0 || doorbell < 0 ||
      p == MAP_FAILED) {
    if (doorbell >= 0) ::close(doorbell);
    if (p != MAP_FAILED) ::munmap(p, size);
    return out;
  }
  out.ring = std::make_unique<RingWriter>(static_cast<char*>(p), capacity, doorbell);
  return out;
}

}  // namespace ferry::internal
