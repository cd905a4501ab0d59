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

using Op = std::variant<CreateTensorOp, FreeTensorOp, UploadOp, DownloadOp, FillOp, CopyOp,
                        BinaryOpArgs, ScaleOp, AxpyOp, ReduceSumOp, GemmOp, LoadModuleOp,
                        UnloadModuleOp, LaunchOp, BeginGraphOp, EndGraphOp, LaunchGraphOp,
                        FreeGraphOp, UploadFromSlabOp, DownloadToSlabOp, MalformedOp>;

/// What each kind of op is, for every layer that classifies ops: rpc's quick path and
/// raw-kernel check (on the wire's ops, through rpc::KindOf), copy turns, admission's graph
/// rule and Enqueue's kernel batches. One table instead of a switch per question; a new op
/// gets its row here and every layer asks the same row. OpKind follows Op's alternatives,
/// in order (checked below).
enum class OpKind : uint8_t {
  kCreateTensor,
  kFreeTensor,
  kUpload,
  kDownload,
  kFill,
  kCopy,
  kBinary,
  kScale,
  kAxpy,
  kReduceSum,
  kGemm,
  kLoadModule,
  kUnloadModule,
  kLaunch,
  kBeginGraph,
  kEndGraph,
  kLaunchGraph,
  kFreeGraph,
  kUploadFromSlab,
  kDownloadToSlab,
  kMalformed,
};

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

inline constexpr OpTraits kOpTraits[] = {
    // name              quick  copy                        raw    batch  graph
    {"create_tensor", false, CopyDirection::kNone, false, false, false},
    {"free_tensor", false, CopyDirection::kNone, false, false, false},
    {"upload", true, CopyDirection::kToDevice, false, false, false},
    {"download", false, CopyDirection::kToHost, false, false, false},
    {"fill", true, CopyDirection::kNone, false, true, true},
    {"copy", true, CopyDirection::kNone, false, false, true},
    {"binary", true, CopyDirection::kNone, false, true, true},
    {"scale", true, CopyDirection::kNone, false, true, true},
    {"axpy", true, CopyDirection::kNone, false, true, true},
    {"reduce_sum", true, CopyDirection::kNone, false, false, true},
    {"gemm", false, CopyDirection::kNone, false, false, true},
    {"load_module", false, CopyDirection::kNone, true, false, false},
    {"unload_module", false, CopyDirection::kNone, false, false, false},
    {"launch", true, CopyDirection::kNone, true, false, true},
    {"begin_graph", false, CopyDirection::kNone, false, false, false},
    {"end_graph", false, CopyDirection::kNone, false, false, true},
    // Not quick: a launch replays up to session-max-graph-ops recorded ops, and admission and
    // the backend check every tensor they use (milliseconds for a large graph). Which
    // messages are quick is decided per wire message (rpc IsQuick) before the session's
    // executor runs, where the session's graphs cannot be looked at, so no graph launch is.
    {"launch_graph", false, CopyDirection::kNone, false, false, false},
    {"free_graph", false, CopyDirection::kNone, false, false, false},
    {"upload_from_slab", true, CopyDirection::kToDevice, false, false, false},
    {"download_to_slab", true, CopyDirection::kToHost, false, false, false},
    {"malformed", false, CopyDirection::kNone, false, false, true},
};
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

static_assert(kKindOf<CreateTensorOp> == OpKind::kCreateTensor &&
                  kKindOf<FreeTensorOp> == OpKind::kFreeTensor &&
                  kKindOf<UploadOp> == OpKind::kUpload &&
                  kKindOf<DownloadOp> == OpKind::kDownload && kKindOf<FillOp> == OpKind::kFill &&
                  kKindOf<CopyOp> == OpKind::kCopy && kKindOf<BinaryOpArgs> == OpKind::kBinary &&
                  kKindOf<ScaleOp> == OpKind::kScale && kKindOf<AxpyOp> == OpKind::kAxpy &&
                  kKindOf<ReduceSumOp> == OpKind::kReduceSum && kKindOf<GemmOp> == OpKind::kGemm &&
                  kKindOf<LoadModuleOp> == OpKind::kLoadModule &&
                  kKindOf<UnloadModuleOp> == OpKind::kUnloadModule &&
                  kKindOf<LaunchOp> == OpKind::kLaunch &&
                  kKindOf<BeginGraphOp> == OpKind::kBeginGraph &&
                  kKindOf<EndGraphOp> == OpKind::kEndGraph &&
                  kKindOf<LaunchGraphOp> == OpKind::kLaunchGraph &&
                  kKindOf<FreeGraphOp> == OpKind::kFreeGraph &&
                  kKindOf<UploadFromSlabOp> == OpKind::kUploadFromSlab &&
                  kKindOf<DownloadToSlabOp> == OpKind::kDownloadToSlab &&
                  kKindOf<MalformedOp> == OpKind::kMalformed,
              "OpKind follows Op's alternatives");

/// Bytes an op moves between host and device (0 for an op that moves none). Lengths come
/// from the wire: admission checks them.
inline uint64_t CopyBytes(const Op& any) {
  if (const auto* op = std::get_if<UploadOp>(&any)) return op->data.size();
  if (const auto* op = std::get_if<UploadFromSlabOp>(&any)) return op->length;
  if (const auto* op = std::get_if<DownloadOp>(&any)) return op->length;
  if (const auto* op = std::get_if<DownloadToSlabOp>(&any)) return op->length;
  return 0;
}

struct SubmitRequest {
  uint64_t submit_id = 0;
  /// Not OK: the connection refuses this submit whole with this status (a policy the session
  /// does not know, such as raw kernels from a remote client); it completes in order and
  /// counts as a failed submit, and its ops are neither admitted nor enqueued.
  Status refusal;
  std::vector<Op> ops;
  /// Owns the bytes UploadOp::data points into; released when the submit completes.
  std::shared_ptr<const void> payload;
};

}  // namespace ferry::session
