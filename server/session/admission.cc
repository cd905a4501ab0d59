#include "session/admission.h"

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ferry::session {
namespace {

std::string H(uint64_t handle) { return "tensor " + std::to_string(handle); }

// The session's tensors as the ops admitted so far leave them, without touching the table.
class TableOverlay {
 public:
  explicit TableOverlay(const HandleTable& table)
      : table_(table), bytes_(table.bytes()), count_(table.size()) {}

  const TensorRecord* Find(uint64_t handle) const {
    if (auto it = created_.find(handle); it != created_.end()) return &it->second;
    if (freed_.count(handle)) return nullptr;
    return table_.Find(handle);
  }
  void Create(uint64_t handle, TensorRecord r) {
    bytes_ += r.bytes;
    ++count_;
    // A generation no real tensor has, distinct for every create of this submit.
    r.generation = (1ull << 63) + (++creates_);
    created_[handle] = std::move(r);
  }
  void Free(uint64_t handle) {
    const TensorRecord* r = Find(handle);
    bytes_ -= r->bytes;
    --count_;
    if (created_.erase(handle) == 0) freed_.insert(handle);
  }
  uint64_t bytes() const { return bytes_; }
  uint64_t count() const { return count_; }  // live tensors

 private:
  const HandleTable& table_;
  std::unordered_map<uint64_t, TensorRecord> created_;
  std::unordered_set<uint64_t> freed_;
  uint64_t bytes_;
  uint64_t count_;
  uint64_t creates_ = 0;
};

using TensorRefs = std::vector<std::pair<uint64_t, uint64_t>>;  // (handle, generation)

// Modules and graphs as the ops admitted so far leave them.
class ObjectOverlay {
 public:
  explicit ObjectOverlay(const HandleTable& table) : table_(table) {}

  bool ModuleLive(uint64_t h) const {
    if (modules_created_.count(h)) return true;
    if (modules_freed_.count(h)) return false;
    return table_.modules().count(h) > 0;
  }
  // `freed` holds table handles freed by this submit and stays so when the handle is created
  // again (the table's object is gone either way); `created` holds the live new ones.
  void CreateModule(uint64_t h) { modules_created_.insert(h); }
  void FreeModule(uint64_t h) {
    if (!modules_created_.erase(h)) modules_freed_.insert(h);
  }
  // Live modules and graphs once the ops admitted so far have run (`freed` is a subset of
  // the table's handles).
  uint64_t module_count() const {
    return table_.modules().size() - modules_freed_.size() + modules_created_.size();
  }
  uint64_t graph_count() const {
    return table_.graphs().size() - graphs_freed_.size() + graphs_created_.size();
  }
  // Return the tensors graph `h` uses, or nullptr when no live graph has that handle.
  const TensorRefs* Graph(uint64_t h) const {
    if (auto it = graphs_created_.find(h); it != graphs_created_.end()) return &it->second.first;
    if (graphs_freed_.count(h)) return nullptr;
    auto it = table_.graphs().find(h);
    return it == table_.graphs().end() ? nullptr : &it->second.tensors;
  }
  // Return the ops graph `h` recorded (0 when no live graph has that handle).
  uint64_t GraphOps(uint64_t h) const {
    if (auto it = graphs_created_.find(h); it != graphs_created_.end()) return it->second.second;
    if (graphs_freed_.count(h)) return 0;
    auto it = table_.graphs().find(h);
    return it == table_.graphs().end() ? 0 : it->second.ops;
  }
  // `h` is not live (admission checked it).
  void CreateGraph(uint64_t h, TensorRefs refs, uint64_t ops) {
    graphs_created_[h] = {std::move(refs), ops};
    created_ops_ += ops;
  }
  // Ops recorded into the live graphs once the ops admitted so far have run. The table's
  // total is summed once per submit (at the first call), the submit's own changes kept as
  // they come: a submit of many EndGraphs costs no walk of every graph at each.
  uint64_t graph_ops() const {
    if (!table_ops_) table_ops_ = table_.graph_ops();
    return *table_ops_ - freed_ops_ + created_ops_;
  }
  // `h` is live (admission checked it).
  void FreeGraph(uint64_t h) {
    if (auto it = graphs_created_.find(h); it != graphs_created_.end()) {
      created_ops_ -= it->second.second;
      graphs_created_.erase(it);
    } else if (graphs_freed_.insert(h).second) {
      auto t = table_.graphs().find(h);
      if (t != table_.graphs().end()) freed_ops_ += t->second.ops;
    }
  }

 private:
  const HandleTable& table_;
  std::unordered_set<uint64_t> modules_created_, modules_freed_;
  std::unordered_map<uint64_t, std::pair<TensorRefs, uint64_t>> graphs_created_;  // (refs, ops)
  std::unordered_set<uint64_t> graphs_freed_;
  mutable std::optional<uint64_t> table_ops_;  // graph_ops: the table's graphs' ops, summed once
  uint64_t freed_ops_ = 0;                     // of the table's graphs this submit frees
  uint64_t created_ops_ = 0;                   // of the graphs this submit creates, still live
};

// The ops a graph may record (device work: ops.h's table). At namespace scope, not a member of
// Admitter: clang 14 does not instantiate a constexpr member template that a generic lambda in the
// class uses before its definition (the sanitizer builds are clang's; undefined references).
template <typename T>
constexpr bool IsGraphable() {
  return Traits(kKindOf<T>).graphable;
}

class Admitter {
 public:
  Admitter(const HandleTable& table, const AdmissionLimits& limits, const pool::SessionSlabs* slabs,
           uint64_t ops)
      : overlay_(table), objects_(table), limits_(limits), slabs_(slabs), work_(ops) {
    result_.peak_device_bytes = table.bytes();
  }

  Status Check(const Op& op, int index) {
    index_ = index;
    return std::visit(
        [this](const auto& o) -> Status {
          using T = std::decay_t<decltype(o)>;
          if (capturing_ && !IsGraphable<T>()) {
            return Status(ErrorKind::kInvalidArgument,
                          "only device work (fill, copy, arithmetic, reductions, gemm, "
                          "launch) may be recorded into a graph");
          }
          if (capturing_ && !std::is_same_v<T, EndGraphOp>) {
            ++capture_ops_;
            if (limits_.max_graph_ops && capture_ops_ > limits_.max_graph_ops) {
              return GraphOpsExceeded(capture_ops_);
            }
          }
          return Do(o);
        },
        op);
  }
  // Check what only the end of the submit can tell.
  Status Finish() {
    if (capturing_) {
      return Status(ErrorKind::kInvalidArgument, "BeginGraph without EndGraph")
          .WithOpIndex(capture_begin_);
    }
    return Status::Ok();
  }
  AdmissionResult result() const { return result_; }

 private:
  Status GraphOpsExceeded(uint64_t ops) const {
    return Status(ErrorKind::kQuotaExceeded,
                  "recording this graph would take the ops recorded into the session's graphs "
                  "to " +
                      std::to_string(ops) + ", past its limit of " +
                      std::to_string(limits_.max_graph_ops) +
                      " (ferryd --session-max-graph-ops); free graphs first");
  }

  Result<const TensorRecord*> Live(uint64_t handle) {
    if (handle == 0) return Status(ErrorKind::kInvalidHandle, "handle 0 is never valid");
    const TensorRecord* r = overlay_.Find(handle);
    if (!r) return Status(ErrorKind::kInvalidHandle, H(handle) + " does not exist");
    if (capturing_) capture_refs_.emplace_back(handle, r->generation);
    return r;
  }
  Result<const TensorRecord*> LiveFloat(uint64_t handle) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* r, Live(handle));
    if (!IsFloatingPoint(r->dtype)) {
      return Status(
          ErrorKind::kDtypeMismatch,
          H(handle) + " is " + std::string(DTypeName(r->dtype)) + "; this op takes f32 or f64");
    }
    return r;
  }
  static Status SameLayout(uint64_t ha, const TensorRecord* a, uint64_t hb, const TensorRecord* b) {
    if (a->dtype != b->dtype) {
      return Status(ErrorKind::kDtypeMismatch, H(ha) + " is " + std::string(DTypeName(a->dtype)) +
                                                   " but " + H(hb) + " is " +
                                                   std::string(DTypeName(b->dtype)));
    }
    if (!(a->shape == b->shape)) {
      return Status(ErrorKind::kShapeMismatch, H(ha) + " has shape " + a->shape.ToString() +
                                                   " but " + H(hb) + " has shape " +
                                                   b->shape.ToString());
    }
    return Status::Ok();
  }
  // A live float tensor `in` and a live tensor `out` of its dtype and shape (the operands of
  // an elementwise op of one input).
  Status FloatAndSameLayout(uint64_t in, uint64_t out) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* x, LiveFloat(in));
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* o, Live(out));
    return SameLayout(in, x, out, o);
  }
  static Status InRange(uint64_t handle, const TensorRecord* r, uint64_t offset, uint64_t length) {
    uint64_t end = 0;
    if (!CheckedAdd(offset, length, &end) || end > r->bytes) {
      return Status(ErrorKind::kOutOfRange, "bytes [" + std::to_string(offset) + ", +" +
                                                std::to_string(length) + ") are outside " +
                                                H(handle) + " of " + std::to_string(r->bytes) +
                                                " bytes");
    }
    return Status::Ok();
  }

  Status Do(const CreateTensorOp& op) {
    if (op.handle == 0) return Status(ErrorKind::kInvalidHandle, "handle 0 is never valid");
    if (overlay_.Find(op.handle)) {
      return Status(ErrorKind::kInvalidHandle, H(op.handle) + " already exists");
    }
    TensorRecord r;
    r.dtype = op.dtype;
    r.shape = op.shape;
    FERRY_ASSIGN_OR_RETURN(r.bytes, TensorBytes(op.dtype, op.shape, &r.elements));
    if (limits_.max_tensors && overlay_.count() >= limits_.max_tensors) {
      return Status(ErrorKind::kQuotaExceeded,
                    "creating " + H(op.handle) + " would take the session past " +
                        std::to_string(limits_.max_tensors) +
                        " live tensors (ferryd --session-max-tensors); free some first");
    }
    if (overlay_.bytes() + r.bytes > limits_.device_bytes_quota) {
      return Status(
          ErrorKind::kQuotaExceeded,
          "creating " + H(op.handle) + " (" + std::to_string(r.bytes) +
              " bytes) would take the session to " + std::to_string(overlay_.bytes() + r.bytes) +
              " bytes, over its device quota of " + std::to_string(limits_.device_bytes_quota));
    }
    result_.bytes_created += r.bytes;
    overlay_.Create(op.handle, std::move(r));
    if (overlay_.bytes() > result_.peak_device_bytes) {
      result_.peak_device_bytes = overlay_.bytes();
    }
    return Status::Ok();
  }
  Status Do(const FreeTensorOp& op) {
    FERRY_ASSIGN_OR_RETURN([[maybe_unused]] const TensorRecord* r, Live(op.handle));
    overlay_.Free(op.handle);
    ++frees_;
    return Status::Ok();
  }
  Status Do(const UploadOp& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* r, Live(op.tensor));
    FERRY_RETURN_IF_ERROR(InRange(op.tensor, r, op.offset, op.data.size()));
    result_.upload_bytes += op.data.size();
    return Status::Ok();
  }
  Status Do(const DownloadOp& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* r, Live(op.tensor));
    FERRY_RETURN_IF_ERROR(InRange(op.tensor, r, op.offset, op.length));
    result_.download_bytes += op.length;
    result_.inline_download_bytes += op.length;
    if (limits_.max_download_bytes && result_.inline_download_bytes > limits_.max_download_bytes) {
      return Status(ErrorKind::kQuotaExceeded, "the submit downloads more than " +
                                                   std::to_string(limits_.max_download_bytes) +
                                                   " bytes");
    }
    return Status::Ok();
  }
  Status Do(const FillOp& op) {
    FERRY_ASSIGN_OR_RETURN([[maybe_unused]] const TensorRecord* r, Live(op.tensor));
    return Status::Ok();
  }
  Status Do(const CopyOp& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* src, Live(op.src));
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* dst, Live(op.dst));
    if (src->dtype != dst->dtype) return SameLayout(op.src, src, op.dst, dst);
    if (src->elements != dst->elements) {
      return Status(ErrorKind::kShapeMismatch, H(op.src) + " has " + std::to_string(src->elements) +
                                                   " elements but " + H(op.dst) + " has " +
                                                   std::to_string(dst->elements));
    }
    return Status::Ok();
  }
  Status Do(const BinaryOpArgs& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* a, LiveFloat(op.a));
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* b, LiveFloat(op.b));
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* out, Live(op.out));
    FERRY_RETURN_IF_ERROR(SameLayout(op.a, a, op.b, b));
    return SameLayout(op.a, a, op.out, out);
  }
  Status Do(const ScaleOp& op) { return FloatAndSameLayout(op.x, op.out); }
  Status Do(const ReluOp& op) { return FloatAndSameLayout(op.x, op.out); }
  Status Do(const AxpyOp& op) { return FloatAndSameLayout(op.x, op.y); }
  Status Do(const ReduceSumOp& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* in, LiveFloat(op.in));
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* out, Live(op.out));
    if (in->dtype != out->dtype) {
      return Status(ErrorKind::kDtypeMismatch, H(op.out) + " must have the dtype of " + H(op.in));
    }
    if (out->elements != 1) {
      return Status(
          ErrorKind::kShapeMismatch,
          H(op.out) + " must hold exactly one element, it has " + std::to_string(out->elements));
    }
    if (op.in == op.out && in->elements != 1) {
      return Status(ErrorKind::kInvalidArgument, "the output of a sum may not be its input");
    }
    return Status::Ok();
  }
  Status Do(const GemmOp& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* a, LiveFloat(op.a));
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* b, LiveFloat(op.b));
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* c, LiveFloat(op.c));
    if (a->dtype != b->dtype || a->dtype != c->dtype) {
      return Status(ErrorKind::kDtypeMismatch, "gemm operands must share one dtype");
    }
    if (a->shape.rank() != 2 || b->shape.rank() != 2 || c->shape.rank() != 2) {
      return Status(ErrorKind::kShapeMismatch, "gemm operands must be rank 2");
    }
    if (op.c == op.a || op.c == op.b) {
      return Status(ErrorKind::kInvalidArgument, "gemm output may not alias an input");
    }
    int64_t m = op.trans_a ? a->shape.dim(1) : a->shape.dim(0);
    int64_t ka = op.trans_a ? a->shape.dim(0) : a->shape.dim(1);
    int64_t kb = op.trans_b ? b->shape.dim(1) : b->shape.dim(0);
    int64_t n = op.trans_b ? b->shape.dim(0) : b->shape.dim(1);
    if (ka != kb || c->shape.dim(0) != m || c->shape.dim(1) != n) {
      return Status(ErrorKind::kShapeMismatch,
                    "gemm shapes do not fit: op(a) " + std::to_string(m) + "x" +
                        std::to_string(ka) + ", op(b) " + std::to_string(kb) + "x" +
                        std::to_string(n) + ", c " + c->shape.ToString());
    }
    return Status::Ok();
  }
  Status Do(const LoadModuleOp& op) {
    if (op.handle == 0) return Status(ErrorKind::kInvalidHandle, "module handle 0 is never valid");
    if (objects_.ModuleLive(op.handle)) {
      return Status(ErrorKind::kInvalidHandle,
                    "module " + std::to_string(op.handle) + " already exists");
    }
    if (op.image.empty()) return Status(ErrorKind::kInvalidArgument, "empty module image");
    if (op.image.size() > kMaxModuleBytes) {
      return Status(ErrorKind::kQuotaExceeded,
                    "module image above " + std::to_string(kMaxModuleBytes) + " bytes");
    }
    objects_.CreateModule(op.handle);
    if (limits_.max_modules && objects_.module_count() > limits_.max_modules) {
      return Status(ErrorKind::kQuotaExceeded, "the session may hold at most " +
                                                   std::to_string(limits_.max_modules) +
                                                   " modules (ferryd --session-max-modules)");
    }
    return Status::Ok();
  }
  Status Do(const UnloadModuleOp& op) {
    if (!objects_.ModuleLive(op.handle)) {
      return Status(ErrorKind::kInvalidHandle,
                    "module " + std::to_string(op.handle) + " does not exist");
    }
    objects_.FreeModule(op.handle);
    return Status::Ok();
  }
  Status Do(const LaunchOp& op) {
    if (!objects_.ModuleLive(op.module)) {
      return Status(ErrorKind::kInvalidHandle,
                    "module " + std::to_string(op.module) + " does not exist");
    }
    if (op.function.empty() || op.function.size() > 1024) {
      return Status(ErrorKind::kInvalidArgument, "bad kernel function name");
    }
    if (op.args.size() > kMaxKernelArgs) {
      return Status(ErrorKind::kInvalidArgument,
                    "more than " + std::to_string(kMaxKernelArgs) + " kernel arguments");
    }
    for (const LaunchArg& a : op.args) {
      if (a.is_tensor) FERRY_RETURN_IF_ERROR(Live(a.tensor).status());
    }
    return Status::Ok();
  }
  Status Do(const BeginGraphOp& op) {
    if (capturing_) return Status(ErrorKind::kInvalidArgument, "BeginGraph inside a graph");
    if (op.handle == 0) return Status(ErrorKind::kInvalidHandle, "graph handle 0 is never valid");
    if (objects_.Graph(op.handle)) {
      return Status(ErrorKind::kInvalidHandle,
                    "graph " + std::to_string(op.handle) + " already exists");
    }
    capturing_ = true;
    capture_handle_ = op.handle;
    capture_begin_ = index_;
    capture_refs_.clear();
    capture_ops_ = 0;
    return Status::Ok();
  }
  Status Do(const EndGraphOp&) {
    if (!capturing_) return Status(ErrorKind::kInvalidArgument, "EndGraph without BeginGraph");
    capturing_ = false;
    graphs_checked_.erase(capture_handle_);
    objects_.CreateGraph(capture_handle_, std::move(capture_refs_), capture_ops_);
    capture_refs_.clear();
    if (limits_.max_graph_ops) {
      const uint64_t total = objects_.graph_ops();
      if (total > limits_.max_graph_ops) return GraphOpsExceeded(total);
    }
    if (limits_.max_graphs && objects_.graph_count() > limits_.max_graphs) {
      return Status(ErrorKind::kQuotaExceeded, "the session may hold at most " +
                                                   std::to_string(limits_.max_graphs) +
                                                   " graphs (ferryd --session-max-graphs)");
    }
    return Status::Ok();
  }
  // A graph launch replays every op the graph recorded: admission checks each tensor they
  // use again, the backend checks each range again (the CUDA backend under its device-wide
  // lock) and the device runs them all. So it counts toward the submit's ops as the ops its
  // graph recorded (at least one), and the limit on ops per submit bounds that work as it
  // bounds a submit of those ops themselves (docs/protocol.md, "Limits"). Checked before the
  // tensors, so that a submit past it costs no more than this count to refuse.
  Status Do(const LaunchGraphOp& op) {
    const TensorRefs* refs = objects_.Graph(op.graph);
    if (!refs) {
      return Status(ErrorKind::kInvalidHandle,
                    "graph " + std::to_string(op.graph) + " does not exist");
    }
    const uint64_t ops = LaunchGraphWeight(objects_.GraphOps(op.graph));
    work_ += ops - 1;  // the launch itself is counted already
    if (limits_.max_ops_per_submit && work_ > limits_.max_ops_per_submit) {
      return Status(ErrorKind::kQuotaExceeded,
                    "a submit may carry at most " + std::to_string(limits_.max_ops_per_submit) +
                        " ops, counting each LaunchGraph as the ops its graph recorded; with "
                        "this launch of graph " +
                        std::to_string(op.graph) + " (" + std::to_string(ops) +
                        " ops) this one has at least " + std::to_string(work_) +
                        " (ferryd --session-max-submit-ops); launch it from more submits");
    }
    // No tensor was freed since this submit last found the graph's tensors live (creates
    // only make live handles that were not): they still are. A free, or the graph recorded
    // again, checks them again.
    if (auto it = graphs_checked_.find(op.graph);
        it != graphs_checked_.end() && it->second == frees_) {
      return Status::Ok();
    }
    for (const auto& [handle, generation] : *refs) {
      const TensorRecord* r = overlay_.Find(handle);
      if (!r || r->generation != generation) {
        return Status(ErrorKind::kInvalidHandle,
                      "graph " + std::to_string(op.graph) + " uses " + H(handle) +
                          ", which was freed after the graph was recorded");
      }
    }
    graphs_checked_[op.graph] = frees_;
    return Status::Ok();
  }
  Status Do(const FreeGraphOp& op) {
    if (!objects_.Graph(op.handle)) {
      return Status(ErrorKind::kInvalidHandle,
                    "graph " + std::to_string(op.handle) + " does not exist");
    }
    graphs_checked_.erase(op.handle);
    objects_.FreeGraph(op.handle);
    return Status::Ok();
  }
  Status Do(const MalformedOp& op) { return op.reason; }
  Status Do(const UploadFromSlabOp& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* r, Live(op.tensor));
    FERRY_RETURN_IF_ERROR(InRange(op.tensor, r, op.offset, op.length));
    FERRY_RETURN_IF_ERROR(SlabRange({op.slab, op.slab_offset, op.length}, false));
    result_.upload_bytes += op.length;
    return Status::Ok();
  }
  Status Do(const DownloadToSlabOp& op) {
    FERRY_ASSIGN_OR_RETURN(const TensorRecord* r, Live(op.tensor));
    FERRY_RETURN_IF_ERROR(InRange(op.tensor, r, op.offset, op.length));
    FERRY_RETURN_IF_ERROR(SlabRange({op.slab, op.slab_offset, op.length}, true));
    result_.download_bytes += op.length;
    return Status::Ok();
  }
  // Check a slab range against the session's slabs (owned, in bounds, not busy) and against
  // the ranges earlier ops of this submit use: a range the device writes may overlap no
  // other; ranges it only reads may overlap each other.
  Status SlabRange(const pool::SlabRange& r, bool written) {
    if (!slabs_) {
      return Status(ErrorKind::kInvalidHandle, "slab " + std::to_string(r.slab) +
                                                   " is not held by this session (it holds none)");
    }
    FERRY_RETURN_IF_ERROR(slabs_->Check(r));
    if (r.length == 0) return Status::Ok();
    for (const auto& [other, other_written] : slab_ranges_) {
      if (other.slab != r.slab || !(written || other_written)) continue;
      if (r.offset < other.offset + other.length && other.offset < r.offset + r.length) {
        return Status(ErrorKind::kBusy, "slab " + std::to_string(r.slab) + " bytes [" +
                                            std::to_string(r.offset) + ", +" +
                                            std::to_string(r.length) +
                                            ") overlap a range an earlier op of this submit "
                                            "uses");
      }
    }
    slab_ranges_.emplace_back(r, written);
    return Status::Ok();
  }

  TableOverlay overlay_;
  ObjectOverlay objects_;
  const AdmissionLimits& limits_;
  const pool::SessionSlabs* slabs_;
  std::vector<std::pair<pool::SlabRange, bool>> slab_ranges_;  // (range, written)
  AdmissionResult result_;
  int index_ = 0;
  bool capturing_ = false;
  uint64_t capture_handle_ = 0;
  int capture_begin_ = 0;
  uint64_t capture_ops_ = 0;  // ops recorded into the graph being recorded
  TensorRefs capture_refs_;
  // The submit's ops, each LaunchGraph counted as the ops its graph recorded (those admitted
  // so far; every other op counted from the start).
  uint64_t work_;
  uint64_t frees_ = 0;  // tensors freed by the ops admitted so far
  // Graphs launched by the ops admitted so far whose tensors were all live: the value of
  // frees_ when they were checked.
  std::unordered_map<uint64_t, uint64_t> graphs_checked_;
};

}  // namespace

Result<uint64_t> TensorBytes(DType dtype, const Shape& shape, uint64_t* elements) {
  size_t elem = DTypeSize(dtype);
  if (elem == 0) return Status(ErrorKind::kInvalidArgument, "invalid dtype");
  // Cap at 2^48 bytes: far above any device, far below overflow.
  constexpr uint64_t kMaxBytes = 1ull << 48;
  FERRY_ASSIGN_OR_RETURN(uint64_t count, shape.ElementCount(kMaxBytes / elem));
  *elements = count;
  return count * elem;
}

Result<AdmissionResult> AdmitSubmit(const SubmitRequest& request, const HandleTable& table,
                                    const AdmissionLimits& limits,
                                    const pool::SessionSlabs* slabs) {
  if (limits.max_ops_per_submit && request.ops.size() > limits.max_ops_per_submit) {
    return Status(ErrorKind::kQuotaExceeded,
                  "a submit may carry at most " + std::to_string(limits.max_ops_per_submit) +
                      " ops, this one has " + std::to_string(request.ops.size()) +
                      " (ferryd --session-max-submit-ops)");
  }
  Admitter admitter(table, limits, slabs, request.ops.size());
  for (size_t i = 0; i < request.ops.size(); ++i) {
    Status s = admitter.Check(request.ops[i], static_cast<int>(i));
    if (!s.ok()) return s.WithOpIndex(static_cast<int>(i));
  }
  FERRY_RETURN_IF_ERROR(admitter.Finish());
  return admitter.result();
}

}  // namespace ferry::session
