#include "transport/slab_broker.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "ferry/little_endian.h"

namespace ferry::transport {
namespace {

// Close the descriptors a peer passed with its bytes (SCM_RIGHTS), which the slab protocol
// never carries toward the daemon. The last close of a descriptor runs on the closing thread,
// and some close slowly on purpose: a TCP socket with unsent bytes and SO_LINGER waits for as
// long as its sender asked. So a socket among them is reset first (SO_LINGER 0: its close
// returns at once; on other files the call fails and changes nothing).
void CloseReceived(msghdr& msg) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      const linger reset{1, 0};
      (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      ::close(fd);
    }
  }
}

// recv (non-blocking) on a client's connection, with room for every descriptor one message
// can pass (the kernel's SCM_MAX_FD, 253): without the room the kernel would close them
// itself, on this thread, with no chance to reset them first. `*passed` is set when the peer
// passed any (closed here).
ssize_t ReceiveFromClient(int fd, char* buf, size_t size, bool* passed) {
  alignas(cmsghdr) char control[CMSG_SPACE(253 * sizeof(int))];
  iovec iov{buf, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n >= 0 && (msg.msg_controllen > 0 || (msg.msg_flags & MSG_CTRUNC) != 0)) {
    *passed = true;
    CloseReceived(msg);
  }
  return n;
}

// Close a client's connection without letting its unread messages close descriptors on this
// thread: shut for reading (its peer's sends fail from here on), take what it had queued with
// ReceiveFromClient, then close.
void CloseClientConnection(int fd) {
  (void)::shutdown(fd, SHUT_RD);
  char scratch[4096];
  bool passed = false;
  while (ReceiveFromClient(fd, scratch, sizeof(scratch), &passed) > 0) {
  }
  ::close(fd);
}

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

// Compare two tokens in time that depends only on their lengths (never on where they
// first differ), so the reply's timing tells a guesser nothing about a live token.
bool TokenEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
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

Result<std::unique_ptr<SlabBroker>> SlabBroker::Start(const std::string& path, int listen_fd,
                                                      const SlabBrokerOptions& options) {
  std::unique_ptr<SlabBroker> b(new SlabBroker());
  b->path_ = path;
  b->options_ = options;
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
  uint32_t granters = options.grant_threads;
  if (granters == 0) granters = std::clamp<uint32_t>(std::thread::hardware_concurrency(), 1, 16);
  for (uint32_t i = 0; i < granters; ++i) {
    b->granters_.emplace_back([raw = b.get()] {
      pthread_setname_np(pthread_self(), "ferry-slabgrant");
      raw->RunGranter();
    });
  }
  return b;
}

SlabBroker::~SlabBroker() {
  // The grant threads first (each ends after the acquire it answers, if any): the poll
  // thread then closes every connection, none of them in a grant thread's hands.
  {
    MutexLock lock(&grant_mu_);
    granters_stop_ = true;
  }
  grant_cv_.NotifyAll();
  for (std::thread& t : granters_) t.join();
  stop_ = true;
  Wake();
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(path_.c_str());
  }
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

Status FillRandom(unsigned char* out, size_t n, RandomSource source) {
  size_t got = 0;
  int retries = 0;
  while (got < n) {
    errno = 0;
    const ssize_t r = source(out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    const int err = r < 0 ? errno : 0;
    if (r < 0 && err != EINTR && err != EAGAIN) {
      return Status(ErrorKind::kUnavailable,
                    std::string("getrandom failed: ") + std::strerror(err));
    }
    if (++retries > kRandomRetries) {
      return Status(ErrorKind::kUnavailable,
                    "getrandom gave no bytes after " + std::to_string(kRandomRetries) + " tries" +
                        (err ? std::string(" (") + std::strerror(err) + ")" : ""));
    }
  }
  return Status::Ok();
}

Result<std::string> SlabBroker::IssueToken(std::weak_ptr<SessionChannels> channels, uid_t uid) {
  unsigned char raw[kSlabTokenBytes / 2];
  FERRY_RETURN_IF_ERROR(FillRandom(raw, sizeof(raw)).WithContext("making a slab token"));
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char c : raw) {
    token += hex[c >> 4];
    token += hex[c & 15];
  }
  MutexLock lock(&mu_);
  tokens_.push_back({token, std::move(channels), uid});
  ++tokens_of_uid_[uid];
  return token;
}

void SlabBroker::RevokeToken(const std::string& token) {
  MutexLock lock(&mu_);
  // The token comes from the daemon here, not from a peer: an early exit tells no one anything.
  for (auto it = tokens_.begin(); it != tokens_.end(); ++it) {
    if (it->token == token) {
      ForgetTokenOfUidLocked(it->uid);
      tokens_.erase(it);
      return;
    }
  }
}

std::shared_ptr<SessionChannels> SlabBroker::SpendToken(std::string_view presented,
                                                        uid_t presenter) {
  MutexLock lock(&mu_);
  // Every pending token is compared in full, whether or not one matched before it: the time
  // taken depends on how many tokens are pending, never on the bytes presented.
  size_t match = tokens_.size();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (TokenEquals(tokens_[i].token, presented)) match = i;
  }
  if (match == tokens_.size()) return nullptr;
  // Only the session's own uid binds it: a token another uid learned is spent, binding nothing.
  std::shared_ptr<SessionChannels> channels =
      tokens_[match].uid == presenter ? tokens_[match].channels.lock() : nullptr;
  ForgetTokenOfUidLocked(tokens_[match].uid);
  tokens_.erase(tokens_.begin() + static_cast<std::ptrdiff_t>(match));  // one connection per
  return channels;                                                      // token, whatever next
}

void SlabBroker::ForgetTokenOfUidLocked(uid_t uid) {
  auto it = tokens_of_uid_.find(uid);
  if (it != tokens_of_uid_.end() && --it->second == 0) tokens_of_uid_.erase(it);
}

uint32_t SlabBroker::PendingAllowance(uid_t uid) {
  MutexLock lock(&mu_);
  auto it = tokens_of_uid_.find(uid);
  return options_.max_pending_per_uid + (it == tokens_of_uid_.end() ? 0 : it->second);
}

void SlabBroker::Wake() {
  if (wake_[1] < 0) return;
  char c = 1;
  (void)!::write(wake_[1], &c, 1);  // a full pipe is readable already
}

void SlabBroker::RunGranter() {
  for (;;) {
    GrantJob job;
    {
      MutexLock lock(&grant_mu_);
      grant_cv_.Wait(&grant_mu_, [&] {
        grant_mu_.AssertHeld();
        return granters_stop_ || !grants_.empty();
      });
      if (granters_stop_) return;
      job = grants_.Pop();
    }
    char reply[24] = {};
    int fd = -1;  // a duplicate of the slab's memfd, taken while the session held the slab
    {
      std::shared_ptr<SessionChannels> channels = job.channels.lock();
      pool::SessionSlabs* slabs = channels ? channels->slabs.get() : nullptr;
      Result<pool::SlabRef> ref =
          slabs ? slabs->Acquire()
                : Result<pool::SlabRef>(Status(ErrorKind::kSessionClosed, "closed"));
      Result<int> dup = ref.ok() ? slabs->DuplicateFd(ref->id) : Result<int>(ref.status());
      if (dup.ok()) {
        fd = *dup;
        Put64(reply + 8, ref->id);
        Put64(reply + 16, ref->size);
      } else {
        Put32(reply, static_cast<uint32_t>(dup.status().kind()));
      }
    }
    {
      MutexLock lock(&grant_mu_);
      --acquires_waiting_;  // before the answer goes: a client that has it never sees it counted
    }
    const bool sent = SendWithFd(job.fd, reply, sizeof(reply), fd);
    if (fd >= 0) ::close(fd);
    {
      MutexLock lock(&grant_mu_);
      done_.push_back({job.fd, sent});
    }
    Wake();
  }
}

SlabBrokerStats SlabBroker::stats() const {
  SlabBrokerStats s;
  s.refused_over_cap = refused_over_cap_.load();
  s.refused_uid_pending = refused_uid_pending_.load();
  s.hello_timeouts = hello_timeouts_.load();
  s.accept_backoffs = accept_backoffs_.load();
  s.refused_unread = refused_unread_.load();
  s.unread_connections = unread_connections_.load();
  MutexLock lock(&grant_mu_);
  s.acquires_waiting = acquires_waiting_;
  return s;
}

bool SlabBroker::AcceptAll(std::map<int, Connection>& conns, std::map<uid_t, uint32_t>& pending) {
  // At most kAcceptBatch per pass: a client that connects in a tight loop (each refused at
  // once past a cap) must not keep the thread from the connections it serves.
  constexpr int kAcceptBatch = 64;
  for (int n = 0; n < kAcceptBatch; ++n) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        return false;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return true;  // EAGAIN: the backlog is empty
    }
    struct ucred cred = {};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      CloseClientConnection(fd);
      continue;
    }
    // Accepted and closed at once rather than left in the backlog: the client sees its
    // connection end (EOF) instead of hanging, and the backlog stays free for others.
    if (conns.size() >= options_.max_connections) {
      ++refused_over_cap_;
      CloseClientConnection(fd);
      continue;
    }
    if (auto u = unread_of_uid_.find(cred.uid);
        u != unread_of_uid_.end() && u->second >= options_.max_pending_per_uid) {
      ++refused_unread_;  // until it reads, or closes, what it was sent
      CloseClientConnection(fd);
      continue;
    }
    uint32_t& waiting = pending[cred.uid];
    if (waiting >= PendingAllowance(cred.uid)) {
      ++refused_uid_pending_;
      CloseClientConnection(fd);
      continue;
    }
    ++waiting;
    Connection& c = conns[fd];
    c.fd = fd;
    c.uid = cred.uid;
    c.hello_deadline = std::chrono::steady_clock::now() + options_.hello_timeout;
    connections_ = conns.size();
  }
  return true;  // more may wait: the next poll says so at once
}

SlabBroker::ConnectionMap::iterator SlabBroker::CloseConnection(ConnectionMap& conns,
                                                                PendingCount& pending,
                                                                ConnectionMap::iterator it) {
  if (!it->second.bound) {
    auto p = pending.find(it->second.uid);
    if (p != pending.end() && --p->second == 0) pending.erase(p);
  }
  CloseOrKeepUnread(it->first, it->second.uid);
  auto next = conns.erase(it);
  connections_ = conns.size();
  return next;
}

std::chrono::steady_clock::time_point SlabBroker::SweepConnections(
    ConnectionMap& conns, PendingCount& pending, std::chrono::steady_clock::time_point now,
    bool* bound_any) {
  auto wake_at = std::chrono::steady_clock::time_point::max();
  *bound_any = false;
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->second.bound && !it->second.granting) {
      auto channels = it->second.channels.lock();
      if (!channels || channels->slabs->closed()) {
        it = CloseConnection(conns, pending, it);
        continue;
      }
      *bound_any = true;
    }
    if (!it->second.bound) {
      if (it->second.hello_deadline <= now) {
        ++hello_timeouts_;
        it = CloseConnection(conns, pending, it);
        continue;
      }
      wake_at = std::min(wake_at, it->second.hello_deadline);
    }
    ++it;
  }
  return wake_at;
}

void SlabBroker::HandlePolled(const std::vector<pollfd>& fds, size_t unread_at,
                              ConnectionMap& conns, PendingCount& pending) {
  if (fds[0].revents) {
    char drain[64];
    while (::read(wake_[0], drain, sizeof(drain)) > 0) {
    }
  }
  // Acquires answered: their connections are read again (what they sent meanwhile first).
  std::vector<GrantDone> done;
  {
    MutexLock lock(&grant_mu_);
    done.swap(done_);
  }
  for (const GrantDone& g : done) {
    auto it = conns.find(g.fd);
    if (it == conns.end()) continue;
    it->second.granting = false;
    if (!g.sent || !Process(it->second)) CloseConnection(conns, pending, it);
  }
  std::vector<int> hung_up;
  for (size_t i = unread_at; i < fds.size(); ++i) {
    if (fds[i].revents) hung_up.push_back(fds[i].fd);
  }
  ReleaseRead(hung_up);
  for (size_t i = 2; i < unread_at; ++i) {
    if (!fds[i].revents) continue;
    auto it = conns.find(fds[i].fd);
    const bool was_bound = it->second.bound;
    if (!Serve(it->second)) {
      if (!was_bound) it->second.bound = false;  // still counted as pending
      CloseConnection(conns, pending, it);
    } else if (!was_bound && it->second.bound) {
      auto p = pending.find(it->second.uid);
      if (p != pending.end() && --p->second == 0) pending.erase(p);
    }
  }
}

void SlabBroker::Run() {
  using Clock = std::chrono::steady_clock;
  ConnectionMap conns;
  PendingCount pending;  // connections not yet bound, per uid
  std::vector<pollfd> fds;
  Clock::time_point accept_paused_until{};
  bool backing_off = false;  // logged once per run of failed accepts
  while (!stop_) {
    // Close connections past their hello deadline, and find the next deadline; close bound
    // connections whose session has ended (looked at again within kSessionEndCheck).
    const Clock::time_point now = Clock::now();
    bool bound_any = false;
    Clock::time_point wake_at = SweepConnections(conns, pending, now, &bound_any);
    const bool accepting = now >= accept_paused_until;
    if (!accepting) wake_at = std::min(wake_at, accept_paused_until);
    if (bound_any || !unread_.empty()) wake_at = std::min(wake_at, now + kSessionEndCheck);
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max()) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
    }
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    // Left out while paused: a readable listening socket would wake poll at once, again
    // and again, while there is no descriptor to accept it with.
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (auto& [fd, c] : conns) {
      if (!c.granting) fds.push_back({fd, POLLIN, 0});  // a grant thread answers it now
    }
    const size_t unread_at = fds.size();
    for (const auto& [fd, uid] : unread_) fds.push_back({fd, 0, 0});  // hang-ups only
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("slab socket poll: {}", std::strerror(errno));
      return;
    }
    if (stop_) break;
    HandlePolled(fds, unread_at, conns, pending);
    if (accepting && (fds[1].revents & POLLIN)) {
      if (!AcceptAll(conns, pending)) {
        ++accept_backoffs_;
        if (!backing_off) {
          spdlog::warn("slab socket: accept: {}; retrying every {} ms", std::strerror(errno),
                       kAcceptBackoff.count());
        }
        backing_off = true;
        accept_paused_until = Clock::now() + kAcceptBackoff;
      } else {
        backing_off = false;
      }
    }
  }
  for (auto& [fd, c] : conns) CloseClientConnection(fd);
  for (auto& [fd, uid] : unread_) CloseClientConnection(fd);
  unread_.clear();
  unread_of_uid_.clear();
  unread_connections_ = 0;
  connections_ = 0;
}

namespace {
// Whether the peer of connection `fd` has not yet read all that was sent on it.
bool PeerHasUnread(int fd) {
  int unread = 0;
  return ::ioctl(fd, SIOCOUTQ, &unread) == 0 && unread > 0;
}

}  // namespace

void SlabBroker::CloseOrKeepUnread(int fd, uid_t uid) {
  if (!PeerHasUnread(fd)) {
    CloseClientConnection(fd);
    return;
  }
  // The peer reads what is queued, then end of file. (Not SHUT_RDWR: a socket shut both
  // ways polls as hung up at once, and the peer's own hang-up is what is watched for.)
  (void)::shutdown(fd, SHUT_WR);
  unread_.emplace(fd, uid);
  ++unread_of_uid_[uid];
  unread_connections_ = unread_.size();
}

void SlabBroker::ReleaseRead(const std::vector<int>& hung_up) {
  for (auto it = unread_.begin(); it != unread_.end();) {
    const bool done = std::find(hung_up.begin(), hung_up.end(), it->first) != hung_up.end() ||
                      !PeerHasUnread(it->first);
    if (!done) {
      ++it;
      continue;
    }
    CloseClientConnection(it->first);
    auto u = unread_of_uid_.find(it->second);
    if (u != unread_of_uid_.end() && --u->second == 0) unread_of_uid_.erase(u);
    it = unread_.erase(it);
  }
  unread_connections_ = unread_.size();
}

bool SlabBroker::Serve(Connection& c) {
  char buf[256];
  bool passed = false;
  ssize_t n = ReceiveFromClient(c.fd, buf, sizeof(buf), &passed);
  if (passed) return false;  // descriptors are never sent to the daemon: the connection ends
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c.in.append(buf, static_cast<size_t>(n));
  if (c.in.size() > 4096) return false;  // a peer that does not wait for answers
  return Process(c);
}

bool SlabBroker::BindHello(Connection& c, const SlabMessage& m) {
  char reply[8] = {};
  std::shared_ptr<SessionChannels> channels;
  // A hello with a bad magic is not this protocol: it is refused before its token is
  // looked at, so the token stays unspent (docs/protocol.md, "Slab socket").
  if (m.kind == SlabMessage::Kind::kHello) {
    channels = SpendToken(m.token, c.uid);
  }
  if (!channels || !channels->slabs->Bind(c.uid)) {
    Put32(reply, static_cast<uint32_t>(ErrorKind::kInvalidArgument));
    (void)SendWithFd(c.fd, reply, sizeof(reply), -1);
    return false;
  }
  c.channels = channels;
  c.bound = true;
  return SendWithFd(c.fd, reply, sizeof(reply), -1);
}

bool SlabBroker::HandChannel(Connection& c, SessionChannels& channels, uint32_t op) {
  char reply[24] = {};
  // A board or ring the session does not have: UNSUPPORTED, no fd.
  auto answer_none = [&] {
    Put32(reply, static_cast<uint32_t>(ErrorKind::kUnsupported));
    return SendWithFd(c.fd, reply, sizeof(reply), -1);
  };
  if (op == kSlabRequestSubmitRing || op == kSlabRequestRingDoorbell) {
    SubmitRing* ring = channels.ring.get();
    if (!ring) return answer_none();
    const bool memory = op == kSlabRequestSubmitRing;
    Put64(reply + 8, memory ? ring->capacity() : 0);
    Put64(reply + 16, memory ? ring->map_bytes() : 8);
    return SendWithFd(c.fd, reply, sizeof(reply),
                      memory ? ring->memfd() : ring->doorbell_for_client());
  }
  CompletionBoard* board = channels.board.get();
  if (!board) return answer_none();
  Put64(reply + 16, CompletionBoard::kBytes);
  return SendWithFd(c.fd, reply, sizeof(reply), board->fd());
}

bool SlabBroker::Process(Connection& c) {
  for (;;) {
    const SlabMessage m = ParseSlabMessage(c.in, c.bound);
    if (m.kind == SlabMessage::Kind::kNeedMore) return true;
    c.in.erase(0, m.bytes);
    if (!c.bound) {
      if (!BindHello(c, m)) return false;
      continue;
    }
    const uint32_t op = m.op;
    char reply[24] = {};
    if (m.kind != SlabMessage::Kind::kRequest) {
      Put32(reply, static_cast<uint32_t>(ErrorKind::kProtocolViolation));
      (void)SendWithFd(c.fd, reply, sizeof(reply), -1);
      return false;
    }
    auto channels = c.channels.lock();
    if (!channels || channels->slabs->closed()) {  // the session ended: so does its connection
      Put32(reply, static_cast<uint32_t>(ErrorKind::kSessionClosed));
      (void)SendWithFd(c.fd, reply, sizeof(reply), -1);
      return false;
    }
    // The board, the ring and the doorbell are handed once each: a client asking again would
    // only pile descriptors up in flight (see the header).
    const uint8_t once = op == kSlabRequestCompletionBoard ? kHandedBoard
                         : op == kSlabRequestSubmitRing    ? kHandedRing
                         : op == kSlabRequestRingDoorbell  ? kHandedDoorbell
                                                           : 0;
    if (once != 0 && (c.handed & once) != 0) {
      Put32(reply, static_cast<uint32_t>(ErrorKind::kProtocolViolation));
      (void)SendWithFd(c.fd, reply, sizeof(reply), -1);
      return false;
    }
    c.handed |= once;
    if (once != 0) {
      if (!HandChannel(c, *channels, op)) return false;
      continue;
    }
    // An acquire may make its slab: a grant thread answers it, and the messages after it
    // wait in c.in until then (answers stay in order).
    {
      MutexLock lock(&grant_mu_);
      grants_.Push(c.uid, {c.fd, c.channels});
      ++acquires_waiting_;
    }
    grant_cv_.NotifyOne();
    c.granting = true;
    return true;
  }
}

}  // namespace ferry::transport
