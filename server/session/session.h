// One client session in the daemon: its tensors, its device stream, its submits in flight.
//
// Threading: every method runs on the session's executor (a SerialExecutor: one at a time,
// in order), and so do the events it raises. Backend completions arrive on the backend's
// completion thread, which runs them itself when the executor is idle (RunOrPost) or hands
// them to the executor's threads. The session keeps itself alive (shared_from_this) while device
// work is in flight, so a client that goes away never frees memory the device may still touch.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "pool/session_slabs.h"
#include "pool/staging.h"
#include "session/admission.h"
#include "session/copy_turns.h"
#include "session/device_supervisor.h"
#include "session/graph_recorder.h"
#include "session/handle_table.h"
#include "session/ops.h"
#include "session/registry.h"
#include "session/serial_executor.h"
#include "session/submit_queue.h"

namespace ferry::session {

using Executor = SerialExecutor;
class OpEnqueuer;

/// The largest chunk of download bytes sent in one message.
inline constexpr uint64_t kMaxChunkBytes = 1ull << 20;

struct SessionConfig {
  uint64_t device_bytes_quota = 1ull << 30;
  uint32_t max_in_flight_submits = 64;
  // Ops one submit may carry, each LaunchGraph counted as the ops its graph recorded
  // (AdmissionLimits); beyond it the submit is refused with QUOTA_EXCEEDED. 0: no limit.
  uint64_t max_ops_per_submit = 1u << 20;
  uint64_t max_download_bytes_per_submit = 1ull << 30;
  // Live objects a session may hold, and ops recorded into its live graphs (together): each
  // costs daemon memory (a tensor ~200 bytes, a recorded op ~250, a module up to 64 MiB of
  // code) that no device quota counts, so a client must not pile them up without bound.
  // Beyond them a submit is refused with QUOTA_EXCEEDED. 0: no limit.
  uint64_t max_tensors = 65536;
  uint64_t max_modules = 256;
  uint64_t max_graphs = 4096;
  uint64_t max_graph_ops = 262144;
  // Bytes the daemon may hold for the session, accepted and not yet delivered: inline upload
  // and module bytes of its submits in flight, their inline download bytes, and a cost per op
  // and per message (the connection counts them, from reading a submit until its Completed is
  // written). At the limit the daemon stops reading the session's messages (backpressure);
  // one submit that alone would exceed it is refused with QUOTA_EXCEEDED. 0: no limit.
  uint64_t max_in_flight_bytes = 256ull << 20;
  // A run of this many or more consecutive kernel ops (fill, binary, scale, axpy) in one
  // submit goes to the device as one batch (backend Stream::BeginBatch); 0: never.
  uint32_t kernel_batch = 8;
  // Submits the ring poller hands over together go to the session as runs of at most this
  // many (Session::BeginSubmitRun): one completion watch per run, and one batch for its
  // kernel-only submits when the run holds kernel_batch or more ops; 0 or 1: no runs.
  uint32_t submit_run = 32;
  // How long a submit waits for staging room for its inline bytes before it takes the
  // direct path (Session::ReserveStaging), so that a session holding staging (inline uploads
  // queued behind long device work) delays others by at most this. 0: never wait.
  uint32_t staging_wait_ms = 100;
  // Device commands (an op enqueued on its own, a batch, a graph launch, a copy piece) the
  // session keeps on its stream not yet known complete. CUDA's launch queue holds about 1024
  // per hardware work queue, which several streams share, and a launch beyond them blocks
  // its thread (backend.h): a submit with more ops enqueues in parts, each continued from
  // the completion of earlier ones, so no executor thread (shared by every session) waits
  // in a launch call while fewer than 1024 / 128 = 8 such sessions share a work queue.
  // 0: no limit.
  uint32_t max_queued_commands = 128;
};

/// Plain copy of a session's counters, as Closed reports them.
struct SessionStatsSnapshot {
  uint64_t submits = 0, failed_submits = 0, ops = 0, kernel_launches = 0;
  uint64_t bytes_uploaded = 0, bytes_downloaded = 0, tensors_created = 0;
  uint64_t peak_device_bytes = 0, device_busy_ns = 0, graph_launches = 0;
  uint64_t kernel_batches = 0;
  uint64_t h2d_bytes = 0, h2d_ns = 0, d2h_bytes = 0, d2h_ns = 0;
};

/// Copy a session's counters (any thread: they are atomics).
SessionStatsSnapshot SnapshotOf(const SessionCounters& counters);

/// The bytes of one download chunk: owned, or still in a staging range that `keep` holds
/// until they are copied out (Take), which the connection does when the chunk is next to be
/// written, so that copying a large download overlaps with writing it.
struct ChunkBytes {
  std::string owned;
  std::shared_ptr<const pool::StagingLease> keep;
  const char* staged = nullptr;  // with keep: `length` bytes in its range
  uint64_t length = 0;

  uint64_t size() const { return keep ? length : owned.size(); }
  /// The bytes, copied out of staging where they are still there (which releases it).
  std::string Take() {
    if (!keep) return std::move(owned);
    std::string out(staged, length);
    keep.reset();
    staged = nullptr;
    return out;
  }
};

/// A session's life, after Open: kOpen takes submits; kClosing (Close or Abort) refuses new
/// ones and lets those in flight finish; once none is left, a tear-down is posted to the
/// executor (kTearDownPosted), which either finds the queue still empty and releases
/// everything (kTornDown: waiting for the final frees, then Finalize) or finds work again
/// and goes back to kClosing to wait for it.
enum class Lifecycle : uint8_t { kOpen, kClosing, kTearDownPosted, kTornDown };

enum class LifecycleEvent : uint8_t {
  kClose,           // Close or Abort
  kPostTearDown,    // closing and nothing in flight: post the tear-down
  kTearDownFound,   // the tear-down runs and finds nothing in flight
  kTearDownDefers,  // the tear-down runs and finds work in flight again
};

/// The state `event` leads to from `state`. An event that does not apply leaves the state
/// as it is (a second Close, a tear-down after one).
constexpr Lifecycle NextLifecycle(Lifecycle state, LifecycleEvent event) {
  switch (event) {
    case LifecycleEvent::kClose:
      return state == Lifecycle::kOpen ? Lifecycle::kClosing : state;
    case LifecycleEvent::kPostTearDown:
      return state == Lifecycle::kClosing ? Lifecycle::kTearDownPosted : state;
    case LifecycleEvent::kTearDownFound:
      return state == Lifecycle::kTearDownPosted ? Lifecycle::kTornDown : state;
    case LifecycleEvent::kTearDownDefers:
      return state == Lifecycle::kTearDownPosted ? Lifecycle::kClosing : state;
  }
  return state;
}

/// What a session tells its connection. Called on the session's executor.
class SessionEvents {
 public:
  virtual ~SessionEvents() = default;
  /// Bytes of a Download op; all chunks of a submit come before its OnCompleted.
  virtual void OnDownloadChunk(uint64_t submit_id, uint32_t op_index, uint64_t offset,
                               ChunkBytes data) = 0;
  /// A submit completed (`ok`: it succeeded): posted where a local client sees it first (its
  /// completion board), before the submit's chunks and its OnCompleted. In submit order.
  virtual void PostCompletion(uint64_t submit_id, bool ok) = 0;
  /// The one completion of a submit, in submit order.
  virtual void OnCompleted(uint64_t submit_id, const Status& status) = 0;
  virtual void OnSynchronized(uint64_t sync_id) = 0;
  /// The session released everything; the last event.
  virtual void OnClosed(const SessionStatsSnapshot& stats) = 0;
};

class Session : public DeviceLostListener, public std::enable_shared_from_this<Session> {
 public:
  // A longer run of kernel ops in one submit is cut into batches of this many (or of
  // kernel_batch where that is more). A batch's capture and instantiation hold an executor
  // thread, which every session shares (CUDA: 2^20 nodes took about 12 s), and a batch is one
  // command of the launch queue, so one batch would also pass session-queued-commands' bound
  // on what a session keeps queued.
  static constexpr uint64_t kMaxBatchOps = 4096;
  // An executor turn enqueues for about this long (from SerialExecutor::TurnStart: what the
  // turn ran before counts): where it is over (between ops outside a batch; inside a graph
  // recording too) the enqueue yields its executor thread, which every session shares, and
  // goes on after the work other sessions queued meanwhile (SerialExecutor::Yield). A long submit
  // (CUDA: a launch takes 2-5 us, a captured op about 12 us, so 2^20 ops take seconds) then holds
  // up another session by about one slice, plus a batch (kMaxBatchOps). Not cut: reading and
  // admitting the submit, before its enqueue starts (on the long lane past kLongSubmitOps); a
  // graph's instantiation, at its EndGraph (on the long lane past kLongGraphOps).
  static constexpr std::chrono::microseconds kEnqueueSlice{2000};
  // The clock is read every this many ops.
  static constexpr size_t kSliceCheckOps = 32;
  // A graph of more recorded ops than this is instantiated at its EndGraph, launched, and
  // released (its FreeGraph, or the session's teardown while it holds one) on the executor's
  // long lane (SerialExecutor::Lane::kLong), where it has one: none of these is cut into
  // slices, and each takes about as long as the graph is big (CUDA: about 12 s for a capture
  // and instantiation of 2^20 ops, 262144 being session-max-graph-ops' default; about 140 ms
  // to destroy, and as long for the first launch, of 2^17 on the H100), and a long-lane
  // thread is one no other session's work waits for. A smaller graph's take about a slice
  // and stay on the shared lane, without the two thread hand-overs. (LaneFor: the long
  // lane also takes the direct path's copies.)
  static constexpr uint64_t kLongGraphOps = 1024;
  // A submit of more ops than this (a LaunchGraph counted as the ops its graph recorded, as
  // session-max-submit-ops counts them) is started on the long lane (StartLane): reading and
  // admitting it is not cut into slices (admission checks every tensor every op uses: 3-5 ms
  // for one launch of a 262144-op graph on the H200), and the connection reads a submit
  // message of more ops than this there too. Its enqueue goes on in slices on the shared lane.
  static constexpr uint64_t kLongSubmitOps = 65536;

  /// Create a session on the supervised device. Fails with QUOTA_EXCEEDED when the daemon
  /// holds its maximum number of sessions, or with the backend's error when no stream can
  /// be made. `turns` (may be null: none) is the daemon's CopyTurns; it must outlive the
  /// session, like `device` and `registry`.
  static Result<std::shared_ptr<Session>> Create(DeviceSupervisor* device,
                                                 SessionRegistry* registry, Executor executor,
                                                 const SessionConfig& config,
                                                 std::string client_name, PeerIdentity peer,
                                                 SessionEvents* events, CopyTurns* turns = nullptr);
  ~Session();

  uint64_t id() const { return id_; }
  const SessionConfig& config() const { return config_; }
  const Executor& executor() const { return executor_; }

  /// Admit and enqueue a submit, or refuse it whole; either way exactly one OnCompleted
  /// follows, after those of all earlier submits. A submit that needs a copy turn which is
  /// not free waits for it, and the session's later submits wait behind it (admitted and
  /// enqueued in order once it has its turn); they count as in flight meanwhile.
  void Submit(SubmitRequest request);
  /// A run: the submits handed over between BeginSubmitRun and EndSubmitRun (the connection
  /// brackets what it took from the submit ring at once) share one completion watch, asked
  /// for at EndSubmitRun, instead of one each; and consecutive small submits made only of
  /// kernel ops go to the device in batches of RunBatchOps() ops, while the caller's count
  /// of the ops in the run (`ops`) says that many follow (a batch that fails fails each of
  /// them). Every submit still gets its own OnCompleted, in order. Runs do not nest;
  /// outside one, nothing changes.
  void BeginSubmitRun(uint64_t ops);
  void EndSubmitRun();
  /// Raise OnSynchronized once every earlier submit has completed.
  void Synchronize(uint64_t sync_id);
  /// Finish in-flight work, free every tensor, then raise OnClosed.
  void Close();
  /// The client is gone: like Close, but raise no more events.
  void Abort();

  /// Return true while another submit fits under the in-flight limit, besides `arriving`
  /// ones already read and about to be submitted. (The connection's backpressure counts more:
  /// every message until its answer is written, and bytes; rpc/session_service.cc, AtLimit.)
  bool CanAcceptSubmit(size_t arriving = 0) const {
    return queue_.size() + arriving < config_.max_in_flight_submits;
  }
  bool closing() const { return lifecycle_ != Lifecycle::kOpen; }
  size_t in_flight() const { return queue_.size(); }

  /// Give the session its shared-memory slab set (local clients); call before the first
  /// Submit. The session gives the slabs back to the pool once its device work is done.
  void AttachSlabs(std::shared_ptr<pool::SessionSlabs> slabs) { slabs_ = std::move(slabs); }
  /// Stage this session's inline transfers through the daemon's pinned staging (every
  /// session: see ReserveStaging).
  void AttachStaging(pool::StagingArea* staging) { staging_ = staging; }

  /// DeviceLostListener: posts OnDeviceLost to the session's executor.
  void NotifyDeviceLost(const DeviceLoss& loss) override;

 private:
  friend class OpEnqueuer;  // enqueues each op of Session::EnqueueOps (op_enqueuer.h)

  Session(DeviceSupervisor* device, SessionRegistry* registry, Executor executor,
          const SessionConfig& config, std::unique_ptr<backend::Stream> stream,
          SessionEvents* events);

  // Admit and enqueue `request` (its turns, if it needs any, are held) into `record`; false
  // (nothing done) when its inline transfers must first wait for staging room.
  bool Start(SubmitRequest& request, InFlightSubmit& record);
  // With staging (every session the daemon gives some): take the pinned ranges of all the
  // submit's inline upload and download bytes at once, into record.staged_ops. A copy
  // between the device and ordinary memory may hold the calling thread until the stream's
  // earlier work is done (CUDA), so no executor thread makes one while staging can take the
  // bytes: when it has no room now, return false and resume the parked submits once it frees
  // some, or once the submit has waited staging_wait_ms (OnStagingFreed). A submit that
  // waited that long, or that the whole area could never hold, takes the direct path.
  bool ReserveStaging(const SubmitRequest& request, InFlightSubmit& record);
  void OnStagingFreed();
  // Objects (live tensors, modules and graphs, ops recorded into graphs) are charged to the
  // daemon's max-objects and the identity's uid-limits objects: before a submit is enqueued
  // as many as it could add (SubmitSummary::objects_added_at_most: its creates, loads,
  // graphs and recorded ops), settled to what it left live after.
  Status ReserveObjects(uint64_t n);
  void SettleObjects();
  void GiveBackObjects();  // none left live (cleared, torn down, gone)
  // Start parked submits in order, with `granted` turns for the first that waits for them,
  // until one must wait (for turns, or for staging).
  void ResumeParked(uint8_t granted);
  // Post ResumeParked to the io threads (once until it runs): the first parked submit may
  // not be started on the thread that reached it. With Lane::kLong it runs on the long lane
  // (from a function of the executor only: it yields to it).
  void PostResumeParked(SerialExecutor::Lane lane = SerialExecutor::Lane::kShared);
  bool resume_posted_ = false;
  // The lane `request` is started on, where the executor has a long lane: kLong when
  // it loads a module (its pre-pass compiles CUDA C++ or has the driver compile PTX, which
  // takes up to seconds and is not cut into slices) or has more than kLongSubmitOps ops
  // (its admission), else kShared. Its ops are then enqueued on the lanes LaneFor says.
  SerialExecutor::Lane StartLane(const SubmitRequest& request) const;
  // Queue for the turns of the first parked submit; OnTurnsGranted follows on the executor.
  void AwaitTurns(uint8_t mask);
  // The identity whose weight (uid-weights) orders this session's turns.
  std::string TurnsIdentity() const { return account_ ? account_->identity() : std::string(); }
  void OnTurnsGranted();
  // Enqueue an admitted submit; returns the first enqueue error (with op index). Where the
  // stream has max_queued_commands in flight, it stops (record.paused holds the rest, the
  // session's later submits park behind it) and ContinueEnqueue goes on once a completion
  // shows room; where its slice (kEnqueueSlice) is over, it stops the same way and
  // ContinueEnqueue goes on after other sessions' queued work.
  Status Enqueue(SubmitRequest& request, const AdmissionResult& admitted, InFlightSubmit& record);
  // Allocate the memory of every create of work.ops and load every module (CUDA C++ compiles
  // here), into work.made, before anything is enqueued, so that a device without the memory
  // or a compile error refuses the submit whole: on failure all of it is given back and the
  // error carries the op's index.
  Status MakeForOps(EnqueueWork& work, const AdmissionResult& admitted);
  // When the running executor turn's enqueue slice (kEnqueueSlice) is over.
  static std::chrono::steady_clock::time_point SliceEnd();
  // Enqueue work.ops from work.next on; stops early (work.paused) where no room is left,
  // the slice is over, or the next op is for the other lane.
  Status EnqueueOps(InFlightSubmit& record, EnqueueWork& work);
  // Enqueue op `i` of work.ops with what MakeForOps made for it (EnqueueOp), and count the
  // submit's raw launches once the first is on the device.
  Status EnqueueWorkOp(InFlightSubmit& record, EnqueueWork& work, size_t i);
  // End the batch of a submit's kernel ops (Stream::EndBatch), counting it where it went.
  Status EndOpBatch();
  using Lane = SerialExecutor::Lane;
  // The lane op `op` (op `index` of `record`) is enqueued on, where the executor has a long
  // lane: kLong for work that may hold its thread for long, which no slice cuts: the EndGraph
  // of a recording of more than kLongGraphOps ops, the LaunchGraph and FreeGraph of such a
  // graph (IsLongGraph), and an inline Upload or Download without
  // staging ranges (the direct path: a copy between the device and pageable memory, which
  // may wait for the stream's earlier work, CUDA). kShared for any other op. The ops after a
  // long-lane op go on on the shared lane; the session's functions still run one at a time.
  Lane LaneFor(const Op& op, const InFlightSubmit& record, size_t index) const;
  Lane CurrentLane() const;  // the lane this executor function runs on
  // `handle` is a graph of the session of more than kLongGraphOps recorded ops.
  bool IsLongGraph(uint64_t handle) const;
  // Stop the enqueue before op `next` (paused), to go on (ContinueEnqueue) on `lane` after
  // what the executor has queued.
  void YieldEnqueue(EnqueueWork& work, size_t next, Lane lane);
  // After the last op of `record` (or a reason to stop): abandon an unfinished graph
  // capture, settle objects, and ask for its completion.
  void EndEnqueue(InFlightSubmit& record);
  // Give back what Enqueue made for the ops from work.next on (freed on the stream unless
  // the device is gone); none is left to enqueue.
  void ReleaseUnenqueued(EnqueueWork& work, bool device_gone);
  // The paused enqueue goes on (posted by OnDeviceComplete once the stream has room, woken
  // by the LaunchRoom, or yielded to at the end of a slice).
  void ContinueEnqueue();
  // Stop the paused enqueue for good with `why` (client gone, device lost): the ops not
  // enqueued give back their memory and reservations.
  void AbandonPausedEnqueue(const Status& why, bool device_gone);
  InFlightSubmit* PausedRecord();
  // The launch-queue commands `op` (op `index` of `record`) takes when enqueued on its own.
  uint64_t CommandsOf(const Op& op, const InFlightSubmit& record, uint32_t index) const;
  // Whether `commands` more fit under max_queued_commands now; when they do not, a
  // completion is asked for (to learn when they will), and one every half of the limit.
  bool RoomForCommands(uint64_t commands);
  // Give the daemon's LaunchRoom back every command not yet reported done (the stream is
  // done or gone), and cancel the session's wait for room, if any.
  void GiveBackQueuedCommands();
  // Withdraw the session's wait for launch room, if any (the session will not use it).
  void CancelLaunchRoomWait();
  // Give the LaunchRoom back the commands it took for this session and no op used.
  void GiveBackHeldRoom();
  // Whether `record`, or any submit in flight, has download bytes in staging (whose
  // delivery cuts chunks: not for the completion thread, see WatchCompletion).
  static bool HasStagedDownloads(const InFlightSubmit& record);
  bool StagedDownloadsInFlight() const;
  // Enqueue op `index` of `record` (OpEnqueuer: one function per kind of op); `fresh` and
  // `loaded` are what Enqueue made for it (a create's memory, a load's module).
  Status EnqueueOp(const Op& op, backend::DevicePtr fresh, std::shared_ptr<backend::Module> loaded,
                   InFlightSubmit& record, uint32_t index);
  // Ask the stream for one completion covering everything enqueued so far (every submit
  // whose seq is at most enqueued_seq_). `may_run_inline`: handling it is cheap (no staged
  // bytes to copy out, no teardown), so the completion thread may run it itself when the
  // executor is idle.
  void WatchCompletion(bool may_run_inline);
  // The device finished every submit up to seq `through` (with `status`), and the first
  // `commands` commands enqueued on the stream.
  void OnDeviceComplete(uint64_t epoch, Status status, uint64_t through, uint64_t commands);
  // End the batch open across a run's submits, if any; if it fails, nothing of it runs and
  // each of its submits fails.
  void EndRunBatch();
  void OnDeviceLost(const DeviceLoss& loss);
  void ReleaseStream();
  // Copy the stream's device usage into the counters (after each completion, and last
  // before the stream goes), so live views and per-uid totals see it.
  void RecordUsage();
  void DeliverReady();
  void Deliver(InFlightSubmit& record);
  // Once closing and idle, post TearDown (release everything, then Finalize).
  void MaybeTearDown();
  void TearDown();
  void Finalize();
  void ReleaseTensor(uint64_t handle);
  void ReleaseSlabs();
  SessionStatsSnapshot Snapshot() const;

  DeviceSupervisor* device_;
  SessionRegistry* registry_;
  // The identity (uid) the session is charged to; set by Create, null in unit-built sessions.
  std::shared_ptr<UidAccount> account_;
  // Its identity's share of the daemon's LaunchRoom; null without an account.
  LaunchShare* launch_share() const { return account_ ? &account_->launch_share() : nullptr; }
  uint64_t objects_live_ = 0;     // what ReserveObjects counts, live now
  uint64_t objects_charged_ = 0;  // charged to the registry and account_ (>= objects_live_)
  // Reserve (or give back) device bytes under the daemon-wide cap and the identity's limit.
  Status ReserveDeviceBytes(uint64_t bytes);
  void ReleaseDeviceBytes(uint64_t bytes);
  // Charge a module just loaded under `handle` to the session: QUOTA_EXCEEDED when the
  // submit's tensors at their peak (`peak_tensor_bytes`, from admission), the modules it
  // loaded before (`*loaded_bytes`) and this one pass the session's quota, or when the
  // daemon's cap or the identity's share refuses them; else reserve its bytes and add them
  // to `*loaded_bytes`.
  Status ChargeModule(uint64_t handle, const backend::Module& module, uint64_t peak_tensor_bytes,
                      uint64_t* loaded_bytes);
  // The live device bytes (tensors' and modules') into the session's stats, and its peak.
  void CountDeviceBytes();
  Executor executor_;
  SessionConfig config_;
  AdmissionLimits limits_;
  std::unique_ptr<backend::Stream> stream_;  // null once released (closed or device lost)
  uint64_t generation_ = 0;                  // the device generation stream_ belongs to
  uint64_t epoch_ = 0;                       // bumped on device loss: stale completions drop
  SessionEvents* events_;                    // null once the client is gone
  std::shared_ptr<SessionCounters> counters_;
  uint64_t id_ = 0;

  HandleTable tensors_;
  std::shared_ptr<pool::SessionSlabs> slabs_;  // null: no shared memory (remote client)
  pool::StagingArea* staging_ = nullptr;       // remote clients' inline transfers; may be null
  // What this session's staging leases hold, against its share of the area; its parent is
  // its identity's (UidAccount::staging_holder), set at Create.
  std::shared_ptr<pool::StagingHolder> staging_holder_ = std::make_shared<pool::StagingHolder>();
  uint64_t next_generation_ = 1;
  GraphRecorder graph_;                 // the graph the stream records, if any
  int64_t raw_launches_in_flight_ = 0;  // submits in flight that launch raw kernels
  std::deque<InFlightSubmit> queue_;
  uint64_t enqueued_seq_ = 0;  // seq of the last submit that reached the device
  // The submit whose ops are being enqueued, or whose enqueue is paused (0: none). A
  // completion asked for meanwhile covers only the submits before it.
  uint64_t enqueuing_seq_ = 0;
  // Seen from outside Enqueue (between executor tasks), a submit still being enqueued is
  // one whose enqueue is paused for launch-queue room.
  bool enqueue_paused() const { return enqueuing_seq_ != 0; }
  bool continue_posted_ = false;       // ContinueEnqueue is posted
  uint64_t commands_enqueued_ = 0;     // launch-queue commands enqueued on the stream, ever
  uint64_t commands_done_ = 0;         // of which a completion has reported this many done
  uint64_t commands_watched_ = 0;      // and the last completion asked for covers this many
  bool awaiting_launch_room_ = false;  // registered with the daemon's LaunchRoom...
  uint64_t launch_room_wait_ = 0;      // ...as this wait (LaunchRoom::Cancel)
  uint64_t launch_room_held_ = 0;      // taken for it by the LaunchRoom, not yet enqueued
  // The run between BeginSubmitRun and EndSubmitRun.
  bool run_open_ = false;
  uint64_t run_ops_left_ = 0;         // ops the caller expects in the rest of the run
  bool run_batch_ = false;            // a batch is open across its submits...
  uint64_t run_batch_first_seq_ = 0;  // ...since this one...
  uint64_t run_batch_ops_ = 0;        // ...holding this many ops
  bool run_unwatched_ = false;        // its submits reached the device; no watch asked yet
  bool run_inline_ = true;            // and their completion may run on the watcher thread
  // A run ended while the paused enqueue recorded a graph: its watch is asked for at that
  // enqueue's end (EndEnqueue).
  bool watch_deferred_ = false;
  // The size of a run's batches: twice kernel_batch, at least 16, at most MaxBatchOps().
  uint64_t RunBatchOps() const {
    return std::min(MaxBatchOps(), std::max<uint64_t>(16, 2ull * config_.kernel_batch));
  }
  // The most ops of one submit that go as one batch: kMaxBatchOps, or kernel_batch where
  // that is more.
  uint64_t MaxBatchOps() const { return std::max<uint64_t>(kMaxBatchOps, config_.kernel_batch); }
  CopyTurns* turns_ = nullptr;                     // null: no turns
  size_t parked_ = 0;                              // records of queue_ that are parked
  ParkedWait parked_wait_ = ParkedWait::kNothing;  // what the first parked submit waits for
  uint8_t turns_awaited_ = CopyTurns::kNone;       // with kCopyTurns: the turns it waits for...
  uint64_t turns_ticket_ = 0;                      // ...as this request (CopyTurns::Cancel)
  Status broken_;  // a sticky device error: every later submit fails with it
  void Advance(LifecycleEvent event) { lifecycle_ = NextLifecycle(lifecycle_, event); }
  Lifecycle lifecycle_ = Lifecycle::kOpen;  // changed only through Advance
};

}  // namespace ferry::session
