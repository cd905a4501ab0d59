// A session with a ferry daemon: tensors, recorded work, submits, transfers.
//
// One Session = one gRPC stream = one device stream in the daemon. A Session has one owner:
// it is move-only and not thread-safe (use one per thread). Work is recorded into the
// session and sent, as one message, at the boundary the caller chooses with submit().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/dtype.h"
#include "ferry/status.h"

namespace ferry {

namespace internal {
class SessionState;
struct BufferBlock;
struct PendingState;
}  // namespace internal

/// Counters of one session, as close() returns them.
struct SessionStats {
  uint64_t submits = 0;
  uint64_t failed_submits = 0;
  uint64_t ops = 0;
  uint64_t kernel_launches = 0;
  uint64_t bytes_uploaded = 0;
  uint64_t bytes_downloaded = 0;
  uint64_t tensors_created = 0;
  uint64_t peak_device_bytes = 0;
  uint64_t device_busy_ns = 0;  // device time of the session's work, measured on the device
  uint64_t graph_launches = 0;
  uint64_t kernel_batches = 0;  // runs of kernel ops the daemon sent as one batch
  // Copy-engine traffic by direction (host to device, device to host), part of device_busy_ns.
  uint64_t h2d_bytes = 0;
  uint64_t h2d_ns = 0;
  uint64_t d2h_bytes = 0;
  uint64_t d2h_ns = 0;
  // Counted by libferry, not by the daemon: bytes of blocking uploads and downloads that
  // went through the session's shared-memory staging buffer (the rest of a local session's,
  // and all of a remote one's, went inline in messages).
  uint64_t staged_upload_bytes = 0;
  uint64_t staged_download_bytes = 0;
};

struct SessionOptions {
  /// Device-memory quota to ask for; 0 takes the daemon's default.
  uint64_t device_bytes_quota = 0;
  /// Submits in flight before the daemon pushes back; 0 takes the daemon's default.
  uint32_t max_in_flight_submits = 0;
};

/// A tensor in the daemon's device memory, named by a handle the client chose.
///
/// Move-only. Destroying a live Tensor records its release into the session's next submit
/// (no message of its own); session.free() does the same explicitly. A moved-from Tensor
/// has handle 0, which the daemon rejects as INVALID_HANDLE wherever it is used.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor();

  uint64_t handle() const { return handle_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  uint64_t element_count() const { return elements_; }
  uint64_t byte_size() const { return elements_ * DTypeSize(dtype_); }
  /// Return false for a moved-from or default-constructed Tensor.
  bool valid() const { return handle_ != 0; }

 private:
  friend class Session;
  Tensor(std::weak_ptr<internal::SessionState> session, uint64_t handle, DType dtype, Shape shape,
         uint64_t elements)
      : session_(std::move(session)),
        handle_(handle),
        dtype_(dtype),
        shape_(std::move(shape)),
        elements_(elements) {}
  void Release();

  std::weak_ptr<internal::SessionState> session_;
  uint64_t handle_ = 0;
  DType dtype_ = DType::kInvalid;
  Shape shape_;
  uint64_t elements_ = 0;
};

/// Host memory for transfers, from Session::pinned_buffer. For a local session it is carved
/// from a shared-memory slab the daemon DMAs straight from (no copy, no message); for a
/// remote one it is ordinary memory whose bytes travel inline.
///
/// Move-only. A moved-from or default-constructed buffer is invalid (size 0, data null);
/// passing one to a transfer is a typed error. The memory stays valid while the buffer
/// lives, even past the session's end.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data();
  const void* data() const;
  uint64_t size() const;
  bool valid() const { return block_ != nullptr; }
  /// Return true when the bytes live in shared memory the daemon maps.
  bool is_shared() const;
  /// View the buffer as elements of T (size() / sizeof(T) of them).
  template <typename T>
  std::span<T> span() {
    return std::span<T>(static_cast<T*>(data()), size() / sizeof(T));
  }

 private:
  friend class Session;
  friend class internal::SessionState;
  explicit PinnedBuffer(std::shared_ptr<internal::BufferBlock> block) : block_(std::move(block)) {}
  std::shared_ptr<internal::BufferBlock> block_;
};

/// What a pending transfer hands back: its outcome, and always both values.
struct Transfer {
  Status status;
  Tensor tensor;
  PinnedBuffer buffer;
};

/// A transfer in flight (Session::upload_pending / download_pending).
///
/// Move-only. Dropping it without wait() detaches it: the library keeps the tensor and the
/// buffer until the daemon reports the copy done, then releases them (on the owner's next
/// call into the session, or at its close), so nothing is freed while the device may
/// still touch it.
class PendingTransfer {
 public:
  PendingTransfer() = default;
  PendingTransfer(PendingTransfer&& other) noexcept;
  PendingTransfer& operator=(PendingTransfer&& other) noexcept;
  PendingTransfer(const PendingTransfer&) = delete;
  PendingTransfer& operator=(const PendingTransfer&) = delete;
  ~PendingTransfer();

  /// Return false while in flight, true once done and OK, or the error when refused or
  /// failed. Never blocks, never sends a message.
  Result<bool> is_ready() const;
  /// Block until done; return the outcome with the tensor and the buffer. A failure
  /// returned here is consumed: the next synchronize() does not report it again. A second
  /// call (or a call on a moved-from handle) returns INVALID_ARGUMENT and empty values.
  Transfer wait();

 private:
  friend class Session;
  explicit PendingTransfer(std::shared_ptr<internal::PendingState> state)
      : state_(std::move(state)) {}
  void Detach();
  std::shared_ptr<internal::PendingState> state_;
};
using PendingUpload = PendingTransfer;
using PendingDownload = PendingTransfer;

/// Format of device code for Session::load_module.
enum class ModuleFormat { kPtx = 1, kCubin = 2, kCudaSource = 3 };

/// A grid or block size.
struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

/// One argument of a raw kernel launch: a tensor (its device address) or a scalar.
class KernelArg {
 public:
  static KernelArg tensor(const Tensor& t) { return KernelArg(Kind::kTensor, t.handle(), 0); }
  static KernelArg i32(int32_t v) { return KernelArg(Kind::kI32, 0, static_cast<double>(v)); }
  static KernelArg u32(uint32_t v) { return KernelArg(Kind::kU32, v, 0); }
  static KernelArg i64(int64_t v) { return KernelArg(Kind::kI64, static_cast<uint64_t>(v), 0); }
  static KernelArg u64(uint64_t v) { return KernelArg(Kind::kU64, v, 0); }
  static KernelArg f32(float v) { return KernelArg(Kind::kF32, 0, v); }
  static KernelArg f64(double v) { return KernelArg(Kind::kF64, 0, v); }

  enum class Kind { kTensor, kI32, kU32, kI64, kU64, kF32, kF64 };
  Kind kind() const { return kind_; }
  uint64_t integer() const { return integer_; }
  double real() const { return real_; }

 private:
  KernelArg(Kind kind, uint64_t integer, double real)
      : kind_(kind), integer_(integer), real_(real) {}
  Kind kind_;
  uint64_t integer_;
  double real_;
};

/// A module of device code loaded in the daemon (CUDA backend only). Move-only;
/// destroying it records its unload into the next submit.
class Module {
 public:
  Module() = default;
  Module(Module&& o) noexcept;
  Module& operator=(Module&& o) noexcept;
  ~Module();
  uint64_t handle() const { return handle_; }

 private:
  friend class Session;
  Module(std::weak_ptr<internal::SessionState> s, uint64_t h)
      : session_(std::move(s)), handle_(h) {}
  void Release();
  std::weak_ptr<internal::SessionState> session_;
  uint64_t handle_ = 0;
};

/// A recorded sequence of device work, replayed with one op. Move-only; destroying it
/// records its release into the next submit.
class Graph {
 public:
  Graph() = default;
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  ~Graph();
  uint64_t handle() const { return handle_; }

 private:
  friend class Session;
  Graph(std::weak_ptr<internal::SessionState> s, uint64_t h) : session_(std::move(s)), handle_(h) {}
  void Release();
  std::weak_ptr<internal::SessionState> session_;
  uint64_t handle_ = 0;
};

struct GemmOptions {
  bool trans_a = false;
  bool trans_b = false;
  double alpha = 1.0;
  double beta = 0.0;
};

class Session {
 public:
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  /// End the stream without waiting for the device; never throws, never blocks on device
  /// work. The daemon finishes in-flight work and releases everything.
  ~Session();

  /// Return the id the daemon gave this session.
  uint64_t id() const;
  /// Return true once the daemon announced it is draining: work already submitted still
  /// completes, then the session ends; open a new one elsewhere.
  bool draining() const;
  /// Return the backend serving this session ("host" or "cuda").
  const std::string& backend() const;
  /// Return the device-memory quota the daemon granted.
  uint64_t device_bytes_quota() const;

  // --- recording: nothing is sent until submit() ----------------------------------------
  /// Record the creation of a tensor (contents undefined until written).
  Tensor create_tensor(DType dtype, const Shape& shape);
  template <typename T>
  Tensor create_tensor(const Shape& shape) {
    return create_tensor(DTypeOf<T>(), shape);
  }
  /// Record the release of a tensor.
  void free(Tensor&& tensor);
  /// Record tensor[:] = value.
  void fill(const Tensor& tensor, double value);
  /// Record dst = src (same dtype and element count).
  void copy(const Tensor& src, const Tensor& dst);
  /// Record out = a + b (and -, *, / below), elementwise, f32 or f64, equal shapes.
  void add(const Tensor& a, const Tensor& b, const Tensor& out);
  void sub(const Tensor& a, const Tensor& b, const Tensor& out);
  void mul(const Tensor& a, const Tensor& b, const Tensor& out);
  void div(const Tensor& a, const Tensor& b, const Tensor& out);
  /// Record out = alpha * x.
  void scale(const Tensor& x, double alpha, const Tensor& out);
  /// Record out = max(x, 0), elementwise, f32 or f64, equal shapes (out may be x; NaN stays
  /// NaN).
  void relu(const Tensor& x, const Tensor& out);
  /// Record y += alpha * x.
  void axpy(double alpha, const Tensor& x, const Tensor& y);
  /// Record out (one element) = sum of in.
  void sum(const Tensor& in, const Tensor& out);
  /// Record c = alpha * op(a) @ op(b) + beta * c for rank-2 row-major tensors.
  void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& options = {});
  /// Record a write of `bytes` at byte `offset` of the tensor (bytes copied now).
  void write_bytes(const Tensor& tensor, uint64_t offset, const void* data, uint64_t bytes);

  // --- raw kernels (CUDA backend; UNSUPPORTED on the host backend) and graphs ----------
  /// Record the loading of a module; compile errors (COMPILE_ERROR, with the log) refuse
  /// the submit that carries it.
  Module load_module(ModuleFormat format, std::string_view image);
  /// Record a launch of `function` from `module`.
  void launch(const Module& module, std::string_view function, Dim3 grid, Dim3 block,
              const std::vector<KernelArg>& args, uint32_t shared_bytes = 0);
  /// Start recording a graph: device work recorded until end_graph() goes into it instead
  /// of running. Begin and end must be in the same submit.
  Graph begin_graph();
  void end_graph();
  /// Record one replay of `graph`.
  void launch_graph(const Graph& graph);

  /// Return how many ops are recorded and not yet submitted.
  size_t recorded_ops() const;

  // --- boundaries -----------------------------------------------------------------------
  /// Send everything recorded since the last submit as one message. Returns once sent;
  /// the outcome arrives later and is reported by synchronize(). SESSION_CLOSED when the
  /// session is gone. An empty record sends nothing.
  Status submit();
  /// Submit what is recorded, then block until all submitted work has completed. Returns
  /// the first failure among the submits completed since the previous synchronize(),
  /// except those a blocking transfer or PendingTransfer::wait() already returned.
  Status synchronize();
  /// Submit, wait, release everything and end the session; return its counters.
  Result<SessionStats> close();

  // --- pinned buffers and pending transfers ----------------------------------------------
  /// Allocate a buffer of `bytes` (256-byte aligned) from the session's shared-memory
  /// slabs; a new slab is asked for only when none has room. QUOTA_EXCEEDED above one
  /// slab's size or when the daemon's pinned budget is spent. Remote sessions get
  /// ordinary memory.
  Result<PinnedBuffer> pinned_buffer(uint64_t bytes);
  /// Return the size of one slab (0 for a remote session).
  uint64_t slab_size() const;
  /// Submit what is recorded, then copy the first tensor.byte_size() bytes of `buffer` into
  /// the tensor as a submit of its own. A refusal (moved-from buffer or tensor, a buffer
  /// too small, a closed session) comes back from wait() with both values untouched.
  PendingUpload upload_pending(PinnedBuffer&& buffer, Tensor&& tensor);
  /// Submit what is recorded, then copy the whole tensor into the start of `buffer`.
  PendingDownload download_pending(Tensor&& tensor, PinnedBuffer&& buffer);

  // --- blocking transfers (local: through shared memory; remote: inline) -----------------
  /// Write `data` into the whole tensor and wait until it is there. The span's element type
  /// must match the tensor's dtype and its size the tensor's element count.
  template <typename T>
  Status upload(const Tensor& tensor, std::span<const T> data) {
    if (DTypeOf<T>() != tensor.dtype()) return DtypeMismatch(tensor);
    return upload_bytes(tensor, data.data(), data.size_bytes());
  }
  template <typename T>
  Status upload(const Tensor& tensor, const std::vector<T>& data) {
    return upload(tensor, std::span<const T>(data));
  }
  /// Read the whole tensor.
  template <typename T>
  Result<std::vector<T>> download(const Tensor& tensor) {
    std::vector<T> out;
    FERRY_RETURN_IF_ERROR(download_into(tensor, out));
    return out;
  }
  /// Read the whole tensor into `out`, reusing its capacity.
  template <typename T>
  Status download_into(const Tensor& tensor, std::vector<T>& out) {
    if (DTypeOf<T>() != tensor.dtype()) return DtypeMismatch(tensor);
    out.resize(tensor.element_count());
    return download_bytes(tensor, out.data(), tensor.byte_size());
  }
  /// Write `bytes` bytes into the tensor (which must hold exactly that many) and wait.
  Status upload_bytes(const Tensor& tensor, const void* data, uint64_t bytes);
  /// Read `bytes` bytes (the tensor's size) into `out` and wait.
  Status download_bytes(const Tensor& tensor, void* out, uint64_t bytes);

 private:
  friend class Client;
  explicit Session(std::shared_ptr<internal::SessionState> state);
  static Status DtypeMismatch(const Tensor& tensor);

  std::shared_ptr<internal::SessionState> state_;
};

}  // namespace ferry
