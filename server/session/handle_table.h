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
  /// Return the device bytes the session is charged for: its live tensors' and its modules'
  /// (module_bytes()).
  uint64_t bytes() const { return bytes_ + module_bytes_; }
  /// Return the device bytes charged for modules: each module handle's Module::device_bytes,
  /// and a module's once more while only graphs hold it (its handles unloaded).
  uint64_t module_bytes() const { return module_bytes_; }
  const std::unordered_map<uint64_t, TensorRecord>& tensors() const { return tensors_; }

  /// Loaded modules and recorded graphs, by client handle.
  const std::unordered_map<uint64_t, std::shared_ptr<backend::Module>>& modules() const {
    return modules_;
  }
  const std::unordered_map<uint64_t, GraphRecord>& graphs() const { return graphs_; }

  /// Insert a loaded module under `handle`, which must not be live; its device bytes are
  /// charged from now on (the caller reserved them).
  void InsertModule(uint64_t handle, std::shared_ptr<backend::Module> module) {
    Holders& h = holders_[module.get()];
    ++h.handles;
    h.charged += module->device_bytes();
    module_bytes_ += module->device_bytes();
    modules_.emplace(handle, std::move(module));
  }
  /// Remove the module of `handle`, if live; return the bytes no longer charged for it.
  /// While a graph of the session still holds the module (so its memory stays), its last
  /// handle's bytes stay charged until the last such graph goes (RemoveGraph).
  uint64_t RemoveModule(uint64_t handle) {
    auto it = modules_.find(handle);
    if (it == modules_.end()) return 0;
    // Held here until the bytes are counted: the handle may have been the module's last
    // owner.
    const std::shared_ptr<backend::Module> module = std::move(it->second);
    modules_.erase(it);
    Holders& h = holders_[module.get()];
    --h.handles;
    // The graphs keep one module's bytes charged.
    const uint64_t released = h.handles == 0 && h.graphs > 0 ? h.charged - module->device_bytes()
                                                             : module->device_bytes();
    return Release(module.get(), released);
  }
  /// Insert a recorded graph under `handle`, which must not be live.
  void InsertGraph(uint64_t handle, GraphRecord graph) {
    if (graph.modules) {
      for (const auto& m : *graph.modules) ++holders_[m.get()].graphs;
    }
    graphs_[handle] = std::move(graph);
  }
  /// Remove the graph of `handle`, if live; return the bytes no longer charged for the
  /// modules that only it held.
  uint64_t RemoveGraph(uint64_t handle) {
    auto it = graphs_.find(handle);
    if (it == graphs_.end()) return 0;
    GraphRecord graph = std::move(it->second);
    graphs_.erase(it);
    uint64_t released = 0;
    if (graph.modules) {
      for (const auto& m : *graph.modules) {
        Holders& h = holders_[m.get()];
        --h.graphs;
        released += Release(m.get(), h.handles == 0 && h.graphs == 0 ? h.charged : 0);
      }
    }
    return released;
  }
  /// Ops recorded into the live graphs, together (what session-max-graph-ops bounds; about
  /// what releasing them all costs). A walk of every graph: once per use, not per op.
  uint64_t graph_ops() const {
    uint64_t total = 0;
    for (const auto& [handle, graph] : graphs_) total += graph.ops;
    return total;
  }

  /// Forget every tensor, module and graph (the device context they lived in is gone, or
  /// the session is): the caller releases bytes() first.
  void Clear() {
    tensors_.clear();
    graphs_.clear();
    modules_.clear();
    holders_.clear();
    bytes_ = 0;
    module_bytes_ = 0;
  }

 private:
  // What holds one module in this session, and the bytes charged for it.
  struct Holders {
    uint64_t handles = 0;
    uint64_t graphs = 0;
    uint64_t charged = 0;
  };
  // Stop charging `bytes` of `module`; forget it once nothing of the session holds it.
  uint64_t Release(const backend::Module* module, uint64_t bytes) {
    auto it = holders_.find(module);
    it->second.charged -= bytes;
    module_bytes_ -= bytes;
    if (it->second.handles == 0 && it->second.graphs == 0) holders_.erase(it);
    return bytes;
  }

  std::unordered_map<uint64_t, std::shared_ptr<backend::Module>> modules_;
  // By module: a module held here is alive (a handle or a graph owns it), so its address
  // names it.
  std::unordered_map<const backend::Module*, Holders> holders_;
  uint64_t module_bytes_ = 0;
  std::unordered_map<uint64_t, GraphRecord> graphs_;
  std::unordered_map<uint64_t, TensorRecord> tensors_;
  uint64_t bytes_ = 0;
};

}  // namespace ferry::session
