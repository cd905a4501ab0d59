#include "session/graph_recorder.h"

#include <algorithm>

namespace ferry::session {

void GraphRecorder::Begin(uint64_t handle) {
  Abandon();
  recording_ = true;
  handle_ = handle;
}

bool GraphRecorder::UseRawLaunch(const std::shared_ptr<backend::Module>& module) {
  if (!recording_) return false;
  raw_ = true;
  if (std::find(modules_.begin(), modules_.end(), module) == modules_.end()) {
    modules_.push_back(module);
  }
  return true;
}

std::pair<uint64_t, GraphRecord> GraphRecorder::Finish(std::unique_ptr<backend::Graph> graph) {
  GraphRecord g;
  g.graph = std::move(graph);
  g.tensors = std::move(tensors_);
  if (!modules_.empty()) {
    g.modules =
        std::make_shared<const std::vector<std::shared_ptr<backend::Module>>>(std::move(modules_));
  }
  g.has_raw_kernels = raw_;
  g.ops = ops_;
  const uint64_t handle = handle_;
  Abandon();
  return {handle, std::move(g)};
}

void GraphRecorder::Abandon() {
  recording_ = false;
  handle_ = 0;
  ops_ = 0;
  raw_ = false;
  tensors_.clear();
  modules_.clear();
}

}  // namespace ferry::session
