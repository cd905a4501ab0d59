// Recording: the Session's ops, and the release of Tensors, Modules and Graphs, into the
// session's next Submit message (owner thread).
#include <utility>

#include "ferry/client.h"
#include "ferry/wire.h"
#include "session_state.h"

namespace ferry {

namespace {
// Record the release of `*handle` into its session's next submit (no message of its own)
// while the session is open, and forget the handle. `record` fills the op.
template <typename RecordFn>
void RecordRelease(const std::weak_ptr<internal::SessionState>& session, uint64_t* handle,
                   RecordFn record) {
  if (*handle == 0) return;
  if (auto s = session.lock(); s && !s->closed()) record(*s->Record(), *handle);
  *handle = 0;
}
}  // namespace

// --- Tensor ------------------------------------------------------------------------------

Tensor::Tensor(Tensor&& o) noexcept
    : session_(std::move(o.session_)),
      handle_(std::exchange(o.handle_, 0)),
      dtype_(o.dtype_),
      shape_(std::move(o.shape_)),
      elements_(std::exchange(o.elements_, 0)) {}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    Release();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    elements_ = std::exchange(o.elements_, 0);
  }
  return *this;
}

Tensor::~Tensor() { Release(); }

void Tensor::Release() {
  RecordRelease(session_, &handle_,
                [](v1::Op& op, uint64_t h) { op.mutable_free_tensor()->set_handle(h); });
}

// --- Module, Graph -------------------------------------------------------------------------

Module::Module(Module&& o) noexcept
    : session_(std::move(o.session_)), handle_(std::exchange(o.handle_, 0)) {}
Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    Release();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Module::~Module() { Release(); }

void Module::Release() {
  RecordRelease(session_, &handle_,
                [](v1::Op& op, uint64_t h) { op.mutable_unload_module()->set_handle(h); });
}

Graph::Graph(Graph&& o) noexcept
    : session_(std::move(o.session_)), handle_(std::exchange(o.handle_, 0)) {}
Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    Release();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Graph::~Graph() { Release(); }

void Graph::Release() {
  RecordRelease(session_, &handle_,
                [](v1::Op& op, uint64_t h) { op.mutable_free_graph()->set_handle(h); });
}

// --- Session -----------------------------------------------------------------------------

Session::Session(std::shared_ptr<internal::SessionState> state) : state_(std::move(state)) {}
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;
Session::~Session() = default;

uint64_t Session::id() const { return state_->opened().session_id(); }
bool Session::draining() const { return state_->draining(); }
const std::string& Session::backend() const { return state_->opened().backend(); }
uint64_t Session::device_bytes_quota() const { return state_->opened().device_bytes_quota(); }

Tensor Session::create_tensor(DType dtype, const Shape& shape) {
  uint64_t handle = state_->NextHandle();
  auto* c = state_->Record()->mutable_create_tensor();
  c->set_handle(handle);
  c->set_dtype(wire::ToProto(dtype));
  for (int64_t d : shape.dims()) c->add_shape(d);
  auto count = shape.ElementCount();
  return Tensor(state_, handle, dtype, shape, count.ok() ? *count : 0);
}

void Session::free(Tensor&& tensor) {
  Tensor t = std::move(tensor);
  t.Release();
}

void Session::fill(const Tensor& t, double value) {
  auto* f = state_->Record()->mutable_fill();
  f->set_tensor(t.handle());
  f->set_value(value);
}

void Session::copy(const Tensor& src, const Tensor& dst) {
  auto* c = state_->Record()->mutable_copy();
  c->set_src(src.handle());
  c->set_dst(dst.handle());
}

namespace {
void RecordBinary(internal::SessionState& s, v1::BinaryKind kind, const Tensor& a, const Tensor& b,
                  const Tensor& out) {
  auto* op = s.Record()->mutable_binary();
  op->set_kind(kind);
  op->set_a(a.handle());
  op->set_b(b.handle());
  op->set_out(out.handle());
}
}  // namespace

void Session::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::ADD, a, b, out);
}
void Session::sub(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::SUB, a, b, out);
}
void Session::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::MUL, a, b, out);
}
void Session::div(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::DIV, a, b, out);
}

void Session::scale(const Tensor& x, double alpha, const Tensor& out) {
  auto* op = state_->Record()->mutable_scale();
  op->set_x(x.handle());
  op->set_alpha(alpha);
  op->set_out(out.handle());
}

void Session::relu(const Tensor& x, const Tensor& out) {
  auto* op = state_->Record()->mutable_relu();
  op->set_x(x.handle());
  op->set_out(out.handle());
}

void Session::axpy(double alpha, const Tensor& x, const Tensor& y) {
  auto* op = state_->Record()->mutable_axpy();
  op->set_alpha(alpha);
  op->set_x(x.handle());
  op->set_y(y.handle());
}

void Session::sum(const Tensor& in, const Tensor& out) {
  auto* op = state_->Record()->mutable_reduce_sum();
  op->set_in(in.handle());
  op->set_out(out.handle());
}

void Session::gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& o) {
  auto* op = state_->Record()->mutable_gemm();
  op->set_a(a.handle());
  op->set_b(b.handle());
  op->set_c(c.handle());
  op->set_trans_a(o.trans_a);
  op->set_trans_b(o.trans_b);
  op->set_alpha(o.alpha);
  op->set_beta(o.beta);
}

void Session::write_bytes(const Tensor& t, uint64_t offset, const void* data, uint64_t bytes) {
  auto* op = state_->Record()->mutable_upload();
  op->set_tensor(t.handle());
  op->set_offset(offset);
  op->set_data(data, bytes);
}

Module Session::load_module(ModuleFormat format, std::string_view image) {
  uint64_t handle = state_->NextHandle();
  auto* op = state_->Record()->mutable_load_module();
  op->set_handle(handle);
  op->set_format(static_cast<v1::ModuleFormat>(format));
  op->set_image(image.data(), image.size());
  return Module(state_, handle);
}

void Session::launch(const Module& module, std::string_view function, Dim3 grid, Dim3 block,
                     const std::vector<KernelArg>& args, uint32_t shared_bytes) {
  auto* op = state_->Record()->mutable_launch();
  op->set_module(module.handle());
  op->set_function(function.data(), function.size());
  for (uint32_t d : {grid.x, grid.y, grid.z}) op->add_grid(d);
  for (uint32_t d : {block.x, block.y, block.z}) op->add_block(d);
  op->set_shared_bytes(shared_bytes);
  for (const KernelArg& a : args) {
    v1::KernelArg* k = op->add_args();
    switch (a.kind()) {
      case KernelArg::Kind::kTensor:
        k->set_tensor(a.integer());
        break;
      case KernelArg::Kind::kI32:
        k->set_i32(static_cast<int32_t>(a.real()));
        break;
      case KernelArg::Kind::kU32:
        k->set_u32(static_cast<uint32_t>(a.integer()));
        break;
      case KernelArg::Kind::kI64:
        k->set_i64(static_cast<int64_t>(a.integer()));
        break;
      case KernelArg::Kind::kU64:
        k->set_u64(a.integer());
        break;
      case KernelArg::Kind::kF32:
        k->set_f32(static_cast<float>(a.real()));
        break;
      case KernelArg::Kind::kF64:
        k->set_f64(a.real());
        break;
    }
  }
}

Graph Session::begin_graph() {
  uint64_t handle = state_->NextHandle();
  state_->Record()->mutable_begin_graph()->set_handle(handle);
  return Graph(state_, handle);
}

void Session::end_graph() { state_->Record()->mutable_end_graph(); }

void Session::launch_graph(const Graph& graph) {
  state_->Record()->mutable_launch_graph()->set_graph(graph.handle());
}

size_t Session::recorded_ops() const { return state_->recorded(); }

Status Session::submit() { return state_->Submit().status(); }

Status Session::synchronize() { return state_->Synchronize(); }

Result<SessionStats> Session::close() { return state_->Close(); }

Status Session::DtypeMismatch(const Tensor& t) {
  return Status(ErrorKind::kDtypeMismatch, "the element type does not match tensor " +
                                               std::to_string(t.handle()) + " (" +
                                               std::string(DTypeName(t.dtype())) + ")");
}

}  // namespace ferry
