// The ops a submit carries, in the daemon's own types (the rpc layer converts from ferry.v1
// messages without copying bulk bytes). Everything here is untrusted client input until
// AdmitSubmit has accepted it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "backend/backend.h"
#include "ferry/dtype.h"
#include "ferry/status.h"

namespace ferry::session {

struct CreateTensorOp {
  uint64_t handle = 0;
  DType dtype = DType::kInvalid;
  Shape shape;
};
struct FreeTensorOp {
  uint64_t handle = 0;
};
/// Write `data` at byte `offset` of the tensor. `data` points into a message the submit
/// keeps alive until its completion.
struct UploadOp {
  uint64_t tensor = 0;
  uint64_t offset = 0;
  std::string_view data;
};
struct DownloadOp {
  uint64_t tensor = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
struct FillOp {
  uint64_t tensor = 0;
  double value = 0;
};
struct CopyOp {
  uint64_t src = 0;
  uint64_t dst = 0;
};
struct BinaryOpArgs {
  backend::BinaryOp kind = backend::BinaryOp::kAdd;
  uint64_t a = 0, b = 0, out = 0;
};
struct ScaleOp {
  uint64_t x = 0;
  double alpha = 1;
  uint64_t out = 0;
};
/// out = max(x, 0) elementwise; out may be x.
struct ReluOp {
  uint64_t x = 0, out = 0;
};
struct AxpyOp {
  double alpha = 1;
  uint64_t x = 0, y = 0;
};
struct ReduceSumOp {
  uint64_t in = 0, out = 0;
};
struct GemmOp {
  uint64_t a = 0, b = 0, c = 0;
  bool trans_a = false, trans_b = false;
  double alpha = 1, beta = 0;
};
/// Load device code; `image` points into the submit's payload.
struct LoadModuleOp {
  uint64_t handle = 0;
  backend::ModuleFormat format = backend::ModuleFormat::kPtx;
  std::string_view image;
};
struct UnloadModuleOp {
  uint64_t handle = 0;
};
/// A kernel argument as the client sent it: a tensor handle or a scalar's bytes.
struct LaunchArg {
  bool is_tensor = false;
  uint64_t tensor = 0;
  std::vector<uint8_t> scalar;
};
struct LaunchOp {
  uint64_t module = 0;
  std::string function;
  backend::LaunchConfig config;
  std::vector<LaunchArg> args;
};
struct BeginGraphOp {
  uint64_t handle = 0;
};
struct EndGraphOp {};
struct LaunchGraphOp {
  uint64_t graph = 0;
};
struct FreeGraphOp {
  uint64_t handle = 0;
};
/// Copy `length` bytes at `slab_offset` of a slab the session holds into the tensor.
struct UploadFromSlabOp {
  uint64_t tensor = 0;
  uint64_t offset = 0;
  uint64_t slab = 0;
  uint64_t slab_offset = 0;
  uint64_t length = 0;
};
/// Copy `length` bytes of the tensor at `offset` into a slab range the session holds.
struct DownloadToSlabOp {
  uint64_t tensor = 0;
  uint64_t offset = 0;
  uint64_t slab = 0;
  uint64_t slab_offset = 0;
  uint64_t length = 0;
};
/// An op the rpc layer could not even decode (unknown kind, bad enum); admission rejects
/// the submit with `reason`.
struct MalformedOp {
  Status reason;
};

/// Every op a submit may carry, declared once; each layer derives what it needs from this list
/// (Op's alternatives, OpKind, kOpTraits, the rpc layer's decoding). A row is
///   X(Name, Type, field, quick, copy, raw_kernel, batch_kernel, graphable)
/// Name: the ferry.v1 message (and its Op oneof case, v1::Op::k<Name>) and OpKind::k<Name>;
/// Type: the daemon's struct above; field: the Op oneof field, also the op's name (OpTraits);
/// the rest: OpTraits' columns, `copy` a CopyDirection. A new op gets its struct, its row
/// here, its message and oneof field in session.proto, and one overload in each visitor
/// (rpc Decode, the Admitter's Do, OpEnqueuer); a missing one does not compile.
///
/// launch_graph is not quick: a launch replays up to session-max-graph-ops recorded ops, and
/// admission and the backend check every tensor they use (milliseconds for a large graph).
/// Which messages are quick is decided per wire message (rpc IsQuick) before the session's
/// executor runs, where the session's graphs cannot be looked at, so no graph launch is.
// clang-format off
#define FERRY_OPS(X)                                                                             \
  /* Name           Type              field             quick  copy       raw    batch  graph */ \
  X(CreateTensor,   CreateTensorOp,   create_tensor,    false, kNone,     false, false, false)   \
  X(FreeTensor,     FreeTensorOp,     free_tensor,      false, kNone,     false, false, false)   \
  X(Upload,         UploadOp,         upload,           true,  kToDevice, false, false, false)   \
  X(Download,       DownloadOp,       download,         false, kToHost,   false, false, false)   \
  X(Fill,           FillOp,           fill,             true,  kNone,     false, true,  true)    \
  X(Copy,           CopyOp,           copy,             true,  kNone,     false, false, true)    \
  X(Binary,         BinaryOpArgs,     binary,           true,  kNone,     false, true,  true)    \
  X(Scale,          ScaleOp,          scale,            true,  kNone,     false, true,  true)    \
  X(Axpy,           AxpyOp,           axpy,             true,  kNone,     false, true,  true)    \
  X(ReduceSum,      ReduceSumOp,      reduce_sum,       true,  kNone,     false, false, true)    \
  X(Gemm,           GemmOp,           gemm,             false, kNone,     false, false, true)    \
  X(LoadModule,     LoadModuleOp,     load_module,      false, kNone,     true,  false, false)   \
  X(UnloadModule,   UnloadModuleOp,   unload_module,    false, kNone,     false, false, false)   \
  X(Launch,         LaunchOp,         launch,           true,  kNone,     true,  false, true)    \
  X(BeginGraph,     BeginGraphOp,     begin_graph,      false, kNone,     false, false, false)   \
  X(EndGraph,       EndGraphOp,       end_graph,        false, kNone,     false, false, true)    \
  X(LaunchGraph,    LaunchGraphOp,    launch_graph,     false, kNone,     false, false, false)   \
  X(FreeGraph,      FreeGraphOp,      free_graph,       false, kNone,     false, false, false)   \
  X(UploadFromSlab, UploadFromSlabOp, upload_from_slab, true,  kToDevice, false, false, false)   \
  X(DownloadToSlab, DownloadToSlabOp, download_to_slab, true,  kToHost,   false, false, false)   \
  X(Relu,           ReluOp,           relu,             true,  kNone,     false, false, true)
// clang-format on

/// The op types, in FERRY_OPS order, and last MalformedOp (no wire message of its own).
#define FERRY_OP_ALTERNATIVE(Name, Type, ...) Type,
using Op = std::variant<FERRY_OPS(FERRY_OP_ALTERNATIVE) MalformedOp>;
#undef FERRY_OP_ALTERNATIVE

/// What each kind of op is, for every layer that classifies ops: rpc's quick path and
/// raw-kernel check (on the wire's ops, through rpc::KindOf), copy turns, admission's graph
/// rule and Enqueue's kernel batches. One table instead of a switch per question. OpKind
/// follows Op's alternatives, in order (checked below).
#define FERRY_OP_KIND(Name, ...) k##Name,
enum class OpKind : uint8_t { FERRY_OPS(FERRY_OP_KIND) kMalformed };
#undef FERRY_OP_KIND

/// Which way an op moves bytes between host and device.
enum class CopyDirection : uint8_t { kNone, kToDevice, kToHost };

struct OpTraits {
  std::string_view name;
  /// Only enqueues device work that runs asynchronously and never blocks the thread (no
  /// allocation, no compile, no wait for a copy into pageable memory), and takes little CPU
  /// time to admit and enqueue: a submit of such ops (and few inline upload bytes) may run on
  /// the thread that read it.
  bool quick;
  /// Moves bytes between host and device, and which way (copy turns, busy accounting).
  CopyDirection copy;
  /// Loads or launches a raw kernel, which only peers allowed raw kernels may send.
  bool raw_kernel;
  /// One kernel launch of ferry's own, which a kernel batch may hold.
  bool batch_kernel;
  /// Device work that may be recorded into a graph (EndGraph ends one; a malformed op is
  /// let through to fail on its own reason).
  bool graphable;
};

#define FERRY_OP_ROW(Name, Type, field, quick, copy, raw, batch, graph) \
  {#field, quick, CopyDirection::copy, raw, batch, graph},
inline constexpr OpTraits kOpTraits[] = {
    // clang-format off
    FERRY_OPS(FERRY_OP_ROW)
    {"malformed", false, CopyDirection::kNone, false, false, true},
    // clang-format on
};
#undef FERRY_OP_ROW
static_assert(std::size(kOpTraits) == std::variant_size_v<Op>, "one row per kind of op");

constexpr const OpTraits& Traits(OpKind kind) { return kOpTraits[static_cast<size_t>(kind)]; }
inline OpKind KindOf(const Op& op) { return static_cast<OpKind>(op.index()); }

namespace internal {
template <typename T, typename... Ts>
constexpr size_t IndexIn(const std::variant<Ts...>*) {
  constexpr bool same[] = {std::is_same_v<T, Ts>...};
  for (size_t i = 0; i < sizeof...(Ts); ++i) {
    if (same[i]) return i;
  }
  return sizeof...(Ts);
}
}  // namespace internal

/// The OpKind of op type T, at compile time.
template <typename T>
inline constexpr OpKind kKindOf =
    static_cast<OpKind>(internal::IndexIn<T>(static_cast<Op*>(nullptr)));

// Each type is one alternative (a type listed twice would find its first row).
#define FERRY_OP_CHECK(Name, Type, ...) \
  static_assert(kKindOf<Type> == OpKind::k##Name, #Type " is Op's alternative k" #Name);
FERRY_OPS(FERRY_OP_CHECK)
#undef FERRY_OP_CHECK
static_assert(kKindOf<MalformedOp> == OpKind::kMalformed, "MalformedOp is Op's last alternative");

/// Bytes an op moves between host and device (0 for an op that moves none). Lengths come
/// from the wire: admission checks them.
inline uint64_t CopyBytes(const Op& any) {
  if (const auto* op = std::get_if<UploadOp>(&any)) return op->data.size();
  if (const auto* op = std::get_if<UploadFromSlabOp>(&any)) return op->length;
  if (const auto* op = std::get_if<DownloadOp>(&any)) return op->length;
  if (const auto* op = std::get_if<DownloadToSlabOp>(&any)) return op->length;
  return 0;
}

/// A submit of at most kQuickSubmitOps ops, each quick (OpTraits::quick), with at most
/// kQuickSubmitUploadBytes inline upload bytes, may be started on the thread that read it
/// (SubmitSummary::quick). Anything else is started on an io thread (Session::Submit parks it
/// when it is reached on another).
inline constexpr size_t kQuickSubmitOps = 64;
inline constexpr uint64_t kQuickSubmitUploadBytes = 64 << 10;

/// What a submit's ops add up to, for every layer that asks about the submit as a whole: rpc's
/// quick path, raw-kernel check and latency sampling, and the session's copy turns, lanes,
/// kernel batches, staging and object charges. Made once, op by op (Add), where the submit
/// is read: by the rpc layer from the wire's ops before they are decoded (rpc::Summarize), or
/// from decoded ops (Summarize) for a request made in process; carried with the submit
/// (SubmitRequest::summary), so that no layer walks the op list again to answer these.
class SubmitSummary {
 public:
  /// Count one op of `kind`. `copy_bytes`: the bytes it moves between host and device
  /// (CopyBytes); `inline_bytes`: those the message itself carries or gets back (an Upload's
  /// data, a Download's length; not a slab op's).
  void Add(OpKind kind, uint64_t copy_bytes, uint64_t inline_bytes);
  /// Mark a submit one of whose ops did not decode (counted by Add under its wire kind).
  void AddMalformed() { kinds_ |= Bit(OpKind::kMalformed); }

  uint64_t ops() const { return ops_; }
  bool Has(OpKind kind) const { return (kinds_ & Bit(kind)) != 0; }
  /// Every op quick, and the submit small enough to start on the thread that read it.
  bool quick() const {
    return ops_ <= kQuickSubmitOps && OnlyKindsWhere(&OpTraits::quick) &&
           to_device_inline_ <= kQuickSubmitUploadBytes;
  }
  /// An op that moves bytes between host and device (even 0 of them).
  bool moves_bytes() const { return (kinds_ & ~KindsWhereCopy(CopyDirection::kNone)) != 0; }
  /// A LoadModule or Launch: what only peers allowed raw kernels may send.
  bool raw_kernels() const { return (kinds_ & KindsWhere(&OpTraits::raw_kernel)) != 0; }
  /// At least one op, each a kernel launch of ferry's own (what a kernel batch may hold).
  bool kernel_ops_only() const { return ops_ > 0 && OnlyKindsWhere(&OpTraits::batch_kernel); }
  /// Bytes the submit moves each way (saturating at 2^64 - 1).
  uint64_t to_device_bytes() const { return to_device_; }
  uint64_t to_host_bytes() const { return to_host_; }
  /// Of those, what the message carries (Upload data) or gets back inline (Download).
  uint64_t inline_bytes() const { return to_device_inline_ + to_host_inline_; }
  /// Objects the submit could leave live: its creates, loads, graphs and the ops recorded
  /// into them (Session::ReserveObjects charges them before it is enqueued).
  uint64_t objects_added_at_most() const { return objects_; }

 private:
  static constexpr uint64_t Bit(OpKind kind) { return uint64_t{1} << static_cast<int>(kind); }
  static constexpr uint64_t KindsWhere(bool OpTraits::*trait) {
    uint64_t kinds = 0;
    for (size_t i = 0; i < std::size(kOpTraits); ++i) {
      if (kOpTraits[i].*trait) kinds |= Bit(static_cast<OpKind>(i));
    }
    return kinds;
  }
  static constexpr uint64_t KindsWhereCopy(CopyDirection copy) {
    uint64_t kinds = 0;
    for (size_t i = 0; i < std::size(kOpTraits); ++i) {
      if (kOpTraits[i].copy == copy) kinds |= Bit(static_cast<OpKind>(i));
    }
    return kinds;
  }
  bool OnlyKindsWhere(bool OpTraits::*trait) const { return (kinds_ & ~KindsWhere(trait)) == 0; }

  uint64_t ops_ = 0;
  uint64_t kinds_ = 0;  // Bit(kind) for each kind present
  uint64_t to_device_ = 0, to_host_ = 0;
  uint64_t to_device_inline_ = 0, to_host_inline_ = 0;
  uint64_t objects_ = 0;
  bool recording_ = false;  // between a BeginGraph and its EndGraph
};
static_assert(std::size(kOpTraits) <= 64, "SubmitSummary keeps the kinds present in 64 bits");

/// Summarize decoded ops (a request made in process; rpc summarizes the wire's ops).
SubmitSummary Summarize(const std::vector<Op>& ops);

struct SubmitRequest {
  uint64_t submit_id = 0;
  /// Not OK: the connection refuses this submit whole with this status (a policy the session
  /// does not know, such as raw kernels from a remote client); it completes in order and
  /// counts as a failed submit, and its ops are neither admitted nor enqueued.
  Status refusal;
  std::vector<Op> ops;
  /// What `ops` add up to (see SubmitSummary): set by whoever makes the request
  /// (rpc::ToSubmitRequest, or Summarize).
  SubmitSummary summary;
  /// Owns the bytes UploadOp::data points into; released when the submit completes.
  std::shared_ptr<const void> payload;
};

}  // namespace ferry::session
