// InputSequencer: puts a session's messages back in the client's order when they arrive by
// two paths, the gRPC stream and the submit ring (docs/protocol.md, "Submit ring"). Messages
// are numbered (`sequence`, from 1) once a session has a ring; an unnumbered message is
// handled at once, but only before any numbered one.
//
// A numbered message is held until every lower number has been delivered, one held message
// per path at most (its path pauses meanwhile: the connection asks holds() before it reads
// more). A number that comes again or late, an unnumbered message after numbered ones, and
// two held messages with the number between them missing are protocol violations.
//
// Thread-safety: none; the session's executor owns it. Header-only (Accept takes its
// callbacks as templates: it runs for every message).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ferry/status.h"

namespace ferry::rpc {

template <typename Message>
class InputSequencer {
 public:
  // Where a message came from.
  enum Source { kStream = 0, kRing = 1 };

  /// Take `message` from `from`, and deliver every message now in order through
  /// `deliver(std::shared_ptr<Message>, Source)` while `running()` (asked before each
  /// numbered delivery) is true. Return PROTOCOL_VIOLATION, having delivered what was in
  /// order, when the message breaks the numbering.
  template <typename Running, typename Deliver>
  Status Accept(std::shared_ptr<Message> message, Source from, Running running, Deliver deliver) {
    const uint64_t sequence = message->sequence();
    if (sequence == 0) {
      if (sequenced_) return Violation("a message without a sequence number after numbered ones");
      deliver(std::move(message), from);
      return Status::Ok();
    }
    if (sequence < next_sequence_) {
      return Violation("sequence number " + std::to_string(sequence) +
                       " comes again or late (expected " + std::to_string(next_sequence_) + ")");
    }
    sequenced_ = true;
    held_[from] = std::move(message);
    while (running()) {
      Source next =
          held_[kStream] && held_[kStream]->sequence() == next_sequence_ ? kStream : kRing;
      if (!held_[next] || held_[next]->sequence() != next_sequence_) break;
      std::shared_ptr<Message> m = std::move(held_[next]);
      ++next_sequence_;
      deliver(std::move(m), next);
    }
    if (held_[kStream] && held_[kRing] && running()) {
      // Each path waits for the other: the number between them never comes.
      return Violation("sequence number " + std::to_string(next_sequence_) +
                       " is missing: the stream and the submit ring are each at a later one");
    }
    return Status::Ok();
  }

  /// Start over, as new: the next session of a kept stream numbers its messages from 1.
  /// Messages held are dropped (they came after the last session's Close). May be called
  /// from `deliver`: Accept then delivers nothing more.
  void Reset() {
    next_sequence_ = 1;
    sequenced_ = false;
    held_[kStream] = held_[kRing] = nullptr;
  }

  /// Whether a message from `source` is held, waiting for a lower number.
  bool holds(Source source) const { return held_[source] != nullptr; }
  /// The number of the message held from `source` (0: none).
  uint64_t held_sequence(Source source) const {
    return held_[source] ? held_[source]->sequence() : 0;
  }
  /// The number the next delivered message must have.
  uint64_t next_sequence() const { return next_sequence_; }

 private:
  static Status Violation(std::string what) {
    return Status(ErrorKind::kProtocolViolation, std::move(what));
  }

  uint64_t next_sequence_ = 1;
  bool sequenced_ = false;
  std::shared_ptr<Message> held_[2];
};

}  // namespace ferry::rpc
