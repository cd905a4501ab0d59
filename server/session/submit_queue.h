// A session's submit queue: its submits between Session::Submit and their OnCompleted, in
// submit order, and what the head of the queue waits for.
//
// A submit is, in turn: parked (not yet admitted: it waits for copy turns, for staging room
// for its inline bytes, for a lane of the executor, or behind a submit that does), then
// enqueued (admitted, its ops going to the device; an enqueue may pause for room in the
// stream's launch queue or the daemon's launch room, or yield at the end of its executor
// slice, and the submits behind it park meanwhile), then on the device (waiting for a
// completion), then delivered (its download chunks and OnCompleted, in order). Session's
// submit_queue.cc parks and starts submits, enqueue.cc enqueues them, session.cc delivers.
//
// Not thread-safe: owned and used by one session on its executor.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "pool/session_slabs.h"
#include "pool/staging.h"
#include "session/copy_turns.h"
#include "session/ops.h"

namespace ferry::session {

/// What the first parked submit waits for before it can be started. One at a time: a
/// submit that waited for one and is resumed may then wait for the other.
enum class ParkedWait : uint8_t {
  kNothing,    // nothing parked, or the first is to be started (posted to its lane), or it
               // waits behind a paused enqueue (which resumes it when it ends)
  kCopyTurns,  // queued with CopyTurns (Session::AwaitTurns); OnTurnsGranted resumes it
  kStaging,    // for staging room, or for its staging wait to end (Session::ReserveStaging);
               // OnStagingFreed resumes it
};

/// A download op of a submit: its bytes, on their way to the client.
struct PendingDownload {
  uint32_t op_index = 0;
  // The download's bytes in order: first the staging ranges the device fills, cut into
  // chunks at delivery (which copy them out when they are written), then the chunks it
  // fills directly, each <= kMaxChunkBytes.
  std::vector<pool::StagingLease> staged;
  std::vector<std::string> chunks;
};

/// An admitted submit's ops on their way to the device, with what Enqueue made for them
/// before enqueueing any (device memory, loaded modules), from op `next` on.
struct EnqueueWork {
  // What Enqueue made for one op before enqueueing any: a create's memory, a load's
  // module, and the device bytes reserved for either.
  struct Made {
    backend::DevicePtr fresh = 0;
    uint64_t fresh_bytes = 0;
    std::shared_ptr<backend::Module> loaded;
  };
  std::vector<Op> ops;
  std::vector<Made> made;  // one per op where the submit creates or loads; else empty
  size_t next = 0;
  bool paused = false;  // stopped before `next`: no launch-queue room, or its slice was over
};

/// One submit between Session::Submit and its OnCompleted.
struct InFlightSubmit {
  uint64_t submit_id = 0;
  bool on_device = false;  // waits for a backend completion
  uint64_t seq = 0;        // the order in which submits reached the device (Enqueue)
  // Waits for its copy turns, or behind a submit that does: not yet admitted. `request`
  // holds it meanwhile; `turns_needed` the turns it will take.
  bool parked = false;
  SubmitRequest request;
  uint8_t turns_needed = CopyTurns::kNone;
  uint8_t turns_held = CopyTurns::kNone;  // given back when the submit leaves the device
  Status status;                          // the refusal or enqueue error, if any
  std::shared_ptr<const void> payload;
  std::vector<PendingDownload> downloads;
  uint64_t download_bytes = 0;
  int first_launch_op = -1;  // the first raw kernel launch of the submit
  std::string first_launch_name;
  std::vector<uint64_t> syncs_after;         // Synchronize ids answered after this completes
  std::vector<pool::SlabRange> slab_ranges;  // busy until this submit completes
  std::vector<pool::StagingLease> staging;   // freed when the submit is delivered
  // The modules its raw launches use (and graphs' lists of them), kept loaded until it is
  // delivered: an UnloadModule behind it drops only the handle.
  std::vector<std::shared_ptr<const void>> modules_in_use;
  // Staging ranges ReserveStaging took for each op's inline bytes (by op index), before
  // Enqueue, which moves them into `staging` and `downloads`.
  std::vector<std::vector<pool::StagingLease>> staged_ops;
  // When it first found staging without room (unset: never).
  std::chrono::steady_clock::time_point staging_wait_since{};
  bool uid_inflight = false;  // charged to the identity's in-flight limit until delivered
  bool raw_counted = false;   // counted in raw_launches_in_flight_ (first_launch_op >= 0)
  // While its enqueue is paused (enqueuing_seq_ == seq): the rest of its ops.
  std::unique_ptr<EnqueueWork> paused;
};

}  // namespace ferry::session
