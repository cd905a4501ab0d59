// SessionlessStreams: session streams that carry no session, counted per peer identity
// ("uid:N" for a local client, "remote" for every TCP peer together) and overall: streams
// whose Open has not yet been handled, and streams whose session has ended that gRPC still
// keeps because their client has not closed its side.
//
// A stream whose session closed with the stream kept for the next Open (Close.keep_stream)
// is sessionless again: it takes a Ticket with Keep, within the same limits (past them the
// stream ends as usual, and a refusal to keep it is not counted in refused_*()).
//
// Why: a session counts against the sessions limits (max-sessions, uid-limits sessions=) only
// from its Open until it ends. Outside that span a stream still costs the daemon gRPC's call
// state and a connection object, about 20 KiB (measured on the development machine: 20,000
// streams that sent nothing grew ferryd by 408 MiB), for as long as the client keeps it. So
// every stream takes a Ticket when gRPC hands it to the daemon and gives it back when its
// Open has been handled, takes one again (Hold) when the daemon finishes it, and gives that
// back when gRPC is done with the call; and a stream has open-timeout to send its Open
// (rpc/session_service.cc ends it DEADLINE_EXCEEDED after that), and, its session ended, to
// have its last answers read (else it is cancelled). The other streaming calls (gRPC's
// Health/Watch, server reflection) carry no session either: each holds a Ticket while it
// lasts (MakeSessionlessCallsInterceptorFactory).
//
// Contract:
// - Admit(identity) gives a Ticket while fewer than `per_identity` streams of that identity
//   and fewer than `total` streams in all hold one (a limit of 0: none); else UNAVAILABLE
//   naming the limit, counted in refused_*(). The stream service then ends the stream at once
//   (and resets it: the client sees CANCELLED; rpc/session_service.cc says why). A refusal is
//   transient for a client that reads (the streams ahead are answered within microseconds,
//   closed by their client, or end at their deadline): libferry's open_session retries it
//   until its connect timeout.
// - Hold(identity) always gives a Ticket (a finished stream cannot be refused); it counts
//   like any other, so new streams of that identity are refused while it is held. Holds can
//   take an identity past its limit, by at most the sessions it had open (each held stream
//   was a session until it ended).
// - A Ticket gives its place back once: at Release(), or when destroyed.
//
// Thread-safe. Outlives every Ticket it gave.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "ferry/mutex.h"
#include "ferry/status.h"

namespace ferry::rpc {

struct SessionlessStreamLimits {
  uint32_t total = 1024;       // max-sessionless-streams
  uint32_t per_identity = 64;  // max-sessionless-streams-per-uid
};

class SessionlessStreams {
 public:
  explicit SessionlessStreams(SessionlessStreamLimits limits) : limits_(limits) {}

  /// A stream's place among the sessionless ones; empty (default) holds none.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    /// Give the place back (idempotent).
    void Release();
    bool held() const { return owner_ != nullptr; }

   private:
    friend class SessionlessStreams;
    Ticket(SessionlessStreams* owner, std::string identity)
        : owner_(owner), identity_(std::move(identity)) {}
    SessionlessStreams* owner_ = nullptr;
    std::string identity_;
  };

  /// A place for a new stream of `identity`, or UNAVAILABLE past a limit (see above).
  Result<Ticket> Admit(const std::string& identity);
  /// A place for a stream of `identity` whatever the limits (a finished stream).
  Ticket Hold(const std::string& identity);
  /// A place for a kept stream of `identity` (its session closed, the stream waits for the
  /// next Open) within the limits, as Admit gives; none past them (not counted as refused).
  std::optional<Ticket> Keep(const std::string& identity);

  /// Streams holding a ticket now.
  uint64_t count() const;
  /// Streams refused since start: past per_identity, and past total.
  uint64_t refused_per_identity() const;
  uint64_t refused_total_limit() const;
  const SessionlessStreamLimits& limits() const { return limits_; }

 private:
  void Give(const std::string& identity);
  Result<Ticket> Take(const std::string& identity, bool count_refusal);

  const SessionlessStreamLimits limits_;
  mutable Mutex mu_;
  std::unordered_map<std::string, uint32_t> by_identity_ ABSL_GUARDED_BY(mu_);
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_per_identity_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_total_limit_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::rpc
