// ferry._ferry: libferry for Python (pybind11). The package ferry (client/python/ferry/)
// re-exports it; ferry/_types.py holds the exception classes, the enums and SessionStats;
// ferry/*.pyi describe it all for type checkers.
//
// Threads and the GIL. A ferry::Session has one owner thread; Python code may call a session
// from several threads, so every call into a ferry::Session (and every destruction of one of
// its Tensors, Modules, Graphs or PendingTransfers, which record into it) happens under
// SessionCore's mutex, which stands in for the owner thread. Lock order: the session mutex
// is taken only with the GIL released, and the GIL is never acquired while it is held. Every
// call, recording ones included, reads its Python arguments with the GIL, then releases the
// GIL, takes the mutex, validates and calls libferry (touching no Python object), drops the
// mutex, and takes the GIL back to raise or to build what it returns. So a thread waiting
// for a session that another thread's synchronize() holds never stops the interpreter. The
// module takes no other lock: the graveyard below and a buffer's view count are atomics,
// and a Pending's own mutex is also taken with the GIL released. Tensors, Modules, Graphs and
// PendingTransfers that Python drops (on whatever thread the garbage collector runs) are
// pushed on the core's graveyard and destroyed under the mutex at the session's next call,
// or when the session object goes. PendingTransfer::is_ready() and wait() are safe without
// the session mutex (libferry guards their state with its own lock); PinnedBuffers may be
// destroyed on any thread.
//
// Arrays, without numpy's C layout. Nothing here includes pybind11/numpy.h: numpy's C structs
// changed in numpy 2 (a dtype's itemsize and flags moved), and code compiled against the 1.x
// layout reads wrong sizes under 2.x without failing. Arrays come in through the buffer
// protocol (PEP 3118: Py_buffer's format, itemsize, ndim, shape and strides, checked here),
// and go out through numpy's Python API (numpy.empty, numpy.frombuffer, numpy.dtype), which
// is the same under every numpy version.
//
// Buffers and views. A Python PinnedBuffer owns its ferry::PinnedBuffer through a shared
// BufferBox. Every view of its memory (buf.numpy(), buf.memoryview(), a DLPack capsule and
// the array a consumer built from it) holds the box and counts itself in box->views, so the
// memory outlives the views, and a transfer is refused (BUSY) while any view exists: the
// slab range must not change under a user's array.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ferry/client.h"
#include "ferry/dtype.h"
#include "ferry/session.h"
#include "ferry/status.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

// --- errors ----------------------------------------------------------------------------------

/// Raise `status` as the ferry._types exception class of its kind, with `tensor` and
/// `buffer` attached (the values a refused or failed transfer gives back). GIL held.
[[noreturn]] void Raise(const Status& status, py::object tensor = py::none(),
                        py::object buffer = py::none()) {
  py::object types = py::module_::import("ferry._types");
  py::object exc =
      types.attr("_make_error")(static_cast<int>(status.code()), static_cast<int>(status.kind()),
                                status.message(), status.op_index());
  exc.attr("tensor") = std::move(tensor);
  exc.attr("buffer") = std::move(buffer);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

[[noreturn]] void Fail(ErrorKind kind, const std::string& message) { Raise(Status(kind, message)); }

// --- numpy, through its Python API only -------------------------------------------------------

py::object Numpy() { return py::module_::import("numpy"); }

/// The numpy.dtype of `obj` (a dtype, a type such as numpy.float32, or a name). GIL held.
py::object NumpyDTypeOf(const py::object& obj) { return Numpy().attr("dtype")(obj); }

/// Return the ferry element type of a numpy dtype (its Python attributes, which mean the same
/// under numpy 1 and 2), or kInvalid.
DType DTypeFromNumpy(const py::object& dt) {
  const auto size = dt.attr("itemsize").cast<int64_t>();
  if (!dt.attr("isnative").cast<bool>() && size != 1) return DType::kInvalid;
  const std::string kind = dt.attr("kind").cast<std::string>();
  if (kind == "f" && size == 4) return DType::kF32;
  if (kind == "f" && size == 8) return DType::kF64;
  if (kind == "i" && size == 4) return DType::kI32;
  if (kind == "u" && size == 1) return DType::kU8;
  return DType::kInvalid;
}

DType ParseDType(const py::object& obj) {
  py::object dt = NumpyDTypeOf(obj);
  DType d = DTypeFromNumpy(dt);
  if (d == DType::kInvalid) {
    Fail(ErrorKind::kInvalidArgument,
         "dtype " + py::str(dt).cast<std::string>() +
             " is not a ferry element type (float32, float64, int32, uint8)");
  }
  return d;
}

const char* NumpyName(DType d) {
  switch (d) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kI32:
      return "int32";
    case DType::kU8:
      return "uint8";
    default:
      return nullptr;
  }
}

py::object NumpyDType(DType d) {
  const char* name = NumpyName(d);
  if (name == nullptr) Fail(ErrorKind::kInternal, "a tensor of dtype " + std::string(DTypeName(d)));
  return NumpyDTypeOf(py::str(name));
}

std::vector<int64_t> ParseShape(const py::object& obj) {
  if (PyIndex_Check(obj.ptr())) return {obj.cast<int64_t>()};  // an int, numpy's too
  std::vector<int64_t> dims;
  for (auto d : py::iter(obj)) dims.push_back(d.cast<int64_t>());
  return dims;
}

py::tuple ShapeTuple(const Shape& shape) {
  py::tuple t(shape.rank());
  for (size_t i = 0; i < shape.rank(); ++i) t[i] = py::int_(shape.dim(i));
  return t;
}

// --- arrays in: the buffer protocol ------------------------------------------------------------

/// One PEP 3118 export of a Python object, released (with the GIL held) when this goes. The
/// exporter keeps the memory still while the export lives, so it may be read with the GIL
/// released.
class BufferExport {
 public:
  /// Export `obj` with `flags` (PyBUF_*); raise what the exporter raises.
  BufferExport(const py::handle& obj, int flags) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw py::error_already_set();
    held_ = true;
  }
  BufferExport(const BufferExport&) = delete;
  BufferExport& operator=(const BufferExport&) = delete;
  ~BufferExport() {
    if (held_) PyBuffer_Release(&view_);
  }
  const Py_buffer& view() const { return view_; }
  void* data() const { return view_.buf; }
  uint64_t bytes() const { return static_cast<uint64_t>(view_.len); }
  uint64_t items() const { return view_.itemsize > 0 ? bytes() / view_.itemsize : 0; }
  bool c_contiguous() const { return PyBuffer_IsContiguous(&view_, 'C') != 0; }
  bool read_only() const { return view_.readonly != 0; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

/// What one item of a PEP 3118 buffer is: the ferry element type (or kInvalid) and a name for
/// messages, numpy-style ("float64", ">f4", "format 'T{...}'").
struct ItemType {
  DType dtype = DType::kInvalid;
  std::string name;
};

/// Read a buffer's `format` (struct-module syntax: an optional byte-order character, then one
/// type code; no count, no struct) together with its itemsize, which is the truth about the
/// size ('l' is 8 bytes natively on Linux, 4 with '<'). Big-endian items are refused on this
/// little-endian machine: the daemon's tensors hold native values.
ItemType ItemTypeOf(const char* format, Py_ssize_t itemsize) {
  std::string_view f = format ? format : "B";  // NULL means unsigned bytes (PEP 3118)
  ItemType out;
  out.name = "format '" + std::string(f) + "' of " + std::to_string(itemsize) + "-byte items";
  bool non_native = false;
  if (!f.empty() && std::string_view("@=<>!").find(f[0]) != std::string_view::npos) {
    non_native = (f[0] == '>' || f[0] == '!') && itemsize != 1;
    f.remove_prefix(1);
  }
  if (f.size() != 1) return out;
  const char code = f[0];
  char kind = 0;
  if (std::string_view("fde").find(code) != std::string_view::npos) kind = 'f';
  if (std::string_view("bhilqn").find(code) != std::string_view::npos) kind = 'i';
  if (std::string_view("BHILQN").find(code) != std::string_view::npos) kind = 'u';
  if (code == '?') kind = 'b';
  if (kind == 0) return out;
  std::string numpy_name = "bool";
  if (kind != 'b') {
    numpy_name = kind == 'f' ? "float" : kind == 'i' ? "int" : "uint";
    numpy_name += std::to_string(itemsize * 8);
  }
  if (non_native) {
    out.name = ">" + numpy_name + " (big-endian)";
    return out;
  }
  out.name = numpy_name;
  if (kind == 'f' && itemsize == 4) out.dtype = DType::kF32;
  if (kind == 'f' && itemsize == 8) out.dtype = DType::kF64;
  if (kind == 'i' && itemsize == 4) out.dtype = DType::kI32;
  if (kind == 'u' && itemsize == 1) out.dtype = DType::kU8;
  return out;
}

/// Copy a strided export's items into `out` in row-major (C) order. Any strides, negative
/// ones included: PEP 3118's `buf` points at item [0, ..., 0]. Touches no Python object.
void GatherRowMajor(const Py_buffer& v, char* out) {
  const int nd = v.ndim;
  const auto item = static_cast<size_t>(v.itemsize);
  if (nd == 0) {
    std::memcpy(out, v.buf, item);
    return;
  }
  for (int i = 0; i < nd; ++i) {
    if (v.shape[i] == 0) return;
  }
  std::vector<Py_ssize_t> index(nd, 0);
  const Py_ssize_t inner = v.shape[nd - 1], inner_stride = v.strides[nd - 1];
  for (;;) {
    const char* row = static_cast<const char*>(v.buf);
    for (int i = 0; i < nd - 1; ++i) row += index[i] * v.strides[i];
    if (inner_stride == static_cast<Py_ssize_t>(item)) {
      std::memcpy(out, row, inner * item);
      out += inner * item;
    } else {
      for (Py_ssize_t j = 0; j < inner; ++j, out += item) {
        std::memcpy(out, row + j * inner_stride, item);
      }
    }
    int d = nd - 2;
    while (d >= 0 && ++index[d] == v.shape[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

// --- the session core ------------------------------------------------------------------------

/// What Python dropped and must be destroyed under the session mutex.
using Buried = std::variant<PendingTransfer, Tensor, Module, Graph>;

/// One ferry::Session and the mutex that stands in for its owner thread. Shared by the
/// Python Session and every Tensor, Module, Graph, PinnedBuffer and Pending made from it.
class SessionCore {
 public:
  explicit SessionCore(Session session) : session_(std::move(session)) {}
  ~SessionCore() {
    // Nothing else holds the core now; the graveyard's values record into the session (or
    // find it gone) on this thread.
    std::lock_guard lock(mu_);
    ReapLocked();
  }

  /// Run fn(session) -> Status under the mutex; the caller has released the GIL, and fn
  /// touches no Python object. SESSION_CLOSED once the session is closed or gone.
  /// With `require_open` false, a closed session is still read (its counters, draining()).
  template <typename Fn>
  Status RunReleased(Fn&& fn, bool require_open = true) {
    std::lock_guard lock(mu_);
    ReapLocked();
    if (!session_ || (require_open && closed_.load())) {
      return Status(ErrorKind::kSessionClosed, "the session is closed");
    }
    return fn(*session_);
  }
  /// Release the GIL, then RunReleased(fn); the GIL is held again when this returns (after
  /// the mutex was let go). Called with the GIL held.
  template <typename Fn>
  Status Run(Fn&& fn, bool require_open = true) {
    py::gil_scoped_release release;
    return RunReleased(std::forward<Fn>(fn), require_open);
  }
  /// Close the session under the mutex (GIL released by the caller): what close() returns.
  /// Closed afterwards whatever the outcome.
  Result<SessionStats> CloseReleased() {
    std::lock_guard lock(mu_);
    ReapLocked();
    if (!session_ || closed_.load())
      return Status(ErrorKind::kSessionClosed, "the session is closed");
    auto r = session_->close();
    closed_.store(true);
    return r;
  }
  /// End the session (its stream) now: the Python Session object is going. GIL released.
  void Shutdown() {
    std::lock_guard lock(mu_);
    ReapLocked();
    session_.reset();
  }
  bool closed() const { return closed_.load(); }

  /// Hand over a value Python dropped; it is destroyed under the mutex later. Any thread,
  /// GIL or not; lock-free (a Treiber stack), so a drop never waits.
  void Bury(Buried value) {
    auto* g = new Grave{std::move(value), graves_.load(std::memory_order_relaxed)};
    while (!graves_.compare_exchange_weak(g->next, g, std::memory_order_release,
                                          std::memory_order_relaxed)) {
    }
  }

 private:
  struct Grave {
    Buried value;
    Grave* next;
  };

  void ReapLocked() {
    Grave* g = graves_.exchange(nullptr, std::memory_order_acquire);
    if (g == nullptr) return;
    std::vector<std::unique_ptr<Grave>> dead;
    for (; g != nullptr; g = g->next) dead.emplace_back(g);
    // Pendings first: a detached transfer's tensor is released after its copy is done. Then
    // the rest in the order Python dropped them (the stack holds them newest first).
    for (auto& d : dead) {
      if (std::holds_alternative<PendingTransfer>(d->value)) d->value = Tensor();
    }
    for (auto it = dead.rbegin(); it != dead.rend(); ++it) (*it)->value = Tensor();
  }

  std::mutex mu_;
  std::optional<Session> session_;   // guarded by mu_; empty after Shutdown
  std::atomic<bool> closed_{false};  // written under mu_; read anywhere
  std::atomic<Grave*> graves_{nullptr};
};

/// Where the C++ value behind a Python Tensor or PinnedBuffer is. kLending: a buffer being
/// lent right now (BufferBox::Lend), read as lent.
enum class Where { kHere, kLent, kDetached, kFreed, kLending };

// --- Tensor, Module, Graph -------------------------------------------------------------------

/// A Python Tensor. `tensor` leaves kHere (free, a transfer's lending) only under the session
/// mutex, so a call holding the mutex that saw kHere may use it until it lets go; wait()
/// puts it back (from kLent, which no one reads) with the GIL held.
struct TensorBox {
  std::shared_ptr<SessionCore> core;
  Tensor tensor;
  std::atomic<Where> where{Where::kHere};
  const uint64_t handle;
  const DType dtype;
  const Shape shape;
  const uint64_t elements;

  TensorBox(std::shared_ptr<SessionCore> c, Tensor t)
      : core(std::move(c)),
        tensor(std::move(t)),
        handle(tensor.handle()),
        dtype(tensor.dtype()),
        shape(tensor.shape()),
        elements(tensor.element_count()) {}
  TensorBox(const TensorBox&) = delete;
  ~TensorBox() {  // no call is using it: each holds a reference
    if (tensor.valid()) core->Bury(std::move(tensor));
  }
  uint64_t nbytes() const { return elements * DTypeSize(dtype); }
  std::string Describe() const {
    return "tensor " + std::to_string(handle) + " (" + std::string(DTypeName(dtype)) + " " +
           shape.ToString() + ")";
  }
};

/// A Python Module (device code loaded in the daemon); dropping it records its unload.
struct ModuleBox {
  std::shared_ptr<SessionCore> core;
  Module module;
  const uint64_t handle;
  ModuleBox(std::shared_ptr<SessionCore> c, Module m)
      : core(std::move(c)), module(std::move(m)), handle(module.handle()) {}
  ModuleBox(const ModuleBox&) = delete;
  ~ModuleBox() { core->Bury(std::move(module)); }
};

/// A Python Graph (a prepared graph); dropping it records its release.
struct GraphBox {
  std::shared_ptr<SessionCore> core;
  Graph graph;
  const uint64_t handle;
  GraphBox(std::shared_ptr<SessionCore> c, Graph g)
      : core(std::move(c)), graph(std::move(g)), handle(graph.handle()) {}
  GraphBox(const GraphBox&) = delete;
  ~GraphBox() { core->Bury(std::move(graph)); }
};

// --- PinnedBuffer and its views --------------------------------------------------------------

std::string NotHereMessage(Where w) {
  return w == Where::kLent || w == Where::kLending
             ? "the buffer is lent to a pending transfer; wait() gives it back"
             : "the buffer was given to a transfer that was dropped";
}

/// A Python PinnedBuffer. Views are made with the GIL held and a transfer lends the buffer
/// under the session mutex, on another thread: the two meet through two atomics, with no lock.
/// A view counts itself, then checks `where`; Lend marks `where`, then checks the count. Of
/// the two, at least one sees the other (sequentially consistent order), so no view is made
/// of a lent buffer and no buffer with a view is lent.
struct BufferBox {
  std::shared_ptr<SessionCore> core;
  PinnedBuffer buffer;
  std::atomic<Where> where{Where::kHere};
  const uint64_t size;
  const bool shared;
  std::atomic<int64_t> views{0};  // live views; decremented on any thread

  BufferBox(std::shared_ptr<SessionCore> c, PinnedBuffer b)
      : core(std::move(c)), buffer(std::move(b)), size(buffer.size()), shared(buffer.is_shared()) {}

  /// Count a new view and return the memory, or why there is none (lent or gone).
  Result<char*> AcquireView() {
    views.fetch_add(1);
    Where w = where.load();
    if (w != Where::kHere) {
      views.fetch_sub(1);
      return Status(ErrorKind::kInvalidArgument, NotHereMessage(w));
    }
    return static_cast<char*>(buffer.data());
  }
  void ReleaseView() { views.fetch_sub(1); }

  /// Take the buffer for a transfer (under the session mutex): BUSY while a view lives.
  Result<PinnedBuffer> Lend() {
    Where expected = Where::kHere;
    if (!where.compare_exchange_strong(expected, Where::kLending)) {
      return Status(ErrorKind::kInvalidArgument, NotHereMessage(expected));
    }
    if (int64_t n = views.load(); n > 0) {
      where.store(Where::kHere);
      return Status(ErrorKind::kBusy, "the buffer has " + std::to_string(n) +
                                          " live view(s) (numpy arrays, memoryviews or DLPack "
                                          "capsules); drop them before handing it to a transfer, "
                                          "the transfer would change memory under them");
    }
    PinnedBuffer b = std::move(buffer);
    where.store(Where::kLent);
    return b;
  }
};

/// One view of a buffer: exports the whole buffer as bytes through the buffer protocol.
struct BufferView {
  std::shared_ptr<BufferBox> box;
  char* data;
  BufferView(std::shared_ptr<BufferBox> b, char* d) : box(std::move(b)), data(d) {}
  BufferView(const BufferView&) = delete;
  ~BufferView() { box->ReleaseView(); }
};

/// A counted view of `box`'s memory; raises when the buffer is lent or gone. GIL held.
std::unique_ptr<BufferView> MakeView(std::shared_ptr<BufferBox> box) {
  auto data = box->AcquireView();
  if (!data.ok()) Raise(data.status());
  return std::make_unique<BufferView>(std::move(box), *data);
}

// DLPack's C ABI (the unversioned DLManagedTensor, as `__dlpack__` capsules named
// "dltensor" carry it), written from the public specification.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDAHost = 3;
constexpr uint8_t kDLUInt = 1;

/// Device type of a buffer's memory: CUDA-registered host memory when it is a slab the
/// daemon maps (it registers its slabs with CUDA), plain host memory for a remote session.
int32_t DlpackDeviceType(const BufferBox& box) { return box.shared ? kDLCUDAHost : kDLCPU; }

/// A DLPack export of a whole buffer as a 1-D uint8 tensor; a view while it lives. Its
/// deleter may run on any thread, with or without the GIL: it touches no Python object.
struct DlpackExport {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  std::unique_ptr<BufferView> view;

  explicit DlpackExport(std::unique_ptr<BufferView> v) : view(std::move(v)) {
    managed.dl_tensor.data = view->data;
    managed.dl_tensor.device = {DlpackDeviceType(*view->box), 0};
    managed.dl_tensor.ndim = 1;
    managed.dl_tensor.dtype = {kDLUInt, 8, 1};
    shape[0] = static_cast<int64_t>(view->box->size);
    managed.dl_tensor.shape = shape;
    managed.dl_tensor.strides = nullptr;  // compact, row-major
    managed.dl_tensor.byte_offset = 0;
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* self) {
      delete static_cast<DlpackExport*>(self->manager_ctx);
    };
  }
};

/// Capsule destructor: a capsule no consumer took ("dltensor" still) frees its export.
void DlpackCapsuleDestructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;  // consumed: "used_dltensor"
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

// --- PendingTransfer -------------------------------------------------------------------------

/// A Python Pending. Its fields are read and written with the GIL held, except `pending`,
/// which libferry calls use with the GIL released under `use_mu` (a PendingTransfer is not
/// for two threads at once): wait() holds it throughout, is_ready() only tries it.
struct PendingBox {
  std::shared_ptr<SessionCore> core;
  std::optional<PendingTransfer> pending;
  py::object tensor;  // the Python Tensor and PinnedBuffer lent to the transfer
  py::object buffer;
  bool waited = false;
  bool waiting = false;  // a thread is in wait()
  std::mutex use_mu;

  PendingBox() = default;
  PendingBox(const PendingBox&) = delete;
  ~PendingBox() {  // GIL held (Python deallocates it); no thread is in wait() or is_ready()
    if (waited || !pending) return;
    // Detach, as dropping a C++ PendingTransfer does: libferry keeps the values until the
    // copy is done; the Python objects stay empty.
    tensor.cast<TensorBox&>().where.store(Where::kDetached);
    buffer.cast<BufferBox&>().where.store(Where::kDetached);
    core->Bury(std::move(*pending));
    pending.reset();
  }
};

// --- raw kernels: arguments ---------------------------------------------------------------------

/// One argument of a raw kernel launch, as Python builds it (ferry.KernelArg). A tensor
/// argument keeps the Python Tensor: its handle is checked when the launch is recorded.
struct PyKernelArg {
  KernelArg::Kind kind = KernelArg::Kind::kI32;
  int64_t signed_value = 0;
  uint64_t unsigned_value = 0;
  double real_value = 0;
  py::object tensor;
};

const char* KernelArgKindName(KernelArg::Kind k) {
  switch (k) {
    case KernelArg::Kind::kTensor:
      return "tensor";
    case KernelArg::Kind::kI32:
      return "i32";
    case KernelArg::Kind::kU32:
      return "u32";
    case KernelArg::Kind::kI64:
      return "i64";
    case KernelArg::Kind::kU64:
      return "u64";
    case KernelArg::Kind::kF32:
      return "f32";
    case KernelArg::Kind::kF64:
      return "f64";
  }
  return "?";
}

/// The Tensor, int or float an argument passes. GIL held.
py::object KernelArgValue(const PyKernelArg& a) {
  switch (a.kind) {
    case KernelArg::Kind::kTensor:
      return a.tensor;
    case KernelArg::Kind::kI32:
    case KernelArg::Kind::kI64:
      return py::int_(a.signed_value);
    case KernelArg::Kind::kU32:
    case KernelArg::Kind::kU64:
      return py::int_(a.unsigned_value);
    case KernelArg::Kind::kF32:
    case KernelArg::Kind::kF64:
      break;
  }
  return py::float_(a.real_value);
}

/// An integer argument in [lo, hi]; INVALID_ARGUMENT for a non-integer (a float, a bool) or
/// one out of range. Accepts Python's and numpy's integers (operator.index).
PyKernelArg IntegerArg(KernelArg::Kind kind, const py::object& v, __int128 lo, __int128 hi) {
  const char* name = KernelArgKindName(kind);
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) {
    Fail(ErrorKind::kInvalidArgument,
         std::string("KernelArg.") + name + " takes an integer, not " +
             py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
  }
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  __int128 value = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
    if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      value = hi + 1;
    } else {
      value = u;
    }
  } else if (overflow < 0) {
    value = lo - 1;
  }
  if (value < lo || value > hi) {
    Fail(ErrorKind::kInvalidArgument, std::string("KernelArg.") + name + "(" +
                                          py::str(i).cast<std::string>() + ") is out of range");
  }
  PyKernelArg a;
  a.kind = kind;
  a.signed_value = static_cast<int64_t>(value);
  a.unsigned_value = static_cast<uint64_t>(value);
  return a;
}

/// A floating-point argument; f32 refuses finite values beyond float's range (they would
/// become infinities).
PyKernelArg RealArg(KernelArg::Kind kind, const py::object& v) {
  const char* name = KernelArgKindName(kind);
  if (PyBool_Check(v.ptr()) ||
      !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) || py::hasattr(v, "__float__"))) {
    Fail(ErrorKind::kInvalidArgument,
         std::string("KernelArg.") + name + " takes a number, not " +
             py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
  }
  const double d = PyFloat_AsDouble(v.ptr());
  if (d == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  if (kind == KernelArg::Kind::kF32 && std::isfinite(d) && std::fabs(d) > FLT_MAX) {
    Fail(ErrorKind::kInvalidArgument,
         std::string("KernelArg.f32(") + std::to_string(d) + ") is out of float32's range");
  }
  PyKernelArg a;
  a.kind = kind;
  a.real_value = d;
  return a;
}

/// The value of `v` (an int, numpy's too: anything with __index__) when it is in [lo, hi].
/// The caller has checked PyIndex_Check.
std::optional<long long> IntIn(const py::object& v, long long lo, long long hi) {
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || n < lo || n > hi) return std::nullopt;
  return n;
}

/// A grid or block size from an int or a sequence of 1 to 3 ints, each 1 to 2^32 - 1.
Dim3 ParseDim3(const py::object& obj, const char* what) {
  std::vector<py::object> parts;
  if (PyIndex_Check(obj.ptr())) {
    parts.push_back(obj);
  } else if (py::isinstance<py::sequence>(obj) && !py::isinstance<py::str>(obj)) {
    for (auto p : py::reinterpret_borrow<py::sequence>(obj)) {
      parts.push_back(py::reinterpret_borrow<py::object>(p));
    }
  } else {
    Fail(ErrorKind::kInvalidArgument,
         std::string(what) + " must be an int or a sequence of 1 to 3 ints");
  }
  if (parts.empty() || parts.size() > 3) {
    Fail(ErrorKind::kInvalidArgument,
         std::string(what) + " needs 1 to 3 dimensions, not " + std::to_string(parts.size()));
  }
  uint32_t dims[3] = {1, 1, 1};
  for (size_t i = 0; i < parts.size(); ++i) {
    if (PyBool_Check(parts[i].ptr()) || !PyIndex_Check(parts[i].ptr())) {
      Fail(ErrorKind::kInvalidArgument, std::string(what) + " dimensions must be ints");
    }
    const auto n = IntIn(parts[i], 1, UINT32_MAX);
    if (!n) {
      Fail(ErrorKind::kInvalidArgument, std::string(what) + " dimension " + std::to_string(i) +
                                            " is " + py::str(parts[i]).cast<std::string>() +
                                            "; each must be 1 to 4294967295");
    }
    dims[i] = static_cast<uint32_t>(*n);
  }
  return Dim3{dims[0], dims[1], dims[2]};
}

/// The most arguments a launch may carry (docs/protocol.md, "Limits"; the daemon refuses
/// more as INVALID_ARGUMENT): checked here so the mistake is named before anything is sent.
constexpr size_t kMaxKernelArgs = 256;
/// The longest kernel name the daemon accepts.
constexpr size_t kMaxFunctionName = 1024;

// --- Session ---------------------------------------------------------------------------------

// Every field of ferry::SessionStats, once: the Python dataclass is built from this list, and
// the static_assert below fails the build when the C++ struct gains a field it lacks.
#define FERRY_SESSION_STATS_FIELDS(X) \
  X(submits)                          \
  X(failed_submits)                   \
  X(ops)                              \
  X(kernel_launches)                  \
  X(bytes_uploaded)                   \
  X(bytes_downloaded)                 \
  X(tensors_created)                  \
  X(peak_device_bytes)                \
  X(device_busy_ns)                   \
  X(graph_launches)                   \
  X(kernel_batches)                   \
  X(h2d_bytes)                        \
  X(h2d_ns)                           \
  X(d2h_bytes)                        \
  X(d2h_ns)                           \
  X(staged_upload_bytes)              \
  X(staged_download_bytes)
#define FERRY_COUNT_FIELD(name) +1
static_assert(sizeof(SessionStats) ==
                  (0 FERRY_SESSION_STATS_FIELDS(FERRY_COUNT_FIELD)) * sizeof(uint64_t),
              "ferry::SessionStats has a field FERRY_SESSION_STATS_FIELDS lacks: add it there, "
              "in ferry/_types.py and in ferry/_types.pyi");
#undef FERRY_COUNT_FIELD

struct PySession {
  std::shared_ptr<SessionCore> core;
  py::object stats = py::none();
  const uint64_t id;
  const std::string backend;
  const uint64_t quota;
  const uint64_t slab_size;

  explicit PySession(Session s)
      : id(s.id()), backend(s.backend()), quota(s.device_bytes_quota()), slab_size(s.slab_size()) {
    core = std::make_shared<SessionCore>(std::move(s));
  }
  PySession(const PySession&) = delete;
  ~PySession() {
    // Ends the stream without waiting for the device (as ~ferry::Session does); no other
    // thread is inside this session's methods, since they hold a reference to it. The GIL
    // is let go first, as for every use of the session mutex.
    py::gil_scoped_release release;
    core->Shutdown();
    core.reset();
  }

  /// The C++ tensor behind `t`, for a call holding the session mutex; the reason when it
  /// cannot be used here. Stays valid while the mutex is held.
  Result<const Tensor*> UseLocked(const TensorBox& t) const {
    if (t.core != core) {
      return Status(ErrorKind::kInvalidHandle, t.Describe() + " belongs to another session");
    }
    switch (t.where.load()) {
      case Where::kHere:
        return &t.tensor;
      case Where::kLent:
      case Where::kLending:
        return Status(ErrorKind::kInvalidHandle,
                      t.Describe() + " is lent to a pending transfer; wait() gives it back");
      case Where::kDetached:
        return Status(ErrorKind::kInvalidHandle,
                      t.Describe() + " was given to a transfer that was dropped (detached)");
      case Where::kFreed:
        break;
    }
    return Status(ErrorKind::kInvalidHandle, t.Describe() + " was freed");
  }
  Status CheckMine(const ModuleBox& m) const {
    if (m.core != core) {
      return Status(ErrorKind::kInvalidHandle,
                    "module " + std::to_string(m.handle) + " belongs to another session");
    }
    return Status::Ok();
  }
  Status CheckMine(const GraphBox& g) const {
    if (g.core != core) {
      return Status(ErrorKind::kInvalidHandle,
                    "graph " + std::to_string(g.handle) + " belongs to another session");
    }
    return Status::Ok();
  }

  /// Record fn(session) (a call that only records): the GIL released while it waits for
  /// the session and runs; raise its failure.
  template <typename Fn>
  void Record(Fn&& fn) {
    Check(core->Run(std::forward<Fn>(fn)));
  }

  py::object MakeStats(const SessionStats& s) {
    py::object cls = py::module_::import("ferry._types").attr("SessionStats");
    py::dict kwargs;
#define FERRY_STATS_KWARG(name) kwargs[#name] = s.name;
    FERRY_SESSION_STATS_FIELDS(FERRY_STATS_KWARG)
#undef FERRY_STATS_KWARG
    return cls(**kwargs);
  }

  /// Close the session; quietly (no raise) when `quiet`. The stats land in .stats.
  py::object Close(bool quiet) {
    std::optional<Result<SessionStats>> r;
    {
      py::gil_scoped_release release;
      r.emplace(core->CloseReleased());
    }
    if (r->ok()) {
      stats = MakeStats(**r);
    } else if (!quiet) {
      Raise(r->status());
    }
    return stats;
  }

  /// Check a transfer's tensor and buffer and take the C++ values out of their boxes. Under
  /// the session mutex. Takes nothing when it refuses.
  Result<std::pair<Tensor, PinnedBuffer>> LendLocked(TensorBox& t, BufferBox& b) {
    FERRY_RETURN_IF_ERROR(UseLocked(t).status());
    if (b.core != core) {
      return Status(ErrorKind::kInvalidArgument, "the buffer belongs to another session");
    }
    FERRY_ASSIGN_OR_RETURN(PinnedBuffer buffer, b.Lend());
    Tensor tensor = std::move(t.tensor);
    t.where.store(Where::kLent);
    return std::make_pair(std::move(tensor), std::move(buffer));
  }

  py::object MakePending(PendingTransfer p, py::object tensor_obj, py::object buffer_obj) {
    auto box = std::make_unique<PendingBox>();
    box->core = core;
    box->pending = std::move(p);
    box->tensor = std::move(tensor_obj);
    box->buffer = std::move(buffer_obj);
    return py::cast(std::move(box));
  }
};

py::object PendingWait(PendingBox& p) {
  if (p.waited || !p.pending) {
    Fail(ErrorKind::kInvalidArgument, "no transfer: already waited for");
  }
  if (p.waiting) Fail(ErrorKind::kInvalidArgument, "another thread is waiting for this transfer");
  // Others see `waiting` and keep off; use_mu keeps is_ready() off the handle meanwhile.
  p.waiting = true;
  Transfer t;
  {
    py::gil_scoped_release release;
    std::lock_guard lock(p.use_mu);
    t = p.pending->wait();
  }
  p.waiting = false;
  p.waited = true;
  p.pending.reset();
  auto& tb = p.tensor.cast<TensorBox&>();
  auto& bb = p.buffer.cast<BufferBox&>();
  // Both were kLent, which no other call reads past: the values go back, then `where`.
  const bool tensor_back = t.tensor.valid(), buffer_back = t.buffer.valid();
  tb.tensor = std::move(t.tensor);
  tb.where.store(tensor_back ? Where::kHere : Where::kFreed);
  bb.buffer = std::move(t.buffer);
  bb.where.store(buffer_back ? Where::kHere : Where::kDetached);
  if (!t.status.ok()) Raise(t.status, p.tensor, p.buffer);
  return py::make_tuple(p.tensor, p.buffer);
}

bool PendingIsReady(PendingBox& p) {
  if (p.waited || !p.pending) Fail(ErrorKind::kInvalidArgument, "no transfer: already waited for");
  if (p.waiting) Fail(ErrorKind::kInvalidArgument, "another thread is waiting for this transfer");
  std::optional<Result<bool>> r;
  {
    py::gil_scoped_release release;
    std::unique_lock lock(p.use_mu, std::try_to_lock);
    if (lock.owns_lock()) r.emplace(p.pending->is_ready());
  }
  // Lost the race to a thread that entered wait() after the check above: never block here.
  if (!r) Fail(ErrorKind::kInvalidArgument, "another thread is waiting for this transfer");
  if (!r->ok()) Raise(r->status());
  return **r;
}

/// The tensor's dtype and element count against an export's; what `what` is in messages.
Status CheckFits(const TensorBox& t, const BufferExport& in, const char* what) {
  const ItemType item = ItemTypeOf(in.view().format, in.view().itemsize);
  if (item.dtype != t.dtype) {
    return Status(ErrorKind::kDtypeMismatch,
                  std::string(what) + " of " + item.name + " for " + t.Describe());
  }
  if (in.items() != t.elements) {
    return Status(ErrorKind::kShapeMismatch,
                  std::string(what) + " of " + std::to_string(in.items()) + " elements for " +
                      t.Describe() + " of " + std::to_string(t.elements));
  }
  return Status::Ok();
}

/// An export of `data` for reading: its buffer, or numpy.asarray(data)'s for an object
/// without one (a list, say), as numpy would take it.
std::unique_ptr<BufferExport> ExportForReading(const py::object& data) {
  constexpr int kFlags = PyBUF_RECORDS_RO | PyBUF_FORMAT;  // strides, format; no suboffsets
  if (PyObject_CheckBuffer(data.ptr())) return std::make_unique<BufferExport>(data, kFlags);
  return std::make_unique<BufferExport>(Numpy().attr("asarray")(data), kFlags);
}

/// The bytes of an export in row-major order: its own memory when C-contiguous, else a
/// gathered copy in `copy` (GIL released by the caller).
const void* RowMajorBytes(const BufferExport& in, std::vector<char>& copy) {
  if (in.c_contiguous()) return in.data();
  copy.resize(in.bytes());
  GatherRowMajor(in.view(), copy.data());
  return copy.data();
}

/// The ModuleFormat `format` names (a ferry.ModuleFormat or its int, never a bool); raises
/// InvalidArgument for anything else.
ModuleFormat ParseModuleFormat(const py::object& format) {
  int f = 0;
  if (PyIndex_Check(format.ptr()) && !PyBool_Check(format.ptr())) f = format.cast<int>();
  if (f < static_cast<int>(ModuleFormat::kPtx) || f > static_cast<int>(ModuleFormat::kCudaSource)) {
    Fail(ErrorKind::kInvalidArgument, "module format " + py::repr(format).cast<std::string>() +
                                          " is not a ferry.ModuleFormat (PTX, CUBIN, CUDA_SOURCE)");
  }
  return static_cast<ModuleFormat>(f);
}

/// The bytes of a module image: a str's UTF-8, or the bytes of anything with the buffer
/// protocol; raises InvalidArgument for another type or an empty image.
std::string ModuleImageBytes(const py::object& image) {
  std::string bytes;
  if (py::isinstance<py::str>(image)) {
    bytes = image.cast<std::string>();  // UTF-8
  } else if (PyObject_CheckBuffer(image.ptr())) {
    BufferExport in(image, PyBUF_SIMPLE);  // C-contiguous bytes, or the exporter says
    bytes.assign(static_cast<const char*>(in.data()), in.bytes());
  } else {
    Fail(ErrorKind::kInvalidArgument,
         "a module image is str (PTX, CUDA C++) or bytes (CUBIN, fatbin, PTX), not " +
             py::str(py::type::handle_of(image).attr("__name__")).cast<std::string>());
  }
  if (bytes.empty()) Fail(ErrorKind::kInvalidArgument, "an empty module image");
  return bytes;
}

/// launch's shared_bytes: an int (not a bool) from 0 to 2^32 - 1; raises InvalidArgument
/// otherwise.
uint32_t ParseSharedBytes(const py::object& shared) {
  if (PyBool_Check(shared.ptr()) || !PyIndex_Check(shared.ptr())) {
    Fail(ErrorKind::kInvalidArgument, "shared_bytes must be an int");
  }
  const auto shared_ll = IntIn(shared, 0, UINT32_MAX);
  if (!shared_ll) Fail(ErrorKind::kInvalidArgument, "shared_bytes must be 0 to 4294967295");
  return static_cast<uint32_t>(*shared_ll);
}

/// launch's arguments as given, before any is checked against the session.
struct ParsedKernelArgs {
  std::vector<PyKernelArg> args;    // a bare Tensor already wrapped as KernelArg.tensor
  std::vector<TensorBox*> tensors;  // tensors[i]: argument i's tensor, or null for a scalar
};

/// Parses launch's `args`: a sequence (not a str) of at most kMaxKernelArgs KernelArgs or
/// Tensors; raises InvalidArgument otherwise, naming the first bad element.
ParsedKernelArgs ParseKernelArgs(const py::object& args) {
  if (py::isinstance<py::str>(args) || !py::isinstance<py::sequence>(args)) {
    Fail(ErrorKind::kInvalidArgument, "args must be a sequence of KernelArg");
  }
  auto seq = py::reinterpret_borrow<py::sequence>(args);
  if (seq.size() > kMaxKernelArgs) {
    Fail(ErrorKind::kInvalidArgument, std::to_string(seq.size()) + " kernel arguments; at most " +
                                          std::to_string(kMaxKernelArgs));
  }
  ParsedKernelArgs parsed;
  parsed.tensors.assign(seq.size(), nullptr);
  for (size_t i = 0; i < seq.size(); ++i) {
    py::object a = seq[i];
    if (py::isinstance<PyKernelArg>(a)) {
      parsed.args.push_back(a.cast<PyKernelArg>());
    } else if (py::isinstance<TensorBox>(a)) {
      parsed.args.push_back(PyKernelArg{KernelArg::Kind::kTensor, 0, 0, 0, a});
    } else {
      Fail(ErrorKind::kInvalidArgument,
           "kernel argument " + std::to_string(i) + " (" +
               py::str(py::type::handle_of(a).attr("__name__")).cast<std::string>() +
               ") is not a Tensor or a KernelArg: the kernel's parameter types decide "
               "what a number is, so wrap it (KernelArg.i32(v), .f32(v), ...)");
    }
    if (parsed.args.back().kind == KernelArg::Kind::kTensor) {
      parsed.tensors[i] = &parsed.args.back().tensor.cast<TensorBox&>();
    }
  }
  return parsed;
}

/// The libferry arguments for a launch; fails when a tensor argument is not usable in `s`.
/// Call with the session locked (inside Record), as UseLocked requires.
Result<std::vector<KernelArg>> KernelArgsLocked(const PySession& s,
                                                const ParsedKernelArgs& parsed) {
  std::vector<KernelArg> out;
  out.reserve(parsed.args.size());
  for (size_t i = 0; i < parsed.args.size(); ++i) {
    const PyKernelArg& a = parsed.args[i];
    switch (a.kind) {
      case KernelArg::Kind::kTensor: {
        FERRY_ASSIGN_OR_RETURN(const Tensor* t, s.UseLocked(*parsed.tensors[i]));
        out.push_back(KernelArg::tensor(*t));
        break;
      }
      case KernelArg::Kind::kI32:
        out.push_back(KernelArg::i32(static_cast<int32_t>(a.signed_value)));
        break;
      case KernelArg::Kind::kU32:
        out.push_back(KernelArg::u32(static_cast<uint32_t>(a.unsigned_value)));
        break;
      case KernelArg::Kind::kI64:
        out.push_back(KernelArg::i64(a.signed_value));
        break;
      case KernelArg::Kind::kU64:
        out.push_back(KernelArg::u64(a.unsigned_value));
        break;
      case KernelArg::Kind::kF32:
        out.push_back(KernelArg::f32(static_cast<float>(a.real_value)));
        break;
      case KernelArg::Kind::kF64:
        out.push_back(KernelArg::f64(a.real_value));
        break;
    }
  }
  return out;
}

/// PinnedBuffer.numpy: a numpy array of `shape` elements of `dtype` over b's first bytes (all
/// that fit, 1-D, when shape is None), no copy; the array keeps the buffer alive. Raises
/// InvalidArgument for a dtype without a size or holding objects, OutOfRange when it does
/// not fit.
py::object NumpyOverBuffer(std::shared_ptr<BufferBox> b, const py::object& dtype,
                           const py::object& shape) {
  py::object dt = NumpyDTypeOf(dtype);
  const auto itemsize = dt.attr("itemsize").cast<int64_t>();
  if (itemsize <= 0 || dt.attr("hasobject").cast<bool>()) {
    Fail(ErrorKind::kInvalidArgument,
         "a buffer cannot be viewed as " + py::str(dt).cast<std::string>());
  }
  const uint64_t size = b->size;
  std::vector<int64_t> dims;
  uint64_t count = 0;
  if (shape.is_none()) {
    count = size / itemsize;
    dims = {static_cast<int64_t>(count)};
  } else {
    dims = ParseShape(shape);
    auto n = Shape(dims).ElementCount();
    if (!n.ok()) Raise(n.status());
    count = *n;
  }
  uint64_t need = 0;
  if (!CheckedMul(count, itemsize, &need) || need > size) {
    Fail(ErrorKind::kOutOfRange, "a view of " + std::to_string(count) + " x " +
                                     std::to_string(itemsize) + " bytes does not fit a buffer of " +
                                     std::to_string(size) + " bytes");
  }
  py::object view = py::cast(MakeView(std::move(b)));
  py::object flat =
      Numpy().attr("frombuffer")(view, py::arg("dtype") = dt, py::arg("count") = count);
  return flat.attr("reshape")(py::tuple(py::cast(dims)));
}

/// PinnedBuffer.__dlpack__: a "dltensor" capsule exporting all of b as 1-D uint8, no copy.
/// Raises ValueError for a stream (host memory has none) or copy=True.
py::object DlpackOverBuffer(std::shared_ptr<BufferBox> b, const py::object& stream,
                            const py::object& copy) {
  if (!stream.is_none()) {
    throw py::value_error("ferry buffers are host memory: stream must be None");
  }
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::value_error("a ferry buffer is exported without a copy (copy=True)");
  }
  auto* e = new DlpackExport(MakeView(std::move(b)));
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", DlpackCapsuleDestructor);
  if (!cap) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

using BinaryOp = void (Session::*)(const Tensor&, const Tensor&, const Tensor&);

void BindBinary(py::class_<PySession>& cls, const char* name, BinaryOp op, const char* doc) {
  cls.def(
      name,
      [op](PySession& s, TensorBox& a, TensorBox& b, TensorBox& out) {
        s.Record([&](Session& ss) -> Status {
          FERRY_ASSIGN_OR_RETURN(const Tensor* ta, s.UseLocked(a));
          FERRY_ASSIGN_OR_RETURN(const Tensor* tb, s.UseLocked(b));
          FERRY_ASSIGN_OR_RETURN(const Tensor* to, s.UseLocked(out));
          (ss.*op)(*ta, *tb, *to);
          return Status::Ok();
        });
      },
      py::arg("a"), py::arg("b"), py::arg("out"), doc);
}

/// Binds a session method recording `op` on two tensors, named `in_name` and `out_name`.
using UnaryOp = void (Session::*)(const Tensor&, const Tensor&);
void BindUnary(py::class_<PySession>& cls, const char* name, UnaryOp op, const char* in_name,
               const char* out_name, const char* doc) {
  cls.def(
      name,
      [op](PySession& s, TensorBox& in, TensorBox& out) {
        s.Record([&](Session& ss) -> Status {
          FERRY_ASSIGN_OR_RETURN(const Tensor* a, s.UseLocked(in));
          FERRY_ASSIGN_OR_RETURN(const Tensor* o, s.UseLocked(out));
          (ss.*op)(*a, *o);
          return Status::Ok();
        });
      },
      py::arg(in_name), py::arg(out_name), doc);
}

/// The module-level tables the Python package builds its enums and SessionStats from, and the
/// hooks its tests use.
void BindModuleTables(py::module_& m) {
  m.def("_error_kind_names", [] {
    std::vector<std::pair<int, std::string>> out;
    for (int k = 0; k <= static_cast<int>(kLastErrorKind); ++k) {
      out.emplace_back(k, std::string(ErrorKindName(static_cast<ErrorKind>(k))));
    }
    return out;
  });
  m.def("_code_names", [] {
    std::vector<std::pair<int, std::string>> out;
    for (int c = 0; c <= static_cast<int>(Code::kUnauthenticated); ++c) {
      out.emplace_back(c, std::string(CodeName(static_cast<Code>(c))));
    }
    return out;
  });
  m.def("_module_format_names", [] {
    return std::vector<std::pair<int, std::string>>{
        {static_cast<int>(ModuleFormat::kPtx), "PTX"},
        {static_cast<int>(ModuleFormat::kCubin), "CUBIN"},
        {static_cast<int>(ModuleFormat::kCudaSource), "CUDA_SOURCE"}};
  });
  m.def("_session_stats_fields", [] {
    std::vector<std::string> out;
#define FERRY_FIELD_NAME(name) out.emplace_back(#name);
    FERRY_SESSION_STATS_FIELDS(FERRY_FIELD_NAME)
#undef FERRY_FIELD_NAME
    return out;
  });
  m.def(
      "_canonical_code", [](int kind) { return static_cast<int>(CanonicalCode(ErrorKind(kind))); },
      "The canonical code an ErrorKind is reported under.");
  m.def(
      "_raise_status_for_test",
      [](int kind, const std::string& message, int op_index) {
        Raise(Status(static_cast<ErrorKind>(kind), message, op_index));
      },
      "Raise a ferry::Status of `kind` the way every failing call does (tests of the mapping).");
}

/// ferry.Tensor: a handle to a tensor in the daemon's device memory.
void BindTensor(py::module_& m) {
  py::class_<TensorBox>(m, "Tensor",
                        "A tensor in the daemon's device memory (Session.tensor). Dropping it "
                        "records its release into the session's next submit.")
      .def_property_readonly(
          "handle", [](const TensorBox& t) { return t.handle; },
          "The handle that names the tensor in the session (never 0).")
      .def_property_readonly(
          "shape", [](const TensorBox& t) { return ShapeTuple(t.shape); },
          "The dimensions, outermost first (a tuple of ints; () for rank 0).")
      .def_property_readonly(
          "dtype", [](const TensorBox& t) { return NumpyDType(t.dtype); },
          "The element type as a numpy.dtype (float32, float64, int32 or uint8).")
      .def_property_readonly(
          "size", [](const TensorBox& t) { return t.elements; }, "The number of elements.")
      .def_property_readonly("nbytes", &TensorBox::nbytes, "The size in bytes.")
      .def_property_readonly(
          "valid", [](const TensorBox& t) { return t.where.load() == Where::kHere; },
          "False while lent to a pending transfer, after free(), or after its Pending was "
          "dropped.")
      .def("__repr__", [](const TensorBox& t) {
        const char* where[] = {"", ", lent to a transfer", ", detached", ", freed",
                               ", lent to a transfer"};
        return "<ferry.Tensor " + std::to_string(t.handle) + " " + std::string(DTypeName(t.dtype)) +
               " " + t.shape.ToString() + where[static_cast<int>(t.where.load())] + ">";
      });
}

/// ferry.Module and ferry.Graph: handles to loaded device code and to a prepared graph.
void BindModuleAndGraph(py::module_& m) {
  py::class_<ModuleBox>(m, "Module",
                        "Device code loaded in the daemon (Session.load_module; CUDA backend "
                        "only). Dropping it records its unload into the next submit; graphs "
                        "and launches recorded earlier keep it loaded.")
      .def_property_readonly(
          "handle", [](const ModuleBox& b) { return b.handle; },
          "The handle that names the module in the session.")
      .def("__repr__",
           [](const ModuleBox& b) { return "<ferry.Module " + std::to_string(b.handle) + ">"; });

  py::class_<GraphBox>(m, "Graph",
                       "A prepared graph: device work recorded once between "
                       "Session.begin_graph() and Session.end_graph(), replayed by "
                       "Session.launch_graph() as one op. Dropping it records its release.")
      .def_property_readonly(
          "handle", [](const GraphBox& b) { return b.handle; },
          "The handle that names the graph in the session.")
      .def("__repr__",
           [](const GraphBox& b) { return "<ferry.Graph " + std::to_string(b.handle) + ">"; });
}

/// ferry.KernelArg: one typed argument of Session.launch.
void BindKernelArg(py::module_& m) {
  py::class_<PyKernelArg>(
      m, "KernelArg",
      "One argument of Session.launch: a tensor (its device address) or a typed scalar. Make "
      "one with KernelArg.tensor(t), .i32(v), .u32(v), .i64(v), .u64(v), .f32(v) or .f64(v); "
      "the type must match the kernel's parameter. A value out of its type's range is "
      "ferry.InvalidArgument.")
      .def_static(
          "tensor",
          [](py::object t) {
            if (!py::isinstance<TensorBox>(t)) {
              Fail(ErrorKind::kInvalidArgument,
                   "KernelArg.tensor takes a ferry.Tensor, not " +
                       py::str(py::type::handle_of(t).attr("__name__")).cast<std::string>());
            }
            PyKernelArg a;
            a.kind = KernelArg::Kind::kTensor;
            a.tensor = std::move(t);
            return a;
          },
          py::arg("tensor"), "Pass a tensor's device address (checked when launched).")
      .def_static(
          "i32",
          [](const py::object& v) {
            return IntegerArg(KernelArg::Kind::kI32, v, INT32_MIN, INT32_MAX);
          },
          py::arg("value"), "Pass a 32-bit signed integer (int).")
      .def_static(
          "u32",
          [](const py::object& v) { return IntegerArg(KernelArg::Kind::kU32, v, 0, UINT32_MAX); },
          py::arg("value"), "Pass a 32-bit unsigned integer (unsigned int).")
      .def_static(
          "i64",
          [](const py::object& v) {
            return IntegerArg(KernelArg::Kind::kI64, v, INT64_MIN, INT64_MAX);
          },
          py::arg("value"), "Pass a 64-bit signed integer (long long).")
      .def_static(
          "u64",
          [](const py::object& v) { return IntegerArg(KernelArg::Kind::kU64, v, 0, UINT64_MAX); },
          py::arg("value"), "Pass a 64-bit unsigned integer (unsigned long long).")
      .def_static(
          "f32", [](const py::object& v) { return RealArg(KernelArg::Kind::kF32, v); },
          py::arg("value"), "Pass a 32-bit float (float).")
      .def_static(
          "f64", [](const py::object& v) { return RealArg(KernelArg::Kind::kF64, v); },
          py::arg("value"), "Pass a 64-bit float (double).")
      .def_property_readonly(
          "kind", [](const PyKernelArg& a) { return KernelArgKindName(a.kind); },
          "'tensor', 'i32', 'u32', 'i64', 'u64', 'f32' or 'f64'.")
      .def_property_readonly("value", &KernelArgValue, "The Tensor, int or float passed.")
      .def("__repr__", [](const PyKernelArg& a) {
        return "KernelArg." + std::string(KernelArgKindName(a.kind)) + "(" +
               py::repr(KernelArgValue(a)).cast<std::string>() + ")";
      });
}

/// ferry.PinnedBuffer and the _BufferView its no-copy exports hold.
void BindPinnedBuffer(py::module_& m) {
  py::class_<BufferView>(m, "_BufferView", py::buffer_protocol()).def_buffer([](BufferView& v) {
    return py::buffer_info(v.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(v.box->size)}, {1}, false);
  });

  py::class_<BufferBox, std::shared_ptr<BufferBox>>(
      m, "PinnedBuffer",
      "Host memory for transfers (Session.pinned_buffer). For a local session it IS a range of "
      "the shared-memory slab the daemon DMAs from: numpy() and __dlpack__ expose it without "
      "a copy. Views keep the buffer alive; a buffer with live views cannot be handed to a "
      "transfer (ferry.Busy).")
      .def_property_readonly(
          "nbytes", [](const BufferBox& b) { return b.size; }, "The size in bytes.")
      .def_property_readonly(
          "is_shared", [](const BufferBox& b) { return b.shared; },
          "True when the bytes live in shared memory the daemon maps.")
      .def_property_readonly(
          "views", [](const BufferBox& b) { return b.views.load(); },
          "How many views of the memory are alive.")
      .def_property_readonly(
          "valid", [](const BufferBox& b) { return b.where.load() == Where::kHere; },
          "False while lent to a pending transfer, or after its Pending was dropped.")
      .def_property_readonly(
          "address",
          [](std::shared_ptr<BufferBox> b) {
            return reinterpret_cast<uintptr_t>(MakeView(std::move(b))->data);
          },
          "The address of the first byte (for checking that views share it).")
      .def(
          "memoryview",
          [](std::shared_ptr<BufferBox> b) {
            return py::memoryview(py::cast(MakeView(std::move(b))));
          },
          "A writable memoryview of all the bytes (a view: it keeps the buffer alive).")
      .def("numpy", &NumpyOverBuffer, py::arg("dtype") = "uint8", py::arg("shape") = py::none(),
           "A numpy array over the buffer's memory (no copy): `shape` elements of `dtype` from "
           "its first byte (default: as many as fit, 1-D), C-contiguous. Writable; keeps the "
           "buffer alive.")
      .def(
          "__dlpack__",
          [](std::shared_ptr<BufferBox> b, const py::object& stream, const py::object&,
             const py::object&,
             const py::object& copy) { return DlpackOverBuffer(std::move(b), stream, copy); },
          py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
          "Export the whole buffer as a 1-D uint8 DLPack tensor (no copy).")
      .def(
          "__dlpack_device__",
          [](const BufferBox& b) { return py::make_tuple(DlpackDeviceType(b), 0); },
          "(3, 0): kDLCUDAHost for slab memory; (1, 0): kDLCPU for a remote session's.")
      .def("__repr__", [](const BufferBox& b) {
        return "<ferry.PinnedBuffer " + std::to_string(b.size) + " bytes" +
               (b.shared ? ", shared" : "") +
               (b.where.load() == Where::kHere ? "" : ", lent or detached") + ">";
      });
}

/// ferry.Pending: a transfer in flight.
void BindPending(py::module_& m) {
  py::class_<PendingBox>(m, "Pending",
                         "A transfer in flight. Dropping it without wait() detaches it: the "
                         "library keeps the tensor and the buffer until the copy is done, then "
                         "releases them.")
      .def("is_ready", &PendingIsReady,
           "False while in flight, True once done and OK; raises the error when refused or "
           "failed (wait() then gives the values back). Never blocks.")
      .def("wait", &PendingWait,
           "Block (the GIL released) until done; return (tensor, buffer). On refusal or "
           "failure raise the typed error with .tensor and .buffer given back.")
      .def_property_readonly(
          "tensor", [](const PendingBox& p) { return p.tensor; },
          "The Tensor lent to the transfer (usable again after wait()).")
      .def_property_readonly(
          "buffer", [](const PendingBox& p) { return p.buffer; },
          "The PinnedBuffer lent to the transfer (usable again after wait()).");
}

/// Session's read-only properties.
void BindSessionProperties(py::class_<PySession>& cls) {
  cls.def_property_readonly(
         "id", [](const PySession& s) { return s.id; }, "The id the daemon gave the session.")
      .def_property_readonly(
          "backend", [](const PySession& s) { return s.backend; },
          "The backend serving the session: 'host' or 'cuda'.")
      .def_property_readonly(
          "device_bytes_quota", [](const PySession& s) { return s.quota; },
          "The device-memory quota the daemon granted, in bytes.")
      .def_property_readonly(
          "slab_size", [](const PySession& s) { return s.slab_size; },
          "The size of one shared-memory slab (the largest pinned buffer); 0 when remote.")
      .def_property_readonly(
          "closed", [](const PySession& s) { return s.core->closed(); },
          "True once close() ran (or the with block ended).")
      .def_property_readonly(
          "stats", [](const PySession& s) { return s.stats; },
          "The SessionStats close() returned; None before.")
      .def_property_readonly(
          "draining",
          [](PySession& s) {
            bool draining = false;
            Check(s.core->Run(
                [&](Session& ss) {
                  draining = ss.draining();
                  return Status::Ok();
                },
                /*require_open=*/false));
            return draining;
          },
          "True once the daemon announced it is draining: submitted work still completes, "
          "then the session ends; open a new one elsewhere.")
      .def_property_readonly(
          "recorded_ops",
          [](PySession& s) {
            size_t n = 0;
            Check(s.core->Run(
                [&](Session& ss) {
                  n = ss.recorded_ops();
                  return Status::Ok();
                },
                /*require_open=*/false));
            return n;
          },
          "How many ops are recorded and not yet submitted.");
}

/// Session methods that record a tensor's creation, release and byte writes.
void BindSessionTensors(py::class_<PySession>& cls) {
  cls.def(
         "tensor",
         [](PySession& s, const py::object& shape, const py::object& dtype) {
           DType d = ParseDType(dtype);
           Shape sh(ParseShape(shape));
           auto n = sh.ElementCount();
           if (!n.ok()) Raise(n.status());
           Tensor t;
           s.Record([&](Session& ss) {
             t = ss.create_tensor(d, sh);
             return Status::Ok();
           });
           return std::make_unique<TensorBox>(s.core, std::move(t));
         },
         py::arg("shape"), py::arg("dtype") = "float32",
         "Record the creation of a tensor (contents undefined until written). `shape`: an int "
         "or a sequence of ints; `dtype`: float32, float64, int32 or uint8 (numpy's names, "
         "types or dtypes).")
      .def(
          "free",
          [](PySession& s, TensorBox& t) {
            s.Record([&](Session& ss) -> Status {
              FERRY_RETURN_IF_ERROR(s.UseLocked(t).status());
              Tensor gone = std::move(t.tensor);
              t.where.store(Where::kFreed);
              ss.free(std::move(gone));
              return Status::Ok();
            });
          },
          py::arg("tensor"), "Record the release of a tensor.");
  cls.def(
      "write_bytes",
      [](PySession& s, TensorBox& t, uint64_t offset, const py::object& data) {
        auto in = ExportForReading(data);
        std::vector<char> copy;
        Check(s.core->Run([&](Session& ss) -> Status {
          FERRY_ASSIGN_OR_RETURN(const Tensor* tt, s.UseLocked(t));
          ss.write_bytes(*tt, offset, RowMajorBytes(*in, copy), in->bytes());
          return Status::Ok();
        }));
      },
      py::arg("tensor"), py::arg("offset"), py::arg("data"),
      "Record a write of `data`'s bytes (any buffer; a non-contiguous one in row-major "
      "order) at byte `offset` of the tensor; the bytes are copied now. The daemon refuses "
      "a range outside the tensor (OUT_OF_RANGE at synchronize()).");
}

/// Session methods that record arithmetic on tensors.
void BindSessionArithmetic(py::class_<PySession>& cls) {
  cls.def(
      "fill",
      [](PySession& s, TensorBox& t, double value) {
        s.Record([&](Session& ss) -> Status {
          FERRY_ASSIGN_OR_RETURN(const Tensor* tt, s.UseLocked(t));
          ss.fill(*tt, value);
          return Status::Ok();
        });
      },
      py::arg("tensor"), py::arg("value"), "Record tensor[:] = value.");
  BindUnary(cls, "copy", &Session::copy, "src", "dst",
            "Record dst = src (same dtype and element count).");
  cls.def(
      "scale",
      [](PySession& s, TensorBox& x, double alpha, TensorBox& out) {
        s.Record([&](Session& ss) -> Status {
          FERRY_ASSIGN_OR_RETURN(const Tensor* a, s.UseLocked(x));
          FERRY_ASSIGN_OR_RETURN(const Tensor* o, s.UseLocked(out));
          ss.scale(*a, alpha, *o);
          return Status::Ok();
        });
      },
      py::arg("x"), py::arg("alpha"), py::arg("out"), "Record out = alpha * x.");
  BindUnary(cls, "relu", &Session::relu, "x", "out",
            "Record out = max(x, 0), elementwise (out may be x).");
  cls.def(
      "axpy",
      [](PySession& s, double alpha, TensorBox& x, TensorBox& y) {
        s.Record([&](Session& ss) -> Status {
          FERRY_ASSIGN_OR_RETURN(const Tensor* a, s.UseLocked(x));
          FERRY_ASSIGN_OR_RETURN(const Tensor* b, s.UseLocked(y));
          ss.axpy(alpha, *a, *b);
          return Status::Ok();
        });
      },
      py::arg("alpha"), py::arg("x"), py::arg("y"), "Record y += alpha * x.");
  BindUnary(cls, "sum", &Session::sum, "input", "out", "Record out (one element) = sum of input.");
  cls.def(
      "gemm",
      [](PySession& s, TensorBox& a, TensorBox& b, TensorBox& c, bool trans_a, bool trans_b,
         double alpha, double beta) {
        GemmOptions o;
        o.trans_a = trans_a;
        o.trans_b = trans_b;
        o.alpha = alpha;
        o.beta = beta;
        s.Record([&](Session& ss) -> Status {
          FERRY_ASSIGN_OR_RETURN(const Tensor* ta, s.UseLocked(a));
          FERRY_ASSIGN_OR_RETURN(const Tensor* tb, s.UseLocked(b));
          FERRY_ASSIGN_OR_RETURN(const Tensor* tc, s.UseLocked(c));
          ss.gemm(*ta, *tb, *tc, o);
          return Status::Ok();
        });
      },
      py::arg("a"), py::arg("b"), py::arg("c"), py::arg("trans_a") = false,
      py::arg("trans_b") = false, py::arg("alpha") = 1.0, py::arg("beta") = 0.0,
      "Record c = alpha * op(a) @ op(b) + beta * c (rank-2, row-major).");
  BindBinary(cls, "add", &Session::add, "Record out = a + b (elementwise).");
  BindBinary(cls, "sub", &Session::sub, "Record out = a - b (elementwise).");
  BindBinary(cls, "mul", &Session::mul, "Record out = a * b (elementwise).");
  BindBinary(cls, "div", &Session::div, "Record out = a / b (elementwise).");
}

/// Session methods that record the loading of device code and launches of its kernels.
void BindSessionKernels(py::class_<PySession>& cls) {
  cls.def(
         "load_module",
         [](PySession& s, const py::object& format, const py::object& image) {
           const ModuleFormat f = ParseModuleFormat(format);
           const std::string bytes = ModuleImageBytes(image);
           Module mod;
           s.Record([&](Session& ss) {
             mod = ss.load_module(f, bytes);
             return Status::Ok();
           });
           return std::make_unique<ModuleBox>(s.core, std::move(mod));
         },
         py::arg("format"), py::arg("image"),
         "Record the loading of device code: `format` a ferry.ModuleFormat, `image` the PTX or "
         "CUDA C++ text (str) or a CUBIN/fatbin (bytes). Raw kernels need the CUDA backend "
         "(ferry.Unsupported at synchronize() on the host backend) and a daemon that allows "
         "them for this user (ferry.PermissionDenied otherwise); a compile error refuses the "
         "submit with ferry.CompileError and the compiler's log.")
      .def(
          "launch",
          [](PySession& s, ModuleBox& module, const std::string& function, const py::object& grid,
             const py::object& block, const py::object& args, const py::object& shared) {
            if (function.empty() || function.size() > kMaxFunctionName) {
              Fail(ErrorKind::kInvalidArgument,
                   "a kernel name is 1 to " + std::to_string(kMaxFunctionName) + " bytes long");
            }
            const Dim3 g = ParseDim3(grid, "grid"), b = ParseDim3(block, "block");
            const uint32_t shared_bytes = ParseSharedBytes(shared);
            const ParsedKernelArgs parsed = ParseKernelArgs(args);
            s.Record([&](Session& ss) -> Status {
              FERRY_RETURN_IF_ERROR(s.CheckMine(module));
              FERRY_ASSIGN_OR_RETURN(std::vector<KernelArg> out, KernelArgsLocked(s, parsed));
              ss.launch(module.module, function, g, b, out, shared_bytes);
              return Status::Ok();
            });
          },
          py::arg("module"), py::arg("function"), py::arg("grid"), py::arg("block"),
          py::arg("args") = py::tuple(), py::arg("shared_bytes") = 0,
          "Record a launch of `function` (its extern \"C\" name) from `module`: `grid` and "
          "`block` an int or 1 to 3 ints (each at least 1), `args` a sequence of KernelArg "
          "(a Tensor stands for KernelArg.tensor), at most 256. Bad arguments raise "
          "ferry.InvalidArgument before anything is recorded; the daemon checks the argument "
          "count and sizes against the kernel (INVALID_ARGUMENT at synchronize()).");
}

/// Session methods that record graphs: their capture and their replay.
void BindSessionGraphs(py::class_<PySession>& cls) {
  cls.def(
         "begin_graph",
         [](PySession& s) {
           Graph g;
           s.Record([&](Session& ss) {
             g = ss.begin_graph();
             return Status::Ok();
           });
           return std::make_unique<GraphBox>(s.core, std::move(g));
         },
         "Start recording a graph: device work recorded until end_graph() goes into it "
         "instead of running. Begin and end must be in the same submit.")
      .def(
          "end_graph",
          [](PySession& s) {
            s.Record([](Session& ss) {
              ss.end_graph();
              return Status::Ok();
            });
          },
          "End the graph begin_graph() started.")
      .def(
          "launch_graph",
          [](PySession& s, GraphBox& g) {
            s.Record([&](Session& ss) -> Status {
              FERRY_RETURN_IF_ERROR(s.CheckMine(g));
              ss.launch_graph(g.graph);
              return Status::Ok();
            });
          },
          py::arg("graph"), "Record one replay of `graph`.");
}

/// Session methods that send, wait for and end the session's work, and its context manager.
void BindSessionLifecycle(py::class_<PySession>& cls) {
  cls.def(
         "submit",
         [](PySession& s) { Check(s.core->Run([](Session& ss) { return ss.submit(); })); },
         "Send what is recorded as one message; the outcome comes at synchronize().")
      .def(
          "synchronize",
          [](PySession& s) { Check(s.core->Run([](Session& ss) { return ss.synchronize(); })); },
          "Submit, wait for all submitted work; raise the first failure since the last one.")
      .def(
          "close", [](PySession& s) { return s.Close(/*quiet=*/false); },
          "Submit, wait, release everything and end the session; return its SessionStats.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Return the session itself.")
      .def(
          "__exit__",
          [](PySession& s, const py::object& exc_type, const py::object&, const py::object&) {
            if (s.core->closed()) return false;
            // The block's exception wins over close()'s; close quietly then.
            s.Close(/*quiet=*/!exc_type.is_none());
            return false;
          },
          "Close the session (quietly when the block raised).");
}

/// Session methods that allocate pinned buffers and start transfers through them.
void BindSessionPendingTransfers(py::class_<PySession>& cls) {
  cls.def(
         "pinned_buffer",
         [](PySession& s, uint64_t nbytes) {
           std::optional<Result<PinnedBuffer>> r;
           Check(s.core->Run([&](Session& ss) {
             r.emplace(ss.pinned_buffer(nbytes));
             return Status::Ok();
           }));
           if (!r->ok()) Raise(r->status());
           return std::make_shared<BufferBox>(s.core, std::move(**r));
         },
         py::arg("nbytes"),
         "Allocate a buffer from the session's shared-memory slabs (QUOTA_EXCEEDED above one "
         "slab's size or when the daemon's pinned budget is spent).")
      .def(
          "upload_pending",
          [](PySession& s, py::object buffer, py::object tensor) {
            auto& t = tensor.cast<TensorBox&>();
            auto& b = buffer.cast<BufferBox&>();
            PendingTransfer p;
            s.Record([&](Session& ss) -> Status {
              FERRY_ASSIGN_OR_RETURN(auto lent, s.LendLocked(t, b));
              p = ss.upload_pending(std::move(lent.second), std::move(lent.first));
              return Status::Ok();
            });
            return s.MakePending(std::move(p), std::move(tensor), std::move(buffer));
          },
          py::arg("buffer"), py::arg("tensor"),
          "Copy the first tensor.nbytes bytes of `buffer` into `tensor`. Both are lent to the "
          "returned Pending until wait().")
      .def(
          "download_pending",
          [](PySession& s, py::object tensor, py::object buffer) {
            auto& t = tensor.cast<TensorBox&>();
            auto& b = buffer.cast<BufferBox&>();
            PendingTransfer p;
            s.Record([&](Session& ss) -> Status {
              FERRY_ASSIGN_OR_RETURN(auto lent, s.LendLocked(t, b));
              p = ss.download_pending(std::move(lent.first), std::move(lent.second));
              return Status::Ok();
            });
            return s.MakePending(std::move(p), std::move(tensor), std::move(buffer));
          },
          py::arg("tensor"), py::arg("buffer"),
          "Copy the whole tensor into the start of `buffer`. Both are lent to the returned "
          "Pending until wait().");
}

/// Session methods that copy host arrays in and out of tensors and wait for the copy.
void BindSessionBlockingTransfers(py::class_<PySession>& cls) {
  cls.def(
         "upload",
         [](PySession& s, TensorBox& t, const py::object& data) {
           auto in = ExportForReading(data);
           Check(CheckFits(t, *in, "an array"));
           std::vector<char> copy;
           Check(s.core->Run([&](Session& ss) -> Status {
             FERRY_ASSIGN_OR_RETURN(const Tensor* tt, s.UseLocked(t));
             return ss.upload_bytes(*tt, RowMajorBytes(*in, copy), in->bytes());
           }));
         },
         py::arg("tensor"), py::arg("data"),
         "Write `data` into the whole tensor and wait. `data`: any object with the buffer "
         "protocol (a numpy array, memoryview, bytes, array.array; else numpy.asarray(data)) "
         "of the tensor's dtype, native byte order, and its element count; a non-contiguous "
         "one (any strides, negative too) is copied in row-major order first.")
      .def(
          "download",
          [](PySession& s, TensorBox& t) {
            py::object out = Numpy().attr("empty")(ShapeTuple(t.shape), NumpyDType(t.dtype));
            BufferExport into(out, PyBUF_CONTIG);  // C-contiguous, writable
            Check(s.core->Run([&](Session& ss) -> Status {
              FERRY_ASSIGN_OR_RETURN(const Tensor* tt, s.UseLocked(t));
              return ss.download_bytes(*tt, into.data(), t.nbytes());
            }));
            return out;
          },
          py::arg("tensor"),
          "Read the whole tensor into a new numpy array of its shape and dtype (C-contiguous).")
      .def(
          "download_into",
          [](PySession& s, TensorBox& t, const py::object& out) {
            BufferExport into(out, PyBUF_RECORDS_RO | PyBUF_FORMAT);
            Check(CheckFits(t, into, "an output array"));
            if (!into.c_contiguous() || into.read_only()) {
              Fail(ErrorKind::kInvalidArgument,
                   "the output array must be C-contiguous and writable");
            }
            Check(s.core->Run([&](Session& ss) -> Status {
              FERRY_ASSIGN_OR_RETURN(const Tensor* tt, s.UseLocked(t));
              return ss.download_bytes(*tt, into.data(), t.nbytes());
            }));
          },
          py::arg("tensor"), py::arg("out"),
          "Read the whole tensor into `out`: any writable C-contiguous buffer (a numpy array, "
          "say) of the tensor's dtype and element count; anything else is refused, never "
          "copied.");
}

/// ferry.Session and all its methods.
void BindSession(py::module_& m) {
  py::class_<PySession> session(
      m, "Session",
      "A session with a ferry daemon: one stream, one device stream. Ops are recorded and "
      "sent at submit(); synchronize() waits and raises the first failure. A context manager: "
      "leaving the block closes it (the counters land in .stats). Threads may share a "
      "session: each call waits for the others' with the GIL released.");
  BindSessionProperties(session);
  BindSessionTensors(session);
  BindSessionArithmetic(session);
  BindSessionKernels(session);
  BindSessionGraphs(session);
  BindSessionLifecycle(session);
  BindSessionPendingTransfers(session);
  BindSessionBlockingTransfers(session);
}

/// ferry.Client: a connection to a daemon, which opens sessions.
void BindClient(py::module_& m) {
  py::class_<Client>(m, "Client", "A connection to one ferry daemon; thread-safe.")
      .def_static(
          "connect",
          [](const std::string& target, const std::string& client_name, double connect_timeout,
             const std::string& tls_ca_cert, const std::string& tls_client_cert,
             const std::string& tls_client_key, const std::string& bearer_token,
             int64_t wait_spin_us) {
            ClientOptions o;
            o.client_name = client_name;
            o.connect_timeout =
                std::chrono::milliseconds(static_cast<int64_t>(connect_timeout * 1000));
            o.tls_ca_cert = tls_ca_cert;
            o.tls_client_cert = tls_client_cert;
            o.tls_client_key = tls_client_key;
            o.bearer_token = bearer_token;
            o.wait_spin = std::chrono::microseconds(wait_spin_us);
            std::optional<Result<Client>> r;
            {
              py::gil_scoped_release release;
              r.emplace(Client::connect(target, o));
            }
            if (!r->ok()) Raise(r->status());
            return std::move(**r);
          },
          py::arg("target"), py::kw_only(), py::arg("client_name") = "ferry-python",
          py::arg("connect_timeout") = 5.0, py::arg("tls_ca_cert") = "",
          py::arg("tls_client_cert") = "", py::arg("tls_client_key") = "",
          py::arg("bearer_token") = "", py::arg("wait_spin_us") = 200,
          "Connect to a daemon at 'unix:PATH' or 'tcp:HOST:PORT' (ferry.Unavailable when it "
          "does not answer within connect_timeout seconds).")
      .def_property_readonly("target", &Client::target, "The target connected to.")
      .def(
          "open_session",
          [](Client& c, uint64_t device_bytes_quota, uint32_t max_in_flight_submits) {
            SessionOptions o;
            o.device_bytes_quota = device_bytes_quota;
            o.max_in_flight_submits = max_in_flight_submits;
            std::optional<Result<Session>> r;
            {
              py::gil_scoped_release release;
              r.emplace(c.open_session(o));
            }
            if (!r->ok()) Raise(r->status());
            return std::make_unique<PySession>(std::move(**r));
          },
          py::kw_only(), py::arg("device_bytes_quota") = 0, py::arg("max_in_flight_submits") = 0,
          "Open a session (0 takes the daemon's default for either limit).")
      .def(
          "session",
          [](py::object self, py::kwargs kwargs) { return self.attr("open_session")(**kwargs); },
          "Open a session for a `with` block: it is closed when the block ends (its counters "
          "in .stats); takes open_session's options.");
}

}  // namespace
}  // namespace ferry::python

PYBIND11_MODULE(_ferry, m) {
  using namespace ferry;          // NOLINT: the module's body names libferry's types
  using namespace ferry::python;  // NOLINT
  m.doc() = "libferry for Python; import the package `ferry`, not this module.";
  BindModuleTables(m);
  BindTensor(m);
  BindModuleAndGraph(m);
  BindKernelArg(m);
  BindPinnedBuffer(m);
  BindPending(m);
  BindSession(m);
  BindClient(m);
}
