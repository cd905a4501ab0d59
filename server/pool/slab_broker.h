// SlabBroker: hands slab fds to local clients over a Unix socket of its own (gRPC owns the
// session's connection), with SCM_RIGHTS.
//
// Every connection's peer uid is read with SO_PEERCRED at accept. The first message names
// a one-time token the session stream issued (Opened.slab_token); it binds the connection
// to that session and fixes the session's uid (the token is then spent). After that, each
// request acquires one slab from the pool for the session and answers its id and size with
// the fd, or answers the session's completion board (a read-only fd). The wire format is in
// docs/protocol.md ("slab socket").
//
// Thread-safe. One thread polls the listening socket and every connection (non-blocking);
// requests are a few bytes, answered at once. Sessions' slab sets are reached through weak
// pointers, so a session that ends first simply makes its connection's requests fail.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

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
  /// Serve the slab protocol on `listen_fd`, a listening Unix socket bound at `path`
  /// (rpc::ListenUnix makes it: a live path refused, a stale one replaced). Owns the fd from
  /// here on, and removes `path` when it stops.
  static Result<std::unique_ptr<SlabBroker>> Start(const std::string& path, int listen_fd);
  ~SlabBroker();

  /// Issue a one-time token binding the next connection that presents it to `slabs`.
  std::string IssueToken(std::weak_ptr<SessionSlabs> slabs);
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

  SlabBroker() = default;
  void Run();
  // Handle what `c` sent; false closes the connection.
  bool Serve(Connection& c);

  std::string path_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> connections_{0};
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<SessionSlabs>> tokens_;  // guarded by mu_
};

}  // namespace ferry::pool
