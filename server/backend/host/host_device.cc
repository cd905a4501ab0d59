#include "backend/host/host_device.h"

#include <pthread.h>

#include <array>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "backend/enqueue_checks.h"
#include "backend/host/host_kernels.h"

namespace ferry::backend {
namespace {

constexpr std::align_val_t kAlignment{256};

// Allocations of every HostDevice of the process not yet released: a count that outlives
// each device, so a test can see that a device's destructor released what was never freed.
std::atomic<uint64_t> g_live_allocations{0};

Status InvalidArgument(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}

Status OutOfDeviceMemory(std::string message) {
  return Status(ErrorKind::kOutOfDeviceMemory, std::move(message));
}

void* HostAddress(DevicePtr ptr) { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)); }

DevicePtr DeviceAddress(const void* ptr) {
  return static_cast<DevicePtr>(reinterpret_cast<uintptr_t>(ptr));
}

}  // namespace

/// One op as enqueued or recorded: the device ranges it touches (checked at enqueue and at
/// every replay of a graph) and the closure that does the work on the worker.
struct HostOp {
  struct Access {
    DevicePtr ptr = 0;
    uint64_t bytes = 0;
    const char* what = "";
  };

  void Touch(DevicePtr ptr, uint64_t bytes, const char* what) {
    accesses[access_count++] = Access{ptr, bytes, what};
  }

  std::function<Status()> run;
  std::array<Access, 3> accesses{};
  size_t access_count = 0;
  // A copy between host and device, counted by direction in the stream's Usage when it is
  // enqueued on its own (not when replayed from a graph: backend.h, Usage).
  enum class Copy { kNone, kToDevice, kToHost } copy = Copy::kNone;
  uint64_t copy_bytes = 0;
};

/// The recorded ops of one capture. Immutable; replayable on any stream of its device.
class HostGraph final : public Graph {
 public:
  HostGraph(const HostDevice* device, std::vector<HostOp> ops)
      : device_(device), ops_(std::move(ops)) {}

  size_t node_count() const override { return ops_.size(); }
  const HostDevice* device() const { return device_; }
  const std::vector<HostOp>& ops() const { return ops_; }

 private:
  const HostDevice* const device_;
  const std::vector<HostOp> ops_;
};

/// A stream of the host backend: a FIFO queue drained by one worker thread.
///
/// The owner (one thread at a time, per backend.h) calls the Stream methods; the capture
/// state is touched by the owner only. The worker owns sticky_. mu_ guards queue_ and
/// stop_.
class HostStream final : public Stream {
 public:
  explicit HostStream(HostDevice* device)
      : device_(device), tracker_(std::make_shared<HostDevice::CompletionTracker>()) {
    worker_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "ferry-host-run");
      WorkerLoop();
    });
  }

  ~HostStream() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyOne();
    worker_.join();
    if (!device_->OnCompletionThread()) device_->WaitForCompletions(tracker_);
  }

  Result<DevicePtr> Allocate(uint64_t bytes) override {
    if (capturing_) {
      return InvalidArgument("Allocate during graph capture; allocate before BeginCapture");
    }
    return device_->AllocateMemory(bytes);
  }

  void Free(DevicePtr ptr) override {
    if (capturing_ && capture_error_.empty()) {
      capture_error_ = "Free during graph capture (the memory is released, not recorded)";
    }
    // A pointer that is not a live allocation of this device has nothing to release.
    if (!device_->MarkFreePending(ptr)) return;
    Task task;
    task.kind = Task::Kind::kFree;
    task.queued_command = false;  // released by the stream's worker, not a device command
    task.ptr = ptr;
    Push(std::move(task));
  }

  Status CopyHostToDevice(DevicePtr dst, const void* src, uint64_t bytes) override {
    if (src == nullptr) return InvalidArgument("CopyHostToDevice: null host pointer");
    HostOp op;
    op.Touch(dst, bytes, "CopyHostToDevice destination");
    void* d = HostAddress(dst);
    op.run = [d, src, bytes] {
      std::memcpy(d, src, bytes);
      return Status::Ok();
    };
    op.copy = HostOp::Copy::kToDevice;
    op.copy_bytes = bytes;
    return EnqueueHostCopy(std::move(op), src, bytes);
  }

  Status CopyDeviceToHost(void* dst, DevicePtr src, uint64_t bytes) override {
    if (dst == nullptr) return InvalidArgument("CopyDeviceToHost: null host pointer");
    HostOp op;
    op.Touch(src, bytes, "CopyDeviceToHost source");
    const void* s = HostAddress(src);
    op.run = [dst, s, bytes] {
      std::memcpy(dst, s, bytes);
      return Status::Ok();
    };
    op.copy = HostOp::Copy::kToHost;
    op.copy_bytes = bytes;
    return EnqueueHostCopy(std::move(op), dst, bytes);
  }

  Status CopyDeviceToDevice(DevicePtr dst, DevicePtr src, uint64_t bytes) override {
    HostOp op;
    op.Touch(dst, bytes, "CopyDeviceToDevice destination");
    op.Touch(src, bytes, "CopyDeviceToDevice source");
    void* d = HostAddress(dst);
    const void* s = HostAddress(src);
    op.run = [d, s, bytes] {
      std::memmove(d, s, bytes);  // the ranges may overlap
      return Status::Ok();
    };
    return Enqueue(std::move(op));
  }

  Status Fill(DType dtype, DevicePtr dst, uint64_t count, double value) override {
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, CheckFill(dtype, count, value));
    HostOp op;
    op.Touch(dst, bytes, "Fill destination");
    void* d = HostAddress(dst);
    op.run = [dtype, d, count, value] {
      host_kernels::Fill(dtype, d, count, value);
      return Status::Ok();
    };
    return Enqueue(std::move(op));
  }

  Status Binary(BinaryOp bop, DType dtype, DevicePtr a, DevicePtr b, DevicePtr out,
                uint64_t count) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "Binary"));
    if (bop != BinaryOp::kAdd && bop != BinaryOp::kSub && bop != BinaryOp::kMul &&
        bop != BinaryOp::kDiv) {
      return InvalidArgument("Binary: unknown op " + std::to_string(static_cast<int>(bop)));
    }
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "Binary"));
    HostOp op;
    op.Touch(a, bytes, "Binary operand a");
    op.Touch(b, bytes, "Binary operand b");
    op.Touch(out, bytes, "Binary output");
    const void* pa = HostAddress(a);
    const void* pb = HostAddress(b);
    void* po = HostAddress(out);
    op.run = [bop, dtype, pa, pb, po, count] {
      host_kernels::Binary(bop, dtype, pa, pb, po, count);
      return Status::Ok();
    };
    return Enqueue(std::move(op));
  }

  Status Scale(DType dtype, DevicePtr x, double alpha, DevicePtr out, uint64_t count) override {
    return EnqueueXToY({"Scale", "Scale input", "Scale output"}, dtype, x, out, count,
                       [dtype, alpha, count](const void* px, void* po) {
                         host_kernels::Scale(dtype, px, alpha, po, count);
                       });
  }

  Status Relu(DType dtype, DevicePtr x, DevicePtr out, uint64_t count) override {
    return EnqueueXToY(
        {"Relu", "Relu input", "Relu output"}, dtype, x, out, count,
        [dtype, count](const void* px, void* po) { host_kernels::Relu(dtype, px, po, count); });
  }

  Status Axpy(DType dtype, double alpha, DevicePtr x, DevicePtr y, uint64_t count) override {
    return EnqueueXToY({"Axpy", "Axpy x", "Axpy y"}, dtype, x, y, count,
                       [dtype, alpha, count](const void* px, void* py) {
                         host_kernels::Axpy(dtype, alpha, px, py, count);
                       });
  }

  Status ReduceSum(DType dtype, DevicePtr in, uint64_t count, DevicePtr out) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, "ReduceSum"));
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, "ReduceSum"));
    HostOp op;
    op.Touch(in, bytes, "ReduceSum input");
    op.Touch(out, DTypeSize(dtype), "ReduceSum output");
    const void* pi = HostAddress(in);
    void* po = HostAddress(out);
    op.run = [dtype, pi, count, po] {
      host_kernels::ReduceSum(dtype, pi, count, po);
      return Status::Ok();
    };
    return Enqueue(std::move(op));
  }

  Status Gemm(const GemmArgs& args) override {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(args.dtype, "Gemm"));
    FERRY_ASSIGN_OR_RETURN(uint64_t a_bytes, MatrixBytes(args.dtype, args.m, args.k, "Gemm A"));
    FERRY_ASSIGN_OR_RETURN(uint64_t b_bytes, MatrixBytes(args.dtype, args.k, args.n, "Gemm B"));
    FERRY_ASSIGN_OR_RETURN(uint64_t c_bytes, MatrixBytes(args.dtype, args.m, args.n, "Gemm C"));
    // With m or n zero nothing is read; with k zero A and B are not read (C = beta * C).
    const bool empty = args.m == 0 || args.n == 0;
    HostOp op;
    op.Touch(args.a, empty ? 0 : a_bytes, "Gemm A");
    op.Touch(args.b, empty ? 0 : b_bytes, "Gemm B");
    op.Touch(args.c, c_bytes, "Gemm C");
    op.run = [args] {
      host_kernels::Gemm(args);
      return Status::Ok();
    };
    return Enqueue(std::move(op));
  }

  Status Launch(const Module& /*module*/, std::string_view /*function*/,
                const LaunchConfig& /*config*/, const std::vector<KernelArg>& /*args*/) override {
    return Status(ErrorKind::kUnsupported, "raw kernels need the CUDA backend");
  }

  Status BeginCapture() override {
    if (capturing_) return InvalidArgument("BeginCapture: the stream is already capturing");
    capturing_ = true;
    captured_.clear();
    capture_error_.clear();
    return Status::Ok();
  }

  Result<std::unique_ptr<Graph>> EndCapture() override {
    if (!capturing_) return InvalidArgument("EndCapture without BeginCapture");
    if (batching_) return InvalidArgument("EndCapture inside a batch; call EndBatch");
    capturing_ = false;
    std::vector<HostOp> ops = std::move(captured_);
    captured_.clear();
    if (!capture_error_.empty()) {
      std::string why = std::move(capture_error_);
      capture_error_.clear();
      return InvalidArgument("graph capture invalidated: " + why);
    }
    return std::unique_ptr<Graph>(std::make_unique<HostGraph>(device_, std::move(ops)));
  }

  Status AbandonCapture() override {
    if (!capturing_) return InvalidArgument("AbandonCapture without BeginCapture");
    if (batching_) return InvalidArgument("AbandonCapture inside a batch; call EndBatch");
    capturing_ = false;
    captured_.clear();
    capture_error_.clear();
    return Status::Ok();
  }

  Status LaunchGraph(const Graph& graph) override {
    const auto* host_graph = dynamic_cast<const HostGraph*>(&graph);
    if (host_graph == nullptr || host_graph->device() != device_) {
      return InvalidArgument("LaunchGraph: the graph was not captured on this device");
    }
    // Memory may have been freed since the capture: check everything before enqueueing any.
    for (const HostOp& op : host_graph->ops()) FERRY_RETURN_IF_ERROR(CheckAccesses(op));
    if (capturing_) {
      captured_.insert(captured_.end(), host_graph->ops().begin(), host_graph->ops().end());
      return Status::Ok();
    }
    {
      MutexLock lock(&mu_);
      // One command, however many ops the graph holds (as on CUDA).
      if (!host_graph->ops().empty()) TakeQueueRoomLocked();
      bool first = true;
      for (const HostOp& op : host_graph->ops()) {
        Task task;
        task.kind = Task::Kind::kRun;
        task.run = op.run;
        task.queued_command = std::exchange(first, false);
        queue_.push_back(std::move(task));
        ++pushed_;  // numbered as Push numbers tasks: WaitRan counts every task run
      }
    }
    cv_.NotifyOne();
    return Status::Ok();
  }

  // The host backend has nothing to keep between batches: a batch is a capture replayed once.
  Status BeginBatch() override {
    FERRY_RETURN_IF_ERROR(BeginCapture());
    batching_ = true;
    return Status::Ok();
  }

  Status EndBatch() override {
    if (!batching_) return InvalidArgument("EndBatch without BeginBatch");
    batching_ = false;
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph, EndCapture());
    return LaunchGraph(*graph);
  }

  void OnComplete(CompletionFn done) override {
    Task task;
    task.kind = Task::Kind::kComplete;
    task.done = std::move(done);
    if (capturing_) {
      task.status_override = InvalidArgument(
          "OnComplete during graph capture is not recorded; call it after "
          "EndCapture");
    }
    device_->AddPendingCompletion(tracker_);
    Push(std::move(task));
  }

  Usage usage() const override { return usage_.Get(); }

 private:
  struct Task {
    enum class Kind { kRun, kFree, kComplete } kind = Kind::kRun;
    std::function<Status()> run;              // kRun
    HostOp::Copy copy = HostOp::Copy::kNone;  // kRun: a copy counted by direction
    uint64_t copy_bytes = 0;
    DevicePtr ptr = 0;       // kFree
    CompletionFn done;       // kComplete
    Status status_override;  // kComplete: reported instead, when not OK
    // Counts in queued_commands_ until it has run: every op enqueued on its own, every
    // completion, and the first op of a graph replay (the replay is one command); not Free.
    bool queued_command = true;
  };

  Status CheckAccesses(const HostOp& op) const {
    for (size_t i = 0; i < op.access_count; ++i) {
      const HostOp::Access& access = op.accesses[i];
      FERRY_RETURN_IF_ERROR(device_->CheckRange(access.ptr, access.bytes, access.what));
    }
    return Status::Ok();
  }

  // The names an elementwise op's errors give it and its two ranges.
  struct XToYNames {
    const char* op;
    const char* x;
    const char* y;
  };
  /// An f32/f64 elementwise op that reads `count` elements at x and writes them at y (y may
  /// be x): check it, then run `kernel(x, y)` (host addresses) on the worker.
  template <typename Kernel>
  Status EnqueueXToY(XToYNames names, DType dtype, DevicePtr x, DevicePtr y, uint64_t count,
                     Kernel kernel) {
    FERRY_RETURN_IF_ERROR(CheckArithmeticDType(dtype, names.op));
    FERRY_ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(dtype, count, names.op));
    HostOp op;
    op.Touch(x, bytes, names.x);
    op.Touch(y, bytes, names.y);
    op.run = [kernel, px = static_cast<const void*>(HostAddress(x)), py = HostAddress(y)] {
      kernel(px, py);
      return Status::Ok();
    };
    return Enqueue(std::move(op));
  }

  /// Check `op` and record it (while capturing) or queue it for the worker; `*seq` (when
  /// given and queued) is its number for WaitRan.
  Status Enqueue(HostOp op, uint64_t* seq = nullptr) {
    FERRY_RETURN_IF_ERROR(CheckAccesses(op));
    if (capturing_) {
      captured_.push_back(std::move(op));
      return Status::Ok();
    }
    Task task;
    task.kind = Task::Kind::kRun;
    task.run = std::move(op.run);
    task.copy = op.copy;
    task.copy_bytes = op.copy_bytes;
    const uint64_t pushed = Push(std::move(task));
    if (seq) *seq = pushed;
    return Status::Ok();
  }

  /// Enqueue a copy between the device and `bytes` of host memory at `host`. Outside a
  /// capture, with host memory that is not registered (ordinary, pageable), return only once
  /// the stream's earlier work and the copy have run, as CUDA does (backend.h): a caller that
  /// makes such a copy on a thread other sessions need is caught here too.
  Status EnqueueHostCopy(HostOp op, const void* host, uint64_t bytes) {
    const bool pageable = !capturing_ && !device_->IsRegisteredHost(host, bytes);
    uint64_t seq = 0;
    FERRY_RETURN_IF_ERROR(Enqueue(std::move(op), pageable ? &seq : nullptr));
    if (pageable) WaitRan(seq);
    return Status::Ok();
  }

  /// Queue `task`; return its number (1, 2, ...: the order the worker runs them in).
  uint64_t Push(Task task) {
    uint64_t seq;
    {
      MutexLock lock(&mu_);
      if (task.queued_command) TakeQueueRoomLocked();
      queue_.push_back(std::move(task));
      seq = ++pushed_;
    }
    cv_.NotifyOne();
    return seq;
  }

  /// Block until the worker has run task `seq` (or the stream is stopping).
  void WaitRan(uint64_t seq) {
    MutexLock lock(&mu_);
    ++ran_waiters_;
    ran_cv_.Wait(&mu_, [this, seq] {
      mu_.AssertHeld();
      return ran_ >= seq || stop_;
    });
    --ran_waiters_;
  }

  /// Count one command, first blocking the enqueueing thread while the stream holds
  /// kHostLaunchQueueCommands not yet run, as CUDA's launch calls do (backend.h).
  void TakeQueueRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    room_cv_.Wait(&mu_, [this] {
      mu_.AssertHeld();
      return queued_commands_ < kHostLaunchQueueCommands;
    });
    ++queued_commands_;
  }

  void WorkerLoop() {
    std::deque<Task> batch;
    for (;;) {
      {
        MutexLock lock(&mu_);
        cv_.Wait(&mu_, [this] {
          mu_.AssertHeld();
          return stop_ || !queue_.empty();
        });
        if (queue_.empty()) return;  // stopping, and everything enqueued has run
        batch.swap(queue_);
      }
      for (Task& task : batch) {
        RunTask(task);
        bool wake_ran = false;
        {
          MutexLock lock(&mu_);
          ++ran_;
          if (task.queued_command) --queued_commands_;
          wake_ran = ran_waiters_ > 0;
        }
        if (task.queued_command) room_cv_.NotifyOne();
        if (wake_ran) ran_cv_.NotifyAll();
      }
      batch.clear();
    }
  }

  void RunTask(Task& task) {
    switch (task.kind) {
      case Task::Kind::kFree:
        // Released even after a fault, so a faulted stream leaks nothing.
        device_->ReleaseMemory(task.ptr);
        return;
      case Task::Kind::kComplete:
        device_->PostCompletion(HostDevice::PendingCompletion{
            std::move(task.done), task.status_override.ok() ? sticky_ : task.status_override,
            tracker_});
        return;
      case Task::Kind::kRun:
        break;
    }
    if (!sticky_.ok()) return;  // a run-time error earlier on this stream: skip
    const auto start = std::chrono::steady_clock::now();
    const auto delay = device_->op_delay();
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (std::optional<Status> fault = device_->TakeInjectedFault()) {
      sticky_ = std::move(*fault);
    } else {
      Status status = task.run();
      if (!status.ok()) sticky_ = std::move(status);
    }
    // Counted before any later completion is posted, as backend.h promises.
    Usage used;
    used.busy_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::steady_clock::now() - start)
                                             .count());
    if (sticky_.ok() && task.copy == HostOp::Copy::kToDevice) {
      used.h2d_bytes = task.copy_bytes;
      used.h2d_ns = used.busy_ns;
    } else if (sticky_.ok() && task.copy == HostOp::Copy::kToHost) {
      used.d2h_bytes = task.copy_bytes;
      used.d2h_ns = used.busy_ns;
    }
    usage_.Add(used);
    device_->usage_.Add(used);
  }

  HostDevice* const device_;
  const std::shared_ptr<HostDevice::CompletionTracker> tracker_;

  // Owner-only capture state.
  bool capturing_ = false;
  bool batching_ = false;  // the capture is a batch (BeginBatch)
  std::vector<HostOp> captured_;
  std::string capture_error_;  // why EndCapture must fail; empty while the capture is valid

  Mutex mu_;
  CondVar cv_;       // queue_ grew or stop_ was set
  CondVar room_cv_;  // queued_commands_ dropped
  CondVar ran_cv_;   // ran_ grew while ran_waiters_ > 0
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;           // tasks queued so far, each numbered (Push)
  uint64_t ran_ ABSL_GUARDED_BY(mu_) = 0;              // tasks the worker has run, in that order
  int ran_waiters_ ABSL_GUARDED_BY(mu_) = 0;           // threads in WaitRan
  uint64_t queued_commands_ ABSL_GUARDED_BY(mu_) = 0;  // enqueued, not yet run (Task)
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  Status sticky_;       // worker-only: the first run-time error
  UsageCounter usage_;  // written by the worker
  std::thread worker_;  // started last in the constructor
};

// --- HostDevice ----------------------------------------------------------------------------

Result<std::unique_ptr<HostDevice>> HostDevice::Create(const HostDeviceOptions& options) {
  if (options.memory_bytes == 0) {
    return InvalidArgument("host device: memory_bytes must be positive");
  }
  if (options.ordinal < 0) return InvalidArgument("host device: negative ordinal");
  return std::unique_ptr<HostDevice>(new HostDevice(options));
}

Result<std::unique_ptr<Device>> CreateHostDevice(const HostDeviceOptions& options) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<HostDevice> device, HostDevice::Create(options));
  return std::unique_ptr<Device>(std::move(device));
}

HostDevice::HostDevice(const HostDeviceOptions& options) : options_(options) {
  info_.backend = "host";
  info_.ordinal = options.ordinal;
  info_.name = "ferry host emulation (CPU)";
  info_.uuid = "HOST-" + std::to_string(options.ordinal);
  info_.driver_version = "none";
  info_.total_memory = options.memory_bytes;
  completion_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ferry-host-done");
    CompletionLoop();
  });
}

HostDevice::~HostDevice() {
  {
    MutexLock lock(&completion_mu_);
    completion_stop_ = true;
  }
  completion_cv_.NotifyAll();
  completion_thread_.join();
  // Memory a caller allocated and never freed.
  MutexLock lock(&mu_);  // no stream is left: for the analysis
  allocations_.ForEach([](DevicePtr base, uint64_t) {
    ::operator delete(HostAddress(base), kAlignment);
    g_live_allocations.fetch_sub(1, std::memory_order_relaxed);
  });
}

Result<std::unique_ptr<Stream>> HostDevice::CreateStream() {
  return std::unique_ptr<Stream>(std::make_unique<HostStream>(this));
}

Status HostDevice::RegisterHostMemory(void* ptr, uint64_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return InvalidArgument("RegisterHostMemory: null pointer or zero length");
  }
  MutexLock lock(&mu_);
  if (!registered_.Add(ptr, bytes)) {
    return InvalidArgument("RegisterHostMemory: the range is already registered");
  }
  return Status::Ok();
}

Status HostDevice::UnregisterHostMemory(void* ptr) {
  MutexLock lock(&mu_);
  if (ptr == nullptr || !registered_.Remove(ptr)) {
    return InvalidArgument("UnregisterHostMemory: the pointer was not registered");
  }
  return Status::Ok();
}

bool HostDevice::IsRegisteredHost(const void* ptr, uint64_t bytes) const {
  MutexLock lock(&mu_);
  return registered_.Contains(ptr, bytes);
}

size_t HostDevice::registered_host_ranges_for_test() const {
  MutexLock lock(&mu_);
  return registered_.size();
}

Result<std::shared_ptr<Module>> HostDevice::LoadModule(ModuleFormat /*format*/,
                                                       std::string_view /*image*/) {
  return Status(ErrorKind::kUnsupported, "raw kernels need the CUDA backend");
}

uint64_t HostDevice::bytes_in_use() const {
  MutexLock lock(&mu_);
  return bytes_in_use_;
}

uint64_t HostDevice::free_memory() const {
  MutexLock lock(&mu_);
  return options_.memory_bytes - bytes_in_use_;
}

void HostDevice::InjectFaultForTest(uint64_t after_ops, Status fault) {
  MutexLock lock(&mu_);
  fault_countdown_ = after_ops;
  injected_fault_ = std::move(fault);
  fault_armed_.store(true, std::memory_order_release);
}

uint64_t HostDevice::live_allocations_for_test() {
  return g_live_allocations.load(std::memory_order_relaxed);
}

void HostDevice::FailNextAllocationForTest() {
  MutexLock lock(&mu_);
  fail_next_allocation_ = true;
}

void HostDevice::SetOpDelayForTest(std::chrono::microseconds delay) {
  op_delay_us_.store(delay.count(), std::memory_order_relaxed);
}

Result<DevicePtr> HostDevice::AllocateMemory(uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("Allocate: bytes must be positive");
  {
    MutexLock lock(&mu_);
    if (fail_next_allocation_) {
      fail_next_allocation_ = false;
      return OutOfDeviceMemory("Allocate: injected failure (FailNextAllocationForTest)");
    }
    if (bytes > options_.memory_bytes - bytes_in_use_) {
      return OutOfDeviceMemory("Allocate: " + std::to_string(bytes) + " bytes requested, " +
                               std::to_string(options_.memory_bytes - bytes_in_use_) + " of " +
                               std::to_string(options_.memory_bytes) + " free");
    }
    bytes_in_use_ += bytes;  // reserved; the host allocation below may still fail
  }
  void* memory = ::operator new(static_cast<size_t>(bytes), kAlignment, std::nothrow);
  // The heap hands back what an earlier allocation (maybe another session's tensor) left:
  // zero it before the pointer exists for anyone, as the CUDA backend does.
  if (memory != nullptr) std::memset(memory, 0, static_cast<size_t>(bytes));
  MutexLock lock(&mu_);
  if (memory == nullptr) {
    bytes_in_use_ -= bytes;
    return OutOfDeviceMemory("Allocate: the host could not provide " + std::to_string(bytes) +
                             " bytes");
  }
  const DevicePtr ptr = DeviceAddress(memory);
  allocations_.Insert(ptr, bytes);
  g_live_allocations.fetch_add(1, std::memory_order_relaxed);
  return ptr;
}

bool HostDevice::MarkFreePending(DevicePtr ptr) {
  MutexLock lock(&mu_);
  return allocations_.MarkFreePending(ptr);
}

void HostDevice::ReleaseMemory(DevicePtr ptr) {
  {
    MutexLock lock(&mu_);
    const std::optional<uint64_t> bytes = allocations_.Erase(ptr);
    if (!bytes) return;
    bytes_in_use_ -= *bytes;
  }
  ::operator delete(HostAddress(ptr), kAlignment);
  g_live_allocations.fetch_sub(1, std::memory_order_relaxed);
}

Status HostDevice::CheckRange(DevicePtr ptr, uint64_t bytes, std::string_view what) const {
  if (ptr == 0) return InvalidArgument(std::string(what) + ": null device pointer");
  if (bytes == 0) return Status::Ok();
  MutexLock lock(&mu_);
  switch (allocations_.Find(ptr, bytes)) {
    case AllocationTable::Range::kInside:
      return Status::Ok();
    case AllocationTable::Range::kFreePending:
      return Status(ErrorKind::kOutOfRange, std::string(what) + ": the memory was freed");
    case AllocationTable::Range::kOutside:
      break;
  }
  return Status(ErrorKind::kOutOfRange, std::string(what) + ": " + std::to_string(bytes) +
                                            " bytes are not inside one allocation");
}

std::optional<Status> HostDevice::TakeInjectedFault() {
  if (!fault_armed_.load(std::memory_order_acquire)) return std::nullopt;
  MutexLock lock(&mu_);
  if (!injected_fault_.has_value()) return std::nullopt;
  if (fault_countdown_ > 0) {
    --fault_countdown_;
    return std::nullopt;
  }
  std::optional<Status> fault = std::move(injected_fault_);
  injected_fault_.reset();
  fault_armed_.store(false, std::memory_order_relaxed);
  return fault;
}

void HostDevice::AddPendingCompletion(const std::shared_ptr<CompletionTracker>& tracker) {
  MutexLock lock(&completion_mu_);
  ++tracker->pending;
}

void HostDevice::PostCompletion(PendingCompletion completion) {
  {
    MutexLock lock(&completion_mu_);
    completions_.push_back(std::move(completion));
  }
  completion_cv_.NotifyOne();
}

void HostDevice::WaitForCompletions(const std::shared_ptr<CompletionTracker>& tracker) {
  MutexLock lock(&completion_mu_);
  delivered_cv_.Wait(&completion_mu_, [&tracker] { return tracker->pending == 0; });
}

bool HostDevice::OnCompletionThread() const {
  return std::this_thread::get_id() == completion_thread_.get_id();
}

void HostDevice::CompletionLoop() {
  MutexLock lock(&completion_mu_);
  for (;;) {
    completion_cv_.Wait(&completion_mu_, [this] {
      completion_mu_.AssertHeld();
      return completion_stop_ || !completions_.empty();
    });
    if (completions_.empty()) return;  // stopping, and everything posted was delivered
    PendingCompletion completion = std::move(completions_.front());
    completions_.pop_front();
    lock.Unlock();
    if (completion.fn) completion.fn(std::move(completion.status));
    completion.fn = nullptr;  // destroy the callback's state outside the lock
    lock.Lock();
    --completion.tracker->pending;
    delivered_cv_.NotifyAll();
  }
}

}  // namespace ferry::backend
