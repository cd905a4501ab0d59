#include "rpc/session_service.h"

#include <google/protobuf/arena.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "ferry/trace_points.h"
#include "ferry/wire.h"
#include "rpc/convert.h"
#include "rpc/in_flight_ledger.h"
#include "rpc/input_sequencer.h"
#include "rpc/message_intake.h"
#include "rpc/outbox.h"
#include "rpc/ring_intake.h"
#include "rpc/stream_channels.h"
#include "rpc/stream_end.h"

namespace ferry::rpc {
namespace {

// The stream's messages are read as bytes: the connection scans and bounds each before it is
// parsed (rpc/message_intake.h); its answers are written as messages.
using Reactor = grpc::ServerBidiReactor<grpc::ByteBuffer, v1::ServerMessage>;

// The state of one session stream; touched only on its serial executor (shared with its
// session). The reactor (owned by gRPC) is used only until Finish is called on it.
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

  SessionConnection(SessionServiceContext* context, Reactor* reactor, session::PeerIdentity peer,
                    SessionlessStreams::Ticket sessionless, grpc::CallbackServerContext* call)
      : context_(context),
        executor_(*context->parts.io, context->parts.long_lane, session::IdentityOf(peer)),
        reactor_(reactor),
        peer_(std::move(peer)),
        sessionless_(std::move(sessionless)),
        outbox_(&context->gauges),
        ledger_(&context->gauges, context->parts.registry) {
    outbox_.set_writer(this);
    MutexLock lock(&call_->mu);
    call_->call = call;
  }

  /// gRPC is done with the call (OnDone, on its thread): its context is about to go.
  void ForgetCall() {
    MutexLock lock(&call_->mu);
    call_->call = nullptr;
  }

  const session::Executor& executor() const { return executor_; }
  SessionServiceContext* context() const { return context_; }
  grpc::ByteBuffer* read_buffer() { return &read_buffer_; }
  /// The bounds the next message is taken under (rpc/message_intake.h); any thread.
  IntakeBounds intake_bounds() const { return gate_->Get(); }

  void Start() {
    ++context_->gauges.streams_started_total;
    {
      MutexLock lock(&context_->gauges.streams_mu);
      context_->gauges.streams[this] = shared_from_this();
    }
    ArmOpenDeadline();
    MaybeStartRead();
  }

  // From now (the stream's start, or its session's close with the stream kept) the stream
  // has the open timeout to send its Open. One timer at a time per stream: a kept stream
  // whose sessions come and go faster than that does not arm one per session.
  void ArmOpenDeadline() {
    sessionless_since_ = std::chrono::steady_clock::now();
    if (context_->limits.open_timeout.count() <= 0 || open_deadline_armed_) return;
    ArmOpenDeadlineIn(context_->limits.open_timeout);
  }
  void ArmOpenDeadlineIn(std::chrono::steady_clock::duration delay) {
    open_deadline_armed_ = true;
    executor_.PostAfter(
        std::chrono::ceil<std::chrono::milliseconds>(delay),
        [weak = weak_from_this()] {
          if (auto self = weak.lock()) self->OpenDeadline();
        },
        "open deadline");
  }

  // The open timeout passed: a stream that has not sent its Open by now is ended, so that
  // streams which never open cannot hold the daemon's memory (rpc/sessionless_streams.h).
  void OpenDeadline() {
    open_deadline_armed_ = false;
    if (session_ || session_done_ || finishing()) return;
    const auto due = sessionless_since_ + context_->limits.open_timeout;
    if (const auto now = std::chrono::steady_clock::now(); now < due) {
      ArmOpenDeadlineIn(due - now);  // a kept stream's later span without a session
      return;
    }
    ++context_->gauges.open_timeouts_total;
    const std::string what = "no Open within the open timeout (" +
                             std::to_string(context_->limits.open_timeout.count()) + " ms)";
    spdlog::info("stream from {}: {}; ending it", peer_.address, what);
    Fail(Status(ErrorKind::kProtocolViolation, what),
         grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, what));
  }

  void NotifyDraining(uint64_t grace_ms) override {
    executor_.Post(
        [self = shared_from_this(), grace_ms] {
          auto m = std::make_unique<v1::ServerMessage>();
          m->mutable_draining()->set_grace_ms(grace_ms);
          self->Send(std::move(m));
        },
        "draining notice");
  }

  // A read finished; `message` is null when the client ended or broke the stream.
  void HandleRead(std::shared_ptr<IncomingMessage> message) {
    reading_ = false;
    if (!message) {
      read_closed_ = true;
      if (sequencer_.holds(kStream) || sequencer_.holds(kRing)) {
        // What is held waits for a number only the stream could still bring.
        return ProtocolViolation("the client ended the stream while message " +
                                 std::to_string(HeldSequence()) + " waits for number " +
                                 std::to_string(sequencer_.next_sequence()));
      }
      if (!close_requested_) ClientGone("the client ended the stream without Close");
      return;
    }
    --context_->gauges.messages_in_hand;
    if (!message->violation.ok()) return EndForIntake(message->violation, "");
    if (sequencer_.holds(kStream)) {
      // Read while the stream's last message waits for a lower number (so that the stream's
      // end is seen): it follows that one (MaybeReadMore).
      parked_ = std::move(message);
      return;
    }
    Accept(std::move(message), kStream);
    if (sequencer_.holds(kStream)) MaybeStartRead();  // held: the next read is parked
  }

  // A message the intake ended the stream for (IncomingMessage::violation): a bad Open's
  // INVALID_ARGUMENT is told as such, anything else is a protocol violation.
  void EndForIntake(const Status& violation, const std::string& where) {
    if (violation.kind() == ErrorKind::kInvalidArgument) {
      spdlog::warn("stream from {}: {}{}", peer_.address, where, violation.message());
      return Fail(violation, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, violation.message()));
    }
    ProtocolViolation(where + violation.message());
  }

  // The number of a message the sequencer holds (the stream's, else the ring's).
  uint64_t HeldSequence() const {
    return sequencer_.held_sequence(sequencer_.holds(kStream) ? kStream : kRing);
  }

  // The ring poller handed over `records` from the session's submit ring (RingIntake), and
  // found it broken after them when `broken` is set.
  void HandleRingMessages(std::vector<RingIntake::Record> records, std::string broken) {
    if (ring_.Take(std::move(records), std::move(broken))) MaybeReadMore();
  }

  // --- RingIntake::Host ----------------------------------------------------------
  bool MayTakeRingMessage() const override {
    return !sequencer_.holds(kRing) && !finishing() && !(session_ && OverBytesOrOutbox());
  }
  std::shared_ptr<session::Session> ring_session() const override { return session_; }
  // A message from the submit ring: accepted in ring order when it is well formed, else the
  // session ends with a protocol violation.
  bool AcceptRingMessage(std::shared_ptr<IncomingMessage> m) override {
    if (!m->violation.ok()) {
      EndForIntake(m->violation, "a submit ring record: ");
      return false;
    }
    if (m->sequence() == 0) {
      ProtocolViolation("a message through the submit ring has no sequence number");
      return false;
    }
    Accept(std::move(m), kRing);
    return true;
  }
  void YieldRingDrain() override {
    executor_.Yield([self = shared_from_this()] { self->MaybeReadMore(); }, "ring messages");
  }
  // On the long lane, for the session the record was taken for (OnLongRingRecord).
  void PostLongRecord(std::string record) override {
    if (executor_.has_long_lane()) context_->parts.registry->CountLongLaneTurn();
    executor_.Post([self = shared_from_this(), record = std::move(record),
                    session = session_id_] { self->OnLongRingRecord(record, session); },
                   "ring record (long lane)", session::SerialExecutor::Lane::kLong);
  }
  void RingBroken(const std::string& what) override { ProtocolViolation(what); }

  // On the long lane: a ring record too large to parse on the shared lane, taken for
  // `session`, is parsed and handled in its place; the rest of the ring's messages are handled
  // back on the shared lane.
  void OnLongRingRecord(const std::string& record, uint64_t session) {
    ring_.LongRecordDone();
    // Not the session it was taken for (the ring went with the stream, or to a next session
    // whose backlog started afresh): dropped, as that backlog was.
    if (!ring_.attached() || session != session_id_ || finishing()) return;
    AcceptRingMessage(TakeClientMessage(record, gate_->Get()));
    executor_.Post([self = shared_from_this()] { self->MaybeReadMore(); }, "ring messages");
  }

  // The handler the ring poller calls with what it took from this session's ring.
  transport::RingPoller::Handler RingHandler() {
    return RingIntake::MakeHandler(
        executor_, &context_->gauges, gate_,
        [weak = weak_from_this(), context = context_](std::vector<RingIntake::Record> records,
                                                      std::string broken) {
          if (auto self = weak.lock()) {
            self->HandleRingMessages(std::move(records), std::move(broken));
          } else {
            context->gauges.messages_in_hand -= static_cast<int64_t>(records.size());
          }
        });
  }

  void HandleWriteDone(bool ok) {
    std::unique_ptr<v1::ServerMessage> written = outbox_.WriteDone();
    if (!ok) {
      DropUnsent(0);
      ClientGone("a write to the client failed");
      return;
    }
    if (written) {
      ledger_.Answered(*written);
      // A kept stream's open timeout (Closed.kept_ms) counts from when its Closed is written,
      // not from the close: its client sends the next Open only once it has read the Closed,
      // and that write may wait behind a busy daemon's others.
      if (written->has_closed() && !session_ && !finishing()) {
        sessionless_since_ = std::chrono::steady_clock::now();
      }
    }
    if (closed_held_ && outbox_.empty()) SendClosed(std::move(closed_held_));
    PumpWrites();
    TryFinish();
    MaybeReadMore();  // reads may have stopped for answers or bytes not yet written
  }

  void HandleCancel() { ClientGone("the client cancelled the stream"); }

  void HandleDone() {
    sessionless_.Release();
    {
      MutexLock lock(&context_->gauges.streams_mu);
      context_->gauges.streams.erase(this);
    }
    DropUnsent(0);
    DropRing();
    // Messages waiting for their turn give back what their parse holds (IncomingMessage::hold).
    sequencer_.Reset();
    parked_.reset();
    // What this stream counted in the daemon-wide gauges goes with it.
    ledger_.Clear();
    if (paused_) --context_->gauges.streams_paused;
    paused_ = false;
    channels_.Release();  // the token revoked; kept slabs go back with the stream
    if (session_ && !session_done_) session_->Abort();
    session_done_ = true;
    session_.reset();
    closed_session_.reset();
    gate_->Set(IntakeBounds{});
    outbox_.set_writer(nullptr);
    reactor_ = nullptr;
  }

  // --- session::SessionEvents ------------------------------------------------------
  void OnDownloadChunk(uint64_t submit_id, uint32_t op_index, uint64_t offset,
                       session::ChunkBytes data) override {
    auto m = std::make_unique<v1::ServerMessage>();
    auto* c = m->mutable_download_chunk();
    c->set_submit_id(submit_id);
    c->set_op_index(op_index);
    c->set_offset(offset);
    const uint64_t bytes = data.size();
    if (!data.keep) *c->mutable_data() = data.Take();  // staged bytes: copied out in Ready
    Send(std::move(m), std::move(data), bytes);
  }
  void OnCompleted(uint64_t submit_id, const Status& status) override {
    // Completions come in submit order: the oldest received submit is this one.
    while (!received_at_.empty() && received_at_.front().id <= submit_id) {
      const Received& r = received_at_.front();
      if (r.id == submit_id) {
        auto latency = std::chrono::steady_clock::now() - r.at;
        context_->latency.submit_latency->Record(latency);
        if (r.transfer && context_->latency.transfer_latency)
          context_->latency.transfer_latency->Record(latency);
      }
      received_at_.pop_front();
    }
    // The board's post (made before this call) is the report of a success, unless Download
    // bytes went out for it: the client waits for its Completed to know they all came.
    if (successes_on_board_ && status.ok() && ledger_.AnsweredOnBoard(submit_id)) {
      MaybeReadMore();
      return;
    }
    SendCompleted(submit_id, status);
  }
  void SendCompleted(uint64_t submit_id, const Status& status) {
    auto m = std::make_unique<v1::ServerMessage>();
    m->mutable_completed()->set_submit_id(submit_id);
    if (!status.ok()) wire::ToProto(status, m->mutable_completed()->mutable_error());
    Send(std::move(m));
    MaybeReadMore();
  }
  void OnSynchronized(uint64_t sync_id) override {
    auto m = std::make_unique<v1::ServerMessage>();
    m->mutable_synchronized()->set_sync_id(sync_id);
    Send(std::move(m));
  }
  void OnClosed(const session::SessionStatsSnapshot& stats) override {
    auto m = std::make_unique<v1::ServerMessage>();
    wire::StatsToProto(stats, m->mutable_closed()->mutable_stats());
    session_done_ = true;
    spdlog::info("session {} closed ({} submits, {} ops)", session_id_, stats.submits, stats.ops);
    if (keep_stream_asked_ && !finishing() && reactor_ &&
        (outbox_.write_in_flight() || !outbox_.empty())) {
      // Answers of the session are still being written, and count as unanswered until they
      // are: Closed waits for them (HandleWriteDone), and whether the stream is kept is
      // decided then. (It would be written after them anyway.)
      closed_held_ = std::move(m);
      HoldUntilDone();  // no session now: counted as sessionless until the stream ends
      ArmFinishDeadline();
      return;
    }
    SendClosed(std::move(m));
  }

  // Write the session's Closed `m`: on a kept stream (Close.keep_stream, KeepStream), or as
  // the stream's last message.
  void SendClosed(std::unique_ptr<v1::ServerMessage> m) {
    if (keep_stream_asked_ && KeepStream()) {
      ++context_->gauges.streams_kept_total;
      m->mutable_closed()->set_stream_kept(true);
      m->mutable_closed()->set_kept_ms(
          static_cast<uint64_t>(context_->limits.open_timeout.count()));
      Send(std::move(m));
      MaybeReadMore();  // the next Open
      return;
    }
    channels_.ReleaseKept();  // no next session to take them
    if (end_ == StreamEnd::kOpen && !outbox_.write_in_flight() && outbox_.empty() && reactor_) {
      // Nothing else to write: Closed and the stream's end go in one write, so the client
      // reads both at once instead of waiting for a second write after this one's.
      DropRing();
      end_ = NextStreamEnd(NextStreamEnd(end_, StreamEndEvent::kFinishAsked),
                           StreamEndEvent::kDrained);
      outbox_.set_writer(nullptr);
      last_message_ = std::move(m);
      reactor_->StartWriteAndFinish(last_message_.get(), grpc::WriteOptions(), grpc::Status::OK);
      HoldUntilDone();
      ArmFinishDeadline();
      return;
    }
    Send(std::move(m));
    FinishWith(grpc::Status::OK);
  }

 private:
  void Dispatch(std::shared_ptr<IncomingMessage> incoming) {
    const v1::ClientMessage* message = incoming->message;
    switch (message->kind_case()) {
      case v1::ClientMessage::kOpen:
        if (session_ || session_done_) return ProtocolViolation("Open sent twice");
        if (message->sequence() != 0) return ProtocolViolation("an Open with a sequence number");
        return Open(message->open());
      case v1::ClientMessage::kSubmit: {
        if (!session_) return ProtocolViolation("Submit before Open");
        uint64_t id = message->submit().submit_id();
        if (id <= last_submit_id_) {
          return ProtocolViolation("submit ids must increase: got " + std::to_string(id) +
                                   " after " + std::to_string(last_submit_id_));
        }
        last_submit_id_ = id;
        if (context_->latency.submit_latency) {
          received_at_.push_back(
              {id, std::chrono::steady_clock::now(), MovesBytes(message->submit())});
        }
        if (Status over = ledger_.ChargeSubmit(*incoming, session_->config().max_in_flight_bytes);
            !over.ok()) {
          session::SubmitRequest refused;
          refused.submit_id = id;
          refused.refusal = std::move(over);
          session_->Submit(std::move(refused));
          return;
        }
        if (HasRawKernelOps(message->submit())) {
          // Refused whole: none of the submit's ops runs, so it cannot be half applied.
          if (Status allowed = RawKernelsAllowed(); !allowed.ok()) {
            session::SubmitRequest refused;
            refused.submit_id = id;
            refused.refusal = std::move(allowed);
            session_->Submit(std::move(refused));
            return;
          }
        }
        // The request keeps the message (its inline bytes) and its arena.
        session_->Submit(ToSubmitRequest(
            std::shared_ptr<const v1::ClientMessage>(std::move(incoming), message)));
        return;
      }
      case v1::ClientMessage::kSynchronize:
        if (!session_) return ProtocolViolation("Synchronize before Open");
        ledger_.AddUnanswered(1);  // until its Synchronized is written
        session_->Synchronize(message->synchronize().sync_id());
        return;
      case v1::ClientMessage::kClose:
        if (!session_) return ProtocolViolation("Close before Open");
        close_requested_ = true;
        keep_stream_asked_ = message->close().keep_stream();
        if (keep_stream_asked_) {
          const auto& ids = message->close().keep_slabs();
          channels_.KeepAtClose(std::vector<uint64_t>(ids.begin(), ids.end()));
        }
        session_->Close();
        return;
      case v1::ClientMessage::KIND_NOT_SET:
        return ProtocolViolation("a message with no kind");
    }
  }

  // The most server messages a stream's outbox holds before the stream stops reading.
  static constexpr size_t kMaxOutboxMessages = 4096;

  // Where a message came from: the gRPC stream or the submit ring.
  using Sequencer = InputSequencer<IncomingMessage>;
  using Source = Sequencer::Source;
  static constexpr Source kStream = Sequencer::kStream;
  static constexpr Source kRing = Sequencer::kRing;

  // Handle `message` in its place (InputSequencer): at once, or held (pausing its path)
  // until every lower number has been handled. Nothing is handled after Close.
  void Accept(std::shared_ptr<IncomingMessage> message, Source from) {
    if (message->sequence() != 0 && !ring_.attached()) {
      // Held, it would wait for lower numbers that no path can bring.
      return ProtocolViolation("message " + std::to_string(message->sequence()) +
                               " is numbered, and the session has no submit ring");
    }
    Status s = sequencer_.Accept(
        std::move(message), from, [this] { return !finishing(); },
        [this](std::shared_ptr<IncomingMessage> m, Source next) {
          if (m->sequence() != 0 && close_requested_) return;  // nothing is read after Close
          Handle(std::move(m), next);
        });
    if (!s.ok()) ProtocolViolation(s.message());
  }

  // Handle one message in order.
  void Handle(std::shared_ptr<IncomingMessage> message, Source from) {
    // Read ahead: ask for the next message before a long submit is enqueued (it may launch
    // many kernels), so that the next one is already here when the executor is done, instead
    // of the device idling through a read's wake-ups between submits. The submit counts
    // against the in-flight limit already, so the limit holds exactly. A short submit is
    // enqueued first: the read is then started while the device runs it, off the round trip.
    if (message->scan.kind == v1::ClientMessage::kSubmit && message->scan.ops > kReadAheadOps) {
      if (from == kStream) {
        MaybeStartRead(1);
      } else {
        MaybeArmRing(1);
      }
    }
    Dispatch(std::move(message));
    MaybeReadMore();
  }

  // Return true when the submit moves bytes between host and device.
  static bool MovesBytes(const v1::Submit& submit) {
    for (const v1::Op& op : submit.ops()) {
      const std::optional<session::OpKind> kind = KindOf(op);
      if (kind && session::Traits(*kind).copy != session::CopyDirection::kNone) return true;
    }
    return false;
  }

  // OK when this session's peer may load and launch raw kernels, PERMISSION_DENIED otherwise.
  // A raw kernel runs in the context every session shares and can read and corrupt all of
  // their memory, so only peers the config trusts get it: TCP peers with
  // --allow-remote-raw-kernels, local uids listed in raw-kernels (by uid or group). The
  // answer is looked up once per stream (its peer does not change), before the first message
  // after the Open where the lookup may block (Open posts it).
  Status RawKernelsAllowed() {
    if (!raw_kernels_checked_) {
      raw_kernels_checked_ = true;
      if (remote_) {
        raw_kernels_allowed_ = context_->access.allow_remote_raw_kernels;
      } else {
        raw_kernels_allowed_ = peer_.uid.has_value() &&
                               context_->access.raw_kernels.Admits(static_cast<uid_t>(*peer_.uid));
      }
    }
    if (raw_kernels_allowed_) return Status::Ok();
    if (remote_) {
      return Status(ErrorKind::kPermissionDenied,
                    "raw kernels (LoadModule, Launch) are disabled for remote sessions "
                    "(ferryd --allow-remote-raw-kernels enables them)");
    }
    return Status(ErrorKind::kPermissionDenied,
                  "raw kernels (LoadModule, Launch) are not enabled for uid " +
                      (peer_.uid ? std::to_string(*peer_.uid) : std::string("(unknown)")) +
                      " (ferryd --raw-kernels uid:UID or gid:GROUP enables them; see "
                      "docs/security.md)");
  }

  // Raw kernels: LoadModule and Launch ops (what a peer may be refused).
  static bool HasRawKernelOps(const v1::Submit& submit) {
    for (const v1::Op& op : submit.ops()) {
      const std::optional<session::OpKind> kind = KindOf(op);
      if (kind && session::Traits(*kind).raw_kernel) return true;
    }
    return false;
  }

  void Open(const v1::Open& open) {
    // From here the stream is a session (counted by the sessions limits) or ends.
    sessionless_.Release();
    closed_session_.reset();  // a kept stream's last session
    // The slabs it kept go to this session (below); whatever is left of them, whatever
    // happens, back to the pool when Open returns.
    StreamChannels::LastSlabs last = channels_.TakeLastSlabs();
    if (open.protocol_version() != v1::PROTOCOL_VERSION_CURRENT) {
      return ProtocolViolation("protocol version " + std::to_string(open.protocol_version()) +
                               " is not supported; this daemon speaks " +
                               std::to_string(v1::PROTOCOL_VERSION_CURRENT));
    }
    if (context_->gauges.draining) {
      return Fail(Status(ErrorKind::kUnavailable, "the daemon is draining"),
                  grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"));
    }
    outbox_.set_coalesce(open.coalesced_completions());
    session::SessionConfig config = context_->limits.defaults;
    if (open.device_bytes_quota()) {
      config.device_bytes_quota =
          std::min<uint64_t>(open.device_bytes_quota(), context_->limits.max_device_bytes_quota);
    }
    if (open.max_in_flight_submits()) {
      config.max_in_flight_submits =
          std::min<uint32_t>(open.max_in_flight_submits(), context_->limits.max_in_flight_submits);
    }
    const std::string client_name = session::CleanClientName(open.client_name());
    auto created =
        session::Session::Create(context_->parts.device, context_->parts.registry, executor_,
                                 config, client_name, peer_, this, context_->parts.copy_turns);
    if (!created.ok()) {
      return Fail(created.status(),
                  grpc::Status(static_cast<grpc::StatusCode>(created.status().code()),
                               created.status().message()));
    }
    session_ = std::move(*created);
    session_id_ = session_->id();
    ledger_.set_account(context_->parts.registry->AccountOf(session_id_));
    gate_->Set(IntakeBounds{true, session_->config().max_ops_per_submit,
                            session_->config().max_in_flight_bytes, context_->parts.registry,
                            ledger_.account()});
    if (!raw_kernels_checked_ && !remote_ && context_->access.raw_kernels.lists_groups()) {
      // The group lookup may block: done now on an io thread, ahead of every message after
      // the Open (the executor keeps the order), not at the first launch, which may be handled
      // on the ring poller's thread, which every local session's ring shares.
      executor_.Post([self = shared_from_this()] { (void)self->RawKernelsAllowed(); },
                     "raw-kernel permission");
    }
    if (peer_.local()) {
      spdlog::info("session {} opened by '{}' from {} (uid {}, pid {})", session_id_, client_name,
                   peer_.address, *peer_.uid, *peer_.pid);
    } else {
      spdlog::info("session {} opened by '{}' from {}", session_id_, client_name, peer_.address);
    }
    auto m = std::make_unique<v1::ServerMessage>();
    auto* o = m->mutable_opened();
    o->set_session_id(session_id_);
    o->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
    backend::DeviceInfo info = context_->parts.device->info();
    o->set_backend(info.backend);
    o->set_device_name(info.name);
    o->set_device_bytes_quota(config.device_bytes_quota);
    o->set_max_in_flight_submits(config.max_in_flight_submits);
    o->set_max_message_bytes(context_->limits.max_message_bytes);
    // Shared memory for a local client: a slab set with its board and ring, and the one-time
    // token that binds a connection on the slab socket to it.
    if (context_->parts.slab_pool && context_->parts.slab_broker && peer_.local()) {
      if (Status s =
              channels_.Open(open, *session_, last, ring_, RingHandler(), o, &successes_on_board_);
          !s.ok()) {
        return Fail(s, grpc::Status(grpc::StatusCode::UNAVAILABLE, s.message()));
      }
    }
    // Inline bytes (every remote transfer; a local client's small ones) are staged, pinned:
    // no executor thread then waits in a copy to or from ordinary memory (Session::ReserveStaging).
    if (context_->parts.staging) session_->AttachStaging(context_->parts.staging);
    Send(std::move(m));
  }

  // Close.keep_stream: make the stream sessionless again, ready for the next Open, and return
  // true; false (the stream then ends as usual) when something of the session is still to
  // be answered, the stream is ending or its client has stopped writing, or the stream
  // cannot take a sessionless place (SessionlessStreams::Keep). Called from OnClosed.
  bool KeepStream() {
    if (finishing() || !reactor_ || read_closed_ || !ledger_.idle()) {
      return false;
    }
    if (SessionlessStreams* streams = context_->parts.sessionless_streams) {
      sessionless_.Release();  // the hold while Closed waited, if any: Keep counts afresh
      std::optional<SessionlessStreams::Ticket> kept = streams->Keep(session::IdentityOf(peer_));
      if (!kept) return false;
      sessionless_ = std::move(*kept);
    }
    // Its board and ring, and the slabs it kept, go to the next session.
    channels_.KeepForNext(ring_);
    // Session::Finalize is still running (it called OnClosed): the session goes at the next
    // Open, or with the stream.
    closed_session_ = std::move(session_);
    session_id_ = 0;
    session_done_ = false;
    ledger_.set_account(nullptr);
    gate_->Set(IntakeBounds{});
    last_submit_id_ = 0;
    received_at_.clear();
    close_requested_ = false;
    keep_stream_asked_ = false;
    outbox_.set_coalesce(false);
    successes_on_board_ = false;
    sequencer_.Reset();  // the next session numbers its messages from 1
    parked_.reset();
    ArmOpenDeadline();
    return true;
  }

  // Report a session-level error to the client, then end the stream with `rpc_status`.
  void Fail(const Status& status, const grpc::Status& rpc_status) {
    auto m = std::make_unique<v1::ServerMessage>();
    wire::ToProto(status, m->mutable_error());
    Send(std::move(m));
    if (session_ && !session_done_) session_->Abort();
    session_done_ = true;
    FinishWith(rpc_status);
  }

  void ProtocolViolation(const std::string& what) {
    spdlog::warn("session {} from {}: protocol violation: {}", session_id_, peer_.address, what);
    Fail(Status(ErrorKind::kProtocolViolation, what),
         grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what));
  }

  void ClientGone(const char* why) {
    if (session_ && !session_done_) {
      spdlog::info("session {}: {}; cleaning up", session_id_, why);
      session_->Abort();
    }
    session_done_ = true;
    // Drop what is not yet written, but keep the message gRPC may still be writing.
    DropUnsent(outbox_.write_in_flight() ? 1u : 0u);
    FinishWith(grpc::Status::CANCELLED);
  }

  // MessageWriter: the outbox's writes go to the stream.
  void StartWrite(const v1::ServerMessage* message) override { reactor_->StartWrite(message); }

  // Queue `message` (Outbox); a DownloadChunk's `chunk_bytes` may still be in staging
  // (`staged`). Nothing is queued once the stream is ending.
  void Send(std::unique_ptr<v1::ServerMessage> message, session::ChunkBytes staged = {},
            uint64_t chunk_bytes = 0) {
    if (finishing()) return;
    outbox_.Push(std::move(message), std::move(staged), chunk_bytes);
    WatchStagedChunks();
  }
  void DropUnsent(size_t keep) { outbox_.DropUnsent(keep); }
  void PumpWrites() {
    outbox_.Pump();
    WatchStagedChunks();
  }

  // Staging is shared by every session, and a chunk holds its range until it is written. A
  // client that stops reading stops the writes, so the chunks queued behind the write in
  // flight would hold their staging for as long as it does not read, and other sessions'
  // inline transfers would wait for it (staging-wait) and then copy directly. So once one
  // write has been in flight for kStalledWrite, every chunk still in staging is copied out
  // (the copy the outbox makes anyway, made early); its bytes stay charged to the session's
  // in-flight bytes until written, as before.
  static constexpr std::chrono::milliseconds kStalledWrite{10};

  // Watch the write in flight while chunks wait in staging behind it.
  void WatchStagedChunks() {
    if (stall_watch_armed_ || !outbox_.write_in_flight() || outbox_.chunks_in_staging() == 0) {
      return;
    }
    stall_watch_armed_ = true;
    executor_.PostAfter(
        kStalledWrite,
        [weak = weak_from_this(), write = outbox_.writes_started()] {
          auto self = weak.lock();
          if (!self) return;
          self->stall_watch_armed_ = false;
          if (self->outbox_.writes_started() != write) {  // writes moved on: watch the one now
            self->WatchStagedChunks();
            return;
          }
          if (self->outbox_.write_in_flight()) self->outbox_.CopyOutStaged();
        },
        "stalled write");
  }

  // Take the next message from the stream and from the submit ring, where allowed.
  void MaybeReadMore() {
    if (parked_ && !sequencer_.holds(kStream) && !finishing()) Accept(std::move(parked_), kStream);
    MaybeStartRead();
    ring_.Drain(*this);
    MaybeArmRing();
    // A stream a limit stops taking more from (by either path: a read may be outstanding on
    // the stream while the client writes to its ring), not one that ends.
    const bool paused = session_ && !session_done_ && !read_closed_ && !close_requested_ &&
                        !finishing() && reactor_ && AtLimit(0);
    if (paused != paused_) {
      paused_ = paused;
      if (paused) {
        ++context_->gauges.streams_paused;
        ++context_->gauges.read_pauses_total;
      } else {
        --context_->gauges.streams_paused;
      }
    }
  }

  // Whether the session may take one more message, counting `arriving` submits not yet
  // handed to it besides those a path may still deliver (a read outstanding, an armed ring,
  // a held message): not when the stream is ending, nor at the session's in-flight limit.
  bool MayTakeMore(size_t arriving) const {
    if (read_closed_ || close_requested_ || finishing() || !reactor_) return false;
    if (!session_) return true;
    return !AtLimit(arriving);
  }

  // Whether a limit keeps the session from taking `arriving` more messages besides those in
  // transit (see MayTakeMore). A client that writes and never reads must not make the daemon
  // hold without bound what it has not read: every Submit and Synchronize counts toward
  // max_in_flight_submits until its answer is written (a refused submit too), every submit's
  // bytes toward max_in_flight_bytes likewise, and the outbox holds at most kMaxOutboxMessages
  // messages and max_in_flight_bytes bytes. Each of these is resumed by a write (or a
  // completion) that calls MaybeReadMore.
  bool AtLimit(size_t arriving) const {
    return ledger_.unanswered() + arriving + Incoming() >=
               session_->config().max_in_flight_submits ||
           OverBytesOrOutbox();
  }
  // Messages a path may still deliver: a read outstanding, what an armed ring may hand over,
  // what the poller took and is not handled yet, a held message.
  size_t Incoming() const {
    return (reading_ ? 1 : 0) + ring_.incoming() + (sequencer_.holds(kStream) ? 1 : 0) +
           (sequencer_.holds(kRing) ? 1 : 0) + (parked_ ? 1 : 0);
  }
  // The limits of AtLimit other than the count of messages.
  // A session that holds bytes also stops while the daemon or its identity has less than
  // one message (max-message) of in-flight bytes left: its own answers resume it. One that
  // holds none reads on, and a submit past those limits is refused (ChargeSubmit).
  bool OverBytesOrOutbox() const {
    return outbox_.size() >= kMaxOutboxMessages ||
           ledger_.OverBytes(session_->config().max_in_flight_bytes, outbox_.bytes(),
                             context_->limits.max_message_bytes);
  }

  // Start the next read unless one is outstanding, a message read while the stream's last one
  // waits for its turn waits too (parked_), or the session may take no more (MayTakeMore).
  void MaybeStartRead(size_t arriving = 0) {
    if (reading_ || parked_ || !MayTakeMore(arriving)) return;
    reading_ = true;
    reactor_->StartRead(&read_buffer_);
  }

  // Likewise let the ring poller take the next messages from the submit ring: as many as
  // the in-flight limit has room for (at most RingIntake::kBatch), once the last ones are
  // handled.
  void MaybeArmRing(size_t arriving = 0) {
    if (!ring_.ready_to_arm() || !session_ || sequencer_.holds(kRing) || !MayTakeMore(arriving)) {
      return;
    }
    const size_t used = ledger_.unanswered() + arriving + Incoming();  // below: MayTakeMore
    const size_t room = session_->config().max_in_flight_submits - used;
    // And no more bytes than the ring holds, nor than the session, its identity and the daemon
    // may still hold in flight (one record is taken all the same): what the poller hands over
    // waits in the intake until the session accepts it (and charges it), so this bounds what a
    // session's ring makes the daemon hold, whatever its client writes while the poller takes.
    const uint64_t bytes = std::min(context_->limits.submit_ring_bytes,
                                    ledger_.Room(session_->config().max_in_flight_bytes));
    ring_.Arm(std::clamp<size_t>(room, 1, RingIntake::kBatch), bytes);
  }

  // Stop taking messages from the submit ring (the stream is ending).
  void DropRing() { ring_.Drop(); }

  bool finishing() const { return end_ != StreamEnd::kOpen; }

  // End the stream with `status` (the first one asked for wins) once writes have drained.
  void FinishWith(const grpc::Status& status) {
    HoldUntilDone();
    ArmFinishDeadline();
    DropRing();
    if (end_ == StreamEnd::kOpen) finish_status_ = status;
    end_ = NextStreamEnd(end_, StreamEndEvent::kFinishAsked);
    TryFinish();
  }

  void TryFinish() {
    if (end_ != StreamEnd::kFinishing || outbox_.write_in_flight() || !outbox_.empty() ||
        !reactor_) {
      return;
    }
    end_ = NextStreamEnd(end_, StreamEndEvent::kDrained);
    outbox_.set_writer(nullptr);
    reactor_->Finish(finish_status_);
    HoldUntilDone();
  }

  // A stream that carries no session any more and is being finished, or waits for its writes
  // to drain, may not stall there: a client that never reads (a zero flow-control window)
  // would otherwise keep its last write, and the stream, in flight for ever. One whose writes
  // make no progress for the open timeout is cancelled (gRPC then ends it: OnCancel, OnDone);
  // one still reading its last answers, however slowly, is looked at again.
  void ArmFinishDeadline() {
    if (finish_deadline_armed_ || context_->limits.open_timeout.count() <= 0) return;
    finish_deadline_armed_ = true;
    executor_.PostAfter(
        context_->limits.open_timeout,
        [weak = weak_from_this(), handle = call_, writes = outbox_.writes_started()] {
          auto self = weak.lock();
          if (!self) return;
          self->finish_deadline_armed_ = false;
          // Still finishing, or Closed still waiting (a stream kept meanwhile has moved on).
          if (!self->finishing() && !self->closed_held_) return;
          if (self->outbox_.writes_started() != writes) {  // writes moved on: another span
            self->ArmFinishDeadline();
            return;
          }
          ++self->context_->gauges.finish_timeouts_total;
          spdlog::info(
              "stream from {}: its last writes were not read within the open timeout; "
              "cancelling it",
              self->peer_.address);
          MutexLock lock(&handle->mu);
          if (handle->call) handle->call->TryCancel();
        },
        "finish deadline");
  }

  // The stream is finished, or carries no session while its last writes drain: until gRPC is
  // done with the call (HandleDone), which takes until its client closes its side, it counts
  // among the sessionless streams again.
  void HoldUntilDone() {
    if (SessionlessStreams* streams = context_->parts.sessionless_streams) {
      if (!sessionless_.held()) sessionless_ = streams->Hold(session::IdentityOf(peer_));
    }
  }

  // Submits of more ops than this start the next read before they are enqueued.
  static constexpr int kReadAheadOps = 4;

  SessionServiceContext* context_;
  session::Executor executor_;
  Reactor* reactor_;  // valid until Finish; null after OnDone
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
  bool session_done_ = false;  // closed, aborted or failed: no more session calls
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
  bool close_requested_ = false;
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

class SessionReactor final : public Reactor {
 public:
  SessionReactor(SessionServiceContext* context, session::PeerIdentity peer,
                 SessionlessStreams::Ticket sessionless, grpc::CallbackServerContext* call)
      : connection_(std::make_shared<SessionConnection>(context, this, std::move(peer),
                                                        std::move(sessionless), call)) {
    // Start only registers the stream and starts its first read: on this gRPC thread.
    RunOrPost([](SessionConnection& c) { c.Start(); });
  }

  void OnReadDone(bool ok) override {
    std::shared_ptr<IncomingMessage> message;
    if (ok) {
      // Scanned, bounded and only then parsed (rpc/message_intake.h).
      grpc::ByteBuffer* bytes = connection_->read_buffer();
      message = TakeClientMessage(*bytes, connection_->intake_bounds());
      bytes->Clear();
      ++connection_->context()->gauges.messages_in_hand;  // until HandleRead has handled it
    }
    const v1::ClientMessage* m = message ? message->message : nullptr;
    // An Open is handled here too while the device serves (it then waits for nothing): the
    // hand-off to an io thread was a quarter of an open's time. So is the end of a stream
    // the intake refused (it only queues the answer).
    const bool quick =
        message &&
        (!m || IsQuick(*m) || (m->has_open() && connection_->context()->parts.device->serving()));
    const bool long_submit = m && m->has_submit() && message->refusal.ok() &&
                             message->scan.ops > session::Session::kLongSubmitOps;
    auto handle = [message = std::move(message)](SessionConnection& c) mutable {
      c.HandleRead(std::move(message));
    };
    if (quick) {
      RunOrPost(std::move(handle));  // on this gRPC thread when the session is idle
    } else if (long_submit && connection_->executor().has_long_lane()) {
      // Its conversion and admission are not cut into slices: on the long lane (its enqueue
      // goes on in slices on the shared one, Session::StartLane).
      connection_->context()->parts.registry->CountLongLaneTurn();
      Post(std::move(handle), "stream message (long lane)", session::SerialExecutor::Lane::kLong);
    } else {
      Post(std::move(handle), "stream message");
    }
  }
  void OnWriteDone(bool ok) override {
    RunOrPost([ok](SessionConnection& c) { c.HandleWriteDone(ok); });
  }
  void OnCancel() override {
    Post([](SessionConnection& c) { c.HandleCancel(); }, "stream cancel");
  }
  void OnDone() override {
    connection_->ForgetCall();
    Post([](SessionConnection& c) { c.HandleDone(); }, "stream done");
    delete this;
  }

 private:
  template <typename F>
  void Post(F&& f, const char* name,
            session::SerialExecutor::Lane lane = session::SerialExecutor::Lane::kShared) {
    connection_->executor().Post([c = connection_, f = std::forward<F>(f)]() mutable { f(*c); },
                                 name, lane);
  }
  template <typename F>
  void RunOrPost(F&& f) {
    // gRPC's threads are many and this one would otherwise go back to waiting: it also runs
    // what queued behind `f` (a completion arriving while a submit's handler finishes).
    connection_->executor().RunOrPost(
        [c = connection_, f = std::forward<F>(f)]() mutable { f(*c); },
        session::SerialExecutor::Followers::kRunHere);
  }

  std::shared_ptr<SessionConnection> connection_;
};

}  // namespace

namespace {

// Who is calling: a local peer by its connection's SO_PEERCRED (LocalConnections), a TCP peer
// as remote, and, where it sent a named tenant's token, as that tenant (its own limits).
session::PeerIdentity PeerOf(SessionServiceContext* context, bool tcp,
                             const grpc::ServerContextBase& call) {
  session::PeerIdentity peer = !tcp && context->parts.local_connections
                                   ? context->parts.local_connections->Identify(call.peer())
                                   : session::PeerIdentity{call.peer()};
  peer.tcp = tcp;
  if (tcp && context->access.token) peer.tenant = context->access.token->TenantOf(call);
  return peer;
}

class SessionlessCallInterceptor final : public grpc::experimental::Interceptor {
 public:
  SessionlessCallInterceptor(SessionServiceContext* context, bool tcp,
                             grpc::experimental::ServerRpcInfo* info)
      : context_(context), tcp_(tcp), info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      TakePlace();
    }
    methods->Proceed();
  }

 private:
  void TakePlace() {
    if (info_->type() == grpc::experimental::ServerRpcInfo::Type::UNARY) return;
    if (std::string_view(info_->method()) == "/ferry.v1.SessionService/Session") return;
    SessionlessStreams* streams = context_->parts.sessionless_streams;
    grpc::ServerContextBase* call = info_->server_context();
    if (!streams || !call) return;
    const session::PeerIdentity peer = PeerOf(context_, tcp_, *call);
    auto admitted = streams->Admit(session::IdentityOf(peer));
    if (!admitted.ok()) {
      spdlog::debug("{} from {} refused: {}", info_->method(), peer.address,
                    admitted.status().message());
      grpc_call_cancel_with_status(call->c_call(), GRPC_STATUS_RESOURCE_EXHAUSTED,
                                   admitted.status().message().c_str(), nullptr);
      return;
    }
    place_ = std::move(*admitted);
  }

  SessionServiceContext* context_;
  const bool tcp_;
  grpc::experimental::ServerRpcInfo* info_;
  SessionlessStreams::Ticket place_;  // given back when the call ends (and this with it)
};

class SessionlessCallInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  SessionlessCallInterceptorFactory(SessionServiceContext* context, bool tcp)
      : context_(context), tcp_(tcp) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new SessionlessCallInterceptor(context_, tcp_, info);
  }

 private:
  SessionServiceContext* context_;
  const bool tcp_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeSessionlessCallsInterceptorFactory(SessionServiceContext* context, bool tcp) {
  return std::make_unique<SessionlessCallInterceptorFactory>(context, tcp);
}

void BroadcastDraining(SessionServiceContext* context, uint64_t grace_ms) {
  std::vector<std::shared_ptr<DrainListener>> streams;
  {
    MutexLock lock(&context->gauges.streams_mu);
    for (auto& [key, weak] : context->gauges.streams) {
      if (auto s = weak.lock()) streams.push_back(std::move(s));
    }
  }
  for (auto& s : streams) s->NotifyDraining(grace_ms);
}

// Ends a stream the daemon will not serve (a TCP peer without the bearer token, a stream
// past the sessionless streams' limits).
//
// gRPC keeps a call the daemon has finished until the client closes its side too: 10,000
// refused streams whose client kept them unread held 140 MiB of ferryd's memory (measured).
// So a refusal either holds a ticket (`held`, given back when gRPC is done with the call)
// and tells the client `status`, or, where there is no ticket to hold, is also cancelled at
// once: the client then sees CANCELLED instead of `status` (libferry's open_session retries
// either), and the call is gone as soon as gRPC has sent its reset.
class RejectedReactor final : public Reactor {
 public:
  RejectedReactor(const grpc::Status& status, SessionlessStreams::Ticket held)
      : held_(std::move(held)) {
    Finish(status);
  }
  RejectedReactor(const grpc::Status& status, grpc::CallbackServerContext* call) {
    Finish(status);
    call->TryCancel();
  }
  void OnDone() override {
    held_.Release();
    delete this;
  }

 private:
  SessionlessStreams::Ticket held_;
};

SessionService::SessionService(SessionServiceContext* context, bool tcp)
    : context_(context), tcp_(tcp) {
  MarkMethodRawCallback(
      0, new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, v1::ServerMessage>(
             [this](grpc::CallbackServerContext* call) { return Session(call); }));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, v1::ServerMessage>* SessionService::Session(
    grpc::CallbackServerContext* context) {
  if (Status s = CheckToken(context_->access.token, *context, tcp_); !s.ok()) {
    const grpc::Status status(static_cast<grpc::StatusCode>(s.code()), s.message());
    // A few such streams are told why; past them (a flood) they are reset.
    if (SessionlessStreams* rejected = context_->parts.unauthenticated_streams) {
      if (auto held = rejected->Admit("unauthenticated"); held.ok()) {
        return new RejectedReactor(status, std::move(*held));
      }
    }
    return new RejectedReactor(status, context);
  }
  session::PeerIdentity peer = PeerOf(context_, tcp_, *context);
  SessionlessStreams::Ticket sessionless;
  if (SessionlessStreams* streams = context_->parts.sessionless_streams) {
    auto admitted = streams->Admit(session::IdentityOf(peer));
    if (!admitted.ok()) {
      spdlog::debug("stream from {} refused: {}", peer.address, admitted.status().message());
      return new RejectedReactor(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, admitted.status().message()), context);
    }
    sessionless = std::move(*admitted);
  }
  return new SessionReactor(context_, std::move(peer), std::move(sessionless), context);
}

}  // namespace ferry::rpc
