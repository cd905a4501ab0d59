// Session's enqueue: an admitted submit's ops on their way to the stream, with the runs and
// batches that group them, the launch-queue room they take, the lanes and slices that cut
// them, and the pause and continuation of an enqueue.
#include <algorithm>
#include <utility>

#include "ferry/trace_points.h"
#include "session/op_enqueuer.h"
#include "session/session.h"

namespace ferry::session {

using backend::DevicePtr;

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
    if (graph_.recording()) {
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
  for (InFlightSubmit& r : queue_) {
    if (!r.on_device || r.seq < run_batch_first_seq_) continue;
    r.on_device = false;
    if (r.status.ok()) r.status = ended.WithOpIndex(0);
  }
  DeliverReady();
}

Status Session::Enqueue(SubmitRequest& request, const AdmissionResult& admitted,
                        InFlightSubmit& record) {
  auto& ops = request.ops;
  // In a run, consecutive submits of fewer than kernel_batch ops, kernel ops only (which
  // would go op by op), share a batch of RunBatchOps() ops, opened only while that many
  // are expected: batches of one size, whose executable graph the stream keeps and updates
  // (CUDA), not one instantiated per run. A submit that does not join ends the batch first:
  // a batch refuses allocations, and a graph capture does not nest in it.
  const uint64_t run_ops_here = run_ops_left_;
  run_ops_left_ -= std::min<uint64_t>(run_ops_left_, ops.size());
  const bool joins_run_batch = run_open_ && config_.kernel_batch > 0 && !graph_.recording() &&
                               ops.size() < config_.kernel_batch &&
                               request.summary.kernel_ops_only() &&
                               (run_batch_ || run_ops_here >= RunBatchOps());
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
  FERRY_RETURN_IF_ERROR(MakeForOps(work, admitted));

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

Status Session::MakeForOps(EnqueueWork& work, const AdmissionResult& admitted) {
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
  return Status::Ok();
}

std::chrono::steady_clock::time_point Session::SliceEnd() {
  // The slice is the executor turn's: what ran before in this turn (the submit's reading,
  // earlier submits of a run or of those resumed together) counts.
  const auto turn_start = SerialExecutor::TurnStart();
  return (turn_start == std::chrono::steady_clock::time_point() ? std::chrono::steady_clock::now()
                                                                : turn_start) +
         kEnqueueSlice;
}

Status Session::EnqueueOps(InFlightSubmit& record, EnqueueWork& work) {
  const std::vector<Op>& ops = work.ops;
  size_t scanned = work.next;             // ops before this one were looked at for a batch
  size_t batch_first = 0, batch_end = 0;  // ops [batch_first, batch_end) go as one batch
  const auto slice_end = SliceEnd();
  size_t slice_checked = work.next;  // the clock was last read before this op
  const Lane here = CurrentLane();
  for (size_t i = work.next; i < ops.size(); ++i) {
    bool starts_batch = false;
    size_t run = i;
    if (i >= scanned) {
      while (run < ops.size() && run - i < MaxBatchOps() && IsKernelOp(ops[run])) ++run;
      scanned = std::max(run, i + 1);
      starts_batch = !graph_.recording() && !run_batch_ && config_.kernel_batch > 0 &&
                     run - i >= config_.kernel_batch;
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
    if (i >= batch_end && !graph_.recording() && !run_batch_) {
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
    Status s = EnqueueWorkOp(record, work, i);
    size_t failed_op = i;
    if (i < batch_end && (i + 1 == batch_end || !s.ok())) {  // the batch is complete
      batch_end = 0;
      if (Status ended = EndOpBatch(); !ended.ok()) {
        s = std::move(ended);  // nothing of the batch runs: its first op reports why
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

Status Session::EnqueueWorkOp(InFlightSubmit& record, EnqueueWork& work, size_t i) {
  Status s;
  if (work.made.empty()) {
    s = EnqueueOp(work.ops[i], 0, nullptr, record, static_cast<uint32_t>(i));
  } else {
    EnqueueWork::Made& made = work.made[i];
    s = EnqueueOp(work.ops[i], made.fresh, std::move(made.loaded), record,
                  static_cast<uint32_t>(i));
    made = {};  // the tensor's now (or freed with it)
  }
  if (record.first_launch_op >= 0 && !record.raw_counted) {
    // Raw kernels are on the device: this session is a fault suspect from now on.
    record.raw_counted = true;
    ++raw_launches_in_flight_;
    device_->RawLaunchesEnqueued(1);
  }
  return s;
}

Status Session::EndOpBatch() {
  Status ended = stream_->EndBatch();
  if (ended.ok()) ++counters_->kernel_batches;
  return ended;
}

Session::Lane Session::LaneFor(const Op& op, const InFlightSubmit& record, size_t index) const {
  if (!executor_.has_long_lane()) return Lane::kShared;
  if (std::holds_alternative<EndGraphOp>(op)) {
    return graph_.recording() && graph_.ops() > kLongGraphOps ? Lane::kLong : Lane::kShared;
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

void Session::EndEnqueue(InFlightSubmit& record) {
  enqueuing_seq_ = 0;
  if (graph_.recording()) {  // an enqueue error inside a graph, or an abort: drop the recording
    graph_.Abandon();
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

uint64_t Session::CommandsOf(const Op& op, const InFlightSubmit& record, uint32_t index) const {
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

bool Session::HasStagedDownloads(const InFlightSubmit& record) {
  return std::any_of(record.downloads.begin(), record.downloads.end(),
                     [](const PendingDownload& d) { return !d.staged.empty(); });
}

bool Session::StagedDownloadsInFlight() const {
  return std::any_of(queue_.begin(), queue_.end(), HasStagedDownloads);
}

InFlightSubmit* Session::PausedRecord() {
  if (!enqueue_paused()) return nullptr;
  for (InFlightSubmit& r : queue_) {
    if (r.seq == enqueuing_seq_ && r.paused) return &r;
  }
  return nullptr;
}

void Session::ContinueEnqueue() {
  continue_posted_ = false;
  InFlightSubmit* record = PausedRecord();
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
  InFlightSubmit* record = PausedRecord();
  if (record == nullptr) return;
  std::unique_ptr<EnqueueWork> work = std::move(record->paused);
  CancelLaunchRoomWait();  // the room it waited for would go unused
  ReleaseUnenqueued(*work, device_gone);
  if (device_gone) {  // OnDeviceLost gives the submit its status, with the fault's culprit
    enqueuing_seq_ = 0;
    graph_.Abandon();
    return;
  }
  if (record->status.ok()) record->status = why;
  EndEnqueue(*record);  // its ops already enqueued still complete first
  SettleObjects();
}

Status Session::EnqueueOp(const Op& op, DevicePtr fresh, std::shared_ptr<backend::Module> loaded,
                          InFlightSubmit& record, uint32_t index) {
  if (!std::holds_alternative<EndGraphOp>(op)) graph_.CountOp();
  return std::visit(OpEnqueuer(*this, record, index, fresh, std::move(loaded)), op);
}

}  // namespace ferry::session
