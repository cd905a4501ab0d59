// SlabBroker: hands slab fds to local clients over a Unix socket of its own (gRPC owns the
// session's connection), with SCM_RIGHTS.
//
// Every connection's peer uid is read with SO_PEERCRED at accept. The first message names
// a one-time token the session stream issued (Opened.slab_token); it binds the connection
// to that session and fixes the session's uid (the token is then spent, whether or not the
// bind succeeds; a hello whose magic is wrong is refused without looking at its token, which
// stays unspent). Tokens are compared in constant time: every pending token in full, so
// the time to answer says nothing about how much of a guess was right. After that, each
// request acquires one slab from the pool for the session and answers its id and size with
// the fd, or answers the session's completion board (a read-only fd). The wire format is in
// docs/protocol.md ("slab socket").
//
// Thread-safe. One thread polls the listening socket and every connection (non-blocking);
// requests are a few bytes, answered at once. Sessions' slab sets are reached through weak
// pointers, so a session that ends first simply makes its connection's requests fail.
#pragma once

#include <sys/random.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/status.h"
#include "pool/session_slabs.h"

namespace ferry::pool {

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

class SlabBroker {
 public:
  /// Serve the slab protocol on `listen_fd`, a listening Unix socket bound at `path`
  /// (rpc::ListenUnix makes it: a live path refused, a stale one replaced). Owns the fd from
  /// here on, and removes `path` when it stops.
  static Result<std::unique_ptr<SlabBroker>> Start(const std::string& path, int listen_fd);
  ~SlabBroker();

  /// Issue a one-time token binding the next connection that presents it to `slabs`; fails
  /// (UNAVAILABLE, nothing issued) when the system gives no random bytes (FillRandom).
  Result<std::string> IssueToken(std::weak_ptr<SessionSlabs> slabs);
  /// Forget a session's token if it was never used.
  void RevokeToken(const std::string& token);

  const std::string& path() const { return path_; }
  /// Connections open now (for leak accounting).
  uint64_t connections() const { return connections_; }

 private:
  struct Connection {
    int fd = -1;
    uid_t uid = 0;
    std::weak_ptr<SessionSlabs> slabs;
    bool bound = false;
    std::string in;  // bytes received, not yet a whole message
  };

  struct PendingToken {
    std::string token;
    std::weak_ptr<SessionSlabs> slabs;
  };

  SlabBroker() = default;
  void Run();
  // Remove and return the session of the pending token equal to `presented` (null when none
  // is, or its session is gone), in time independent of the bytes presented.
  std::shared_ptr<SessionSlabs> SpendToken(std::string_view presented);
  // Handle what `c` sent; false closes the connection.
  bool Serve(Connection& c);

  std::string path_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> connections_{0};
  std::mutex mu_;
  // Pending tokens (one per session that has not bound its slab connection yet): searched
  // by a full scan, never by a keyed container whose lookup compares the secret.
  std::vector<PendingToken> tokens_;  // guarded by mu_
};

}  // namespace ferry::pool
