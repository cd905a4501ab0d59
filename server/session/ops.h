// The ops a submit carries, in the daemon's own types (the rpc layer converts from ferry.v1
// messages without copying bulk bytes). Everything here is untrusted client input until
// AdmitSubmit has accepted it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
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
