// The tensors a session holds, keyed by the handles its client chose.
//
// Not thread-safe: owned and used by one session on its executor.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "ferry/dtype.h"

namespace ferry::session {

struct TensorRecord {
  backend::DevicePtr ptr = 0;  // 0 for an empty tensor (no elements)
  DType dtype = DType::kInvalid;
  Shape shape;
  uint64_t elements = 0;
  uint64_t bytes = 0;
  /// Unique per creation within the session, so a graph can tell a tensor from a later
  /// one that reuses its handle.
  uint64_t generation = 0;
};

/// A recorded graph, the tensors (handle, generation) its ops use, and the modules its raw
/// launches use, which it keeps loaded (an UnloadModule drops only the handle). `modules` is
/// declared first so that the graph goes before them; a launch in flight keeps them too.
struct GraphRecord {
  std::shared_ptr<const std::vector<std::shared_ptr<backend::Module>>> modules;
  std::shared_ptr<backend::Graph> graph;
  std::vector<std::pair<uint64_t, uint64_t>> tensors;
  bool has_raw_kernels = false;
  uint64_t ops = 0;  // ops recorded into it (what the session's graph-op quota counts)
};

class HandleTable {
 public:
  /// Return the tensor for `handle`, or nullptr when no live tensor has it.
  const TensorRecord* Find(uint64_t handle) const {
    auto it = tensors_.find(handle);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  /// Insert a tensor; the handle must not be live (admission checked it).
  void Insert(uint64_t handle, TensorRecord record) {
    bytes_ += record.bytes;
    tensors_.emplace(handle, std::move(record));
  }
  /// Remove and return a live tensor.
  TensorRecord Remove(uint64_t handle) {
    auto it = tensors_.find(handle);
    TensorRecord r = std::move(it->second);
    tensors_.erase(it);
    bytes_ -= r.bytes;
    return r;
  }
  size_t size() const { return tensors_.size(); }
  /// Return the device bytes held by live tensors.
  uint64_t bytes() const { return bytes_; }
  const std::unordered_map<uint64_t, TensorRecord>& tensors() const { return tensors_; }

  /// Loaded modules and recorded graphs, by client handle.
  std::unordered_map<uint64_t, std::shared_ptr<backend::Module>>& modules() { return modules_; }
  const std::unordered_map<uint64_t, std::shared_ptr<backend::Module>>& modules() const {
    return modules_;
  }
  std::unordered_map<uint64_t, GraphRecord>& graphs() { return graphs_; }
  const std::unordered_map<uint64_t, GraphRecord>& graphs() const { return graphs_; }
  /// Ops recorded into the live graphs, together (what session-max-graph-ops bounds; about
  /// what releasing them all costs). A walk of every graph: once per use, not per op.
  uint64_t graph_ops() const {
    uint64_t total = 0;
    for (const auto& [handle, graph] : graphs_) total += graph.ops;
    return total;
  }

  /// Forget every tensor, module and graph (the device context they lived in is gone).
  void Clear() {
    tensors_.clear();
    modules_.clear();
    graphs_.clear();
    bytes_ = 0;
  }

 private:
  std::unordered_map<uint64_t, std::shared_ptr<backend::Module>> modules_;
  std::unordered_map<uint64_t, GraphRecord> graphs_;
  std::unordered_map<uint64_t, TensorRecord> tensors_;
  uint64_t bytes_ = 0;
};

}  // namespace ferry::session
