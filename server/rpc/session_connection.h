// SessionConnection: one session stream's state and its dispatch (the reactor's glue is
// rpc/session_service.cc). It reads messages from the stream and from the session's submit
// ring (RingIntake), bounded before they are parsed (rpc/message_intake.h), puts them back in
// the client's order (InputSequencer) and hands them to its session; it writes the session's
// answers through its Outbox, counts what it holds in its InFlightLedger and stops reading
// at the limits (backpressure); it opens sessions, keeps a stream for the next one
// (StreamChannels) and ends the stream.
//
// Threading: touched only on its serial executor (shared with its session); the reactor
// (owned by gRPC) is used only until Finish is called on it. intake_bounds() and ForgetCall()
// are the exceptions, called from gRPC's threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/v1/session.pb.h"
#include "rpc/in_flight_ledger.h"
#include "rpc/input_sequencer.h"
#include "rpc/message_intake.h"
#include "rpc/outbox.h"
#include "rpc/ring_intake.h"
#include "rpc/session_context.h"
#include "rpc/stream_channels.h"
#include "rpc/stream_end.h"

namespace ferry::rpc {

// The stream's messages are read as bytes: the connection scans and bounds each before it is
// parsed (rpc/message_intake.h); its answers are written as messages.
using SessionReactorBase = grpc::ServerBidiReactor<grpc::ByteBuffer, v1::ServerMessage>;

class SessionConnection : public session::SessionEvents,
                          public DrainListener,
                          public MessageWriter,
                          public RingIntake::Host,
                          public std::enable_shared_from_this<SessionConnection> {
 public:
  // The call's context, for cancelling it from a timer: cleared (under its mutex) when gRPC
  // is done with the call, after which the context is gone.
  struct CallHandle {
    Mutex mu;
    grpc::CallbackServerContext* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  SessionConnection(SessionServiceContext* context, SessionReactorBase* reactor,
                    session::PeerIdentity peer, SessionlessStreams::Ticket sessionless,
                    grpc::CallbackServerContext* call);

  /// gRPC is done with the call (OnDone, on its thread): its context is about to go.
  void ForgetCall();

  const session::Executor& executor() const;
  SessionServiceContext* context() const;
  grpc::ByteBuffer* read_buffer();
  /// The bounds the next message is taken under (rpc/message_intake.h); any thread.
  IntakeBounds intake_bounds() const;

  /// Register the stream and start its first read (on the reactor's thread).
  void Start();
  /// The reactor's reactions, each on the executor:
  /// a read finished; `message` is null when the client ended or broke the stream;
  void HandleRead(std::shared_ptr<IncomingMessage> message);
  /// a write finished (`ok`: it reached the transport);
  void HandleWriteDone(bool ok);
  /// the client cancelled the stream;
  void HandleCancel();
  /// gRPC is done with the call: everything the stream holds is given back.
  void HandleDone();

 private:
  // From now (the stream's start, or its session's close with the stream kept) the stream
  // has the open timeout to send its Open. One timer at a time per stream: a kept stream
  // whose sessions come and go faster than that does not arm one per session.
  void ArmOpenDeadline();
  void ArmOpenDeadlineIn(std::chrono::steady_clock::duration delay);

  // The open timeout passed: a stream that has not sent its Open by now is ended, so that
  // streams which never open cannot hold the daemon's memory (rpc/sessionless_streams.h).
  void OpenDeadline();

  void NotifyDraining(uint64_t grace_ms) override;

  // A message the intake ended the stream for (IncomingMessage::violation): a bad Open's
  // INVALID_ARGUMENT is told as such, anything else is a protocol violation.
  void EndForIntake(const Status& violation, const std::string& where);

  // The number of a message the sequencer holds (the stream's, else the ring's).
  uint64_t HeldSequence() const;

  // The ring poller handed over `records` from the session's submit ring (RingIntake), and
  // found it broken after them when `broken` is set.
  void HandleRingMessages(std::vector<RingIntake::Record> records, std::string broken);

  // --- RingIntake::Host ----------------------------------------------------------
  bool MayTakeRingMessage() const override;
  std::shared_ptr<session::Session> ring_session() const override;
  // A message from the submit ring: accepted in ring order when it is well formed, else the
  // session ends with a protocol violation.
  bool AcceptRingMessage(std::shared_ptr<IncomingMessage> m) override;
  void YieldRingDrain() override;
  // On the long lane, for the session the record was taken for (OnLongRingRecord).
  void PostLongRecord(std::string record) override;
  void RingBroken(const std::string& what) override;

  // On the long lane: a ring record too large to parse on the shared lane, taken for
  // `session`, is parsed and handled in its place; the rest of the ring's messages are handled
  // back on the shared lane.
  void OnLongRingRecord(const std::string& record, uint64_t session);

  // The handler the ring poller calls with what it took from this session's ring.
  transport::RingPoller::Handler RingHandler();

  // --- session::SessionEvents ------------------------------------------------------
  void OnDownloadChunk(uint64_t submit_id, uint32_t op_index, uint64_t offset,
                       session::ChunkBytes data) override;
  void PostCompletion(uint64_t submit_id, bool ok) override;
  void OnCompleted(uint64_t submit_id, const Status& status) override;
  void SendCompleted(uint64_t submit_id, const Status& status);
  void OnSynchronized(uint64_t sync_id) override;
  void OnClosed(const session::SessionStatsSnapshot& stats) override;

  // Write the session's Closed `m`: on a kept stream (Close.keep_stream, KeepStream), or as
  // the stream's last message.
  void SendClosed(std::unique_ptr<v1::ServerMessage> m);

  void Dispatch(std::shared_ptr<IncomingMessage> incoming);

  // The most server messages a stream's outbox holds before the stream stops reading.
  static constexpr size_t kMaxOutboxMessages = 4096;

  // Where a message came from: the gRPC stream or the submit ring.
  using Sequencer = InputSequencer<IncomingMessage>;
  using Source = Sequencer::Source;
  static constexpr Source kStream = Sequencer::kStream;
  static constexpr Source kRing = Sequencer::kRing;

  // Handle `message` in its place (InputSequencer): at once, or held (pausing its path)
  // until every lower number has been handled. Nothing is handled after Close.
  void Accept(std::shared_ptr<IncomingMessage> message, Source from);

  // Handle one message in order.
  void Handle(std::shared_ptr<IncomingMessage> message, Source from);

  // OK when this session's peer may load and launch raw kernels, PERMISSION_DENIED otherwise.
  // A raw kernel runs in the context every session shares and can read and corrupt all of
  // their memory, so only peers the config trusts get it: TCP peers with
  // --allow-remote-raw-kernels, local uids listed in raw-kernels (by uid or group). The
  // answer is looked up once per stream (its peer does not change), before the first message
  // after the Open where the lookup may block (Open posts it).
  Status RawKernelsAllowed();

  void Open(const v1::Open& open);

  // Close.keep_stream: make the stream sessionless again, ready for the next Open, and return
  // true; false (the stream then ends as usual) when something of the session is still to
  // be answered, the stream is ending or its client has stopped writing, or the stream
  // cannot take a sessionless place (SessionlessStreams::Keep). Called from OnClosed.
  bool KeepStream();

  // Report a session-level error to the client, then end the stream with `rpc_status`.
  void Fail(const Status& status, const grpc::Status& rpc_status);

  void ProtocolViolation(const std::string& what);

  void ClientGone(const char* why);

  // MessageWriter: the outbox's writes go to the stream.
  void StartWrite(const v1::ServerMessage* message) override;

  // Queue `message` (Outbox); a DownloadChunk's `chunk_bytes` may still be in staging
  // (`staged`). Nothing is queued once the stream is ending.
  void Send(std::unique_ptr<v1::ServerMessage> message, session::ChunkBytes staged = {},
            uint64_t chunk_bytes = 0);
  void DropUnsent(size_t keep);
  void PumpWrites();

  // Staging is shared by every session, and a chunk holds its range until it is written. A
  // client that stops reading stops the writes, so the chunks queued behind the write in
  // flight would hold their staging for as long as it does not read, and other sessions'
  // inline transfers would wait for it (staging-wait) and then copy directly. So once one
  // write has been in flight for kStalledWrite, every chunk still in staging is copied out
  // (the copy the outbox makes anyway, made early); its bytes stay charged to the session's
  // in-flight bytes until written, as before.
  static constexpr std::chrono::milliseconds kStalledWrite{10};

  // Watch the write in flight while chunks wait in staging behind it.
  void WatchStagedChunks();

  // Take the next message from the stream and from the submit ring, where allowed.
  void MaybeReadMore();

  // Whether the session may take one more message, counting `arriving` submits not yet
  // handed to it besides those a path may still deliver (a read outstanding, an armed ring,
  // a held message): not when the stream is ending, nor at the session's in-flight limit.
  bool MayTakeMore(size_t arriving) const;

  // Whether a limit keeps the session from taking `arriving` more messages besides those in
  // transit (see MayTakeMore). A client that writes and never reads must not make the daemon
  // hold without bound what it has not read: every Submit and Synchronize counts toward
  // max_in_flight_submits until its answer is written (a refused submit too), every submit's
  // bytes toward max_in_flight_bytes likewise, and the outbox holds at most kMaxOutboxMessages
  // messages and max_in_flight_bytes bytes. Each of these is resumed by a write (or a
  // completion) that calls MaybeReadMore.
  bool AtLimit(size_t arriving) const;
  // Messages a path may still deliver: a read outstanding, what an armed ring may hand over,
  // what the poller took and is not handled yet, a held message.
  size_t Incoming() const;
  // The limits of AtLimit other than the count of messages.
  // A session that holds bytes also stops while the daemon or its identity has less than
  // one message (max-message) of in-flight bytes left: its own answers resume it. One that
  // holds none reads on, and a submit past those limits is refused (ChargeSubmit).
  bool OverBytesOrOutbox() const;

  // Start the next read unless one is outstanding, a message read while the stream's last one
  // waits for its turn waits too (parked_), or the session may take no more (MayTakeMore).
  void MaybeStartRead(size_t arriving = 0);

  // Likewise let the ring poller take the next messages from the submit ring: as many as
  // the in-flight limit has room for (at most RingIntake::kBatch), once the last ones are
  // handled.
  void MaybeArmRing(size_t arriving = 0);

  // Stop taking messages from the submit ring (the stream is ending).
  void DropRing();

  bool finishing() const;

  // End the stream with `status` (the first one asked for wins) once writes have drained.
  void FinishWith(const grpc::Status& status);

  void TryFinish();

  // A stream that carries no session any more and is being finished, or waits for its writes
  // to drain, may not stall there: a client that never reads (a zero flow-control window)
  // would otherwise keep its last write, and the stream, in flight for ever. One whose writes
  // make no progress for the open timeout is cancelled (gRPC then ends it: OnCancel, OnDone);
  // one still reading its last answers, however slowly, is looked at again.
  void ArmFinishDeadline();

  // The stream is finished, or carries no session while its last writes drain: until gRPC is
  // done with the call (HandleDone), which takes until its client closes its side, it counts
  // among the sessionless streams again.
  void HoldUntilDone();

  // Submits of more ops than this start the next read before they are enqueued.
  static constexpr int kReadAheadOps = 4;

  // Where the stream is in its session's life; a kept stream goes round again.
  enum class StreamPhase : uint8_t {
    kNoSession,  // before Open, or a kept stream between sessions
    kOpen,       // the session takes messages
    kClosing,    // its Close was read: nothing more is read; the session finishes its work
    kClosed,     // the session ended after its Close was read
    kEnded,      // it (or the stream before one) ended without a Close: failed, aborted, gone
  };
  // The session ended: no more calls on it.
  bool session_done() const;
  // Its Close was read (nothing more is read).
  bool close_read() const;
  void SessionDone();

  SessionServiceContext* context_;
  StreamPhase phase_ = StreamPhase::kNoSession;
  session::Executor executor_;
  SessionReactorBase* reactor_;  // valid until Finish; null after OnDone
  session::PeerIdentity peer_;
  SessionlessStreams::Ticket sessionless_;  // held while the stream carries no session
  Outbox outbox_;                           // server messages not yet written
  bool remote_ = peer_.tcp;                 // came in over TCP
  bool raw_kernels_checked_ = false;        // RawKernelsAllowed looked it up
  bool raw_kernels_allowed_ = false;
  grpc::ByteBuffer read_buffer_;  // written by gRPC between StartRead and OnReadDone
  // The bounds messages are taken under (set at Open, cleared when the stream has no session).
  const std::shared_ptr<IntakeGate> gate_ = std::make_shared<IntakeGate>();
  // The submit ring (local sessions of a daemon with rings): what its poller hands over.
  RingIntake ring_{&context_->gauges, gate_};

  std::shared_ptr<session::Session> session_;
  uint64_t session_id_ = 0;
  uint64_t last_submit_id_ = 0;
  struct Received {
    uint64_t id;
    std::chrono::steady_clock::time_point at;
    bool transfer;  // the submit uploads or downloads bytes
  };
  std::deque<Received> received_at_;
  // Messages accepted and not yet answered, and what they are charged (set to the session's
  // identity at Open).
  InFlightLedger ledger_;
  bool paused_ = false;  // a limit stops reading (counted in streams_paused)
  bool reading_ = false;
  bool read_closed_ = false;
  // Numbered messages (ClientMessage.sequence) put back in order across the two paths.
  Sequencer sequencer_;
  // A message the stream brought while its previous one was held by the sequencer; it goes
  // to the sequencer once that one is delivered. The read that brought it is what tells the
  // daemon when a client ends the stream with a message held (a protocol violation).
  std::shared_ptr<IncomingMessage> parked_;
  bool keep_stream_asked_ = false;  // the Close asked to keep the stream (Close.keep_stream)
  // The session a kept stream carried last (see KeepStream); released at the next Open.
  std::shared_ptr<session::Session> closed_session_;
  // A local session's shared memory, and what a kept stream carries to its next session.
  StreamChannels channels_{context_, peer_.uid.value_or(static_cast<uint32_t>(-1))};
  // Since when the stream has carried no session, and whether an open deadline is armed.
  std::chrono::steady_clock::time_point sessionless_since_;
  bool open_deadline_armed_ = false;
  bool finish_deadline_armed_ = false;
  std::shared_ptr<CallHandle> call_ = std::make_shared<CallHandle>();
  bool stall_watch_armed_ = false;    // a WatchStagedChunks check is due
  bool successes_on_board_ = false;   // Opened.successes_on_board
  StreamEnd end_ = StreamEnd::kOpen;  // changed only through NextStreamEnd
  // Written with the stream's end (StartWriteAndFinish): gRPC reads it until OnDone.
  std::unique_ptr<v1::ServerMessage> last_message_;
  // The session's Closed, held while answers before it are still being written (OnClosed).
  std::unique_ptr<v1::ServerMessage> closed_held_;
  grpc::Status finish_status_;
};

}  // namespace ferry::rpc
