// The device seam: everything ferryd asks of a GPU goes through these interfaces.
//
// Two implementations exist: host/ (a CPU emulation with the same semantics, the default
// where no GPU is visible) and cuda/ (CUDA runtime/driver). Nothing outside this folder
// includes CUDA headers or touches device addresses other than as opaque DevicePtr values.
//
// Semantics every backend honours (the conformance suite in tests/conformance checks them):
//  * A Stream executes enqueued work asynchronously, in FIFO order.
//  * Enqueue methods return an error for what is wrong at enqueue time (bad argument, launch
//    configuration, allocation failure); such an error enqueues nothing and is not sticky.
//  * An error that happens while the work runs (a device fault) is sticky: the stream skips
//    all later work, and every later completion reports that first error.
//  * OnComplete(fn) calls fn exactly once, on a backend-owned completion thread, after all
//    work enqueued before it has finished, with OK or the stream's sticky error. fn must not
//    block: it posts to the owner's executor.
//  * The launch queue is bounded: once a stream's hardware work queue (CUDA: one of
//    CUDA_DEVICE_MAX_CONNECTIONS, shared by the streams mapped to it) holds about a
//    thousand commands not yet run (an op enqueued on its own, a completion, a graph replay
//    of any size, a batch), an enqueue blocks the calling thread until the device has run
//    one. A caller that must not be held (an executor thread shared by sessions) keeps
//    fewer in flight (session/session.h, SessionConfig::max_queued_commands). The host
//    backend models one queue per stream.
//  * Host memory passed to a copy must stay valid until the completion that follows the copy.
//  * A copy to or from host memory that is not registered (RegisterHostMemory: ordinary,
//    pageable memory) blocks the calling thread until the stream's earlier work has run
//    (outside a capture), and may block it until the copy itself has run too. (CUDA stages
//    pageable copies through buffers every stream shares: the CUDA backend waits for the
//    stream first, so that a copy never holds them while it waits for its stream's work;
//    the host backend waits the same way.) A caller that must not be held runs it where
//    waiting holds no other session's work (session/session.h: the long lane).
//  * Device memory freed with Free() is released only after all work enqueued before the
//    Free() has finished, so in-flight work never touches freed memory.
//  * Usage (device time, copy bytes and time per direction) of work enqueued before an
//    OnComplete is counted in the stream's and the device's usage() by the time that
//    completion's callback runs; a device's usage is the sum of all its streams' (Usage).
//
// Thread-safety: a Device is safe for concurrent use from many threads. A Stream is used by
// one owner at a time (the session's executor); its completion callbacks run elsewhere.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/dtype.h"
#include "ferry/status.h"

namespace ferry::backend {

/// An address in device memory. Opaque outside the backend; never sent to clients.
using DevicePtr = uint64_t;

enum class BinaryOp { kAdd, kSub, kMul, kDiv };

/// Arguments of a row-major GEMM: C[m,n] = alpha * op(A) * op(B) + beta * C, where op(A) is
/// m x k (A is stored k x m when trans_a) and op(B) is k x n (B is n x k when trans_b).
struct GemmArgs {
  DType dtype = DType::kF32;
  bool trans_a = false;
  bool trans_b = false;
  uint64_t m = 0, n = 0, k = 0;
  double alpha = 1.0;
  double beta = 0.0;
  DevicePtr a = 0, b = 0, c = 0;
};

enum class ModuleFormat { kPtx, kCubin, kCudaSource };

/// One argument of a raw kernel launch: a device pointer or a scalar passed by value.
struct KernelArg {
  enum class Kind { kPointer, kScalar } kind = Kind::kScalar;
  DevicePtr pointer = 0;
  std::vector<uint8_t> scalar;  // the scalar's bytes, little-endian, as the kernel expects
};

struct LaunchConfig {
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_bytes = 0;
};

/// A loaded module of device code. Thread-safe; shared by the sessions that use it.
class Module {
 public:
  virtual ~Module() = default;
  /// Return the sizes of the named function's parameters in bytes, in order, or an empty
  /// vector when the backend cannot tell; INVALID_ARGUMENT if there is no such function.
  virtual Result<std::vector<size_t>> ParameterSizes(std::string_view function) const = 0;
  /// Return the device memory the module takes at most (its code, constant banks and
  /// global variables), fixed when it was loaded (module_footprint.h): what a session that
  /// holds it is charged.
  virtual uint64_t device_bytes() const = 0;
};

/// A recorded sequence of stream work that can be replayed with one call.
class Graph {
 public:
  virtual ~Graph() = default;
  /// Return the number of nodes the graph holds: one per operation, except that the CUDA
  /// backend may run a run of elementwise ops as one node (CudaDeviceOptions::fuse_elementwise).
  virtual size_t node_count() const = 0;
};

/// Device time and copy-engine traffic: of one stream (Stream::usage) or of a whole device
/// (Device::usage: every stream it ever had, destroyed ones included, so the device's total
/// is the sum of its streams'). The owner attributes a stream's figures to its session.
///
/// busy_ns is device time spent on the stream's work, measured on the device: the host
/// backend times each op on its worker; the CUDA backend records a timing event before the
/// first work enqueued after a completion and takes the completion's own event as the end,
/// so one pair of events spans each submit's work, idle gaps inside the span included
/// (streams that run concurrently each count their overlapping spans: the device's total
/// may exceed wall time). Copies between host and device count in busy_ns and also, by
/// direction, in h2d/d2h bytes and ns; copies recorded into a graph or a batch count in
/// busy_ns only (a graph's nodes cannot be timed one by one). Counters only grow.
struct Usage {
  uint64_t busy_ns = 0;
  uint64_t h2d_bytes = 0, h2d_ns = 0;
  uint64_t d2h_bytes = 0, d2h_ns = 0;

  Usage& operator+=(const Usage& o) {
    busy_ns += o.busy_ns;
    h2d_bytes += o.h2d_bytes;
    h2d_ns += o.h2d_ns;
    d2h_bytes += o.d2h_bytes;
    d2h_ns += o.d2h_ns;
    return *this;
  }
  bool operator==(const Usage& o) const {
    return busy_ns == o.busy_ns && h2d_bytes == o.h2d_bytes && h2d_ns == o.h2d_ns &&
           d2h_bytes == o.d2h_bytes && d2h_ns == o.d2h_ns;
  }
};

/// Usage counters updated by one thread (a worker, a completion thread) and read by any:
/// each field is atomic, so a reader may see a copy's bytes a moment before its time.
class UsageCounter {
 public:
  void Add(const Usage& u) {
    busy_ns_.fetch_add(u.busy_ns, std::memory_order_relaxed);
    h2d_bytes_.fetch_add(u.h2d_bytes, std::memory_order_relaxed);
    h2d_ns_.fetch_add(u.h2d_ns, std::memory_order_relaxed);
    d2h_bytes_.fetch_add(u.d2h_bytes, std::memory_order_relaxed);
    d2h_ns_.fetch_add(u.d2h_ns, std::memory_order_relaxed);
  }
  Usage Get() const {
    Usage u;
    u.busy_ns = busy_ns_.load(std::memory_order_relaxed);
    u.h2d_bytes = h2d_bytes_.load(std::memory_order_relaxed);
    u.h2d_ns = h2d_ns_.load(std::memory_order_relaxed);
    u.d2h_bytes = d2h_bytes_.load(std::memory_order_relaxed);
    u.d2h_ns = d2h_ns_.load(std::memory_order_relaxed);
    return u;
  }

 private:
  std::atomic<uint64_t> busy_ns_{0}, h2d_bytes_{0}, h2d_ns_{0}, d2h_bytes_{0}, d2h_ns_{0};
};

/// Called once, on the backend's completion thread, with OK or the stream's sticky error.
using CompletionFn = std::function<void(Status)>;

/// An in-order queue of device work. See the file comment for the contract.
class Stream {
 public:
  /// Destroying a stream waits for its enqueued work and pending completions to finish.
  virtual ~Stream() = default;

  /// Allocate `bytes` (> 0) of device memory usable by work enqueued after this call. Every
  /// byte reads as zero until written: memory is shared by all sessions, so what an earlier
  /// owner left must never be readable (the zeroing is ordered on this stream, before any
  /// work enqueued after the call). OUT_OF_DEVICE_MEMORY when the device cannot provide it.
  virtual Result<DevicePtr> Allocate(uint64_t bytes) = 0;
  /// Release memory from Allocate once all work enqueued before this call has finished.
  virtual void Free(DevicePtr ptr) = 0;

  virtual Status CopyHostToDevice(DevicePtr dst, const void* src, uint64_t bytes) = 0;
  virtual Status CopyDeviceToHost(void* dst, DevicePtr src, uint64_t bytes) = 0;
  virtual Status CopyDeviceToDevice(DevicePtr dst, DevicePtr src, uint64_t bytes) = 0;

  /// Set `count` elements at dst to `value` (converted to dtype).
  virtual Status Fill(DType dtype, DevicePtr dst, uint64_t count, double value) = 0;
  /// out[i] = a[i] op b[i] for i < count. out may alias a or b.
  virtual Status Binary(BinaryOp op, DType dtype, DevicePtr a, DevicePtr b, DevicePtr out,
                        uint64_t count) = 0;
  /// out[i] = alpha * x[i]. out may alias x.
  virtual Status Scale(DType dtype, DevicePtr x, double alpha, DevicePtr out, uint64_t count) = 0;
  /// out[i] = max(x[i], 0) (NaN stays NaN). out may alias x.
  virtual Status Relu(DType dtype, DevicePtr x, DevicePtr out, uint64_t count) = 0;
  /// y[i] += alpha * x[i].
  virtual Status Axpy(DType dtype, double alpha, DevicePtr x, DevicePtr y, uint64_t count) = 0;
  /// out[0] = sum of in[0..count). count may be 0 (the sum is then 0).
  virtual Status ReduceSum(DType dtype, DevicePtr in, uint64_t count, DevicePtr out) = 0;
  /// Row-major matrix product; see GemmArgs.
  virtual Status Gemm(const GemmArgs& args) = 0;

  /// Launch `function` of `module`. UNSUPPORTED where the backend runs no device code.
  virtual Status Launch(const Module& module, std::string_view function, const LaunchConfig& config,
                        const std::vector<KernelArg>& args) = 0;

  /// Start recording: work enqueued until EndCapture is recorded into a graph, not run.
  virtual Status BeginCapture() = 0;
  /// Stop recording and return the graph of the work enqueued since BeginCapture.
  virtual Result<std::unique_ptr<Graph>> EndCapture() = 0;
  /// Stop recording and drop what was recorded: none of it runs, and no graph is built
  /// (CUDA: not instantiated, which for a large recording costs far more than the capture).
  /// Frees deferred by the capture are enqueued, as at EndCapture. After it the stream
  /// works as before BeginCapture. Refused without a capture or inside a batch; otherwise
  /// the recording is gone, and the result is an error only where the device faulted.
  virtual Status AbandonCapture() = 0;
  /// Enqueue one replay of `graph`.
  virtual Status LaunchGraph(const Graph& graph) = 0;

  /// A batch: many small ops handed to the device at once. Work enqueued between BeginBatch
  /// and EndBatch is recorded under the rules of BeginCapture (Allocate refused, Free
  /// deferred and the batch then invalid, OnComplete refused; a batch and a capture do not
  /// nest). EndBatch enqueues all of it, in order, with one replay, as if each op had been
  /// enqueued on its own at EndBatch; nothing of the batch runs before. An op refused inside
  /// the batch is not recorded, and the others still run. An invalid batch enqueues
  /// nothing (EndBatch: INVALID_ARGUMENT). Unlike a capture, the stream keeps what makes the
  /// next batch of the same shape cheaper (CUDA: the executable graph, updated in place).
  virtual Status BeginBatch() = 0;
  virtual Status EndBatch() = 0;

  /// Call `done` once all work enqueued before this call has finished; see file comment.
  virtual void OnComplete(CompletionFn done) = 0;

  /// Return the device time and copy traffic of this stream's work so far (see Usage). All
  /// work enqueued before an OnComplete is counted by the time that completion's callback
  /// runs (unless the stream's work failed).
  virtual Usage usage() const = 0;
  uint64_t busy_ns() const { return usage().busy_ns; }
};

struct DeviceInfo {
  std::string backend;  // "host" or "cuda"
  int ordinal = 0;
  std::string name;
  std::string uuid;
  std::string driver_version;
  uint64_t total_memory = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

/// One device (one CUDA context, or the CPU emulation of one).
class Device {
 public:
  virtual ~Device() = default;

  virtual const DeviceInfo& info() const = 0;
  /// Create a new stream; each session gets its own.
  virtual Result<std::unique_ptr<Stream>> CreateStream() = 0;

  /// Pin host memory for fast copies (cudaHostRegister); a no-op on the host backend.
  virtual Status RegisterHostMemory(void* ptr, uint64_t bytes) = 0;
  virtual Status UnregisterHostMemory(void* ptr) = 0;

  /// Load a module. COMPILE_ERROR (with the log) when it does not build or load;
  /// INVALID_ARGUMENT, before anything is loaded, when the device memory it would take
  /// cannot be bounded (module_footprint.h); UNSUPPORTED where the backend runs no device code.
  virtual Result<std::shared_ptr<Module>> LoadModule(ModuleFormat format,
                                                     std::string_view image) = 0;

  /// Return the device bytes currently allocated through Stream::Allocate and not yet
  /// released.
  virtual uint64_t bytes_in_use() const = 0;
  /// Return the device memory still free, as the device reports it.
  virtual uint64_t free_memory() const = 0;
  /// Return the usage of every stream this device has had, destroyed ones included: the
  /// sum of their Stream::usage().
  virtual Usage usage() const = 0;
};

struct HostDeviceOptions {
  int ordinal = 0;
  /// Emulated device memory size; Allocate fails with OUT_OF_DEVICE_MEMORY beyond it.
  uint64_t memory_bytes = 8ull << 30;
};

/// Create the CPU emulation backend.
Result<std::unique_ptr<Device>> CreateHostDevice(const HostDeviceOptions& options);

struct CudaDeviceOptions {
  /// Bounds of one CUDA C++ (NVRTC) compile, run in a helper process: wall-clock time (also
  /// its CPU time, rounded up to seconds) and address space. Past them: QUOTA_EXCEEDED.
  std::chrono::milliseconds nvrtc_timeout{30000};
  uint64_t nvrtc_memory = 4ull << 30;
  /// Compiles at once (each holds a session executor thread while it runs); more are refused
  /// with BUSY. 0: DefaultNvrtcConcurrency().
  int nvrtc_concurrency = 0;
  /// The helper (ferry-nvrtc); empty: next to the running executable, else where installed.
  std::string nvrtc_helper;
  /// Batches and graphs run each run of consecutive f32/f64 elementwise ops (Fill, Binary,
  /// Scale, Axpy) as one kernel, where that gives the same results (backend/elementwise_run.h).
  bool fuse_elementwise = true;
  /// Fresh CUDA streams (with their scratch) a thread of the device keeps made ahead for
  /// the next sessions, which also destroys closed sessions' streams; 0: no such thread, a
  /// session makes its stream at its open and destroys it at its close.
  uint32_t streams_ahead = 4;
};

/// A quarter of the machine's cores, at least 1.
int DefaultNvrtcConcurrency();

/// Return the number of CUDA devices visible, or 0 when none (or built without CUDA).
int CudaDeviceCount();
/// Create the CUDA backend for device `ordinal`. UNSUPPORTED when built without CUDA.
Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal,
                                                 const CudaDeviceOptions& options = {});
/// Destroy and re-create the primary context of CUDA device `ordinal` (cudaDeviceReset),
/// after a sticky fault. Every Device, Stream, Module and Graph of it must be gone.
Status ResetCudaContext(int ordinal);

}  // namespace ferry::backend
