// Enqueue one admitted op on the session's stream: one function per kind of op, which
// Session::EnqueueOp dispatches to with std::visit (as LevelDB's WriteBatch::Iterate drives a
// Handler). Adding an op adds its overload to op_enqueuer.cc (declared here from FERRY_OPS).
#pragma once

#include <cstdint>
#include <memory>

#include "session/ops.h"
#include "session/session.h"

namespace ferry::session {

/// Enqueues op `index` of the submit `record` is for, on the session's executor, inside
/// Session::EnqueueOps (which has checked room on the stream, lanes and batches). Made for
/// one op and used once. It reads and changes the session's state as the session itself
/// would (it is the session's friend): the handle table, the graph being recorded, the
/// counters. Every op was admitted (AdmitSubmit) against the table as the submit's earlier
/// ops leave it, so the handles it looks up exist; an error is the backend's refusal or a
/// device fault, and the caller gives it the op's index.
class OpEnqueuer {
 public:
  /// `fresh`: the memory Enqueue allocated for a CreateTensorOp; `loaded`: the module it
  /// loaded for a LoadModuleOp (both empty for any other op).
  OpEnqueuer(Session& session, InFlightSubmit& record, uint32_t index, backend::DevicePtr fresh,
             std::shared_ptr<backend::Module> loaded)
      : s_(session), record_(record), index_(index), fresh_(fresh), loaded_(std::move(loaded)) {}

  // One per FERRY_OPS row, each defined in op_enqueuer.cc (a row without one does not link).
#define FERRY_OP_ENQUEUE(Name, Type, ...) Status operator()(const Type& op);
  FERRY_OPS(FERRY_OP_ENQUEUE)
#undef FERRY_OP_ENQUEUE
  Status operator()(const MalformedOp& op);

 private:
  // The live tensor `handle`. Every tensor an op touches goes through here, so a graph being
  // recorded learns which tensors (and which generation of each handle) it uses.
  const TensorRecord* Use(uint64_t handle);
  backend::DevicePtr PtrOf(uint64_t handle) { return Use(handle)->ptr; }
  // One kernel launch enqueued (the session's kernel_launches counter).
  void CountLaunch();
  // The op's staging ranges (ReserveStaging), or null where it has none (the direct path).
  std::vector<pool::StagingLease>* Staged();

  Session& s_;
  InFlightSubmit& record_;
  const uint32_t index_;
  const backend::DevicePtr fresh_;
  std::shared_ptr<backend::Module> loaded_;
};

}  // namespace ferry::session
