#include "rpc/session_connection.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "ferry/trace_points.h"
#include "ferry/wire.h"
#include "rpc/convert.h"

namespace ferry::rpc {

SessionConnection::SessionConnection(SessionServiceContext* context, SessionReactorBase* reactor,
                                     session::PeerIdentity peer,
                                     SessionlessStreams::Ticket sessionless,
                                     grpc::CallbackServerContext* call)
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

void SessionConnection::ForgetCall() {
  MutexLock lock(&call_->mu);
  call_->call = nullptr;
}

const session::Executor& SessionConnection::executor() const { return executor_; }

SessionServiceContext* SessionConnection::context() const { return context_; }

grpc::ByteBuffer* SessionConnection::read_buffer() { return &read_buffer_; }

IntakeBounds SessionConnection::intake_bounds() const { return gate_->Get(); }

void SessionConnection::Start() {
  ++context_->gauges.streams_started_total;
  {
    MutexLock lock(&context_->gauges.streams_mu);
    context_->gauges.streams[this] = shared_from_this();
  }
  ArmOpenDeadline();
  MaybeStartRead();
}

void SessionConnection::ArmOpenDeadline() {
  sessionless_since_ = std::chrono::steady_clock::now();
  if (context_->limits.open_timeout.count() <= 0 || open_deadline_armed_) return;
  ArmOpenDeadlineIn(context_->limits.open_timeout);
}

void SessionConnection::ArmOpenDeadlineIn(std::chrono::steady_clock::duration delay) {
  open_deadline_armed_ = true;
  executor_.PostAfter(
      std::chrono::ceil<std::chrono::milliseconds>(delay),
      [weak = weak_from_this()] {
        if (auto self = weak.lock()) self->OpenDeadline();
      },
      "open deadline");
}

void SessionConnection::OpenDeadline() {
  open_deadline_armed_ = false;
  if (phase_ != StreamPhase::kNoSession || finishing()) return;
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

void SessionConnection::NotifyDraining(uint64_t grace_ms) {
  executor_.Post(
      [self = shared_from_this(), grace_ms] {
        auto m = std::make_unique<v1::ServerMessage>();
        m->mutable_draining()->set_grace_ms(grace_ms);
        self->Send(std::move(m));
      },
      "draining notice");
}

void SessionConnection::HandleRead(std::shared_ptr<IncomingMessage> message) {
  reading_ = false;
  if (!message) {
    read_closed_ = true;
    if (sequencer_.holds(kStream) || sequencer_.holds(kRing)) {
      // What is held waits for a number only the stream could still bring.
      return ProtocolViolation("the client ended the stream while message " +
                               std::to_string(HeldSequence()) + " waits for number " +
                               std::to_string(sequencer_.next_sequence()));
    }
    if (!close_read()) ClientGone("the client ended the stream without Close");
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

void SessionConnection::EndForIntake(const Status& violation, const std::string& where) {
  if (violation.kind() == ErrorKind::kInvalidArgument) {
    spdlog::warn("stream from {}: {}{}", peer_.address, where, violation.message());
    return Fail(violation, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, violation.message()));
  }
  ProtocolViolation(where + violation.message());
}

uint64_t SessionConnection::HeldSequence() const {
  return sequencer_.held_sequence(sequencer_.holds(kStream) ? kStream : kRing);
}

void SessionConnection::HandleRingMessages(std::vector<RingIntake::Record> records,
                                           std::string broken) {
  if (ring_.Take(std::move(records), std::move(broken))) MaybeReadMore();
}

bool SessionConnection::MayTakeRingMessage() const {
  return !sequencer_.holds(kRing) && !finishing() && !(session_ && OverBytesOrOutbox());
}

std::shared_ptr<session::Session> SessionConnection::ring_session() const { return session_; }

bool SessionConnection::AcceptRingMessage(std::shared_ptr<IncomingMessage> m) {
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

void SessionConnection::YieldRingDrain() {
  executor_.Yield([self = shared_from_this()] { self->MaybeReadMore(); }, "ring messages");
}

void SessionConnection::PostLongRecord(std::string record) {
  if (executor_.has_long_lane()) context_->parts.registry->CountLongLaneTurn();
  executor_.Post([self = shared_from_this(), record = std::move(record),
                  session = session_id_] { self->OnLongRingRecord(record, session); },
                 "ring record (long lane)", session::SerialExecutor::Lane::kLong);
}

void SessionConnection::RingBroken(const std::string& what) { ProtocolViolation(what); }

void SessionConnection::OnLongRingRecord(const std::string& record, uint64_t session) {
  ring_.LongRecordDone();
  // Not the session it was taken for (the ring went with the stream, or to a next session
  // whose backlog started afresh): dropped, as that backlog was.
  if (!ring_.attached() || session != session_id_ || finishing()) return;
  AcceptRingMessage(TakeClientMessage(record, gate_->Get()));
  executor_.Post([self = shared_from_this()] { self->MaybeReadMore(); }, "ring messages");
}

transport::RingPoller::Handler SessionConnection::RingHandler() {
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

void SessionConnection::HandleWriteDone(bool ok) {
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

void SessionConnection::HandleCancel() { ClientGone("the client cancelled the stream"); }

void SessionConnection::HandleDone() {
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
  if (session_ && !session_done()) session_->Abort();
  SessionDone();
  session_.reset();
  closed_session_.reset();
  gate_->Set(IntakeBounds{});
  outbox_.set_writer(nullptr);
  reactor_ = nullptr;
}

void SessionConnection::OnDownloadChunk(uint64_t submit_id, uint32_t op_index, uint64_t offset,
                                        session::ChunkBytes data) {
  auto m = std::make_unique<v1::ServerMessage>();
  auto* c = m->mutable_download_chunk();
  c->set_submit_id(submit_id);
  c->set_op_index(op_index);
  c->set_offset(offset);
  const uint64_t bytes = data.size();
  if (!data.keep) *c->mutable_data() = data.Take();  // staged bytes: copied out in Ready
  Send(std::move(m), std::move(data), bytes);
}

void SessionConnection::PostCompletion(uint64_t submit_id, bool ok) {
  if (transport::CompletionBoard* board = channels_.board()) board->Post(submit_id, ok);
}

void SessionConnection::OnCompleted(uint64_t submit_id, const Status& status) {
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

void SessionConnection::SendCompleted(uint64_t submit_id, const Status& status) {
  auto m = std::make_unique<v1::ServerMessage>();
  m->mutable_completed()->set_submit_id(submit_id);
  if (!status.ok()) wire::ToProto(status, m->mutable_completed()->mutable_error());
  Send(std::move(m));
  MaybeReadMore();
}

void SessionConnection::OnSynchronized(uint64_t sync_id) {
  auto m = std::make_unique<v1::ServerMessage>();
  m->mutable_synchronized()->set_sync_id(sync_id);
  Send(std::move(m));
}

void SessionConnection::OnClosed(const session::SessionStatsSnapshot& stats) {
  auto m = std::make_unique<v1::ServerMessage>();
  wire::StatsToProto(stats, m->mutable_closed()->mutable_stats());
  SessionDone();
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

void SessionConnection::SendClosed(std::unique_ptr<v1::ServerMessage> m) {
  if (keep_stream_asked_ && KeepStream()) {
    ++context_->gauges.streams_kept_total;
    m->mutable_closed()->set_stream_kept(true);
    m->mutable_closed()->set_kept_ms(static_cast<uint64_t>(context_->limits.open_timeout.count()));
    Send(std::move(m));
    MaybeReadMore();  // the next Open
    return;
  }
  channels_.ReleaseKept();  // no next session to take them
  if (end_ == StreamEnd::kOpen && !outbox_.write_in_flight() && outbox_.empty() && reactor_) {
    // Nothing else to write: Closed and the stream's end go in one write, so the client
    // reads both at once instead of waiting for a second write after this one's.
    DropRing();
    end_ =
        NextStreamEnd(NextStreamEnd(end_, StreamEndEvent::kFinishAsked), StreamEndEvent::kDrained);
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

void SessionConnection::Dispatch(std::shared_ptr<IncomingMessage> incoming) {
  const v1::ClientMessage* message = incoming->message;
  switch (message->kind_case()) {
    case v1::ClientMessage::kOpen:
      if (phase_ != StreamPhase::kNoSession) return ProtocolViolation("Open sent twice");
      if (message->sequence() != 0) return ProtocolViolation("an Open with a sequence number");
      return Open(message->open());
    case v1::ClientMessage::kSubmit: {
      if (!session_) return ProtocolViolation("Submit before Open");
      uint64_t id = message->submit().submit_id();
      if (id <= last_submit_id_) {
        return ProtocolViolation("submit ids must increase: got " + std::to_string(id) + " after " +
                                 std::to_string(last_submit_id_));
      }
      last_submit_id_ = id;
      if (context_->latency.submit_latency) {
        received_at_.push_back(
            {id, std::chrono::steady_clock::now(), incoming->summary.moves_bytes()});
      }
      if (Status over = ledger_.ChargeSubmit(*incoming, session_->config().max_in_flight_bytes);
          !over.ok()) {
        session::SubmitRequest refused;
        refused.submit_id = id;
        refused.refusal = std::move(over);
        session_->Submit(std::move(refused));
        return;
      }
      if (incoming->summary.raw_kernels()) {
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
      session::SubmitSummary summary = incoming->summary;
      session_->Submit(ToSubmitRequest(
          std::shared_ptr<const v1::ClientMessage>(std::move(incoming), message), summary));
      return;
    }
    case v1::ClientMessage::kSynchronize:
      if (!session_) return ProtocolViolation("Synchronize before Open");
      ledger_.AddUnanswered(1);  // until its Synchronized is written
      session_->Synchronize(message->synchronize().sync_id());
      return;
    case v1::ClientMessage::kClose:
      if (!session_) return ProtocolViolation("Close before Open");
      phase_ = StreamPhase::kClosing;
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

void SessionConnection::Accept(std::shared_ptr<IncomingMessage> message, Source from) {
  if (message->sequence() != 0 && !ring_.attached()) {
    // Held, it would wait for lower numbers that no path can bring.
    return ProtocolViolation("message " + std::to_string(message->sequence()) +
                             " is numbered, and the session has no submit ring");
  }
  Status s = sequencer_.Accept(
      std::move(message), from, [this] { return !finishing(); },
      [this](std::shared_ptr<IncomingMessage> m, Source next) {
        if (m->sequence() != 0 && close_read()) return;  // nothing is read after Close
        Handle(std::move(m), next);
      });
  if (!s.ok()) ProtocolViolation(s.message());
}

void SessionConnection::Handle(std::shared_ptr<IncomingMessage> message, Source from) {
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

Status SessionConnection::RawKernelsAllowed() {
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

void SessionConnection::Open(const v1::Open& open) {
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
      session::Session::Create(context_->parts.device, context_->parts.registry, executor_, config,
                               client_name, peer_, this, context_->parts.copy_turns);
  if (!created.ok()) {
    return Fail(created.status(),
                grpc::Status(static_cast<grpc::StatusCode>(created.status().code()),
                             created.status().message()));
  }
  session_ = std::move(*created);
  session_id_ = session_->id();
  phase_ = StreamPhase::kOpen;
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

bool SessionConnection::KeepStream() {
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
  phase_ = StreamPhase::kNoSession;
  ledger_.set_account(nullptr);
  gate_->Set(IntakeBounds{});
  last_submit_id_ = 0;
  received_at_.clear();
  keep_stream_asked_ = false;
  outbox_.set_coalesce(false);
  successes_on_board_ = false;
  sequencer_.Reset();  // the next session numbers its messages from 1
  parked_.reset();
  ArmOpenDeadline();
  return true;
}

void SessionConnection::Fail(const Status& status, const grpc::Status& rpc_status) {
  auto m = std::make_unique<v1::ServerMessage>();
  wire::ToProto(status, m->mutable_error());
  Send(std::move(m));
  if (session_ && !session_done()) session_->Abort();
  SessionDone();
  FinishWith(rpc_status);
}

void SessionConnection::ProtocolViolation(const std::string& what) {
  spdlog::warn("session {} from {}: protocol violation: {}", session_id_, peer_.address, what);
  Fail(Status(ErrorKind::kProtocolViolation, what),
       grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what));
}

void SessionConnection::ClientGone(const char* why) {
  if (session_ && !session_done()) {
    spdlog::info("session {}: {}; cleaning up", session_id_, why);
    session_->Abort();
  }
  SessionDone();
  // Drop what is not yet written, but keep the message gRPC may still be writing.
  DropUnsent(outbox_.write_in_flight() ? 1u : 0u);
  FinishWith(grpc::Status::CANCELLED);
}

void SessionConnection::StartWrite(const v1::ServerMessage* message) {
  reactor_->StartWrite(message);
}

void SessionConnection::Send(std::unique_ptr<v1::ServerMessage> message, session::ChunkBytes staged,
                             uint64_t chunk_bytes) {
  if (finishing()) return;
  outbox_.Push(std::move(message), std::move(staged), chunk_bytes);
  WatchStagedChunks();
}

void SessionConnection::DropUnsent(size_t keep) { outbox_.DropUnsent(keep); }

void SessionConnection::PumpWrites() {
  outbox_.Pump();
  WatchStagedChunks();
}

void SessionConnection::WatchStagedChunks() {
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

void SessionConnection::MaybeReadMore() {
  if (parked_ && !sequencer_.holds(kStream) && !finishing()) Accept(std::move(parked_), kStream);
  MaybeStartRead();
  ring_.Drain(*this);
  MaybeArmRing();
  // A stream a limit stops taking more from (by either path: a read may be outstanding on
  // the stream while the client writes to its ring), not one that ends.
  const bool paused =
      phase_ == StreamPhase::kOpen && !read_closed_ && !finishing() && reactor_ && AtLimit(0);
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

bool SessionConnection::MayTakeMore(size_t arriving) const {
  if (read_closed_ || close_read() || finishing() || !reactor_) return false;
  if (!session_) return true;
  return !AtLimit(arriving);
}

bool SessionConnection::AtLimit(size_t arriving) const {
  return ledger_.unanswered() + arriving + Incoming() >= session_->config().max_in_flight_submits ||
         OverBytesOrOutbox();
}

size_t SessionConnection::Incoming() const {
  return (reading_ ? 1 : 0) + ring_.incoming() + (sequencer_.holds(kStream) ? 1 : 0) +
         (sequencer_.holds(kRing) ? 1 : 0) + (parked_ ? 1 : 0);
}

bool SessionConnection::OverBytesOrOutbox() const {
  return outbox_.size() >= kMaxOutboxMessages ||
         ledger_.OverBytes(session_->config().max_in_flight_bytes, outbox_.bytes(),
                           context_->limits.max_message_bytes);
}

void SessionConnection::MaybeStartRead(size_t arriving) {
  if (reading_ || parked_ || !MayTakeMore(arriving)) return;
  reading_ = true;
  reactor_->StartRead(&read_buffer_);
}

void SessionConnection::MaybeArmRing(size_t arriving) {
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

void SessionConnection::DropRing() { ring_.Drop(); }

bool SessionConnection::finishing() const { return end_ != StreamEnd::kOpen; }

void SessionConnection::FinishWith(const grpc::Status& status) {
  HoldUntilDone();
  ArmFinishDeadline();
  DropRing();
  if (end_ == StreamEnd::kOpen) finish_status_ = status;
  end_ = NextStreamEnd(end_, StreamEndEvent::kFinishAsked);
  TryFinish();
}

void SessionConnection::TryFinish() {
  if (end_ != StreamEnd::kFinishing || outbox_.write_in_flight() || !outbox_.empty() || !reactor_) {
    return;
  }
  end_ = NextStreamEnd(end_, StreamEndEvent::kDrained);
  outbox_.set_writer(nullptr);
  reactor_->Finish(finish_status_);
  HoldUntilDone();
}

void SessionConnection::ArmFinishDeadline() {
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

void SessionConnection::HoldUntilDone() {
  if (SessionlessStreams* streams = context_->parts.sessionless_streams) {
    if (!sessionless_.held()) sessionless_ = streams->Hold(session::IdentityOf(peer_));
  }
}

bool SessionConnection::session_done() const {
  return phase_ == StreamPhase::kClosed || phase_ == StreamPhase::kEnded;
}

bool SessionConnection::close_read() const {
  return phase_ == StreamPhase::kClosing || phase_ == StreamPhase::kClosed;
}

void SessionConnection::SessionDone() {
  phase_ = close_read() ? StreamPhase::kClosed : StreamPhase::kEnded;
}

}  // namespace ferry::rpc
