// InFlightLedger: what a session stream holds for the messages it has accepted and not yet
// answered, and whether that stops it from reading more (backpressure).
//
// Every Submit and Synchronize counts as unanswered from being accepted until its answer
// (Completed, Synchronized) is written, a refused submit too, and each submit is charged bytes
// until then: what its parse takes (the intake's estimate, rpc/message_intake.h), the inline
// download bytes it asks for, and kMessageCost for it and each download. The charge is also
// taken from the daemon's and the session's identity's in-flight bytes
// (SessionRegistry::ChargeInFlightBytes), whose limits bound what many sessions hold together;
// a refused submit is charged the session's part only. docs/protocol.md, "Backpressure".
//
// Thread-safety: none; the connection's executor owns it. The registry is thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>

#include "ferry/status.h"
#include "ferry/v1/session.pb.h"
#include "rpc/message_intake.h"
#include "session/registry.h"

namespace ferry::rpc {

struct StreamGauges;

class InFlightLedger {
 public:
  /// What a message costs besides its parse: its place in a queue, its conversion; an
  /// estimate, so that a client cannot make the daemon hold millions of small things for the
  /// price of a few bytes each.
  static constexpr uint64_t kMessageCost = 256;

  /// `gauges` (may be null) count the daemon's unanswered messages and bytes in flight;
  /// `registry` (may be null: nothing charged beyond the session) takes the daemon's and the
  /// identity's share.
  InFlightLedger(StreamGauges* gauges, session::SessionRegistry* registry)
      : gauges_(gauges), registry_(registry) {}
  ~InFlightLedger() { Clear(); }
  InFlightLedger(const InFlightLedger&) = delete;
  InFlightLedger& operator=(const InFlightLedger&) = delete;

  /// The identity charged (the session's, set at Open); change it only while idle().
  void set_account(std::shared_ptr<session::UidAccount> account) { account_ = std::move(account); }
  const std::shared_ptr<session::UidAccount>& account() const { return account_; }

  /// Count `n` more accepted messages whose answer is not yet written (a Synchronize).
  void AddUnanswered(uint64_t n);
  /// Count a submit as unanswered and charge it (see the file comment). Not OK (the submit to
  /// be refused; it is counted and charged all the same, so that its refusal, a Completed, is
  /// answered like any) when the intake refused it (its refusal), when it alone is more than
  /// `session_limit` bytes (QUOTA_EXCEEDED; 0: no limit), or when the daemon or its identity
  /// cannot hold it (QUOTA_EXCEEDED). Takes over `message`'s hold when it is charged.
  Status ChargeSubmit(IncomingMessage& message, uint64_t session_limit);
  /// `written` was written: what it answers (a Completed, possibly of a run of submits; a
  /// Synchronized) is done, and its charges given back.
  void Answered(const v1::ServerMessage& written);
  /// The completion board reported submit `submit_id` (Opened.successes_on_board): done as if
  /// its Completed had been written, unless it has Download ops (its Completed goes out, and
  /// answers it). Returns whether it was answered so.
  bool AnsweredOnBoard(uint64_t submit_id);
  /// Give back everything (the stream is done).
  void Clear();

  uint64_t unanswered() const { return unanswered_; }
  uint64_t bytes() const { return bytes_; }
  /// Nothing unanswered and nothing charged.
  bool idle() const { return unanswered_ == 0 && charges_.empty(); }

  /// Whether the bytes stop reading: the session holds `session_limit` (0: no limit), or its
  /// unsent answers do (`outbox_bytes`), or, while it holds any, the daemon or its identity
  /// has less than `headroom` (one message) left: its own answers resume it. One that holds
  /// none reads on, and a submit past those limits is refused (ChargeSubmit).
  bool OverBytes(uint64_t session_limit, uint64_t outbox_bytes, uint64_t headroom) const;
  /// The bytes the stream may still take in: the least of what the session (`session_limit`,
  /// 0: none), its identity and the daemon have left.
  uint64_t Room(uint64_t session_limit) const;

 private:
  // What one submit is charged until its Completed is written.
  struct Charge {
    uint64_t submit_id = 0;
    uint64_t bytes = 0;
    bool held = false;       // charged to the daemon's and the identity's in-flight bytes too
    bool downloads = false;  // the submit has Download ops (its Completed always goes out)
  };
  // Give back what an answered submit's charge took: the session's bytes, the daemon-wide
  // gauge, and the daemon's and the identity's share.
  void Release(const Charge& c);
  // `n` accepted messages were answered (never more than are counted unanswered).
  void CountAnswered(uint64_t n);

  StreamGauges* const gauges_;
  session::SessionRegistry* const registry_;
  std::shared_ptr<session::UidAccount> account_;
  uint64_t unanswered_ = 0;
  std::deque<Charge> charges_;  // in submit order
  uint64_t bytes_ = 0;          // their sum
};

}  // namespace ferry::rpc
