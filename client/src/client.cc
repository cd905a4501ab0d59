// libferry's implementation: the session stream, its reader thread, and the recording of
// ops into ferry.v1 messages.
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "ferry/client.h"
#include "ferry/v1/session.grpc.pb.h"

namespace ferry {
namespace internal {
namespace {

constexpr uint64_t kUploadChunkBytes = 1ull << 20;      // bytes per Upload op
constexpr uint64_t kUploadSubmitBytes = 8ull << 20;     // upload bytes per submit message
constexpr uint64_t kDownloadSubmitBytes = 256ull << 20; // download bytes per submit
constexpr uint64_t kMaxMessageBytes = 80ull << 20;

std::string GrpcTarget(const std::string& target) {
  if (target.rfind("tcp:", 0) == 0) return target.substr(4);
  return target;  // "unix:PATH" and gRPC's own schemes pass through
}

Status FromProto(const v1::Error& e) {
  int kind = e.kind();
  if (kind < 0 || kind > static_cast<int>(ErrorKind::kBusy)) {
    kind = static_cast<int>(ErrorKind::kInternal);
  }
  int code = e.code();
  if (code <= 0 || code > static_cast<int>(Code::kUnauthenticated)) {
    code = static_cast<int>(Code::kUnknown);
  }
  return Status(static_cast<Code>(code), static_cast<ErrorKind>(kind), e.message(),
                e.op_index());
}

v1::DType ToProto(DType d) {
  switch (d) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kF64: return v1::DTYPE_F64;
    case DType::kI32: return v1::DTYPE_I32;
    case DType::kU8: return v1::DTYPE_U8;
    default: return v1::DTYPE_INVALID;
  }
}

SessionStats FromProto(const v1::SessionStats& s) {
  SessionStats out;
  out.submits = s.submits();
  out.failed_submits = s.failed_submits();
  out.ops = s.ops();
  out.kernel_launches = s.kernel_launches();
  out.bytes_uploaded = s.bytes_uploaded();
  out.bytes_downloaded = s.bytes_downloaded();
  out.tensors_created = s.tensors_created();
  out.peak_device_bytes = s.peak_device_bytes();
  out.device_busy_ns = s.device_busy_ns();
  out.graph_launches = s.graph_launches();
  return out;
}

}  // namespace

class ClientState {
 public:
  std::string target;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::SessionService::Stub> stub;
};

// The state of one session, shared by the Session object and its Tensors (weakly).
// Recording and writes happen on the owner's thread; the reader thread delivers events.
class SessionState {
 public:
  using Stream = grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>;

  ~SessionState() { Shutdown(); }

  Status Open(std::shared_ptr<ClientState> client, const SessionOptions& options) {
    client_ = std::move(client);
    stream_ = client_->stub->Session(&context_);
    v1::ClientMessage m;
    auto* open = m.mutable_open();
    open->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
    open->set_client_name(client_->options.client_name);
    open->set_device_bytes_quota(options.device_bytes_quota);
    open->set_max_in_flight_submits(options.max_in_flight_submits);
    if (!stream_->Write(m)) return StreamFailure("sending Open");
    v1::ServerMessage reply;
    if (!stream_->Read(&reply)) return StreamFailure("waiting for Opened");
    if (reply.has_error()) {
      Status s = FromProto(reply.error());
      Shutdown();
      return s;
    }
    if (!reply.has_opened()) {
      Shutdown();
      return Status(ErrorKind::kProtocolViolation, "the daemon did not answer Open with Opened");
    }
    opened_ = reply.opened();
    reader_ = std::thread([this] { ReadLoop(); });
    return Status::Ok();
  }

  const v1::Opened& opened() const { return opened_; }

  // --- recording (owner thread) -----------------------------------------------------
  uint64_t NextHandle() { return next_handle_++; }
  v1::Op* Record() { return pending_.add_ops(); }
  size_t recorded() const { return pending_.ops_size(); }
  bool closed() const { return closed_; }

  /// Send the recorded ops as one Submit; `downloads` are where Download op bytes go.
  Result<uint64_t> Submit(std::vector<std::pair<uint32_t, std::pair<void*, uint64_t>>> downloads =
                              {}) {
    if (closed_) return Status(ErrorKind::kSessionClosed, "the session is closed");
    if (pending_.ops_size() == 0) return uint64_t{0};
    uint64_t id = next_submit_id_++;
    v1::ClientMessage m;
    pending_.set_submit_id(id);
    m.mutable_submit()->Swap(&pending_);
    pending_.Clear();
    {
      std::lock_guard lock(mu_);
      if (!dead_.ok()) return dead_;
      if (!downloads.empty()) {
        auto& targets = download_targets_[id];
        for (auto& [op, dest] : downloads) targets[op] = dest;
      }
    }
    if (!stream_->Write(m)) {
      std::lock_guard lock(mu_);
      download_targets_.erase(id);
      return dead_.ok() ? Status(ErrorKind::kSessionClosed, "the session stream is gone") : dead_;
    }
    last_submitted_ = id;
    return id;
  }

  /// Wait for submit `id`'s completion and return its outcome (consuming it).
  Status WaitSubmit(uint64_t id) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return last_completed_ >= id || !dead_.ok(); });
    if (last_completed_ < id) return dead_;
    auto it = failures_.find(id);
    if (it == failures_.end()) return Status::Ok();
    Status s = it->second;
    failures_.erase(it);
    return s;
  }

  Status Synchronize() {
    auto submitted = Submit();
    if (!submitted.ok()) return submitted.status();
    uint64_t sync_id = next_sync_id_++;
    v1::ClientMessage m;
    m.mutable_synchronize()->set_sync_id(sync_id);
    if (!stream_->Write(m)) return DeadOr("the session stream is gone");
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return last_synchronized_ >= sync_id || !dead_.ok(); });
    if (last_synchronized_ < sync_id) return dead_;
    Status first;
    if (!failures_.empty()) first = failures_.begin()->second;
    failures_.clear();
    return first;
  }

  Result<SessionStats> Close() {
    if (closed_) return Status(ErrorKind::kSessionClosed, "the session is already closed");
    auto submitted = Submit();
    closed_ = true;
    if (!submitted.ok()) {
      Shutdown();
      return submitted.status();
    }
    v1::ClientMessage m;
    m.mutable_close();
    bool sent = stream_->Write(m);
    std::optional<SessionStats> stats;
    {
      std::unique_lock lock(mu_);
      if (sent) cv_.wait(lock, [&] { return closed_stats_.has_value() || !dead_.ok(); });
      stats = closed_stats_;
    }
    Shutdown();
    if (!stats) return DeadOr("the session stream ended before Closed");
    return *stats;
  }

  /// End the stream without waiting for the device; idempotent.
  void Shutdown() {
    if (shut_down_) return;
    shut_down_ = true;
    closed_ = true;
    if (stream_) {
      bool clean;
      {
        std::lock_guard lock(mu_);
        clean = closed_stats_.has_value();
      }
      if (clean) {
        stream_->WritesDone();
      } else {
        context_.TryCancel();
      }
    }
    if (reader_.joinable()) reader_.join();
    if (stream_) stream_->Finish();
  }

 private:
  Status StreamFailure(const char* what) {
    grpc::Status s = stream_->Finish();
    shut_down_ = true;
    closed_ = true;
    return Status(ErrorKind::kUnavailable, std::string(what) + ": " + s.error_message());
  }
  Status DeadOr(const char* what) {
    std::lock_guard lock(mu_);
    return dead_.ok() ? Status(ErrorKind::kSessionClosed, what) : dead_;
  }

  void ReadLoop() {
    v1::ServerMessage m;
    while (stream_->Read(&m)) {
      std::lock_guard lock(mu_);
      switch (m.kind_case()) {
        case v1::ServerMessage::kDownloadChunk: {
          const auto& c = m.download_chunk();
          auto t = download_targets_.find(c.submit_id());
          if (t == download_targets_.end()) break;
          auto d = t->second.find(c.op_index());
          if (d == t->second.end()) break;
          auto [dest, length] = d->second;
          uint64_t end = 0;
          if (__builtin_add_overflow(c.offset(), c.data().size(), &end) || end > length) {
            dead_ = Status(ErrorKind::kProtocolViolation, "download chunk out of range");
            cv_.notify_all();
            return;
          }
          std::memcpy(static_cast<char*>(dest) + c.offset(), c.data().data(), c.data().size());
          break;
        }
        case v1::ServerMessage::kCompleted: {
          const auto& c = m.completed();
          last_completed_ = c.submit_id();
          download_targets_.erase(c.submit_id());
          if (c.has_error()) failures_[c.submit_id()] = FromProto(c.error());
          cv_.notify_all();
          break;
        }
        case v1::ServerMessage::kSynchronized:
          last_synchronized_ = m.synchronized().sync_id();
          cv_.notify_all();
          break;
        case v1::ServerMessage::kClosed:
          closed_stats_ = FromProto(m.closed().stats());
          cv_.notify_all();
          break;
        case v1::ServerMessage::kError:
          dead_ = FromProto(m.error());
          cv_.notify_all();
          break;
        default:
          break;
      }
    }
    std::lock_guard lock(mu_);
    if (dead_.ok()) {
      dead_ = closed_stats_ ? Status(ErrorKind::kSessionClosed, "the session is closed")
                            : Status(ErrorKind::kUnavailable,
                                     "the daemon ended the session stream (daemon gone?)");
    }
    cv_.notify_all();
  }

  std::shared_ptr<ClientState> client_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  std::thread reader_;
  v1::Opened opened_;

  // Owner thread only.
  v1::Submit pending_;
  uint64_t next_handle_ = 1;
  uint64_t next_submit_id_ = 1;
  uint64_t next_sync_id_ = 1;
  uint64_t last_submitted_ = 0;
  bool closed_ = false;
  bool shut_down_ = false;

  // Shared with the reader thread.
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t last_completed_ = 0;                  // guarded by mu_
  uint64_t last_synchronized_ = 0;               // guarded by mu_
  std::map<uint64_t, Status> failures_;          // guarded by mu_
  std::map<uint64_t, std::map<uint32_t, std::pair<void*, uint64_t>>>
      download_targets_;                         // guarded by mu_
  std::optional<SessionStats> closed_stats_;     // guarded by mu_
  Status dead_;                                  // guarded by mu_; set once the stream ends
};

}  // namespace internal

// --- Client ------------------------------------------------------------------------------

Result<Client> Client::connect(const std::string& target, const ClientOptions& options) {
  auto state = std::make_shared<internal::ClientState>();
  state->target = target;
  state->options = options;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(internal::kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(internal::kMaxMessageBytes));
  state->channel = grpc::CreateCustomChannel(internal::GrpcTarget(target),
                                             grpc::InsecureChannelCredentials(), args);
  if (!state->channel->WaitForConnected(std::chrono::system_clock::now() +
                                        options.connect_timeout)) {
    return Status(ErrorKind::kUnavailable, "no ferry daemon answers at " + target);
  }
  state->stub = v1::SessionService::NewStub(state->channel);
  return Client(std::move(state));
}

Result<Session> Client::open_session(const SessionOptions& options) {
  auto state = std::make_shared<internal::SessionState>();
  FERRY_RETURN_IF_ERROR(state->Open(state_, options));
  return Session(std::move(state));
}

const std::string& Client::target() const { return state_->target; }

// --- Tensor ------------------------------------------------------------------------------

Tensor::Tensor(Tensor&& o) noexcept
    : session_(std::move(o.session_)), handle_(std::exchange(o.handle_, 0)), dtype_(o.dtype_),
      shape_(std::move(o.shape_)), elements_(std::exchange(o.elements_, 0)) {}

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
  if (handle_ == 0) return;
  if (auto s = session_.lock(); s && !s->closed()) {
    s->Record()->mutable_free_tensor()->set_handle(handle_);
  }
  handle_ = 0;
}

// --- Module, Graph -------------------------------------------------------------------------

Module::Module(Module&& o) noexcept
    : session_(std::move(o.session_)), handle_(std::exchange(o.handle_, 0)) {}
Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    this->~Module();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Module::~Module() {
  if (handle_ == 0) return;
  if (auto s = session_.lock(); s && !s->closed()) {
    s->Record()->mutable_unload_module()->set_handle(handle_);
  }
  handle_ = 0;
}

Graph::Graph(Graph&& o) noexcept
    : session_(std::move(o.session_)), handle_(std::exchange(o.handle_, 0)) {}
Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    this->~Graph();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Graph::~Graph() {
  if (handle_ == 0) return;
  if (auto s = session_.lock(); s && !s->closed()) {
    s->Record()->mutable_free_graph()->set_handle(handle_);
  }
  handle_ = 0;
}

// --- Session -----------------------------------------------------------------------------

Session::Session(std::shared_ptr<internal::SessionState> state) : state_(std::move(state)) {}
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;
Session::~Session() = default;

uint64_t Session::id() const { return state_->opened().session_id(); }
const std::string& Session::backend() const { return state_->opened().backend(); }
uint64_t Session::device_bytes_quota() const { return state_->opened().device_bytes_quota(); }

Tensor Session::create_tensor(DType dtype, const Shape& shape) {
  uint64_t handle = state_->NextHandle();
  auto* c = state_->Record()->mutable_create_tensor();
  c->set_handle(handle);
  c->set_dtype(internal::ToProto(dtype));
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
void RecordBinary(internal::SessionState& s, v1::BinaryKind kind, const Tensor& a,
                  const Tensor& b, const Tensor& out) {
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
      case KernelArg::Kind::kTensor: k->set_tensor(a.integer()); break;
      case KernelArg::Kind::kI32: k->set_i32(static_cast<int32_t>(a.real())); break;
      case KernelArg::Kind::kU32: k->set_u32(static_cast<uint32_t>(a.integer())); break;
      case KernelArg::Kind::kI64: k->set_i64(static_cast<int64_t>(a.integer())); break;
      case KernelArg::Kind::kU64: k->set_u64(a.integer()); break;
      case KernelArg::Kind::kF32: k->set_f32(static_cast<float>(a.real())); break;
      case KernelArg::Kind::kF64: k->set_f64(a.real()); break;
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

Status Session::upload_bytes(const Tensor& t, const void* data, uint64_t bytes) {
  if (t.valid() && bytes != t.byte_size()) {
    return Status(ErrorKind::kShapeMismatch,
                  "upload of " + std::to_string(bytes) + " bytes into tensor " +
                      std::to_string(t.handle()) + " of " + std::to_string(t.byte_size()));
  }
  // Flush what is recorded, then send the bytes in submits of a few MiB each, each made of
  // Upload ops of at most 1 MiB; wait for all of them.
  FERRY_RETURN_IF_ERROR(state_->Submit().status());
  const char* p = static_cast<const char*>(data);
  uint64_t first = 0, last = 0;
  uint64_t off = 0;
  do {
    uint64_t window_end = std::min(bytes, off + internal::kUploadSubmitBytes);
    do {
      uint64_t n = std::min(internal::kUploadChunkBytes, window_end - off);
      write_bytes(t, off, p + off, n);
      off += n;
    } while (off < window_end);
    FERRY_ASSIGN_OR_RETURN(last, state_->Submit());
    if (!first) first = last;
  } while (off < bytes);
  Status result;
  for (uint64_t id = first; id && id <= last; ++id) {
    Status s = state_->WaitSubmit(id);
    if (result.ok() && !s.ok()) result = s;
  }
  return result;
}

Status Session::download_bytes(const Tensor& t, void* out, uint64_t bytes) {
  if (t.valid() && bytes != t.byte_size()) {
    return Status(ErrorKind::kShapeMismatch,
                  "download of " + std::to_string(bytes) + " bytes from tensor " +
                      std::to_string(t.handle()) + " of " + std::to_string(t.byte_size()));
  }
  FERRY_RETURN_IF_ERROR(state_->Submit().status());
  uint64_t first = 0, last = 0;
  uint64_t off = 0;
  do {
    uint64_t n = std::min(internal::kDownloadSubmitBytes, bytes - off);
    auto* d = state_->Record()->mutable_download();
    d->set_tensor(t.handle());
    d->set_offset(off);
    d->set_length(n);
    FERRY_ASSIGN_OR_RETURN(last, state_->Submit({{0u, {static_cast<char*>(out) + off, n}}}));
    if (!first) first = last;
    off += n;
  } while (off < bytes);
  Status result;
  for (uint64_t id = first; id && id <= last; ++id) {
    Status s = state_->WaitSubmit(id);
    if (result.ok() && !s.ok()) result = s;
  }
  return result;
}

}  // namespace ferry
