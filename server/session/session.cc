#include "session/session.h"

#include <algorithm>
#include <utility>

#include "ferry/trace_points.h"

namespace ferry::session {

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
  for (const InFlightSubmit& r : queue_) {
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
  for (InFlightSubmit& r : queue_) {
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
  for (InFlightSubmit& r : queue_) {
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
  graph_.Abandon();
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
    InFlightSubmit record = std::move(queue_.front());
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

void Session::Deliver(InFlightSubmit& record) {
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
  if (parked_wait_ == ParkedWait::kCopyTurns && turns_->Cancel(turns_ticket_)) {
    parked_wait_ = ParkedWait::kNothing;
    turns_awaited_ = CopyTurns::kNone;
  }
  AbandonPausedEnqueue(Status(ErrorKind::kSessionClosed, "the client went away"),
                       /*device_gone=*/false);
  for (InFlightSubmit& r : queue_) {
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
