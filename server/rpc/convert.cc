#include "rpc/convert.h"

#include <cstring>

#include "ferry/wire.h"
#include "session/admission.h"

namespace ferry::rpc {
namespace {

session::Op Malformed(std::string why) {
  return session::MalformedOp{Status(ErrorKind::kInvalidArgument, std::move(why))};
}

// One Decode per wire op (FERRY_OPS names each op's message); FromProto dispatches on the
// oneof case. Each turns what the daemon's types cannot hold (a bad enum, too many
// dimensions) into a MalformedOp; everything else is admission's to check.
session::Op Decode(const v1::CreateTensor& c) {
  DType dtype = wire::FromProto(c.dtype());
  if (dtype == DType::kInvalid) return Malformed("create_tensor: invalid dtype");
  if (static_cast<size_t>(c.shape_size()) > Shape::kMaxRank) {
    return session::MalformedOp{Status(
        ErrorKind::kShapeMismatch, "create_tensor: rank above " + std::to_string(Shape::kMaxRank))};
  }
  return session::CreateTensorOp{c.handle(), dtype,
                                 Shape(std::vector<int64_t>(c.shape().begin(), c.shape().end()))};
}
session::Op Decode(const v1::FreeTensor& f) { return session::FreeTensorOp{f.handle()}; }
session::Op Decode(const v1::Upload& u) {
  return session::UploadOp{u.tensor(), u.offset(), std::string_view(u.data())};
}
session::Op Decode(const v1::Download& d) {
  return session::DownloadOp{d.tensor(), d.offset(), d.length()};
}
session::Op Decode(const v1::Fill& f) { return session::FillOp{f.tensor(), f.value()}; }
session::Op Decode(const v1::Copy& c) { return session::CopyOp{c.src(), c.dst()}; }
session::Op Decode(const v1::Binary& b) {
  backend::BinaryOp kind;
  switch (b.kind()) {
    case v1::ADD:
      kind = backend::BinaryOp::kAdd;
      break;
    case v1::SUB:
      kind = backend::BinaryOp::kSub;
      break;
    case v1::MUL:
      kind = backend::BinaryOp::kMul;
      break;
    case v1::DIV:
      kind = backend::BinaryOp::kDiv;
      break;
    default:
      return Malformed("binary: invalid kind");
  }
  return session::BinaryOpArgs{kind, b.a(), b.b(), b.out()};
}
session::Op Decode(const v1::Scale& s) { return session::ScaleOp{s.x(), s.alpha(), s.out()}; }
session::Op Decode(const v1::Relu& r) { return session::ReluOp{r.x(), r.out()}; }
session::Op Decode(const v1::Axpy& a) { return session::AxpyOp{a.alpha(), a.x(), a.y()}; }
session::Op Decode(const v1::ReduceSum& r) { return session::ReduceSumOp{r.in(), r.out()}; }
session::Op Decode(const v1::Gemm& g) {
  return session::GemmOp{g.a(), g.b(), g.c(), g.trans_a(), g.trans_b(), g.alpha(), g.beta()};
}
session::Op Decode(const v1::LoadModule& m) {
  backend::ModuleFormat format;
  switch (m.format()) {
    case v1::PTX:
      format = backend::ModuleFormat::kPtx;
      break;
    case v1::CUBIN:
      format = backend::ModuleFormat::kCubin;
      break;
    case v1::CUDA_SOURCE:
      format = backend::ModuleFormat::kCudaSource;
      break;
    default:
      return Malformed("load_module: invalid format");
  }
  return session::LoadModuleOp{m.handle(), format, std::string_view(m.image())};
}
session::Op Decode(const v1::UnloadModule& u) { return session::UnloadModuleOp{u.handle()}; }
session::Op Decode(const v1::Launch& l) {
  session::LaunchOp out;
  out.module = l.module();
  out.function = l.function();
  if (l.grid_size() < 1 || l.grid_size() > 3 || l.block_size() < 1 || l.block_size() > 3) {
    return Malformed("launch: grid and block need 1 to 3 dimensions");
  }
  for (int i = 0; i < l.grid_size(); ++i) out.config.grid[i] = l.grid(i);
  for (int i = 0; i < l.block_size(); ++i) out.config.block[i] = l.block(i);
  out.config.shared_bytes = l.shared_bytes();
  if (l.args_size() > static_cast<int>(session::kMaxKernelArgs)) {
    return Malformed("launch: too many arguments");
  }
  for (const v1::KernelArg& a : l.args()) {
    session::LaunchArg arg;
    auto bytes = [&arg](const auto& v) {
      arg.scalar.resize(sizeof(v));
      std::memcpy(arg.scalar.data(), &v, sizeof(v));
    };
    switch (a.kind_case()) {
      case v1::KernelArg::kTensor:
        arg.is_tensor = true;
        arg.tensor = a.tensor();
        break;
      case v1::KernelArg::kI32:
        bytes(a.i32());
        break;
      case v1::KernelArg::kU32:
        bytes(a.u32());
        break;
      case v1::KernelArg::kI64:
        bytes(a.i64());
        break;
      case v1::KernelArg::kU64:
        bytes(a.u64());
        break;
      case v1::KernelArg::kF32:
        bytes(a.f32());
        break;
      case v1::KernelArg::kF64:
        bytes(a.f64());
        break;
      case v1::KernelArg::KIND_NOT_SET:
        return Malformed("launch: an argument with no kind");
    }
    out.args.push_back(std::move(arg));
  }
  return out;
}
session::Op Decode(const v1::BeginGraph& b) { return session::BeginGraphOp{b.handle()}; }
session::Op Decode(const v1::EndGraph&) { return session::EndGraphOp{}; }
session::Op Decode(const v1::LaunchGraph& l) { return session::LaunchGraphOp{l.graph()}; }
session::Op Decode(const v1::FreeGraph& f) { return session::FreeGraphOp{f.handle()}; }
session::Op Decode(const v1::UploadFromSlab& u) {
  return session::UploadFromSlabOp{u.tensor(), u.offset(), u.slab(), u.slab_offset(), u.length()};
}
session::Op Decode(const v1::DownloadToSlab& d) {
  return session::DownloadToSlabOp{d.tensor(), d.offset(), d.slab(), d.slab_offset(), d.length()};
}

session::Op FromProto(const v1::Op& op) {
  switch (op.kind_case()) {
#define FERRY_DECODE_CASE(Name, Type, field, ...) \
  case v1::Op::k##Name:                           \
    return Decode(op.field());
    FERRY_OPS(FERRY_DECODE_CASE)
#undef FERRY_DECODE_CASE
    case v1::Op::KIND_NOT_SET:
      break;
  }
  return Malformed("op has no kind this daemon knows");
}

}  // namespace

session::SubmitSummary Summarize(const v1::Submit& submit) {
  session::SubmitSummary summary;
  for (const v1::Op& op : submit.ops()) {
    // The bytes each copy op moves (session::CopyBytes, on the wire's fields).
    uint64_t bytes = 0, inline_bytes = 0;
    switch (op.kind_case()) {
      case v1::Op::kUpload:
        bytes = inline_bytes = op.upload().data().size();
        break;
      case v1::Op::kDownload:
        bytes = inline_bytes = op.download().length();
        break;
      case v1::Op::kUploadFromSlab:
        bytes = op.upload_from_slab().length();
        break;
      case v1::Op::kDownloadToSlab:
        bytes = op.download_to_slab().length();
        break;
      default:
        break;
    }
    summary.Add(KindOf(op).value_or(session::OpKind::kMalformed), bytes, inline_bytes);
  }
  return summary;
}

session::SubmitRequest ToSubmitRequest(std::shared_ptr<const v1::ClientMessage> message,
                                       session::SubmitSummary summary) {
  session::SubmitRequest req;
  const v1::Submit& submit = message->submit();
  req.submit_id = submit.submit_id();
  req.ops.reserve(submit.ops_size());
  for (const v1::Op& op : submit.ops()) {
    req.ops.push_back(FromProto(op));
    if (std::holds_alternative<session::MalformedOp>(req.ops.back())) summary.AddMalformed();
  }
  req.summary = summary;
  req.payload = std::move(message);
  return req;
}

session::SubmitRequest ToSubmitRequest(std::shared_ptr<const v1::ClientMessage> message) {
  session::SubmitSummary summary = Summarize(message->submit());
  return ToSubmitRequest(std::move(message), summary);
}

std::optional<session::OpKind> KindOf(const v1::Op& op) {
  switch (op.kind_case()) {
#define FERRY_KIND_CASE(Name, ...) \
  case v1::Op::k##Name:            \
    return session::OpKind::k##Name;
    FERRY_OPS(FERRY_KIND_CASE)
#undef FERRY_KIND_CASE
    default:
      return std::nullopt;
  }
}

bool AbsorbCompletion(v1::Completed* run, const v1::ServerMessage& next) {
  if (run->has_error() || !next.has_completed() || next.completed().has_error() ||
      next.completed().first_submit_id() != 0 ||
      next.completed().submit_id() != run->submit_id() + 1) {
    return false;
  }
  if (run->first_submit_id() == 0) run->set_first_submit_id(run->submit_id());
  run->set_submit_id(next.completed().submit_id());
  return true;
}

}  // namespace ferry::rpc
