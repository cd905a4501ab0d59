#include "session_state.h"

#include <pthread.h>

#include <algorithm>
#include <string>

#include "ferry/trace_points.h"
#include "ferry/wire.h"

namespace ferry::internal {

ClientState::~ClientState() {
  MutexLock lock(&kept_mu_);
  if (kept_) kept_->Cancel();
}

std::unique_ptr<SessionCall> ClientState::TakeKeptCall() {
  std::unique_ptr<SessionCall> call;
  {
    MutexLock lock(&kept_mu_);
    call = std::move(kept_);
  }
  if (call && std::chrono::steady_clock::now() >= call->usable_until) {
    call->Cancel();
    call.reset();
  }
  return call;
}

void ClientState::KeepCall(std::unique_ptr<SessionCall> call, uint64_t kept_ms) {
  auto age = kKeptCallMaxAge;
  if (kept_ms != 0) age = std::min(age, std::chrono::milliseconds(kept_ms / 2));
  call->usable_until = std::chrono::steady_clock::now() + age;
  {
    MutexLock lock(&kept_mu_);
    std::swap(call, kept_);
  }
  if (call) call->Cancel();
}

SessionState::~SessionState() {
  Shutdown();
  detached_.clear();
  staging_ = PinnedBuffer();
  // board_ is unmapped by its own destructor: no waiter is left to read it.
}

template <typename Done>
void SessionState::Wait(Done done, uint64_t board_last) {
  if (done()) return;
  const bool on_board = board_ && board_last != 0;
  const auto until = std::chrono::steady_clock::now() + client_->options.wait_spin;
  uint64_t seen = answers_.load(std::memory_order_acquire);
  uint64_t seen_through = on_board ? board_->CompletedThrough() : 0;
  mu_.Unlock();
  // Spin: look again whenever the reader applied a message or the board moved.
  while (std::chrono::steady_clock::now() < until) {
    const uint64_t answers = answers_.load(std::memory_order_acquire);
    const uint64_t through = on_board ? board_->CompletedThrough() : 0;
    if (answers == seen && through == seen_through) {
      std::this_thread::yield();
      continue;
    }
    seen = answers;
    seen_through = through;
    mu_.Lock();
    if (done()) return;
    mu_.Unlock();
  }
  if (on_board) {
    // Sleep on the board until it covers board_last: the daemon wakes its futex at every
    // post while a sleep is announced, and a success may come with no message at all
    // (Opened.successes_on_board). Each sleep is bounded (kBoardSleep) to look at the messages'
    // side (a dead stream posts nothing). Once the board covers the range, what is still missing
    // can only come in messages (a failure's error, Download bytes), which wake cv_.
    for (;;) {
      const uint64_t through = board_->CompletedThrough();
      mu_.Lock();
      if (done()) return;
      if (through >= board_last) break;
      mu_.Unlock();
      // Announced in the ring, the daemon wakes the board only then; the ring lives as
      // long as the board (both go at Shutdown, when no waiter is left).
      if (ring_) ring_->AnnounceBoardSleep(+1);
      board_->Sleep(through, kBoardSleep);
      if (ring_) ring_->AnnounceBoardSleep(-1);
    }
  } else {
    mu_.Lock();
  }
  cv_.Wait(&mu_, done);
}

void SessionState::AttachStream() {
  // On the stream the last closed session left open, if there is one: no new stream to make
  // (docs/protocol.md, "Kept streams").
  call_ = client_->TakeKeptCall();
  on_kept_stream_ = call_ != nullptr;
  if (!call_) {
    call_ = std::make_unique<SessionCall>();
    // The stream's initial metadata goes out with Open, in one write, instead of in a
    // blocking step of its own.
    call_->context.set_initial_metadata_corked(true);
    call_->stream = client_->stub->Session(&call_->context);
  }
  stream_ = call_->stream.get();
}

void SessionState::StartReaderThread() {
  reader_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ferry-reader");
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [&] {
        mu_.AssertHeld();
        return reader_start_ != ReaderStart::kWait;
      });
      if (reader_start_ == ReaderStart::kEnd) return;
    }
    ReadLoop();
  });
}

Status SessionState::AwaitOpened() {
  v1::ServerMessage reply;
  do {
    if (!stream_->Read(&reply)) return StreamFailure("waiting for Opened");
    if (reply.has_draining()) draining_ = true;  // sent to every stream: Opened (or not) follows
  } while (reply.has_draining());
  if (reply.has_error()) {
    Status s = wire::FromProto(reply.error());
    Shutdown();
    return s;
  }
  if (!reply.has_opened()) {
    Shutdown();
    return Status(ErrorKind::kProtocolViolation, "the daemon did not answer Open with Opened");
  }
  opened_ = reply.opened();
  return Status::Ok();
}

void SessionState::TakeLocalResources() {
  // The slab socket is connected at the first slab's acquire, or now for the channels.
  slab_socket_ = std::make_unique<SlabSocket>(opened_.slab_socket(), opened_.slab_token());
  if (opened_.channels_kept() && call_->board && call_->ring) {
    board_ = std::move(call_->board);
    ring_ = std::move(call_->ring);
  } else {
    SlabSocket::SessionChannels channels =
        slab_socket_->MapSessionChannels(opened_.completion_board(), opened_.submit_ring());
    board_ = std::move(channels.board);
    ring_ = std::move(channels.ring);
  }
  // The last session's slabs the daemon kept for this one: mapped already, no acquire.
  for (uint64_t id : opened_.kept_slabs()) {
    for (auto& slab : call_->slabs) {
      if (slab && slab->id == id) {
        arena_->Add(std::move(slab));
        break;
      }
    }
  }
}

Status SessionState::Open(std::shared_ptr<ClientState> client, const SessionOptions& options) {
  client_ = std::move(client);
  AttachStream();
  v1::ClientMessage m;
  auto* open = m.mutable_open();
  open->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  open->set_client_name(client_->options.client_name);
  open->set_device_bytes_quota(options.device_bytes_quota);
  open->set_max_in_flight_submits(options.max_in_flight_submits);
  open->set_coalesced_completions(true);   // reader.cc reads first_submit_id
  open->set_successes_on_board(true);      // CompletedLocked reads the board
  open->set_board_sleeps_announced(true);  // Wait announces its sleeps in the ring
  if (!stream_->Write(m)) return StreamFailure("sending Open");
  // Started now, it is ready by the time Opened has come; it reads once Open succeeded.
  StartReaderThread();
  FERRY_RETURN_IF_ERROR(AwaitOpened());
  if (local()) TakeLocalResources();
  call_->board.reset();  // a kept stream's channels this session did not take over
  call_->ring.reset();
  call_->slabs.clear();  // likewise its slabs
  StartReader(/*read=*/true);
  return Status::Ok();
}

void SessionState::StartReader(bool read) {
  {
    MutexLock lock(&mu_);
    if (reader_start_ != ReaderStart::kWait) return;
    reader_start_ = read ? ReaderStart::kRead : ReaderStart::kEnd;
  }
  cv_.NotifyAll();
}

Result<uint64_t> SessionState::Submit(
    std::vector<std::pair<uint32_t, std::pair<void*, uint64_t>>> downloads, bool track) {
  ReapDetached();
  if (closed_) return Status(ErrorKind::kSessionClosed, "the session is closed");
  if (pending_.ops_size() == 0) return uint64_t{0};
  uint64_t id = next_submit_id_++;
  v1::ClientMessage m;
  pending_.set_submit_id(id);
  m.mutable_submit()->Swap(&pending_);
  pending_.Clear();
  {
    MutexLock lock(&mu_);
    if (!dead_.ok()) {
      pending_.Clear();
      return dead_;
    }
    if (track) tracked_[id];
    if (!downloads.empty()) {
      auto& targets = download_targets_[id];
      for (auto& [op, dest] : downloads) targets[op] = dest;
    }
  }
  FERRY_TRACE(trace::kIssue, id);
  if (!Send(m)) {
    MutexLock lock(&mu_);
    download_targets_.erase(id);
    tracked_.erase(id);
    return dead_.ok() ? Status(ErrorKind::kSessionClosed, "the session stream is gone") : dead_;
  }
  last_submitted_ = id;
  return id;
}

bool SessionState::WaitCompletedLocked(uint64_t first, uint64_t last) {
  Wait(
      [&] {
        mu_.AssertHeld();
        return CompletedLocked(first, last) || !dead_.ok();
      },
      last);
  return CompletedLocked(first, last);
}

Status SessionState::WaitSubmit(uint64_t id) {
  MutexLock lock(&mu_);
  if (!WaitCompletedLocked(id, id)) return dead_;
  auto it = failures_.find(id);
  if (it == failures_.end()) return Status::Ok();
  Status s = it->second;
  failures_.erase(it);
  return s;
}

Status SessionState::Synchronize() {
  auto submitted = Submit();
  if (!submitted.ok()) return submitted.status();
  // Submits complete in order: once the last one submitted has completed, all have, and no
  // Synchronize message (a round trip) is needed.
  uint64_t last = last_submitted_;
  MutexLock lock(&mu_);
  // Failures before synchronized_through_ were reported by an earlier Synchronize (or
  // consumed by a WaitSubmit); the submits since are what this one reports.
  if (!WaitCompletedLocked(synchronized_through_ + 1, last)) return dead_;
  synchronized_through_ = last;
  Status first_failure;
  if (!failures_.empty()) first_failure = failures_.begin()->second;
  failures_.clear();
  return first_failure;
}

Result<SessionStats> SessionState::Close() {
  if (closed_) return Status(ErrorKind::kSessionClosed, "the session is already closed");
  auto submitted = Submit();
  closed_ = true;
  if (!submitted.ok()) {
    Shutdown();
    return submitted.status();
  }
  v1::ClientMessage m;
  m.mutable_close()->set_keep_stream(true);  // for the next session this client opens
  // And the slabs no buffer uses, so that the next session's buffers need no fresh slab
  // (docs/protocol.md, "Kept slabs"). The staging buffer's slab among them: nothing uses it
  // once the session is closed.
  staging_ = PinnedBuffer();
  closing_slabs_ = arena_->TakeUnused();
  for (const auto& slab : closing_slabs_) m.mutable_close()->add_keep_slabs(slab->id);
  bool sent = Send(m);
  std::optional<SessionStats> stats;
  {
    MutexLock lock(&mu_);
    if (sent) {
      // Spins first, as the waits for completions do: Closed comes within one round trip.
      Wait(
          [&] {
            mu_.AssertHeld();
            return closed_stats_.has_value() || !dead_.ok();
          },
          /*board_last=*/0);
    }
    stats = closed_stats_;
  }
  Shutdown();
  detached_.clear();  // every completion has arrived (or the stream is gone)
  if (!stats) return DeadOr("the session stream ended before Closed");
  stats->staged_upload_bytes = staged_upload_bytes_;
  stats->staged_download_bytes = staged_download_bytes_;
  return *stats;
}

void SessionState::Shutdown() {
  StartReader(/*read=*/false);  // a reader still waiting for Open's verdict ends
  if (reader_.joinable() && shut_down_) reader_.join();  // after StreamFailure
  if (shut_down_) return;
  shut_down_ = true;
  closed_ = true;
  bool kept = false;
  uint64_t kept_ms = 0;
  if (call_) {
    bool clean;
    {
      MutexLock lock(&mu_);
      clean = closed_stats_.has_value();
      kept = stream_kept_;
      kept_ms = kept_ms_;
    }
    if (kept) {
      // The reader stopped at Closed: the stream waits for the next session's Open.
    } else if (clean) {
      stream_->WritesDone();
    } else {
      call_->context.TryCancel();
    }
  }
  if (reader_.joinable()) reader_.join();
  if (call_) {
    if (kept) {
      // The daemon keeps the board and ring for the next session on the stream: so does the
      // client (nothing of this session reads or writes them any more).
      call_->board = std::move(board_);
      call_->ring = std::move(ring_);
      call_->slabs = std::move(closing_slabs_);
      client_->KeepCall(std::move(call_), kept_ms);
    } else {
      stream_->Finish();
    }
    stream_ = nullptr;
  }
  closing_slabs_.clear();  // not kept: unmapped (moved to the kept call otherwise)
  if (slab_socket_) slab_socket_->Close();
}

bool SessionState::Outcome(uint64_t first, uint64_t last, Status* status) {
  MutexLock lock(&mu_);
  return OutcomeLocked(first, last, status);
}

Status SessionState::WaitOutcome(uint64_t first, uint64_t last) {
  MutexLock lock(&mu_);
  Status s;
  WaitCompletedLocked(first, last);
  OutcomeLocked(first, last, &s);  // completed, or the stream's end
  for (uint64_t id = first; id <= last; ++id) tracked_.erase(id);
  // The waiter returns these submits' failure: consumed, as WaitSubmit does, so that the
  // next Synchronize does not report it again (docs/protocol.md, "Who reports a failed
  // submit").
  failures_.erase(failures_.lower_bound(first), failures_.upper_bound(last));
  return s;
}

void SessionState::Detach(std::shared_ptr<PendingState> p) {
  if (shut_down_) return;  // every completion is in (or never will be): release now
  detached_.push_back(std::move(p));
}

void SessionState::ReapDetached() {
  for (size_t i = 0; i < detached_.size();) {
    Status s;
    auto& p = detached_[i];
    if (p->first_id == 0 || Outcome(p->first_id, p->last_id, &s)) {
      {
        MutexLock lock(&mu_);
        for (uint64_t id = p->first_id; id && id <= p->last_id; ++id) tracked_.erase(id);
      }
      auto done = std::move(p);
      detached_.erase(detached_.begin() + static_cast<long>(i));
      done.reset();  // records the tensor's release into the current record
    } else {
      ++i;
    }
  }
}

Result<PinnedBuffer> SessionState::Allocate(uint64_t bytes) {
  ReapDetached();
  if (closed_) return Status(ErrorKind::kSessionClosed, "the session is closed");
  auto block = std::make_shared<BufferBlock>();
  block->size = bytes;
  if (!local()) {
    block->heap = std::make_unique<char[]>(std::max<uint64_t>(bytes, 1));
    block->data = block->heap.get();
    return PinnedBuffer(std::move(block));
  }
  uint64_t need = AlignUp(std::max<uint64_t>(bytes, 1));
  if (need > slab_size()) {
    return Status(ErrorKind::kQuotaExceeded, "a pinned buffer of " + std::to_string(bytes) +
                                                 " bytes does not fit in one slab of " +
                                                 std::to_string(slab_size()) +
                                                 " bytes (the daemon's --slab-size)");
  }
  if (!arena_->Allocate(need, &block->slab, &block->slab_offset)) {
    FERRY_RETURN_IF_ERROR(AcquireSlab());
    if (!arena_->Allocate(need, &block->slab, &block->slab_offset)) {
      return Status(ErrorKind::kInternal, "a fresh slab has no room");
    }
  }
  block->reserved = need;
  block->arena = arena_;
  block->data = block->slab->base + block->slab_offset;
  return PinnedBuffer(std::move(block));
}

PinnedBuffer* SessionState::Staging() {
  if (!staging_.valid() && !staging_failed_) {
    auto b =
        Allocate(std::min(kStagingBytes, slab_size()) / (2 * kBufferAlign) * (2 * kBufferAlign));
    if (b.ok() && b->size() >= 2 * kBufferAlign) {
      staging_ = std::move(*b);
    } else {
      staging_failed_ = true;
    }
  }
  return staging_.valid() ? &staging_ : nullptr;
}

Status SessionState::AcquireSlab() {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<SlabMapping> m, slab_socket_->AcquireSlab());
  arena_->Add(std::move(m));
  return Status::Ok();
}

bool SessionState::Send(v1::ClientMessage& m) {
  if (ring_) {
    m.set_sequence(next_sequence_++);
    for (int tries = 0;; ++tries) {
      const RingWriter::Wrote wrote = ring_->Write(m);
      if (wrote == RingWriter::Wrote::kWritten) return true;
      if (wrote == RingWriter::Wrote::kTooLarge) break;
      if (tries % 64 == 63) {
        MutexLock lock(&mu_);
        if (!dead_.ok()) return false;
      }
      if (tries < 256) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  return stream_->Write(m);
}

bool SessionState::CompletedLocked(uint64_t first, uint64_t last) const {
  if (first > last || last_completed_ >= last) return true;  // messages come in submit order
  if (!board_) return false;
  // Download bytes come only in messages, before their submit's Completed.
  if (!download_targets_.empty() && download_targets_.begin()->first <= last) return false;
  uint64_t last_failed = 0;
  if (board_->CompletedThrough(&last_failed) < last) return false;
  // Every failure's error comes in a message, in order: with none from `first` on, the range
  // succeeded; else once the message of the last failure posted has come, so have those of
  // the range's failures.
  return last_failed < first || last_completed_ >= last_failed;
}

bool SessionState::OutcomeLocked(uint64_t first, uint64_t last, Status* status) {
  if (!CompletedLocked(first, last)) {
    if (dead_.ok()) return false;
    *status = dead_;  // the stream ended before these completed
    return true;
  }
  // A tracked submit's failure is recorded when its Completed comes; one without is a success
  // (its Completed may not have come, or may never come: Opened.successes_on_board).
  *status = Status::Ok();
  for (auto t = tracked_.lower_bound(first); t != tracked_.end() && t->first <= last; ++t) {
    if (t->second && !t->second->ok()) {
      *status = *t->second;
      break;
    }
  }
  return true;
}

Status SessionState::StreamFailure(const char* what) {
  grpc::Status s = stream_->Finish();
  shut_down_ = true;
  closed_ = true;
  return Status(ErrorKind::kUnavailable, std::string(what) + ": " + s.error_message());
}

Status SessionState::DeadOr(const char* what) {
  MutexLock lock(&mu_);
  return dead_.ok() ? Status(ErrorKind::kSessionClosed, what) : dead_;
}

}  // namespace ferry::internal
