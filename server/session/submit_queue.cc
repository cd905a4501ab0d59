// Session's submit queue: a submit's arrival (Submit), its parking while it waits for copy
// turns, staging room or a lane of the executor, and its start (admission, staging, then
// Enqueue). The queue's states are in submit_queue.h.
#include <optional>
#include <unordered_map>
#include <utility>

#include "ferry/trace_points.h"
#include "session/session.h"

namespace ferry::session {

void Session::Submit(SubmitRequest request) {
  // For the trace points: by the end the request may be moved and the record delivered.
  [[maybe_unused]] const uint64_t traced_id = request.submit_id;
  FERRY_TRACE(trace::kSubmit0, traced_id, id_);
  InFlightSubmit record;
  record.submit_id = request.submit_id;
  ++counters_->submits;
  Status over_uid_limit;
  if (!request.refusal.ok()) {
    record.status = request.refusal;
  } else if (lifecycle_ != Lifecycle::kOpen) {
    record.status = Status(ErrorKind::kSessionClosed, "the session is closing");
  } else if (account_ && !(over_uid_limit = account_->ChargeInflight()).ok()) {
    record.status = over_uid_limit;
  } else {
    record.uid_inflight = account_ != nullptr;
    uint8_t needs = turns_ ? turns_->Needs(request.summary) : CopyTurns::kNone;
    record.turns_needed = needs;
    // Behind a paused enqueue a submit waits for it, not for turns (ContinueEnqueue starts it).
    bool waits_for_turns = !enqueue_paused();
    // A submit that may block or run long is not started on a caller's thread (a gRPC
    // thread, the ring poller, the completion watcher, which every session shares): the
    // connection hands such messages to the io threads, but one that was held for the
    // sequencer or backpressure can reach here from a quick one's handling. It parks, and
    // an io thread starts it (ResumeParked); the session's later submits wait behind it.
    // One that loads a module is started on the long lane (StartLane).
    const Lane start_lane = StartLane(request);
    const bool start_elsewhere =
        (SerialExecutor::RunningOnCallersThread() && !request.summary.quick()) ||
        start_lane != CurrentLane();
    if (start_elsewhere) waits_for_turns = false;
    if (parked_ == 0 && !enqueue_paused() && !start_elsewhere &&
        (needs == CopyTurns::kNone || turns_->TryTake(needs, TurnsIdentity()))) {
      record.turns_held = needs;
      waits_for_turns = false;
      if (!Start(request, record)) record.parked = true;  // waits for staging, turns held
    } else {
      record.parked = true;
    }
    if (record.parked) record.request = std::move(request);
    if (record.parked && ++parked_ == 1 && waits_for_turns) {
      // The first parked submit is one whose turn was not free: queue for it.
      AwaitTurns(needs);
    }
    // Behind a paused enqueue, ContinueEnqueue resumes it (no hop to a lane to find that).
    if (record.parked && parked_ == 1 && start_elsewhere && !enqueue_paused()) {
      PostResumeParked(start_lane);
    }
  }
  queue_.push_back(std::move(record));
  counters_->submits_in_flight = queue_.size();
  InFlightSubmit& added = queue_.back();
  if (!added.parked && !added.on_device) DeliverReady();
  FERRY_TRACE(trace::kSubmit1, traced_id, id_);
}

bool Session::Start(SubmitRequest& request, InFlightSubmit& record) {
  if (!broken_.ok()) {
    record.status = broken_;
  } else {
    auto admitted = AdmitSubmit(request, tensors_, limits_, slabs_.get());
    if (!admitted.ok()) {
      record.status = admitted.status();
    } else if (!ReserveStaging(request, record)) {
      return false;  // admitted again when it resumes: nothing changed meanwhile
    } else if (Status objects = ReserveObjects(request.summary.objects_added_at_most());
               !objects.ok()) {
      record.status = std::move(objects);
    } else {
      record.status = Enqueue(request, *admitted, record);
      if (!record.paused) SettleObjects();  // else once the rest is enqueued (EndEnqueue)
    }
  }
  if (!record.on_device && record.turns_held != CopyTurns::kNone) {  // nothing reached the device
    turns_->Give(record.turns_held, TurnsIdentity());
    record.turns_held = CopyTurns::kNone;
  }
  return true;
}

bool Session::ReserveStaging(const SubmitRequest& request, InFlightSubmit& record) {
  if (!staging_ || request.summary.inline_bytes() == 0) return true;
  // Pieces of at most kMaxChunkBytes: a download's chunks, and ranges that an empty area
  // always places while their sum fits it (no piece is wasted for lack of a large hole).
  const uint64_t piece = std::min(kMaxChunkBytes, staging_->max_lease());
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> op_of;  // the op each piece is for
  for (size_t i = 0; i < request.ops.size(); ++i) {
    uint64_t n = 0;
    if (const auto* up = std::get_if<UploadOp>(&request.ops[i])) n = up->data.size();
    if (const auto* down = std::get_if<DownloadOp>(&request.ops[i])) n = down->length;
    for (uint64_t at = 0; at < n; at += piece) {
      sizes.push_back(std::min(piece, n - at));
      op_of.push_back(static_cast<uint32_t>(i));
    }
  }
  if (sizes.empty()) return true;
  std::vector<pool::StagingLease> leases;
  auto wake = [weak = weak_from_this()] {
    if (auto self = weak.lock()) {
      Executor executor = self->executor_;
      executor.Post([self = std::move(self)] { self->OnStagingFreed(); }, "staging freed");
    }
  };
  switch (staging_->AllocateAll(sizes, &leases, std::move(wake), staging_holder_)) {
    case pool::StagingArea::Outcome::kAllocated:
      record.staged_ops.resize(request.ops.size());
      for (size_t k = 0; k < leases.size(); ++k) {
        record.staged_ops[op_of[k]].push_back(std::move(leases[k]));
      }
      return true;
    case pool::StagingArea::Outcome::kWait: {
      const auto now = std::chrono::steady_clock::now();
      if (record.staging_wait_since == std::chrono::steady_clock::time_point{}) {
        record.staging_wait_since = now;
      }
      const auto bound = std::chrono::milliseconds(config_.staging_wait_ms);
      const auto waited = now - record.staging_wait_since;
      if (waited >= bound) {  // long enough: the direct path, counted
        staging_->CountFallback();
        return true;
      }
      parked_wait_ = ParkedWait::kStaging;
      executor_.PostAfter(
          std::chrono::ceil<std::chrono::milliseconds>(bound - waited) +
              std::chrono::milliseconds(1),
          [weak = weak_from_this()] {
            if (auto self = weak.lock()) self->OnStagingFreed();
          },
          "staging wait over");
      return false;
    }
    case pool::StagingArea::Outcome::kWaitOwn:
      // The session holds its share of staging (half): its own earlier submits free it as
      // they complete. It waits for them however long they run: the direct path would hold
      // a thread for as long (the copy waits for its stream's earlier work; a long-lane
      // thread, see LaneFor, or an executor thread where there is no long lane), and only
      // its own later submits wait behind.
      parked_wait_ = ParkedWait::kStaging;
      return false;
    case pool::StagingArea::Outcome::kNever:
      // More than half the area (a session's share: staging-slabs x slab-size / 2, which
      // libferry's submits of at most 8 MiB inline never reach), or no slab to be had: the
      // direct path, counted.
      staging_->CountFallback();
      return true;
  }
  return true;
}

void Session::OnStagingFreed() {
  if (parked_wait_ != ParkedWait::kStaging) return;
  parked_wait_ = ParkedWait::kNothing;
  ResumeParked(CopyTurns::kNone);
}

void Session::AwaitTurns(uint8_t mask) {
  parked_wait_ = ParkedWait::kCopyTurns;
  turns_awaited_ = mask;
  turns_ticket_ = turns_->Wait(
      mask,
      [self = shared_from_this()] {
        // On the thread that gave a turn back (another session's): starting submits may block
        // (module loads), so the session's own executor does it.
        self->executor_.Post([self] { self->OnTurnsGranted(); }, "copy turns granted");
      },
      TurnsIdentity());
}

void Session::OnTurnsGranted() {
  const uint8_t granted = std::exchange(turns_awaited_, CopyTurns::kNone);
  parked_wait_ = ParkedWait::kNothing;
  ResumeParked(granted);
}

void Session::PostResumeParked(Lane lane) {
  if (resume_posted_) return;  // ResumeParked, when it runs, goes to the lane its submit needs
  resume_posted_ = true;
  auto resume = [self = shared_from_this()] {
    self->resume_posted_ = false;
    if (self->parked_wait_ == ParkedWait::kNothing) self->ResumeParked(CopyTurns::kNone);
  };
  if (lane == Lane::kLong) {
    registry_->CountLongLaneTurn();
    executor_.Yield(std::move(resume), "parked submits (long lane)", Lane::kLong);
  } else {
    executor_.Post(std::move(resume), "parked submits");
  }
}

SerialExecutor::Lane Session::StartLane(const SubmitRequest& request) const {
  // A broken session's submit fails at once (Start): no hop for it.
  if (!executor_.has_long_lane() || !broken_.ok()) return Lane::kShared;
  const SubmitSummary& summary = request.summary;
  if (summary.Has(OpKind::kLoadModule)) return Lane::kLong;
  // Every op but a graph launch counts as one.
  if (!summary.Has(OpKind::kLaunchGraph)) {
    return summary.ops() > kLongSubmitOps ? Lane::kLong : Lane::kShared;
  }
  uint64_t admitted_ops = 0;  // as session-max-submit-ops counts them
  // Graphs this submit records, by handle: their ops (a launch of one weighs as much as a
  // launch of a graph the session held; admission counts it so).
  std::unordered_map<uint64_t, uint64_t> recorded;
  std::optional<uint64_t> recording;
  uint64_t recording_ops = 0;
  for (const Op& op : request.ops) {
    uint64_t n = 1;
    if (const auto* begin = std::get_if<BeginGraphOp>(&op)) {
      recording = begin->handle;
      recording_ops = 0;
    } else if (std::holds_alternative<EndGraphOp>(op)) {
      if (recording) recorded[*recording] = recording_ops;
      recording.reset();
    } else if (recording) {
      ++recording_ops;
    } else if (const auto* launch = std::get_if<LaunchGraphOp>(&op)) {
      if (auto r = recorded.find(launch->graph); r != recorded.end()) {
        n = LaunchGraphWeight(r->second);
      } else if (auto g = tensors_.graphs().find(launch->graph); g != tensors_.graphs().end()) {
        n = LaunchGraphWeight(g->second.ops);
      }
    }
    admitted_ops += n;
  }
  return admitted_ops > kLongSubmitOps ? Lane::kLong : Lane::kShared;
}

void Session::ResumeParked(uint8_t granted) {
  for (InFlightSubmit& r : queue_) {
    if (enqueue_paused()) break;  // the submits after it wait (ContinueEnqueue resumes them)
    if (!r.parked) continue;
    if (SerialExecutor::RunningOnCallersThread() && !r.request.summary.quick()) {
      PostResumeParked();  // not on a caller's thread (Submit): an io thread starts it
      break;
    }
    if (const Lane lane = StartLane(r.request); lane != CurrentLane()) {
      // Started on its lane; those behind it wait. Turns granted to it go with it; it
      // takes none before (they would be held while it waits for a long-lane thread).
      if (granted != CopyTurns::kNone && r.turns_needed != CopyTurns::kNone &&
          r.turns_held == CopyTurns::kNone) {
        r.turns_held = std::exchange(granted, CopyTurns::kNone);
      }
      PostResumeParked(lane);
      break;
    }
    // A submit that waited for staging holds its turns already (so may one granted them
    // before its lane hand-over).
    const bool has_turns = r.turns_needed == CopyTurns::kNone || r.turns_held != CopyTurns::kNone;
    if (!has_turns) {
      if (granted == CopyTurns::kNone && !turns_->TryTake(r.turns_needed, TurnsIdentity())) {
        AwaitTurns(r.turns_needed);
        break;
      }
      r.turns_held = granted != CopyTurns::kNone ? granted : r.turns_needed;
      granted = CopyTurns::kNone;  // the first parked submit holds the granted turns
    }
    if (!Start(r.request, r)) break;  // waits for staging (ReserveStaging), still parked
    r.parked = false;
    r.request = SubmitRequest();
    --parked_;
  }
  // No parked submit was left to take them (the client went away): give them back.
  if (granted != CopyTurns::kNone) turns_->Give(granted, TurnsIdentity());
  DeliverReady();
}

}  // namespace ferry::session
