#include "session/session.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include "ferry/trace_points.h"
#include "session/op_enqueuer.h"

namespace ferry::session {

using backend::DevicePtr;

Result<std::shared_ptr<Session>> Session::Create(DeviceSupervisor* device,
                                                 SessionRegistry* registry, Executor executor,
                                                 const SessionConfig& config,
                                                 std::string client_name, PeerIdentity peer,
                                                 SessionEvents* events, CopyTurns* turns) {
  auto counters = std::make_shared<SessionCounters>();
  FERRY_ASSIGN_OR_RETURN(uint64_t id,
                         registry->Open(std::move(client_name), std::move(peer), counters));
  std::shared_ptr<Session> session(
      new Session(device, registry, std::move(executor), config, nullptr, events));
  session->id_ = id;
  session->account_ = registry->AccountOf(id);
  if (session->account_) {
    session->staging_holder_ =
        std::make_shared<pool::StagingHolder>(session->account_->staging_holder());
  }
  session->counters_ = std::move(counters);
  session->turns_ = turns;
  auto lease = device->Join(id, session);
  if (!lease.ok()) {
    registry->Remove(id);
    return lease.status().WithContext("creating the session's stream");
  }
  session->stream_ = std::move(lease->stream);
  session->generation_ = lease->generation;
  return session;
}

Session::Session(DeviceSupervisor* device, SessionRegistry* registry, Executor executor,
                 const SessionConfig& config, std::unique_ptr<backend::Stream> stream,
                 SessionEvents* events)
    : device_(device),
      registry_(registry),
      executor_(std::move(executor)),
      config_(config),
      stream_(std::move(stream)),
      events_(events) {
  limits_.device_bytes_quota = config.device_bytes_quota;
  limits_.max_ops_per_submit = config.max_ops_per_submit;
  // A submit's inline download bytes are held until delivered: one submit may not ask for
  // more than the session may hold in flight.
  limits_.max_download_bytes = config.max_download_bytes_per_submit;
  if (config.max_in_flight_bytes && (limits_.max_download_bytes == 0 ||
                                     config.max_in_flight_bytes < limits_.max_download_bytes)) {
    limits_.max_download_bytes = config.max_in_flight_bytes;
  }
  limits_.max_modules = config.max_modules;
  limits_.max_graphs = config.max_graphs;
  limits_.max_tensors = config.max_tensors;
  limits_.max_graph_ops = config.max_graph_ops;
}

Session::~Session() {
  // Normally released in Finalize; this covers a session dropped before it was closed.
  for (const InFlight& r : queue_) {
    if (r.uid_inflight) account_->RefundInflight();
  }
  ReleaseStream();
  ReleaseSlabs();
  GiveBackObjects();         // (done in Finalize where it ran)
  GiveBackQueuedCommands();  // likewise
  device_->Leave(id_);
}

void Session::ReleaseSlabs() {
  if (slabs_) slabs_->Close();
}

void Session::ReleaseStream() {
  if (!stream_) return;
  RecordUsage();
  stream_.reset();
  device_->ReleaseStream(generation_);
}

void Session::Submit(SubmitRequest request) {
  // For the trace points: by the end the request may be moved and the record delivered.
  [[maybe_unused]] const uint64_t traced_id = request.submit_id;
  FERRY_TRACE(trace::kSubmit0, traced_id, id_);
  InFlight record;
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
  InFlight& added = queue_.back();
  if (!added.parked && !added.on_device) DeliverReady();
  FERRY_TRACE(trace::kSubmit1, traced_id, id_);
}

bool Session::Start(SubmitRequest& request, InFlight& record) {
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

bool Session::ReserveStaging(const SubmitRequest& request, InFlight& record) {
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
      awaiting_staging_ = true;
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
      awaiting_staging_ = true;
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
  if (!awaiting_staging_) return;
  awaiting_staging_ = false;
  ResumeParked(CopyTurns::kNone);
}

void Session::AwaitTurns(uint8_t mask) {
  awaiting_turns_ = mask;
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
  uint8_t granted = awaiting_turns_;
  awaiting_turns_ = CopyTurns::kNone;
  ResumeParked(granted);
}

void Session::PostResumeParked(Lane lane) {
  if (resume_posted_) return;  // ResumeParked, when it runs, goes to the lane its submit needs
  resume_posted_ = true;
  auto resume = [self = shared_from_this()] {
    self->resume_posted_ = false;
    if (self->awaiting_turns_ == CopyTurns::kNone && !self->awaiting_staging_) {
      self->ResumeParked(CopyTurns::kNone);
    }
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
  for (InFlight& r : queue_) {
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

namespace {
/// An op that is one kernel launch of ferry's own, so that a batch may hold it.
bool IsKernelOp(const Op& op) { return Traits(KindOf(op)).batch_kernel; }
}  // namespace

void Session::BeginSubmitRun(uint64_t ops) {
  run_open_ = true;
  run_ops_left_ = ops;
  run_unwatched_ = false;
  run_inline_ = true;
}

void Session::EndSubmitRun() {
  if (!run_open_) return;
  EndRunBatch();
  run_open_ = false;
  if (run_unwatched_ && stream_) {
    if (capturing_) {
      // The paused enqueue is recording a graph: a watch asked for now would be recorded
      // into it (refused). The paused submit's EndEnqueue asks for one, through these.
      watch_deferred_ = true;
    } else {
      WatchCompletion(run_inline_);
    }
  }
  run_unwatched_ = false;
}

void Session::EndRunBatch() {
  if (!run_batch_) return;
  run_batch_ = false;
  Status ended = stream_ ? stream_->EndBatch() : Status::Ok();
  if (ended.ok()) {
    ++counters_->kernel_batches;
    ++commands_enqueued_;  // one launch-queue command (see RoomForCommands)
    registry_->launch_room().Add(1, launch_share());
    return;
  }
  // Nothing of the batch runs: each of its submits fails, its first op reporting why. (They
  // hold kernel ops only: no raw launches, nothing created.)
  for (InFlight& r : queue_) {
    if (!r.on_device || r.seq < run_batch_first_seq_) continue;
    r.on_device = false;
    if (r.status.ok()) r.status = ended.WithOpIndex(0);
  }
  DeliverReady();
}

Status Session::Enqueue(SubmitRequest& request, const AdmissionResult& admitted, InFlight& record) {
  auto& ops = request.ops;
  // In a run, consecutive submits of fewer than kernel_batch ops, kernel ops only (which
  // would go op by op), share a batch of RunBatchOps() ops, opened only while that many
  // are expected: batches of one size, whose executable graph the stream keeps and updates
  // (CUDA), not one instantiated per run. A submit that does not join ends the batch first:
  // a batch refuses allocations, and a graph capture does not nest in it.
  const uint64_t run_ops_here = run_ops_left_;
  run_ops_left_ -= std::min<uint64_t>(run_ops_left_, ops.size());
  const bool joins_run_batch =
      run_open_ && config_.kernel_batch > 0 && !capturing_ && ops.size() < config_.kernel_batch &&
      request.summary.kernel_ops_only() && (run_batch_ || run_ops_here >= RunBatchOps());
  if (run_batch_ && !joins_run_batch) EndRunBatch();
  // Allocate everything the submit creates first, so that a device that cannot provide
  // the memory refuses the submit whole.
  FERRY_RETURN_IF_ERROR(ReserveDeviceBytes(admitted.bytes_created));
  EnqueueWork work;
  work.ops = std::move(ops);
  // Most submits (transfers, kernels) make nothing: `made` only for those that do.
  if (request.summary.Has(OpKind::kCreateTensor) || request.summary.Has(OpKind::kLoadModule)) {
    work.made.resize(work.ops.size());
  }
  // Every create's reservation is known before anything can fail, so a failure gives all
  // of it back.
  for (size_t i = 0; i < work.made.size(); ++i) {
    if (auto* create = std::get_if<CreateTensorOp>(&work.ops[i])) {
      uint64_t elements = 0;
      work.made[i].fresh_bytes = *TensorBytes(create->dtype, create->shape, &elements);  // admitted
    }
  }
  uint64_t loaded_bytes = 0;  // of the modules loaded so far, charged with them
  for (size_t i = 0; i < work.made.size(); ++i) {
    Status failed;
    EnqueueWork::Made& made = work.made[i];
    if (std::get_if<CreateTensorOp>(&work.ops[i])) {
      if (made.fresh_bytes == 0) continue;
      auto ptr = stream_->Allocate(made.fresh_bytes);
      if (ptr.ok()) {
        made.fresh = *ptr;
      } else {
        failed = ptr.status();
      }
    } else if (auto* load = std::get_if<LoadModuleOp>(&work.ops[i])) {
      // Modules load (and CUDA C++ compiles) here, before anything is enqueued, so a
      // compile error refuses the submit whole.
      auto module = device_->device()->LoadModule(load->format, load->image);
      if (module.ok()) {
        failed = ChargeModule(load->handle, **module, admitted.peak_device_bytes, &loaded_bytes);
        if (failed.ok()) {
          made.fresh_bytes = (*module)->device_bytes();
          made.loaded = std::move(*module);
        }
      } else {
        failed = module.status();
      }
    }
    if (!failed.ok()) {
      ReleaseUnenqueued(work, /*device_gone=*/false);
      return failed.WithOpIndex(static_cast<int>(i));
    }
  }

  record.on_device = true;
  record.seq = ++enqueued_seq_;
  FERRY_TRACE(trace::kSeq, record.submit_id, record.seq);
  if (joins_run_batch && !run_batch_ && stream_->BeginBatch().ok()) {
    run_batch_ = true;
    run_batch_first_seq_ = record.seq;
    run_batch_ops_ = 0;
  }
  record.payload = std::move(request.payload);
  counters_->ops += work.ops.size();
  counters_->bytes_uploaded += admitted.upload_bytes;
  if (admitted.peak_device_bytes > counters_->peak_device_bytes) {
    counters_->peak_device_bytes = admitted.peak_device_bytes;
  }
  enqueuing_seq_ = record.seq;
  Status first_error = EnqueueOps(record, work);
  if (work.paused) {
    record.paused = std::make_unique<EnqueueWork>(std::move(work));
    return Status::Ok();
  }
  if (run_batch_ && (run_batch_ops_ += work.ops.size()) >= RunBatchOps()) EndRunBatch();
  EndEnqueue(record);
  return first_error;
}

Status Session::EnqueueOps(InFlight& record, EnqueueWork& work) {
  const std::vector<Op>& ops = work.ops;
  size_t scanned = work.next;             // ops before this one were looked at for a batch
  size_t batch_first = 0, batch_end = 0;  // ops [batch_first, batch_end) go as one batch
  // The slice is the executor turn's: what ran before in this turn (the submit's reading,
  // earlier submits of a run or of those resumed together) counts.
  const auto turn_start = SerialExecutor::TurnStart();
  const auto slice_end =
      (turn_start == std::chrono::steady_clock::time_point() ? std::chrono::steady_clock::now()
                                                             : turn_start) +
      kEnqueueSlice;
  size_t slice_checked = work.next;  // the clock was last read before this op
  const Lane here = CurrentLane();
  for (size_t i = work.next; i < ops.size(); ++i) {
    bool starts_batch = false;
    size_t run = i;
    if (i >= scanned) {
      while (run < ops.size() && run - i < MaxBatchOps() && IsKernelOp(ops[run])) ++run;
      scanned = std::max(run, i + 1);
      starts_batch =
          !capturing_ && !run_batch_ && config_.kernel_batch > 0 && run - i >= config_.kernel_batch;
    }
    // Between ops outside any batch, the enqueue may stop, to go on later.
    if (i >= batch_end && !run_batch_) {
      // Work that may hold its thread for long goes to the long lane, and what follows it
      // back to the shared one (LaneFor).
      if (const Lane lane = LaneFor(ops[i], record, i); lane != here) {
        YieldEnqueue(work, i, lane);
        return Status::Ok();
      }
      // Its slice is over (read the clock every kSliceCheckOps ops): the rest goes on after
      // other sessions' queued work, on the lane it runs on (the next op is that lane's), so
      // that a long submit holds an executor thread, which every session shares, one slice
      // at a time. A graph recording goes on where it
      // stopped (the stream keeps capturing, and CUDA's relaxed capture may go on from
      // another thread). What of the session runs meanwhile leaves the stream alone: its
      // later submits park behind this one, a run's end defers its watch (EndSubmitRun),
      // and an abort ends the capture first (AbandonPausedEnqueue).
      if (i - slice_checked >= kSliceCheckOps) {
        slice_checked = i;
        if (std::chrono::steady_clock::now() >= slice_end) {
          registry_->CountEnqueueYield();
          YieldEnqueue(work, i, here);
          return Status::Ok();
        }
      }
    }
    if (i >= batch_end && !capturing_ && !run_batch_) {
      // An op outside any batch or capture is a command of the launch queue of its own, and
      // a batch starting here is one: stop where the stream has no room for it.
      const uint64_t commands = starts_batch ? 1 : CommandsOf(ops[i], record, i);
      if (!RoomForCommands(commands)) {
        registry_->CountEnqueuePause();
        work.next = i;
        work.paused = true;
        return Status::Ok();
      }
      commands_enqueued_ += commands;
    }
    if (starts_batch && stream_->BeginBatch().ok()) {
      batch_first = i;
      batch_end = run;
    }
    Status s;
    if (work.made.empty()) {
      s = EnqueueOp(ops[i], 0, nullptr, record, static_cast<uint32_t>(i));
    } else {
      EnqueueWork::Made& made = work.made[i];
      s = EnqueueOp(ops[i], made.fresh, std::move(made.loaded), record, static_cast<uint32_t>(i));
      made = {};  // the tensor's now (or freed with it)
    }
    if (record.first_launch_op >= 0 && !record.raw_counted) {
      // Raw kernels are on the device: this session is a fault suspect from now on.
      record.raw_counted = true;
      ++raw_launches_in_flight_;
      device_->RawLaunchesEnqueued(1);
    }
    size_t failed_op = i;
    if (i < batch_end && (i + 1 == batch_end || !s.ok())) {  // the batch is complete
      batch_end = 0;
      Status ended = stream_->EndBatch();
      if (ended.ok()) {
        ++counters_->kernel_batches;
      } else {  // nothing of the batch runs: its first op reports why
        s = std::move(ended);
        failed_op = batch_first;
      }
    }
    if (!s.ok()) {
      work.next = i + 1;
      ReleaseUnenqueued(work, /*device_gone=*/false);
      return s.WithOpIndex(static_cast<int>(failed_op));
    }
  }
  work.next = ops.size();
  return Status::Ok();
}

Session::Lane Session::LaneFor(const Op& op, const InFlight& record, size_t index) const {
  if (!executor_.has_long_lane()) return Lane::kShared;
  if (std::holds_alternative<EndGraphOp>(op)) {
    return capturing_ && capture_ops_ > kLongGraphOps ? Lane::kLong : Lane::kShared;
  }
  if (const auto* launch = std::get_if<LaunchGraphOp>(&op)) {
    return IsLongGraph(launch->graph) ? Lane::kLong : Lane::kShared;
  }
  if (const auto* free = std::get_if<FreeGraphOp>(&op)) {
    return IsLongGraph(free->handle) ? Lane::kLong : Lane::kShared;
  }
  // An inline transfer without staging ranges (the direct path) copies between the device
  // and the message's own, pageable memory.
  const bool staged = index < record.staged_ops.size() && !record.staged_ops[index].empty();
  if (const auto* up = std::get_if<UploadOp>(&op)) {
    return !up->data.empty() && !staged ? Lane::kLong : Lane::kShared;
  }
  if (const auto* down = std::get_if<DownloadOp>(&op)) {
    return down->length > 0 && !staged ? Lane::kLong : Lane::kShared;
  }
  return Lane::kShared;
}

bool Session::IsLongGraph(uint64_t handle) const {
  auto g = tensors_.graphs().find(handle);
  return g != tensors_.graphs().end() && g->second.ops > kLongGraphOps;
}

Session::Lane Session::CurrentLane() const {
  return executor_.running_on_long_lane() ? Lane::kLong : Lane::kShared;
}

void Session::YieldEnqueue(EnqueueWork& work, size_t next, Lane lane) {
  work.next = next;
  work.paused = true;
  if (continue_posted_) return;  // a ContinueEnqueue already queued yields again if it must
  continue_posted_ = true;
  if (lane == Lane::kLong) registry_->CountLongLaneTurn();
  executor_.Yield([self = shared_from_this()] { self->ContinueEnqueue(); },
                  lane == Lane::kLong ? "long-lane enqueue" : "enqueue continues", lane);
}

void Session::ReleaseUnenqueued(EnqueueWork& work, bool device_gone) {
  for (size_t j = work.next; j < work.made.size(); ++j) {
    EnqueueWork::Made& made = work.made[j];
    if (made.fresh && !device_gone) stream_->Free(made.fresh);
    ReleaseDeviceBytes(made.fresh_bytes);
    made = {};
  }
  work.next = work.ops.size();
}

void Session::EndEnqueue(InFlight& record) {
  enqueuing_seq_ = 0;
  if (capturing_) {  // an enqueue error inside a graph, or an abort: drop the recording
    capturing_ = false;
    capture_modules_.clear();
    (void)stream_->AbandonCapture();  // a fault is the completion watch's to report
  }
  // Delivering staged download bytes cuts them into chunks: not on the completion thread.
  // (A watch deferred from a run's end covers that run's submits too.)
  const bool may_run_inline = std::exchange(watch_deferred_, false) ? !StagedDownloadsInFlight()
                                                                    : !HasStagedDownloads(record);
  if (run_open_) {  // one watch for the run, at its end
    run_unwatched_ = true;
    run_inline_ = run_inline_ && may_run_inline;
  } else {
    WatchCompletion(may_run_inline);
  }
}

uint64_t Session::CommandsOf(const Op& op, const InFlight& record, uint32_t index) const {
  const size_t staged = index < record.staged_ops.size() ? record.staged_ops[index].size() : 0;
  if (const auto* up = std::get_if<UploadOp>(&op)) {
    return up->data.empty() ? 0 : std::max<uint64_t>(1, staged);
  }
  if (const auto* down = std::get_if<DownloadOp>(&op)) {
    uint64_t staged_bytes = 0;
    if (staged > 0) {
      for (const pool::StagingLease& lease : record.staged_ops[index]) {
        staged_bytes += lease.length();
      }
    }
    const uint64_t rest = down->length - std::min(down->length, staged_bytes);
    return staged + (rest + kMaxChunkBytes - 1) / kMaxChunkBytes;
  }
  if (std::holds_alternative<CreateTensorOp>(op) || std::holds_alternative<LoadModuleOp>(op) ||
      std::holds_alternative<UnloadModuleOp>(op) || std::holds_alternative<BeginGraphOp>(op) ||
      std::holds_alternative<EndGraphOp>(op) || std::holds_alternative<FreeGraphOp>(op)) {
    return 0;  // nothing on the stream (a free is one: cudaFreeAsync)
  }
  return 1;
}

bool Session::RoomForCommands(uint64_t commands) {
  const uint64_t cap = config_.max_queued_commands;
  const uint64_t queued = commands_enqueued_ - commands_done_;
  // One op of more commands than the cap still goes, alone on the stream.
  const bool own_room = cap == 0 || commands == 0 || queued == 0 || queued + commands <= cap;
  LaunchRoom& daemon_room = registry_->launch_room();
  // Commands the room took for this session when it woke it (LaunchRoom::Await): this op's
  // when they match it (ContinueEnqueue gives back what it did not use).
  const bool held = own_room && launch_room_held_ != 0 && launch_room_held_ == commands;
  if (held) launch_room_held_ = 0;
  if (held || (own_room && daemon_room.TryTake(commands, launch_share()))) {
    // Ask for a completion every half of the cap, so that room shows up while the stream
    // still has the other half to run.
    if (cap != 0 && commands_enqueued_ + commands - commands_watched_ > cap / 2 && queued > 0) {
      WatchCompletion(/*may_run_inline=*/!StagedDownloadsInFlight());
    }
    return true;
  }
  // No room: the session's own completions tell when it has some, and the daemon's room
  // (all sessions' commands, and its identity's share) wakes it when others' complete.
  if (queued > 0 && commands_watched_ < commands_enqueued_) {
    WatchCompletion(/*may_run_inline=*/!StagedDownloadsInFlight());
  }
  if (own_room && !awaiting_launch_room_) {
    awaiting_launch_room_ = true;
    std::shared_ptr<LaunchShare> share;
    if (account_) share = std::shared_ptr<LaunchShare>(account_, &account_->launch_share());
    launch_room_wait_ =
        daemon_room.Await(commands, std::move(share), [weak = weak_from_this(), commands] {
          auto self = weak.lock();
          if (!self) return false;  // the room takes its commands back
          Executor executor = self->executor_;
          executor.Post(
              [self = std::move(self), commands] {
                self->awaiting_launch_room_ = false;
                self->launch_room_held_ += commands;
                self->ContinueEnqueue();
                // What the continuation did not use; unless it yielded (to the other lane, or
                // at its slice's end) before the op the room is for: kept for that op.
                if (!self->continue_posted_) self->GiveBackHeldRoom();
              },
              "launch room");
          return true;
        });
  }
  return false;
}

void Session::GiveBackQueuedCommands() {
  CancelLaunchRoomWait();  // nothing will be enqueued on this stream any more
  registry_->launch_room().Give(commands_enqueued_ - commands_done_, launch_share());
  commands_done_ = commands_watched_ = commands_enqueued_;
  GiveBackHeldRoom();
}

void Session::CancelLaunchRoomWait() {
  if (!awaiting_launch_room_) return;
  registry_->launch_room().Cancel(launch_room_wait_);
  awaiting_launch_room_ = false;
}

void Session::GiveBackHeldRoom() {
  if (launch_room_held_ == 0) return;
  registry_->launch_room().Give(std::exchange(launch_room_held_, 0), launch_share());
}

bool Session::HasStagedDownloads(const InFlight& record) {
  return std::any_of(record.downloads.begin(), record.downloads.end(),
                     [](const PendingDownload& d) { return !d.staged.empty(); });
}

bool Session::StagedDownloadsInFlight() const {
  return std::any_of(queue_.begin(), queue_.end(), HasStagedDownloads);
}

Session::InFlight* Session::PausedRecord() {
  if (!enqueue_paused()) return nullptr;
  for (InFlight& r : queue_) {
    if (r.seq == enqueuing_seq_ && r.paused) return &r;
  }
  return nullptr;
}

void Session::ContinueEnqueue() {
  continue_posted_ = false;
  InFlight* record = PausedRecord();
  if (record == nullptr) {  // abandoned meanwhile (abort, device loss)
    GiveBackHeldRoom();
    return;
  }
  EnqueueWork& work = *record->paused;
  work.paused = false;
  Status s = EnqueueOps(*record, work);
  if (work.paused) return;  // still no room: the next completion posts this again
  if (!s.ok() && record->status.ok()) record->status = std::move(s);
  if (CurrentLane() == Lane::kLong) {  // the long-lane op was the last: end on the shared lane
    YieldEnqueue(work, work.ops.size(), Lane::kShared);
    return;
  }
  record->paused.reset();
  GiveBackHeldRoom();  // room held for an op of it that did not need it (it failed first)
  EndEnqueue(*record);
  SettleObjects();
  ResumeParked(CopyTurns::kNone);  // the submits that waited behind it; delivers
}

void Session::AbandonPausedEnqueue(const Status& why, bool device_gone) {
  InFlight* record = PausedRecord();
  if (record == nullptr) return;
  std::unique_ptr<EnqueueWork> work = std::move(record->paused);
  CancelLaunchRoomWait();  // the room it waited for would go unused
  ReleaseUnenqueued(*work, device_gone);
  if (device_gone) {  // OnDeviceLost gives the submit its status, with the fault's culprit
    enqueuing_seq_ = 0;
    capturing_ = false;
    capture_modules_.clear();
    return;
  }
  if (record->status.ok()) record->status = why;
  EndEnqueue(*record);  // its ops already enqueued still complete first
  SettleObjects();
}

void Session::WatchCompletion(bool may_run_inline) {
  // A submit still being enqueued (or paused) is not complete with what is enqueued so far.
  const uint64_t through = enqueuing_seq_ != 0 ? enqueuing_seq_ - 1 : enqueued_seq_;
  FERRY_TRACE(trace::kWatch, through, id_);
  commands_watched_ = commands_enqueued_;
  stream_->OnComplete([self = shared_from_this(), epoch = epoch_, through,
                       commands = commands_enqueued_, may_run_inline](Status status) mutable {
    FERRY_TRACE(trace::kSeen, through, self->id_);
    Executor executor = self->executor_;
    // A cheap completion runs on the completion thread itself when the session is idle (no
    // wake-up of an executor thread). A fault goes to the executor: handling it rebuilds the
    // device, which must not happen on the device's own completion thread.
    const bool run_here = may_run_inline && status.ok();
    auto handle = [self = std::move(self), epoch, through, commands,
                   status = std::move(status)]() mutable {
      FERRY_TRACE(trace::kComplete0, through, self->id_);
      self->OnDeviceComplete(epoch, std::move(status), through, commands);
      FERRY_TRACE(trace::kComplete1, through, self->id_);
    };
    if (run_here) {
      executor.RunOrPost(std::move(handle));
    } else {
      executor.Post(std::move(handle), "device completion");
    }
  });
}

Status Session::EnqueueOp(const Op& op, DevicePtr fresh, std::shared_ptr<backend::Module> loaded,
                          InFlight& record, uint32_t index) {
  if (capturing_ && !std::holds_alternative<EndGraphOp>(op)) ++capture_ops_;
  return std::visit(OpEnqueuer(*this, record, index, fresh, std::move(loaded)), op);
}

Status Session::ReserveDeviceBytes(uint64_t bytes) {
  if (!registry_->TryReserveDeviceBytes(bytes)) {
    return Status(ErrorKind::kQuotaExceeded, "the daemon-wide device memory cap (" +
                                                 std::to_string(registry_->device_bytes_cap()) +
                                                 " bytes) is reached");
  }
  if (account_) {
    Status s = account_->ChargeDeviceBytes(bytes);
    if (!s.ok()) {
      registry_->ReleaseDeviceBytes(bytes);
      return s;
    }
  }
  return Status::Ok();
}

void Session::ReleaseDeviceBytes(uint64_t bytes) {
  if (bytes == 0) return;
  registry_->ReleaseDeviceBytes(bytes);
  if (account_) account_->RefundDeviceBytes(bytes);
}

Status Session::ChargeModule(uint64_t handle, const backend::Module& module,
                             uint64_t peak_tensor_bytes, uint64_t* loaded_bytes) {
  // Admission could not know the module's size: the session's quota is checked here, against
  // the most the submit's tensors hold at any point (with the modules already charged) plus
  // every module it loads, which is never below what it holds.
  const uint64_t bytes = module.device_bytes();
  uint64_t total = 0;
  if (!CheckedAdd(peak_tensor_bytes, *loaded_bytes, &total) || !CheckedAdd(total, bytes, &total) ||
      total > limits_.device_bytes_quota) {
    return Status(ErrorKind::kQuotaExceeded,
                  "loading module " + std::to_string(handle) + " (" + std::to_string(bytes) +
                      " bytes of device memory: its code, constants and global variables) "
                      "would take the session past its device quota of " +
                      std::to_string(limits_.device_bytes_quota) + " bytes");
  }
  FERRY_RETURN_IF_ERROR(ReserveDeviceBytes(bytes));
  *loaded_bytes = total - peak_tensor_bytes;
  return Status::Ok();
}

void Session::CountDeviceBytes() {
  const uint64_t bytes = tensors_.bytes();
  counters_->device_bytes = bytes;
  if (bytes > counters_->peak_device_bytes) counters_->peak_device_bytes = bytes;
}

Status Session::ReserveObjects(uint64_t n) {
  if (n == 0) return Status::Ok();
  FERRY_RETURN_IF_ERROR(registry_->ChargeObjects(account_.get(), n));
  objects_charged_ += n;
  return Status::Ok();
}

void Session::GiveBackObjects() {
  objects_live_ = 0;
  SettleObjects();
}

void Session::SettleObjects() {
  if (objects_charged_ > objects_live_) {
    registry_->RefundObjects(account_.get(), objects_charged_ - objects_live_);
    objects_charged_ = objects_live_;
  }
}

void Session::ReleaseTensor(uint64_t handle) {
  TensorRecord r = tensors_.Remove(handle);
  --objects_live_;
  if (r.ptr) stream_->Free(r.ptr);
  ReleaseDeviceBytes(r.bytes);
  counters_->live_tensors = tensors_.size();
  CountDeviceBytes();
}

void Session::OnDeviceComplete(uint64_t epoch, Status status, uint64_t through, uint64_t commands) {
  if (epoch != epoch_) return;               // the device was lost since; OnDeviceLost settled it
  if (lifecycle_ == Lifecycle::kTornDown) {  // the completion that follows the final frees
    if (status.kind() == ErrorKind::kDeviceFault) device_->ReportFault(generation_, id_, status);
    Finalize();
    return;
  }
  if (status.kind() == ErrorKind::kDeviceFault) {
    // The context is gone for every session: the supervisor tells them all, this one
    // included (OnDeviceLost), and rebuilds the device.
    device_->ReportFault(generation_, id_, status);
    return;
  }
  RecordUsage();
  // The submits on the device up to `through` (those of a run share one watch). Parked
  // submits come after every submit on the device.
  for (InFlight& r : queue_) {
    if (r.parked || r.seq > through) break;
    if (!r.on_device) continue;
    r.on_device = false;
    if (r.first_launch_op >= 0) {
      --raw_launches_in_flight_;
      device_->RawLaunchesEnqueued(-1);
    }
    // An asynchronous error names no single op.
    if (!status.ok() && r.status.ok()) r.status = status.WithOpIndex(-1);
  }
  if (status.kind() == ErrorKind::kDeviceReset) broken_ = status.WithOpIndex(-1);
  if (commands > commands_done_) {
    registry_->launch_room().Give(commands - commands_done_, launch_share());
    commands_done_ = commands;
  }
  if (enqueue_paused() && !continue_posted_ &&
      (config_.max_queued_commands == 0 ||
       commands_enqueued_ - commands_done_ < config_.max_queued_commands)) {
    // Enqueueing is not for the completion thread (which may be running this): posted.
    continue_posted_ = true;
    executor_.Post([self = shared_from_this()] { self->ContinueEnqueue(); }, "enqueue continues");
  }
  DeliverReady();
}

void Session::NotifyDeviceLost(const DeviceLoss& loss) {
  executor_.Post([self = shared_from_this(), loss] { self->OnDeviceLost(loss); }, "device lost");
}

void Session::OnDeviceLost(const DeviceLoss& loss) {
  if (loss.generation != generation_ || !stream_) return;
  // Blame this session if it had raw kernels in flight, or, when nobody had, if it is the
  // one whose own work reported the fault; every other session lost its state to a reset.
  bool faulted =
      raw_launches_in_flight_ > 0 || (!loss.raw_kernels_in_flight && loss.reporter == id_);
  Status lost = faulted ? Status(ErrorKind::kDeviceFault,
                                 "this session's work faulted the device (" + loss.fault.message() +
                                     "); its tensors are gone")
                        : Status(ErrorKind::kDeviceReset,
                                 "another session faulted the device; the context was "
                                 "rebuilt and this session's tensors are gone");
  ++epoch_;
  broken_ = lost;
  const bool was_paused = enqueue_paused();
  AbandonPausedEnqueue(lost, /*device_gone=*/true);
  GiveBackQueuedCommands();  // the stream is gone
  for (InFlight& r : queue_) {
    if (!r.on_device) continue;
    r.on_device = false;
    if (r.status.ok()) {
      r.status = lost;
      if (faulted && r.first_launch_op >= 0) {
        r.status = Status(ErrorKind::kDeviceFault,
                          "kernel '" + r.first_launch_name + "' faulted the device (" +
                              loss.fault.message() + ")",
                          r.first_launch_op);
      }
    }
  }
  device_->RawLaunchesEnqueued(-raw_launches_in_flight_);
  raw_launches_in_flight_ = 0;
  // The memory went with the context: forget it without freeing.
  ReleaseDeviceBytes(tensors_.bytes());  // tensors' and modules'
  tensors_.Clear();
  GiveBackObjects();
  counters_->live_tensors = 0;
  counters_->device_bytes = 0;
  capturing_ = false;
  capture_modules_.clear();
  watch_deferred_ = false;
  ReleaseStream();
  if (lifecycle_ == Lifecycle::kTornDown) {  // waiting for final frees that never complete
    Finalize();
    return;
  }
  if (was_paused) {
    ResumeParked(CopyTurns::kNone);  // those behind it fail with broken_; delivers
  } else {
    DeliverReady();
  }
}

void Session::DeliverReady() {
  while (!queue_.empty() && !queue_.front().on_device && !queue_.front().parked) {
    InFlight record = std::move(queue_.front());
    queue_.pop_front();
    counters_->submits_in_flight = queue_.size();
    if (record.uid_inflight) account_->RefundInflight();
    if (record.turns_held != CopyTurns::kNone) turns_->Give(record.turns_held, TurnsIdentity());
    // The device is done with the submit's slab ranges: free them, or quarantine them
    // when the submit failed (their bytes are of unknown state).
    for (const pool::SlabRange& r : record.slab_ranges) slabs_->Finish(r, !record.status.ok());
    Deliver(record);
    if (!record.modules_in_use.empty() && SerialExecutor::RunningOnCallersThread()) {
      // Its last reference may unload a module, which may wait for the device: not on a
      // caller's thread (the completion watcher, which every session shares).
      executor_.Post([modules = std::move(record.modules_in_use)] {}, "modules released");
    }
  }
  MaybeTearDown();
}

void Session::Deliver(InFlight& record) {
  if (record.status.ok()) {
    counters_->bytes_downloaded += record.download_bytes;
  } else {
    ++counters_->failed_submits;
  }
  if (!events_) return;
  // Before the Completed message: a client polling the board sees the completion first.
  events_->PostCompletion(record.submit_id, record.status.ok());
  if (record.status.ok()) {
    for (PendingDownload& d : record.downloads) {
      uint64_t offset = 0;
      // Staged: chunks that copy themselves out of the staging range when written; the
      // range stays held until the last of them has.
      for (pool::StagingLease& lease : d.staged) {
        auto keep = std::make_shared<const pool::StagingLease>(std::move(lease));
        for (uint64_t at = 0; at < keep->length(); at += kMaxChunkBytes) {
          ChunkBytes chunk;
          chunk.keep = keep;
          chunk.staged = keep->data() + at;
          chunk.length = std::min(kMaxChunkBytes, keep->length() - at);
          const uint64_t chunk_offset = offset;
          offset += chunk.length;
          events_->OnDownloadChunk(record.submit_id, d.op_index, chunk_offset, std::move(chunk));
        }
      }
      for (std::string& data : d.chunks) {
        ChunkBytes chunk;
        chunk.owned = std::move(data);
        const uint64_t chunk_offset = offset;
        offset += chunk.owned.size();
        events_->OnDownloadChunk(record.submit_id, d.op_index, chunk_offset, std::move(chunk));
      }
    }
  }
  events_->OnCompleted(record.submit_id, record.status);
  for (uint64_t sync_id : record.syncs_after) events_->OnSynchronized(sync_id);
}

void Session::Synchronize(uint64_t sync_id) {
  if (queue_.empty()) {
    if (events_) events_->OnSynchronized(sync_id);
  } else {
    queue_.back().syncs_after.push_back(sync_id);
  }
}

void Session::Close() {
  Advance(LifecycleEvent::kClose);
  // A session with nothing in flight that holds no tensor, module or graph has nothing to
  // release that takes a while: it is torn down here, so that a Close handled on the thread
  // that read it (IsQuick) is answered without a hand-off.
  if (lifecycle_ == Lifecycle::kClosing && queue_.empty() && tensors_.size() == 0 &&
      tensors_.modules().empty() && tensors_.graphs().empty()) {
    Advance(LifecycleEvent::kPostTearDown);
    TearDown();
    return;
  }
  MaybeTearDown();
}

void Session::Abort() {
  events_ = nullptr;
  // Nobody can see the results of submits that have not started: drop them, and the rest of
  // one whose enqueue is paused. Their turn request, if any, is withdrawn: a request left
  // waiting would hold this session until granted (turns can be held for as long as other
  // sessions' kernels run), and requests of sessions that are gone would pile up ahead of
  // live ones. One granted already is given back when its grant runs (ResumeParked).
  if (awaiting_turns_ != CopyTurns::kNone && turns_->Cancel(turns_ticket_)) {
    awaiting_turns_ = CopyTurns::kNone;
  }
  AbandonPausedEnqueue(Status(ErrorKind::kSessionClosed, "the client went away"),
                       /*device_gone=*/false);
  for (InFlight& r : queue_) {
    if (!r.parked) continue;
    r.parked = false;
    r.request = SubmitRequest();
    r.status = Status(ErrorKind::kSessionClosed, "the client went away");
  }
  parked_ = 0;
  Advance(LifecycleEvent::kClose);
  DeliverReady();  // and tears down once idle
}

void Session::MaybeTearDown() {
  if (lifecycle_ != Lifecycle::kClosing || !queue_.empty()) return;
  // Releasing everything takes a while (frees, module and graph destruction): never on the
  // completion thread or a gRPC reaction thread, either of which may be running this.
  Advance(LifecycleEvent::kPostTearDown);
  // Releasing graphs takes about as long as building them did: by their ops all together
  // (many graphs just under kLongGraphOps each are as long as one large one).
  const bool long_graph = executor_.has_long_lane() && tensors_.graph_ops() > kLongGraphOps;
  if (long_graph) registry_->CountLongLaneTurn();
  executor_.Post([self = shared_from_this()] { self->TearDown(); }, "session teardown",
                 long_graph ? Lane::kLong : Lane::kShared);
}

void Session::TearDown() {
  if (lifecycle_ != Lifecycle::kTearDownPosted) return;
  if (!queue_.empty()) {  // MaybeTearDown comes again once the queue drains
    Advance(LifecycleEvent::kTearDownDefers);
    return;
  }
  Advance(LifecycleEvent::kTearDownFound);
  std::vector<uint64_t> handles;
  handles.reserve(tensors_.size());
  for (const auto& [handle, record] : tensors_.tensors()) handles.push_back(handle);
  if (!stream_) {  // the device was lost: nothing left on it
    Finalize();
    return;
  }
  for (uint64_t h : handles) ReleaseTensor(h);
  ReleaseDeviceBytes(tensors_.module_bytes());
  tensors_.Clear();  // modules and graphs
  counters_->device_bytes = 0;
  GiveBackObjects();
  // Report closed only once the device has finished with everything, frees included: at
  // once when nothing was freed and every command enqueued has been reported done (no
  // round trip through the completion watcher), else after a completion. Finalize destroys
  // the stream: never on the completion thread.
  if (handles.empty() && commands_done_ == commands_enqueued_) {
    Finalize();
    return;
  }
  WatchCompletion(/*may_run_inline=*/false);
}

void Session::RecordUsage() {
  if (!stream_) return;
  const backend::Usage used = stream_->usage();
  counters_->device_busy_ns = used.busy_ns;
  counters_->h2d_bytes = used.h2d_bytes;
  counters_->h2d_ns = used.h2d_ns;
  counters_->d2h_bytes = used.d2h_bytes;
  counters_->d2h_ns = used.d2h_ns;
}

void Session::Finalize() {
  GiveBackQueuedCommands();  // the device has run all of them (or is gone)
  RecordUsage();             // the stream's usage, last: it has no work left
  ReleaseSlabs();            // no device work touches them any more
  GiveBackObjects();
  SessionStatsSnapshot stats = Snapshot();
  registry_->Remove(id_);
  if (events_) events_->OnClosed(stats);
  events_ = nullptr;
  // The stream goes once Closed is on its way: its destruction (on CUDA a synchronize of the
  // idle stream and cudaStreamDestroy) is not part of the close the client waits for.
  ReleaseStream();
}

SessionStatsSnapshot Session::Snapshot() const { return SnapshotOf(*counters_); }

SessionStatsSnapshot SnapshotOf(const SessionCounters& c) {
  SessionStatsSnapshot s;
  s.submits = c.submits;
  s.failed_submits = c.failed_submits;
  s.ops = c.ops;
  s.kernel_launches = c.kernel_launches;
  s.bytes_uploaded = c.bytes_uploaded;
  s.bytes_downloaded = c.bytes_downloaded;
  s.tensors_created = c.tensors_created;
  s.peak_device_bytes = c.peak_device_bytes;
  s.device_busy_ns = c.device_busy_ns;
  s.graph_launches = c.graph_launches;
  s.kernel_batches = c.kernel_batches;
  s.h2d_bytes = c.h2d_bytes;
  s.h2d_ns = c.h2d_ns;
  s.d2h_bytes = c.d2h_bytes;
  s.d2h_ns = c.d2h_ns;
  return s;
}

}  // namespace ferry::session
