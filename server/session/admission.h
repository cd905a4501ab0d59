// Admission: the whole-submit check that runs before anything of a submit is enqueued.
//
// A submit is admitted only if every op in it is valid given the session's tensors as the
// earlier ops of the same submit leave them (a submit may create, use and free a tensor),
// and if the session's device-memory quota holds at every point of it. A refused submit
// changes nothing.
#pragma once

#include <cstdint>

#include "ferry/status.h"
#include "pool/session_slabs.h"
#include "session/handle_table.h"
#include "session/ops.h"

namespace ferry::session {

struct AdmissionLimits {
  uint64_t device_bytes_quota = 0;  // the session's quota for live tensor bytes
  // Ops one submit may carry, each LaunchGraph counted as the ops its graph recorded (at
  // least one): what admitting and enqueueing the submit checks and enqueues. 0: no limit.
  uint64_t max_ops_per_submit = 0;
  // Total inline Download bytes one submit may ask for (the daemon buffers them until they
  // are sent); 0: none. DownloadToSlab bytes land in the client's slab and do not count.
  uint64_t max_download_bytes = 0;
  uint64_t max_modules = 0;  // live modules a session may hold; 0: no limit
  uint64_t max_graphs = 0;   // live graphs a session may hold; 0: no limit
  uint64_t max_tensors = 0;  // live tensors a session may hold; 0: no limit
  // Ops recorded into the session's live graphs, all of them together (so also into any one
  // graph); 0: no limit.
  uint64_t max_graph_ops = 0;
};

struct AdmissionResult {
  uint64_t peak_device_bytes = 0;  // the most the session's tensors hold during the submit
  uint64_t bytes_created = 0;      // bytes of the tensors the submit creates
  uint64_t upload_bytes = 0;
  uint64_t download_bytes = 0;         // Download and DownloadToSlab
  uint64_t inline_download_bytes = 0;  // Download only: what max_download_bytes bounds
};

/// The most bytes of device code one LoadModule may carry.
inline constexpr uint64_t kMaxModuleBytes = 64ull << 20;
/// The most arguments one kernel launch may pass.
inline constexpr size_t kMaxKernelArgs = 256;

/// The ops a LaunchGraph counts as, against max_ops_per_submit and wherever a submit's size
/// is weighed: the ops its graph recorded, at least one.
inline uint64_t LaunchGraphWeight(uint64_t graph_ops) { return graph_ops > 0 ? graph_ops : 1; }

/// Check `request` against `table`, `limits` and the session's slabs (null: it holds none,
/// so every slab op is refused). On failure the Status names the op.
Result<AdmissionResult> AdmitSubmit(const SubmitRequest& request, const HandleTable& table,
                                    const AdmissionLimits& limits,
                                    const pool::SessionSlabs* slabs = nullptr);

/// Return the byte size of a tensor of `dtype` and `shape`, or a typed error.
Result<uint64_t> TensorBytes(DType dtype, const Shape& shape, uint64_t* elements);

}  // namespace ferry::session
