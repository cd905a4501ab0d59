// Local (Unix-socket) clients: ferryd accepts their connections itself.
//
// gRPC's own Unix listener says nothing about who connected. So ferryd listens on its Unix
// endpoints itself (or adopts systemd's inherited sockets), accepts each connection on a
// thread of its own (systemd::SocketAcceptor), reads SO_PEERCRED, records the credentials
// here and only then hands the fd to gRPC, which names that peer "fd:N". A session stream
// looks its peer up here: a hit means a local client (it may use shared memory) with a known
// uid and pid, shown by `ferryctl sessions`.
//
// Connections are bounded here, in all and per uid (max-local-connections,
// max-local-connections-per-uid). Why: each one costs the daemon a descriptor and gRPC's
// per-connection state (about 6-12 KiB idle, measured), whether or not it ever carries a
// stream, so a uid that opened connections and sent nothing could take every descriptor the
// daemon may open (its slabs, other uids' connections and the device need them too).
//
// Contract:
// - A connection counts from Admit until its client closes its end or gRPC closes the fd
//   (gRPC does when the client closes its side or the transport ends). ferryd is not told
//   when, so a recorded fd is taken as closed when its descriptor no longer refers to the
//   socket it was accepted as (fstat's device and inode) or the kernel reports the peer's
//   hang-up on it (poll's POLLRDHUP/POLLHUP: set as the client's close returns, while gRPC
//   closes the fd only once it has read the end of the stream; so a client that closes a
//   connection and at once opens another at its limit is not refused). The counts of a uid
//   are brought up to date that way when the uid reaches its limit, and all of them when the
//   total does, before a refusal. A hung-up connection still holds its descriptor until gRPC
//   closes it, which it does on its next read: the limits may be passed by the connections
//   gRPC is closing at that moment.
// - `exempt_uid` (the daemon's own) and root, while `exempt_root` (config `admins` lists
//   root), are never refused and not counted against the total: an operator can always
//   reach a daemon others have filled. Where root is no admin (clients in containers running
//   as root), it is counted like any uid.
// - A refused connection is closed by the caller at once; refused_*() count them.
//
// Thread-safe: each Unix endpoint's acceptor admits on its own thread, streams identify.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "rpc/systemd_notify.h"
#include "session/registry.h"

namespace ferry::rpc {

struct LocalConnectionLimits {
  uint32_t total = 4096;    // max-local-connections; 0: no limit
  uint32_t per_uid = 1024;  // max-local-connections-per-uid; 0: no limit
};

/// max-local-connections and max-local-connections-per-uid as configured; unset ones are
/// derived from the daemon's descriptor limit (ResolveLocalConnectionLimits).
struct LocalConnectionSettings {
  std::optional<uint32_t> total;
  std::optional<uint32_t> per_uid;
};

/// The limits in effect for a daemon that may hold `descriptors` open (RLIMIT_NOFILE): those
/// configured, else derived so that connections cannot take the descriptors the rest of the
/// daemon needs, nor one uid those of every other: in all, half of them (the other half is for
/// the sessions' slabs, boards, rings and slab-socket connections, TCP and the device), at
/// most 4096; per uid, a quarter of that, at most 1024.
LocalConnectionLimits ResolveLocalConnectionLimits(const LocalConnectionSettings& settings,
                                                   uint64_t descriptors);

/// max-sessions where not configured: an eighth of `descriptors` (a local session holds about
/// four: its slab socket connection, completion board, submit ring and doorbell; so all
/// sessions together take at most half), at most 1024.
uint32_t DeriveMaxSessions(uint64_t descriptors);

/// Raise this process's soft RLIMIT_NOFILE to its hard limit (many containers and services
/// start with a soft limit of 1024, far below what the hard limit allows). What it was and is.
struct DescriptorLimit {
  uint64_t soft_before = 0;
  uint64_t soft = 0;
  uint64_t hard = 0;
};
DescriptorLimit RaiseDescriptorLimit();
/// The limit now (soft_before == soft).
DescriptorLimit CurrentDescriptorLimit();

class LocalConnections {
 public:
  explicit LocalConnections(LocalConnectionLimits limits = {},
                            uint32_t exempt_uid = static_cast<uint32_t>(-1),
                            bool exempt_root = true)
      : limits_(limits), exempt_uid_(exempt_uid), exempt_root_(exempt_root) {}

  /// Record the connection accepted as `fd` on `endpoint` ("unix:PATH") when the limits allow
  /// it; false when refused (the caller closes the fd; nothing is recorded). Call before gRPC
  /// sees the fd. A later connection that reuses the fd number replaces the record (the
  /// earlier connection is closed by then, so no stream can still ask for it).
  bool Admit(int fd, std::string endpoint, const systemd::PeerCredentials& peer);

  /// Who is behind a gRPC peer name: the endpoint and credentials of a connection accepted
  /// here ("fd:N"), or only the address gRPC reports (TCP peers).
  session::PeerIdentity Identify(const std::string& grpc_peer) const;

  /// Connections gRPC still holds, in all and by uid (uids holding none left out).
  uint64_t count() const;
  std::vector<std::pair<uint32_t, uint64_t>> CountByUid() const;
  /// Connections refused since start: past per_uid, and past total.
  uint64_t refused_per_uid() const;
  uint64_t refused_total_limit() const;
  const LocalConnectionLimits& limits() const { return limits_; }

 private:
  struct Entry {
    std::string endpoint;
    systemd::PeerCredentials peer;
    dev_t dev = 0;  // the socket fd was accepted as
    ino_t ino = 0;
    bool counted = false;  // against the total and its uid (not exempt)
  };
  static bool StillOpen(int fd, const Entry& e);
  void Forget(std::unordered_map<int, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The connections counted for `uid`.
  size_t HeldLocked(uid_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forget the entries whose fd gRPC has closed: of `uid`, or every uid when unset.
  void SweepLocked(std::optional<uid_t> uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LocalConnectionLimits limits_;
  const uint32_t exempt_uid_;
  const bool exempt_root_;
  mutable Mutex mu_;
  std::unordered_map<int, Entry> by_fd_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uid_t, std::unordered_set<int>> fds_by_uid_ ABSL_GUARDED_BY(mu_);  // counted
  uint64_t counted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_per_uid_ ABSL_GUARDED_BY(mu_) = 0, refused_total_ ABSL_GUARDED_BY(mu_) = 0;
};

/// Create a listening Unix stream socket at `path` (mode 0660, close-on-exec), refusing
/// passed descriptors where the kernel can (RefusePassedDescriptors). A stale socket file is
/// replaced; a path where a daemon still accepts connections is refused.
Result<int> ListenUnix(const std::string& path);

/// Make the Unix socket `fd` (a listener: its connections inherit it) refuse descriptors
/// passed to it (SCM_RIGHTS): the sender's sendmsg fails with EPERM. None of ferry's
/// protocols passes one toward the daemon, and the last close of one runs on the thread that
/// reads it, which a peer can make wait (a TCP socket with unsent bytes and SO_LINGER) for as
/// long as it likes. Linux 6.16 and later (SO_PASSRIGHTS); false, changing nothing, on an older
/// kernel (the first time, logged).
bool RefusePassedDescriptors(int fd);

}  // namespace ferry::rpc
