// SlabBroker: hands slab fds to local clients over a Unix socket of its own (gRPC owns the
// session's connection), with SCM_RIGHTS.
//
// Every connection's peer uid is read with SO_PEERCRED at accept. The first message names
// a one-time token the session stream issued (Opened.slab_token) to the session's uid; it
// binds a connection of that uid (of no other) to that session and fixes the session's uid (the
// token is then spent, whether or not the bind succeeds; a hello whose magic is wrong is refused
// without looking at its token, which stays unspent). Tokens are compared in constant time: every
// pending token in full, so the time to answer says nothing about how much of a guess was right.
// After that, each request acquires one slab from the pool for the session and answers its id and
// size with the fd, or answers the session's completion board (a read-only fd). The wire format is
// in docs/protocol.md ("slab socket").
//
// Thread-safe. One thread polls the listening socket and every connection (non-blocking);
// requests are a few bytes, answered at once, except a slab's acquire: that may make the
// slab (tens of ms), so it goes to a few grant threads ("ferry-slabgrant"), and its
// connection is left alone (not read, not closed) until its answer is sent. A burst of
// new sessions thus gets its slabs made side by side, and no acquire holds up another
// session's hello, board or ring. Grant threads take the queued acquires of the uids in
// turn (round robin), so one uid's burst delays another uid's acquire by at most one
// make per grant thread. Sessions' channels (SessionChannels: slab set, board, ring) are
// reached through weak pointers, so a session that ends first simply makes its connection's
// requests fail.
//
// Bounded against hostile local clients (SlabBrokerOptions): a connection that has not sent
// its hello within hello_timeout is closed; connections past max_connections overall, or
// past max_pending_per_uid (plus the uid's unspent tokens) not yet bound for one uid, are accepted
// and closed at once (so the listen backlog never fills with them); when accept fails for want of
// descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM) the thread stops polling the listening socket for
// kAcceptBackoff instead of spinning on it, and keeps serving the connections it has.
//
// Descriptors in flight: a descriptor sent with SCM_RIGHTS and not yet read by the peer is
// charged by the kernel to the daemon's user, and past its RLIMIT_NOFILE of them every later
// send of the daemon fails (ETOOMANYREFS) for every uid. So a client gets each descriptor of
// its session once: its board, ring and doorbell at most once per connection (a second
// request is a protocol violation that ends the connection), its slabs within its pinned
// quota; a connection ends once its session has (a client cannot keep connections beyond
// its sessions); and a connection closed while the peer still has answers unread stays
// open, counted against its uid, until the peer reads them or hangs up. A uid with
// max_pending_per_uid such connections has its new connections closed at accept, so what
// one uid holds unread is bounded by its live sessions and that cap.
#pragma once

#include <poll.h>
#include <sys/random.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "transport/session_channels.h"
#include "transport/uid_round_robin.h"

namespace ferry::transport {

/// Wire constants of the slab socket (all integers little-endian).
inline constexpr char kSlabMagic[4] = {'F', 'S', 'L', '1'};
inline constexpr size_t kSlabTokenBytes = 32;  // ASCII hex
inline constexpr uint32_t kSlabRequestAcquire = 1;
inline constexpr uint32_t kSlabRequestCompletionBoard = 2;
inline constexpr uint32_t kSlabRequestSubmitRing = 3;
inline constexpr uint32_t kSlabRequestRingDoorbell = 4;

/// Where random bytes come from: getrandom(2)'s signature (tests pass a failing one).
using RandomSource = ssize_t (*)(void* buf, size_t len, unsigned int flags);
/// The most times FillRandom retries a source that reports EINTR or EAGAIN (or returns no
/// bytes) before it gives up.
inline constexpr int kRandomRetries = 64;

/// Fill `out[0, n)` from `source`. EINTR and EAGAIN are retried, at most kRandomRetries times;
/// any other error, or running out of retries, is an UNAVAILABLE error naming it, so that no
/// token is ever made from bytes that are not random (nor does a broken source spin a thread).
Status FillRandom(unsigned char* out, size_t n, RandomSource source = &::getrandom);

struct SlabBrokerOptions {
  /// A connection that has not sent a whole hello by then is closed.
  std::chrono::milliseconds hello_timeout{1000};
  /// Connections open at once, bound or not; more are closed as they are accepted.
  uint32_t max_connections = 4096;
  /// Connections of one uid that have not sent a valid hello yet; more are closed as they
  /// are accepted. (Bound connections are one per session, which per-uid limits bound.)
  uint32_t max_pending_per_uid = 32;
  /// Threads that answer slab acquires (each may make its slab): how many slabs are made
  /// at once for a burst of sessions. 0: one per core, at least 1 and at most 16 (making
  /// a slab is mostly the kernel zeroing its pages, which scales with cores; on the H200's
  /// 16 cores, 64 new sessions' blocking row had max/min 1.09-1.18 with 16, 9-24 with 4).
  uint32_t grant_threads = 0;
};

/// Counters of the broker's bounds (for metrics and tests); monotonic but for the gauge
/// acquires_waiting.
struct SlabBrokerStats {
  uint64_t refused_over_cap = 0;     // closed at accept: max_connections reached
  uint64_t refused_uid_pending = 0;  // closed at accept: the uid's pending cap reached
  uint64_t hello_timeouts = 0;       // closed: no hello within hello_timeout
  uint64_t accept_backoffs = 0;      // accept failed for want of descriptors; paused
  uint64_t acquires_waiting = 0;     // now: acquires queued for or with the grant threads
  uint64_t refused_unread = 0;       // closed at accept: the uid's connections left unread
  uint64_t unread_connections = 0;   // now: closed connections whose peer has answers unread
};

/// One message parsed off the front of a connection's received bytes (pure: no I/O, no
/// state), so the parse can be tested and fuzzed on its own (tests/fuzz/slab_request_fuzz.cc).
struct SlabMessage {
  enum class Kind {
    kNeedMore,    // not a whole message yet
    kHello,       // the magic and a token (`token`); unbound connections only
    kBadHello,    // a whole hello without the magic
    kRequest,     // a known request (`op`); bound connections only
    kBadRequest,  // a whole request with an unknown op
  };
  Kind kind = Kind::kNeedMore;
  size_t bytes = 0;   // how many bytes of the input the message took (0 for kNeedMore)
  std::string token;  // kHello
  uint32_t op = 0;    // kRequest and kBadRequest
};
/// Parse the first message of `in`: a hello when `bound` is false, else a request.
SlabMessage ParseSlabMessage(std::string_view in, bool bound);

class SlabBroker {
 public:
  /// How long the listening socket is left alone after accept ran out of descriptors.
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};
  /// How soon a bound connection is closed after its session ended (at the latest), and a
  /// connection left unread is looked at again.
  static constexpr std::chrono::milliseconds kSessionEndCheck{200};

  /// Serve the slab protocol on `listen_fd`, a listening Unix socket bound at `path`
  /// (rpc::ListenUnix makes it: a live path refused, a stale one replaced). Owns the fd from
  /// here on, and removes `path` when it stops.
  static Result<std::unique_ptr<SlabBroker>> Start(const std::string& path, int listen_fd,
                                                   const SlabBrokerOptions& options = {});
  ~SlabBroker();

  /// Issue a one-time token binding the next connection that presents it to `channels`; fails
  /// (UNAVAILABLE, nothing issued) when the system gives no random bytes (FillRandom).
  /// `uid` is the session's peer: each unspent token of a uid lets one more of its
  /// connections wait for its hello (beyond max_pending_per_uid), so a client opening many
  /// sessions at once is never refused, while connections without a session stay capped.
  Result<std::string> IssueToken(std::weak_ptr<SessionChannels> channels, uid_t uid);
  /// Forget a session's token if it was never used.
  void RevokeToken(const std::string& token);

  const std::string& path() const { return path_; }
  /// Connections open now (for leak accounting).
  uint64_t connections() const { return connections_; }
  SlabBrokerStats stats() const;

 private:
  static constexpr uint8_t kHandedBoard = 1, kHandedRing = 2, kHandedDoorbell = 4;
  struct Connection {
    int fd = -1;
    uid_t uid = 0;
    std::weak_ptr<SessionChannels> channels;
    bool bound = false;
    bool granting = false;  // an acquire is with the grant threads: not read, not closed
    uint8_t handed = 0;     // kHanded* bits: the descriptors answered (each at most once)
    std::chrono::steady_clock::time_point hello_deadline;  // while not bound
    std::string in;  // bytes received, not yet a whole message
  };

  struct PendingToken {
    std::string token;
    std::weak_ptr<SessionChannels> channels;
    uid_t uid = 0;  // the session's peer
  };

  // An acquire handed to the grant threads.
  struct GrantJob {
    int fd = -1;
    std::weak_ptr<SessionChannels> channels;
  };
  // An acquire answered: `sent` false closes the connection.
  struct GrantDone {
    int fd = -1;
    bool sent = false;
  };

  using ConnectionMap = std::map<int, Connection>;  // by fd
  using PendingCount = std::map<uid_t, uint32_t>;   // connections not yet bound, per uid

  SlabBroker() = default;
  // The poll thread: accepts, reads and answers connections until stopped.
  void Run();
  // Close (or keep until read: CloseOrKeepUnread) connection `it`; the next one.
  ConnectionMap::iterator CloseConnection(ConnectionMap& conns, PendingCount& pending,
                                          ConnectionMap::iterator it);
  // Close connections past their hello deadline at `now`, and bound ones whose session
  // ended; the earliest hello deadline left (max: none). `bound_any`: a bound connection is left.
  std::chrono::steady_clock::time_point SweepConnections(ConnectionMap& conns,
                                                         PendingCount& pending,
                                                         std::chrono::steady_clock::time_point now,
                                                         bool* bound_any);
  // After poll: the wake pipe drained, answered acquires' connections processed again,
  // kept connections whose peer read everything closed, readable connections served.
  // fds: [wake pipe, listener, connections..., from `unread_at` unread_'s].
  void HandlePolled(const std::vector<pollfd>& fds, size_t unread_at, ConnectionMap& conns,
                    PendingCount& pending);
  // The first message of a connection: a hello whose token binds it to its session; false
  // closes it.
  bool BindHello(Connection& c, const SlabMessage& m);
  // Answer a request for the session's submit ring, its doorbell or its completion board
  // (`op`) with its descriptor, or UNSUPPORTED where it has none; false closes the connection.
  bool HandChannel(Connection& c, SessionChannels& channels, uint32_t op);
  // Grant threads: answer queued acquires until stopped.
  void RunGranter();
  // Answer the messages `c` has sent, up to the first acquire (queued: the rest wait for
  // its answer); false closes the connection.
  bool Process(Connection& c);
  // Remove and return the session of the pending token equal to `presented` (null when none
  // is, its session is gone, or it was issued to a uid other than `presenter`: the token is
  // spent then too), in time independent of the bytes presented.
  std::shared_ptr<SessionChannels> SpendToken(std::string_view presented, uid_t presenter);
  // Accept what the backlog holds (a bounded batch), within the caps; false when out of
  // descriptors.
  bool AcceptAll(std::map<int, Connection>& conns, std::map<uid_t, uint32_t>& pending);
  // Close the connection `fd` of `uid`, or, where its peer has not read all it was sent
  // (descriptors among it), keep it open in unread_ until the peer has (poll thread).
  void CloseOrKeepUnread(int fd, uid_t uid);
  // Close the connections of unread_ whose peer has read everything or hung up; `hung_up`:
  // the fds poll reported done (poll thread).
  void ReleaseRead(const std::vector<int>& hung_up);
  // Read what `c` sent and Process it; false closes the connection.
  bool Serve(Connection& c);
  void Wake();

  std::string path_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::vector<std::thread> granters_;
  std::atomic<bool> stop_{false};
  mutable Mutex grant_mu_;
  CondVar grant_cv_;                                           // a job queued, or stop
  UidRoundRobin<GrantJob> grants_ ABSL_GUARDED_BY(grant_mu_);  // queued, uids in turn
  std::vector<GrantDone> done_ ABSL_GUARDED_BY(grant_mu_);     // answered, for the poll thread
  uint64_t acquires_waiting_ ABSL_GUARDED_BY(grant_mu_) = 0;   // queued or being answered
  bool granters_stop_ ABSL_GUARDED_BY(grant_mu_) = false;
  SlabBrokerOptions options_;
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> refused_over_cap_{0}, refused_uid_pending_{0}, hello_timeouts_{0},
      accept_backoffs_{0}, refused_unread_{0}, unread_connections_{0};
  // Closed connections whose peer has answers unread, and how many each uid has (the poll
  // thread's alone).
  std::map<int, uid_t> unread_;
  std::map<uid_t, uint32_t> unread_of_uid_;
  Mutex mu_;
  // Pending tokens (one per session that has not bound its slab connection yet): searched
  // by a full scan, never by a keyed container whose lookup compares the secret.
  std::vector<PendingToken> tokens_ ABSL_GUARDED_BY(mu_);
  std::map<uid_t, uint32_t> tokens_of_uid_ ABSL_GUARDED_BY(mu_);  // unspent tokens per uid
  void ForgetTokenOfUidLocked(uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The connections of `uid` that may wait for their hello at once: max_pending_per_uid
  // plus the uid's unspent tokens.
  uint32_t PendingAllowance(uid_t uid);
};

}  // namespace ferry::transport
