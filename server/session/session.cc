#include "session/session.h"

#include <boost/asio/post.hpp>
#include <type_traits>

namespace ferry::session {

using backend::DevicePtr;

Result<std::shared_ptr<Session>> Session::Create(backend::Device* device,
                                                 SessionRegistry* registry, Executor executor,
                                                 const SessionConfig& config,
                                                 std::string client_name, std::string peer,
                                                 SessionEvents* events) {
  auto counters = std::make_shared<SessionCounters>();
  uint64_t id = registry->Add(std::move(client_name), std::move(peer), counters);
  if (id == 0) {
    return Status(ErrorKind::kQuotaExceeded, "the daemon holds its maximum number of sessions");
  }
  auto stream = device->CreateStream();
  if (!stream.ok()) {
    registry->Remove(id);
    return stream.status().WithContext("creating the session's stream");
  }
  std::shared_ptr<Session> session(
      new Session(device, registry, std::move(executor), config, std::move(*stream), events));
  session->id_ = id;
  session->counters_ = std::move(counters);
  return session;
}

Session::Session(backend::Device* device, SessionRegistry* registry, Executor executor,
                 const SessionConfig& config, std::unique_ptr<backend::Stream> stream,
                 SessionEvents* events)
    : device_(device),
      registry_(registry),
      executor_(std::move(executor)),
      config_(config),
      stream_(std::move(stream)),
      events_(events) {
  limits_.device_bytes_quota = config.device_bytes_quota;
  limits_.max_ops_per_submit = config.max_ops_per_submit;
  limits_.max_download_bytes = config.max_download_bytes_per_submit;
}

Session::~Session() = default;

void Session::Submit(SubmitRequest request) {
  InFlight record;
  record.submit_id = request.submit_id;
  ++counters_->submits;
  if (closing_) {
    record.status = Status(ErrorKind::kSessionClosed, "the session is closing");
  } else if (!broken_.ok()) {
    record.status = broken_;
  } else {
    auto admitted = AdmitSubmit(request, tensors_, limits_);
    if (!admitted.ok()) {
      record.status = admitted.status();
    } else {
      record.status = Enqueue(request, *admitted, record);
    }
  }
  queue_.push_back(std::move(record));
  counters_->submits_in_flight = queue_.size();
  if (!queue_.back().on_device) DeliverReady();
}

Status Session::Enqueue(SubmitRequest& request, const AdmissionResult& admitted,
                        InFlight& record) {
  auto& ops = request.ops;
  // Allocate everything the submit creates first, so that a device that cannot provide
  // the memory refuses the submit whole.
  if (!registry_->TryReserveDeviceBytes(admitted.bytes_created)) {
    return Status(ErrorKind::kQuotaExceeded,
                  "the daemon-wide device memory cap (" +
                      std::to_string(registry_->device_bytes_cap()) + " bytes) is reached");
  }
  std::vector<DevicePtr> fresh(ops.size(), 0);
  std::vector<uint64_t> fresh_bytes(ops.size(), 0);
  auto release_from = [&](size_t first) {
    for (size_t j = first; j < ops.size(); ++j) {
      if (fresh[j]) stream_->Free(fresh[j]);
      registry_->ReleaseDeviceBytes(fresh_bytes[j]);
      fresh[j] = 0;
    }
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    auto* create = std::get_if<CreateTensorOp>(&ops[i]);
    if (!create) continue;
    uint64_t elements = 0;
    fresh_bytes[i] = *TensorBytes(create->dtype, create->shape, &elements);  // admitted
    if (fresh_bytes[i] == 0) continue;
    auto ptr = stream_->Allocate(fresh_bytes[i]);
    if (!ptr.ok()) {
      release_from(0);
      return ptr.status().WithOpIndex(static_cast<int>(i));
    }
    fresh[i] = *ptr;
  }

  record.on_device = true;
  record.payload = std::move(request.payload);
  counters_->ops += ops.size();
  counters_->bytes_uploaded += admitted.upload_bytes;
  if (admitted.peak_device_bytes > counters_->peak_device_bytes) {
    counters_->peak_device_bytes = admitted.peak_device_bytes;
  }
  Status first_error;
  for (size_t i = 0; i < ops.size(); ++i) {
    Status s = EnqueueOp(ops[i], fresh[i], record, static_cast<uint32_t>(i));
    if (!s.ok()) {
      release_from(i + 1);
      first_error = s.WithOpIndex(static_cast<int>(i));
      break;
    }
  }
  auto self = shared_from_this();
  stream_->OnComplete([self = std::move(self)](Status status) mutable {
    Executor executor = self->executor_;
    boost::asio::post(executor, [self = std::move(self), status = std::move(status)]() mutable {
      self->OnDeviceComplete(std::move(status));
    });
  });
  return first_error;
}

Status Session::EnqueueOp(const Op& any, DevicePtr fresh, InFlight& record, uint32_t index) {
  auto ptr = [this](uint64_t handle) { return tensors_.Find(handle)->ptr; };
  auto rec = [this](uint64_t handle) { return tensors_.Find(handle); };
  auto launch = [this] { ++counters_->kernel_launches; };

  return std::visit(
      [&](const auto& op) -> Status {
        using T = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<T, CreateTensorOp>) {
          TensorRecord r;
          r.ptr = fresh;
          r.dtype = op.dtype;
          r.shape = op.shape;
          r.bytes = *TensorBytes(op.dtype, op.shape, &r.elements);
          tensors_.Insert(op.handle, std::move(r));
          ++counters_->tensors_created;
          counters_->live_tensors = tensors_.size();
          counters_->device_bytes = tensors_.bytes();
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, FreeTensorOp>) {
          ReleaseTensor(op.handle);
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, UploadOp>) {
          if (op.data.empty()) return Status::Ok();
          return stream_->CopyHostToDevice(ptr(op.tensor) + op.offset, op.data.data(),
                                           op.data.size());
        } else if constexpr (std::is_same_v<T, DownloadOp>) {
          PendingDownload pd;
          pd.op_index = index;
          pd.chunks.reserve((op.length + kMaxChunkBytes - 1) / kMaxChunkBytes);
          DevicePtr src = ptr(op.tensor) + op.offset;
          for (uint64_t off = 0; off < op.length; off += kMaxChunkBytes) {
            uint64_t n = std::min(kMaxChunkBytes, op.length - off);
            // The chunk is constructed in place and never moves again (reserved above), so
            // its buffer stays where the device writes.
            std::string& chunk = pd.chunks.emplace_back(n, '\0');
            FERRY_RETURN_IF_ERROR(stream_->CopyDeviceToHost(chunk.data(), src + off, n));
          }
          record.download_bytes += op.length;
          record.downloads.push_back(std::move(pd));
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, FillOp>) {
          const TensorRecord* t = rec(op.tensor);
          if (t->elements == 0) return Status::Ok();
          launch();
          return stream_->Fill(t->dtype, t->ptr, t->elements, op.value);
        } else if constexpr (std::is_same_v<T, CopyOp>) {
          const TensorRecord* s = rec(op.src);
          const TensorRecord* d = rec(op.dst);
          if (s->bytes == 0 || op.src == op.dst) return Status::Ok();
          launch();
          return stream_->CopyDeviceToDevice(d->ptr, s->ptr, s->bytes);
        } else if constexpr (std::is_same_v<T, BinaryOpArgs>) {
          const TensorRecord* a = rec(op.a);
          if (a->elements == 0) return Status::Ok();
          launch();
          return stream_->Binary(op.kind, a->dtype, a->ptr, ptr(op.b), ptr(op.out),
                                 a->elements);
        } else if constexpr (std::is_same_v<T, ScaleOp>) {
          const TensorRecord* x = rec(op.x);
          if (x->elements == 0) return Status::Ok();
          launch();
          return stream_->Scale(x->dtype, x->ptr, op.alpha, ptr(op.out), x->elements);
        } else if constexpr (std::is_same_v<T, AxpyOp>) {
          const TensorRecord* x = rec(op.x);
          if (x->elements == 0) return Status::Ok();
          launch();
          return stream_->Axpy(x->dtype, op.alpha, x->ptr, ptr(op.y), x->elements);
        } else if constexpr (std::is_same_v<T, ReduceSumOp>) {
          const TensorRecord* in = rec(op.in);
          const TensorRecord* out = rec(op.out);
          launch();
          if (in->elements == 0) return stream_->Fill(out->dtype, out->ptr, 1, 0.0);
          return stream_->ReduceSum(in->dtype, in->ptr, in->elements, out->ptr);
        } else if constexpr (std::is_same_v<T, GemmOp>) {
          const TensorRecord* a = rec(op.a);
          const TensorRecord* b = rec(op.b);
          const TensorRecord* c = rec(op.c);
          backend::GemmArgs g;
          g.dtype = a->dtype;
          g.trans_a = op.trans_a;
          g.trans_b = op.trans_b;
          g.m = static_cast<uint64_t>(c->shape.dim(0));
          g.n = static_cast<uint64_t>(c->shape.dim(1));
          g.k = static_cast<uint64_t>(op.trans_a ? a->shape.dim(0) : a->shape.dim(1));
          g.alpha = op.alpha;
          g.beta = op.beta;
          g.a = a->ptr;
          g.b = b->ptr;
          g.c = c->ptr;
          if (g.m == 0 || g.n == 0) return Status::Ok();
          launch();
          if (g.k == 0) {  // op(A) op(B) is all zeros: C = beta * C
            if (op.beta == 0) return stream_->Fill(c->dtype, c->ptr, c->elements, 0.0);
            return stream_->Scale(c->dtype, c->ptr, op.beta, c->ptr, c->elements);
          }
          return stream_->Gemm(g);
        } else {
          return Status(ErrorKind::kInternal, "malformed op reached the device");
        }
      },
      any);
}

void Session::ReleaseTensor(uint64_t handle) {
  TensorRecord r = tensors_.Remove(handle);
  if (r.ptr) stream_->Free(r.ptr);
  registry_->ReleaseDeviceBytes(r.bytes);
  counters_->live_tensors = tensors_.size();
  counters_->device_bytes = tensors_.bytes();
}

void Session::OnDeviceComplete(Status status) {
  if (torn_down_) {  // the completion that follows the final frees
    Finalize();
    return;
  }
  InFlight& front = queue_.front();
  front.on_device = false;
  if (!status.ok()) {
    // An asynchronous error names no single op.
    Status device_error = status.WithOpIndex(-1);
    if (front.status.ok()) front.status = device_error;
    if (status.kind() == ErrorKind::kDeviceFault || status.kind() == ErrorKind::kDeviceReset) {
      broken_ = device_error;
    }
  }
  DeliverReady();
}

void Session::DeliverReady() {
  while (!queue_.empty() && !queue_.front().on_device) {
    InFlight record = std::move(queue_.front());
    queue_.pop_front();
    counters_->submits_in_flight = queue_.size();
    Deliver(record);
  }
  MaybeTearDown();
}

void Session::Deliver(InFlight& record) {
  if (record.status.ok()) {
    counters_->bytes_downloaded += record.download_bytes;
  } else {
    ++counters_->failed_submits;
  }
  if (!events_) return;
  if (record.status.ok()) {
    for (PendingDownload& d : record.downloads) {
      uint64_t offset = 0;
      for (std::string& chunk : d.chunks) {
        uint64_t n = chunk.size();
        events_->OnDownloadChunk(record.submit_id, d.op_index, offset, std::move(chunk));
        offset += n;
      }
    }
  }
  events_->OnCompleted(record.submit_id, record.status);
  for (uint64_t sync_id : record.syncs_after) events_->OnSynchronized(sync_id);
}

void Session::Synchronize(uint64_t sync_id) {
  if (queue_.empty()) {
    if (events_) events_->OnSynchronized(sync_id);
  } else {
    queue_.back().syncs_after.push_back(sync_id);
  }
}

void Session::Close() {
  closing_ = true;
  MaybeTearDown();
}

void Session::Abort() {
  events_ = nullptr;
  Close();
}

void Session::MaybeTearDown() {
  if (!closing_ || !queue_.empty() || torn_down_) return;
  torn_down_ = true;
  std::vector<uint64_t> handles;
  handles.reserve(tensors_.size());
  for (const auto& [handle, record] : tensors_.tensors()) handles.push_back(handle);
  for (uint64_t h : handles) ReleaseTensor(h);
  // Report closed only once the device has finished with everything, frees included.
  stream_->OnComplete([self = shared_from_this()](Status status) mutable {
    Executor executor = self->executor_;
    boost::asio::post(executor, [self = std::move(self)]() { self->OnDeviceComplete(Status()); });
  });
}

void Session::Finalize() {
  counters_->device_busy_ns = stream_->busy_ns();
  stream_.reset();
  SessionStatsSnapshot stats = Snapshot();
  registry_->Remove(id_);
  if (events_) events_->OnClosed(stats);
  events_ = nullptr;
}

SessionStatsSnapshot Session::Snapshot() const {
  SessionStatsSnapshot s;
  s.submits = counters_->submits;
  s.failed_submits = counters_->failed_submits;
  s.ops = counters_->ops;
  s.kernel_launches = counters_->kernel_launches;
  s.bytes_uploaded = counters_->bytes_uploaded;
  s.bytes_downloaded = counters_->bytes_downloaded;
  s.tensors_created = counters_->tensors_created;
  s.peak_device_bytes = counters_->peak_device_bytes;
  s.device_busy_ns = counters_->device_busy_ns;
  return s;
}

}  // namespace ferry::session
