// What a session learns while its stream records a graph (from a BeginGraph op to its
// EndGraph): the tensors its ops use, the modules its raw launches use, whether any of them
// is a raw launch, and how many ops it holds. The stream records the work itself
// (backend::Stream::BeginCapture / EndCapture); this is the bookkeeping that becomes the
// graph's GraphRecord.
//
// Not thread-safe: owned and used by one session on its executor.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "session/handle_table.h"

namespace ferry::session {

class GraphRecorder {
 public:
  /// A graph is being recorded (between Begin and Finish or Abandon).
  bool recording() const { return recording_; }
  /// Ops recorded into it so far (EndGraph not counted); 0 when none is being recorded.
  uint64_t ops() const { return ops_; }

  /// Start recording the graph `handle`; forgets any earlier recording.
  void Begin(uint64_t handle);
  /// While recording: one more op (every op but the EndGraph that ends it).
  void CountOp() {
    if (recording_) ++ops_;
  }
  /// While recording: an op uses tensor `handle` of `generation`; else nothing.
  void UseTensor(uint64_t handle, uint64_t generation) {
    if (recording_) tensors_.emplace_back(handle, generation);
  }
  /// While recording: a raw launch of `module` (kept loaded by the graph); false when
  /// nothing is being recorded (the caller keeps the module for its own submit instead).
  bool UseRawLaunch(const std::shared_ptr<backend::Module>& module);

  /// End the recording: the graph's record, holding `graph`, with its handle.
  std::pair<uint64_t, GraphRecord> Finish(std::unique_ptr<backend::Graph> graph);
  /// Drop the recording (an enqueue error inside it, an abort, a lost device).
  void Abandon();

 private:
  bool recording_ = false;
  uint64_t handle_ = 0;
  uint64_t ops_ = 0;
  bool raw_ = false;
  std::vector<std::pair<uint64_t, uint64_t>> tensors_;
  std::vector<std::shared_ptr<backend::Module>> modules_;  // each once
};

}  // namespace ferry::session
