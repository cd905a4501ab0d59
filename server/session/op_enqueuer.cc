#include "session/op_enqueuer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace ferry::session {

using backend::DevicePtr;

const TensorRecord* OpEnqueuer::Use(uint64_t handle) {
  const TensorRecord* r = s_.tensors_.Find(handle);
  s_.graph_.UseTensor(handle, r->generation);
  return r;
}

void OpEnqueuer::CountLaunch() { ++s_.counters_->kernel_launches; }

std::vector<pool::StagingLease>* OpEnqueuer::Staged() {
  return index_ < record_.staged_ops.size() ? &record_.staged_ops[index_] : nullptr;
}

Status OpEnqueuer::operator()(const CreateTensorOp& op) {
  TensorRecord r;
  r.ptr = fresh_;
  r.dtype = op.dtype;
  r.shape = op.shape;
  r.bytes = *TensorBytes(op.dtype, op.shape, &r.elements);
  r.generation = s_.next_generation_++;
  s_.tensors_.Insert(op.handle, std::move(r));
  ++s_.objects_live_;
  ++s_.counters_->tensors_created;
  s_.counters_->live_tensors = s_.tensors_.size();
  s_.CountDeviceBytes();
  return Status::Ok();
}

Status OpEnqueuer::operator()(const FreeTensorOp& op) {
  s_.ReleaseTensor(op.handle);
  return Status::Ok();
}

Status OpEnqueuer::operator()(const UploadOp& op) {
  if (op.data.empty()) return Status::Ok();
  // Staged (ReserveStaging took its ranges): copied piece by piece into pinned ranges, and
  // the device copies from there; the ranges are freed at delivery.
  if (std::vector<pool::StagingLease>* staged = Staged(); staged && !staged->empty()) {
    uint64_t at = 0;
    for (pool::StagingLease& lease : *staged) {
      std::memcpy(lease.data(), op.data.data() + at, lease.length());
      const char* from = lease.data();
      const uint64_t n = lease.length();
      record_.staging.push_back(std::move(lease));
      FERRY_RETURN_IF_ERROR(
          s_.stream_->CopyHostToDevice(PtrOf(op.tensor) + op.offset + at, from, n));
      at += n;
    }
    staged->clear();
    return Status::Ok();
  }
  return s_.stream_->CopyHostToDevice(PtrOf(op.tensor) + op.offset, op.data.data(), op.data.size());
}

Status OpEnqueuer::operator()(const DownloadOp& op) {
  // The record holds the download's buffers from here until it is delivered, even when an
  // enqueue below fails: copies enqueued before the failure still write them.
  PendingDownload& pd = record_.downloads.emplace_back();
  pd.op_index = index_;
  record_.download_bytes += op.length;
  const DevicePtr src = PtrOf(op.tensor) + op.offset;
  uint64_t done = 0;
  // Staged (ReserveStaging took its ranges): the device lands the bytes in pinned ranges,
  // cut into chunks at delivery.
  if (std::vector<pool::StagingLease>* staged = Staged()) {
    for (pool::StagingLease& lease : *staged) {
      char* dst = lease.data();
      const uint64_t n = lease.length();
      pd.staged.push_back(std::move(lease));
      FERRY_RETURN_IF_ERROR(s_.stream_->CopyDeviceToHost(dst, src + done, n));
      done += n;
    }
    staged->clear();
  }
  pd.chunks.reserve((op.length - done + kMaxChunkBytes - 1) / kMaxChunkBytes);
  for (uint64_t off = done; off < op.length; off += kMaxChunkBytes) {
    uint64_t n = std::min(kMaxChunkBytes, op.length - off);
    // The chunk is constructed in place and never moves again (reserved above), so its
    // buffer stays where the device writes.
    std::string& chunk = pd.chunks.emplace_back(n, '\0');
    FERRY_RETURN_IF_ERROR(s_.stream_->CopyDeviceToHost(chunk.data(), src + off, n));
  }
  return Status::Ok();
}

Status OpEnqueuer::operator()(const UploadFromSlabOp& op) {
  pool::SlabRange r{op.slab, op.slab_offset, op.length};
  const char* src = s_.slabs_->MarkBusy(r);
  record_.slab_ranges.push_back(r);
  if (op.length == 0) return Status::Ok();
  return s_.stream_->CopyHostToDevice(PtrOf(op.tensor) + op.offset, src, op.length);
}

Status OpEnqueuer::operator()(const DownloadToSlabOp& op) {
  pool::SlabRange r{op.slab, op.slab_offset, op.length};
  char* dst = s_.slabs_->MarkBusy(r);
  record_.slab_ranges.push_back(r);
  record_.download_bytes += op.length;
  if (op.length == 0) return Status::Ok();
  return s_.stream_->CopyDeviceToHost(dst, PtrOf(op.tensor) + op.offset, op.length);
}

Status OpEnqueuer::operator()(const FillOp& op) {
  const TensorRecord* t = Use(op.tensor);
  if (t->elements == 0) return Status::Ok();
  CountLaunch();
  return s_.stream_->Fill(t->dtype, t->ptr, t->elements, op.value);
}

Status OpEnqueuer::operator()(const CopyOp& op) {
  const TensorRecord* src = Use(op.src);
  const TensorRecord* dst = Use(op.dst);
  if (src->bytes == 0 || op.src == op.dst) return Status::Ok();
  CountLaunch();
  return s_.stream_->CopyDeviceToDevice(dst->ptr, src->ptr, src->bytes);
}

Status OpEnqueuer::operator()(const BinaryOpArgs& op) {
  const TensorRecord* a = Use(op.a);
  if (a->elements == 0) return Status::Ok();
  CountLaunch();
  return s_.stream_->Binary(op.kind, a->dtype, a->ptr, PtrOf(op.b), PtrOf(op.out), a->elements);
}

Status OpEnqueuer::operator()(const ScaleOp& op) {
  const TensorRecord* x = Use(op.x);
  if (x->elements == 0) return Status::Ok();
  CountLaunch();
  return s_.stream_->Scale(x->dtype, x->ptr, op.alpha, PtrOf(op.out), x->elements);
}

Status OpEnqueuer::operator()(const ReluOp& op) {
  const TensorRecord* x = Use(op.x);
  if (x->elements == 0) return Status::Ok();
  CountLaunch();
  return s_.stream_->Relu(x->dtype, x->ptr, PtrOf(op.out), x->elements);
}

Status OpEnqueuer::operator()(const AxpyOp& op) {
  const TensorRecord* x = Use(op.x);
  if (x->elements == 0) return Status::Ok();
  CountLaunch();
  return s_.stream_->Axpy(x->dtype, op.alpha, x->ptr, PtrOf(op.y), x->elements);
}

Status OpEnqueuer::operator()(const ReduceSumOp& op) {
  const TensorRecord* in = Use(op.in);
  const TensorRecord* out = Use(op.out);
  CountLaunch();
  if (in->elements == 0) return s_.stream_->Fill(out->dtype, out->ptr, 1, 0.0);
  return s_.stream_->ReduceSum(in->dtype, in->ptr, in->elements, out->ptr);
}

Status OpEnqueuer::operator()(const GemmOp& op) {
  const TensorRecord* a = Use(op.a);
  const TensorRecord* b = Use(op.b);
  const TensorRecord* c = Use(op.c);
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
  CountLaunch();
  if (g.k == 0) {  // op(A) op(B) is all zeros: C = beta * C
    if (op.beta == 0) return s_.stream_->Fill(c->dtype, c->ptr, c->elements, 0.0);
    return s_.stream_->Scale(c->dtype, c->ptr, op.beta, c->ptr, c->elements);
  }
  return s_.stream_->Gemm(g);
}

Status OpEnqueuer::operator()(const LoadModuleOp& op) {
  // Its device bytes were reserved at the load (ChargeModule): the table's now.
  s_.tensors_.InsertModule(op.handle, std::move(loaded_));
  ++s_.objects_live_;
  s_.CountDeviceBytes();
  return Status::Ok();
}

Status OpEnqueuer::operator()(const UnloadModuleOp& op) {
  // Work already enqueued, and the graphs that launch it, keep the module loaded
  // (InFlightSubmit::modules_in_use, GraphRecord::modules); the session's graphs keep it charged
  // too (HandleTable::RemoveModule).
  if (s_.tensors_.modules().count(op.handle) > 0) {
    --s_.objects_live_;
    s_.ReleaseDeviceBytes(s_.tensors_.RemoveModule(op.handle));
    s_.CountDeviceBytes();
  }
  return Status::Ok();
}

Status OpEnqueuer::operator()(const LaunchOp& op) {
  std::vector<backend::KernelArg> args;
  args.reserve(op.args.size());
  for (const LaunchArg& a : op.args) {
    backend::KernelArg k;
    if (a.is_tensor) {
      k.kind = backend::KernelArg::Kind::kPointer;
      k.pointer = PtrOf(a.tensor);
    } else {
      k.kind = backend::KernelArg::Kind::kScalar;
      k.scalar = a.scalar;
    }
    args.push_back(std::move(k));
  }
  CountLaunch();
  auto module = s_.tensors_.modules().find(op.module);
  if (module == s_.tensors_.modules().end() || !module->second) {
    return Status(ErrorKind::kInternal, "admitted launch of a module that is not loaded");
  }
  const std::shared_ptr<backend::Module>& used = module->second;
  // Recorded into a graph, the graph keeps the module; else the submit does, and its first
  // raw launch names it in a fault report.
  if (!s_.graph_.UseRawLaunch(used)) {
    if (record_.first_launch_op < 0) {
      record_.first_launch_op = static_cast<int>(index_);
      record_.first_launch_name = op.function;
    }
    if (record_.modules_in_use.empty() ||
        record_.modules_in_use.back().get() != static_cast<const void*>(used.get())) {
      record_.modules_in_use.push_back(used);
    }
  }
  return s_.stream_->Launch(*used, op.function, op.config, args);
}

Status OpEnqueuer::operator()(const BeginGraphOp& op) {
  FERRY_RETURN_IF_ERROR(s_.stream_->BeginCapture());
  s_.graph_.Begin(op.handle);
  return Status::Ok();
}

Status OpEnqueuer::operator()(const EndGraphOp&) {
  auto graph = s_.stream_->EndCapture();
  if (!graph.ok()) {
    s_.graph_.Abandon();  // the stream's capture is over either way
    return graph.status();
  }
  auto [handle, record] = s_.graph_.Finish(std::move(*graph));
  s_.objects_live_ += 1 + record.ops;
  s_.tensors_.InsertGraph(handle, std::move(record));
  return Status::Ok();
}

Status OpEnqueuer::operator()(const LaunchGraphOp& op) {
  auto found = s_.tensors_.graphs().find(op.graph);
  if (found == s_.tensors_.graphs().end()) {
    return Status(ErrorKind::kInternal, "admitted launch of a graph that does not exist");
  }
  const GraphRecord& g = found->second;
  ++s_.counters_->graph_launches;
  if (g.has_raw_kernels && record_.first_launch_op < 0) {
    record_.first_launch_op = static_cast<int>(index_);
    record_.first_launch_name = "graph " + std::to_string(op.graph);
  }
  if (g.modules) record_.modules_in_use.push_back(g.modules);
  return s_.stream_->LaunchGraph(*g.graph);
}

Status OpEnqueuer::operator()(const FreeGraphOp& op) {
  if (auto found = s_.tensors_.graphs().find(op.handle); found != s_.tensors_.graphs().end()) {
    s_.objects_live_ -= 1 + found->second.ops;
    s_.ReleaseDeviceBytes(s_.tensors_.RemoveGraph(op.handle));  // modules only it held
    s_.CountDeviceBytes();
  }
  return Status::Ok();
}

Status OpEnqueuer::operator()(const MalformedOp&) {
  return Status(ErrorKind::kInternal, "malformed op reached the device");
}

}  // namespace ferry::session
