// RingIntake: a local session's messages through its submit ring (docs/protocol.md, "Submit
// ring"), from the ring poller's hand-over to the session.
//
// The ring poller (transport/ring_poller.h) takes records while the ring is armed (Arm: as many
// as the session may take, and no more bytes than it may hold) and hands them to the handler
// MakeHandler builds, on its thread, which every local ring shares. That handler parses a few
// records itself while its ring is the only busy one (within kParseOnPollerBudget), and runs
// short messages there when the session's executor is free; everything else goes to the
// executor as a backlog. Drain then takes the backlog in ring order as the session may take it,
// parsing what is left unparsed a slice of a turn at a time (kParseSlice), passing records too
// large for a shared thread to the long lane, and grouping submits into runs
// (Session::BeginSubmitRun). Parsing is message intake's (rpc/message_intake.h): every record is
// bounded before it is parsed.
//
// This lives in rpc/, not transport/: transport/ moves the ring's bytes; turning them into
// ClientMessages and handing them to a session is the protocol's.
//
// Thread-safety: MakeHandler's handler runs on the poller's thread; everything else on the
// connection's executor, which owns the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rpc/message_intake.h"
#include "session/serial_executor.h"
#include "session/session.h"
#include "transport/ring_poller.h"

namespace ferry::rpc {

struct StreamGauges;

class RingIntake {
 public:
  /// The most messages the poller takes from one ring at a time (RingPoller::Arm): a
  /// pipelining client's queued messages reach the executor in one hand-off instead of one
  /// each.
  static constexpr size_t kBatch = 32;
  /// A record larger than this is parsed on the long lane (SerialExecutor::Lane::kLong), and
  /// handled there: parsing it, and converting a submit of that many ops, is not cut into
  /// slices. A daemon's default ring is this size, so its records never are; a larger
  /// `submit-ring` lets a client write records of megabytes (tens of milliseconds to parse).
  static constexpr size_t kLongLaneRecordBytes = 64 << 10;

  /// A message the poller took: taken (IncomingMessage), or a record left unparsed.
  struct Record {
    std::shared_ptr<IncomingMessage> message;
    std::string unparsed;
  };

  /// What a drain needs of the connection it serves (on its executor).
  class Host {
   public:
    virtual ~Host() = default;
    /// Whether the session may take the next ring message now: no message of the ring waits
    /// for a lower number, the stream is not ending, and no limit on bytes or unsent answers
    /// is reached.
    virtual bool MayTakeRingMessage() const = 0;
    /// The session the messages go to (null before Open), for runs of submits.
    virtual std::shared_ptr<session::Session> ring_session() const = 0;
    /// Take `message` from the ring, in ring order; whether it was accepted (the stream ends
    /// otherwise).
    virtual bool AcceptRingMessage(std::shared_ptr<IncomingMessage> message) = 0;
    /// The drain stopped at the end of its slice: drain again after other work.
    virtual void YieldRingDrain() = 0;
    /// A record too large for the shared lane: parse and take it on the long lane, then call
    /// LongRecordDone and drain again.
    virtual void PostLongRecord(std::string record) = 0;
    /// The ring broke after the messages it handed over, all handled now.
    virtual void RingBroken(const std::string& what) = 0;
  };

  /// `gauges` count the messages taken and not yet handled (messages_in_hand); `gate` gives
  /// the bounds records are taken under.
  RingIntake(StreamGauges* gauges, std::shared_ptr<IntakeGate> gate)
      : gauges_(gauges), gate_(std::move(gate)) {}
  RingIntake(const RingIntake&) = delete;
  RingIntake& operator=(const RingIntake&) = delete;

  /// Where the poller's hand-overs go: called on the executor with what it took, and the
  /// reason the ring broke after them (empty while it holds).
  using Deliver = std::function<void(std::vector<Record> records, std::string broken)>;
  /// The handler to register this session's ring with the poller (RingPoller::Add).
  static transport::RingPoller::Handler MakeHandler(session::Executor executor,
                                                    StreamGauges* gauges,
                                                    std::shared_ptr<IntakeGate> gate,
                                                    Deliver deliver);

  /// The ring's registration with the poller (null: the session has no ring).
  void Attach(std::shared_ptr<transport::RingPoller::Registration> ring) {
    ring_ = std::move(ring);
  }
  bool attached() const { return ring_ != nullptr; }
  /// Stop taking messages: the registration goes, with what was taken and not handled.
  void Drop();
  /// Drop what was taken and not handled, keeping the registration (a kept stream's ring
  /// goes to its next session, which numbers its messages afresh).
  void ClearBacklog();

  /// Let the poller take up to `credits` records and about `bytes` bytes (at least one record).
  void Arm(size_t credits, uint64_t bytes);
  /// Whether the ring may be armed: attached, and nothing armed, taken or on the long lane.
  bool ready_to_arm() const { return ring_ && credits_ == 0 && backlog_.empty() && !long_record_; }
  /// Messages the ring may still deliver: what an armed ring may hand over, what was taken
  /// and not handled, a record on the long lane.
  size_t incoming() const { return credits_ + backlog_.size() + (long_record_ ? 1 : 0); }

  /// A hand-over arrived (Deliver): the ring is disarmed; the records wait for Drain. False
  /// (the records dropped) when the ring was dropped meanwhile: the stream is ending.
  bool Take(std::vector<Record> records, std::string broken);
  /// Hand the backlog to `host`, oldest first, while it may take them (see the file
  /// comment). Not entered again from the host's handling of a message.
  void Drain(Host& host);
  /// The long lane is done with the record PostLongRecord sent it (taken or dropped).
  void LongRecordDone();

 private:
  // The ops of the next `submits` submits in the backlog.
  uint64_t OpsAhead(uint32_t submits) const;
  // Subtract `n` messages from those in hand.
  void Unhand(size_t n);

  StreamGauges* const gauges_;
  const std::shared_ptr<IntakeGate> gate_;
  std::shared_ptr<transport::RingPoller::Registration> ring_;
  size_t credits_ = 0;          // what the poller may still take (0: not armed)
  std::deque<Record> backlog_;  // taken and not handled, oldest first
  bool long_record_ = false;    // one taken is being handled on the long lane
  std::string broken_;          // the ring broke after the backlog: told once it is handled
  bool draining_ = false;       // Drain is running
};

}  // namespace ferry::rpc
