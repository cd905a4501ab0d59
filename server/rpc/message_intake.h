// Message intake: how a session's connection takes a client message off its gRPC stream or
// its submit ring. The message is held to the session's bounds before it is parsed, onto a
// protobuf arena of its own, and a submit's parse is charged to its identity's and the
// daemon's in-flight bytes. A message so small that its parse fits every bound whatever it
// holds (rpc/wire_scan.h, MostParsedBytes: at most about a hundred times its size) is parsed
// at once and charged what its parse took; any other is scanned first (ScanClientMessage),
// and parsed only if the scan's estimate fits. What is over a bound is never parsed: refusing
// it costs the daemon about its own size.
//
// Outcomes (IncomingMessage):
//  - parsed: `message` is the ClientMessage;
//  - a submit refused before it was parsed (ops over max_ops, a parse estimate over the
//    session's in-flight bytes or over what its identity or the daemon may still hold, a
//    string that is not UTF-8): `refusal` says why and `message` holds only its submit_id
//    and sequence; the session answers it with a failed Completed, as any refused submit;
//  - a violation that ends the stream (`violation`): bytes that are not a ClientMessage, a
//    message other than a submit over kMaxControlBytes, an Open whose client name is not
//    UTF-8 (INVALID_ARGUMENT naming the field).
//
// Thread-safety: TakeClientMessage is a pure function of its input and the bounds (it charges
// the registry, which is thread-safe); it runs on gRPC threads, the ring poller and executors.
#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "ferry/v1/session.pb.h"
#include "rpc/wire_scan.h"
#include "session/ops.h"
#include "session/registry.h"

namespace ferry::rpc {

/// The most a message other than a Submit (Open, Synchronize, Close) may take once parsed;
/// such messages are a few fields (a Close's slab ids, a client name of which 64 bytes are
/// kept), and past this one ends the stream.
inline constexpr uint64_t kMaxControlBytes = 4 << 20;

/// What a connection takes its next messages under: set when a session opens, cleared when
/// it ends.
struct IntakeBounds {
  /// A session is open. Without one a message other than a Submit is still taken (the
  /// connection answers what is out of order), but nothing over kMaxControlBytes.
  bool session = false;
  uint64_t max_ops = 0;           // ops in one submit (max_ops_per_submit; 0: no limit)
  uint64_t max_parsed_bytes = 0;  // one submit's parse (max_in_flight_bytes; 0: no limit)
  /// Charged each submit's parse until the session takes its charge over; null: no charge.
  session::SessionRegistry* registry = nullptr;
  std::shared_ptr<session::UidAccount> account;
};

/// In-flight bytes charged to an identity and the daemon (SessionRegistry::ChargeInFlightBytes)
/// and refunded when this is destroyed, unless Release() handed them on. Move-only.
class InFlightHold {
 public:
  InFlightHold() = default;
  InFlightHold(session::SessionRegistry* registry, std::shared_ptr<session::UidAccount> account,
               uint64_t bytes)
      : registry_(registry), account_(std::move(account)), bytes_(bytes) {}
  InFlightHold(InFlightHold&& o) noexcept { *this = std::move(o); }
  InFlightHold& operator=(InFlightHold&& o) noexcept;
  InFlightHold(const InFlightHold&) = delete;
  InFlightHold& operator=(const InFlightHold&) = delete;
  ~InFlightHold() { Refund(); }

  uint64_t bytes() const { return bytes_; }
  /// Stop holding: the caller now owns the charge of bytes() (and refunds it itself).
  uint64_t Release() { return std::exchange(bytes_, 0); }

 private:
  void Refund();
  session::SessionRegistry* registry_ = nullptr;
  std::shared_ptr<session::UidAccount> account_;
  uint64_t bytes_ = 0;
};

/// A client message as the connection took it. Made only by TakeClientMessage.
class IncomingMessage {
 public:
  IncomingMessage();
  IncomingMessage(const IncomingMessage&) = delete;
  IncomingMessage& operator=(const IncomingMessage&) = delete;

  /// The parsed message (null only with a violation); for a refused submit, only its
  /// submit_id and sequence. Lives on this object's arena.
  v1::ClientMessage* message = nullptr;
  /// What the scan found: the op counts and the parse's estimated memory (for a message
  /// parsed without a scan, the same counts read from it, and the memory its parse took).
  WireScan scan;
  /// A parsed submit's ops, summarized once (rpc::Summarize) for every later question about
  /// them; empty for any other message and for a refused submit.
  session::SubmitSummary summary;
  /// Not OK: a submit refused before it was parsed (see the file comment).
  Status refusal;
  /// Not OK: the stream ends with this (see the file comment).
  Status violation;
  /// The submit's parse, charged to its identity and the daemon until the session takes the
  /// charge over (released) or the message is dropped (refunded).
  InFlightHold hold;

  uint64_t sequence() const { return message ? message->sequence() : 0; }

 private:
  // The arena's first block, with the object: a small message (a transfer's submit: 208 and
  // 336 bytes of it used with protobuf 3.21) takes no allocation of its own.
  static constexpr size_t kFirstBlock = 512;
  alignas(std::max_align_t) char first_block_[kFirstBlock];

 public:
  google::protobuf::Arena arena;  // after first_block_, which it uses
};

/// A connection's intake bounds: written on its executor when a session opens or ends, read by
/// whichever thread takes a message (a gRPC thread, the ring poller). Thread-safe.
class IntakeGate {
 public:
  IntakeBounds Get() const {
    MutexLock lock(&mu_);
    return bounds_;
  }
  void Set(IntakeBounds bounds) {
    MutexLock lock(&mu_);
    bounds_ = std::move(bounds);
  }

 private:
  mutable Mutex mu_;
  IntakeBounds bounds_ ABSL_GUARDED_BY(mu_);
};

/// Whether handling `in` (parsed: `in.message` is set) is short and never blocks, so that it
/// may run on the thread that took it (a gRPC thread, the ring poller): see
/// message_intake.cc.
bool IsQuick(const IncomingMessage& in);

/// Take one message in memory (a submit ring record; see the file comment). Never null.
std::shared_ptr<IncomingMessage> TakeClientMessage(std::string_view bytes,
                                                   const IntakeBounds& bounds);
/// The same for a message gRPC read off the stream.
std::shared_ptr<IncomingMessage> TakeClientMessage(grpc::ByteBuffer& bytes,
                                                   const IntakeBounds& bounds);

}  // namespace ferry::rpc
