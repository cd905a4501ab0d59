#include "rpc/convert.h"

namespace ferry::rpc {
namespace {

DType FromProto(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F32: return DType::kF32;
    case v1::DTYPE_F64: return DType::kF64;
    case v1::DTYPE_I32: return DType::kI32;
    case v1::DTYPE_U8: return DType::kU8;
    default: return DType::kInvalid;
  }
}

session::Op Malformed(std::string why) {
  return session::MalformedOp{Status(ErrorKind::kInvalidArgument, std::move(why))};
}

session::Op FromProto(const v1::Op& op) {
  using namespace session;
  switch (op.kind_case()) {
    case v1::Op::kCreateTensor: {
      const auto& c = op.create_tensor();
      DType dtype = FromProto(c.dtype());
      if (dtype == DType::kInvalid) return Malformed("create_tensor: invalid dtype");
      if (static_cast<size_t>(c.shape_size()) > Shape::kMaxRank) {
        return session::MalformedOp{Status(ErrorKind::kShapeMismatch,
                                           "create_tensor: rank above " +
                                               std::to_string(Shape::kMaxRank))};
      }
      return CreateTensorOp{c.handle(), dtype,
                            Shape(std::vector<int64_t>(c.shape().begin(), c.shape().end()))};
    }
    case v1::Op::kFreeTensor: return FreeTensorOp{op.free_tensor().handle()};
    case v1::Op::kUpload: {
      const auto& u = op.upload();
      return UploadOp{u.tensor(), u.offset(), std::string_view(u.data())};
    }
    case v1::Op::kDownload: {
      const auto& d = op.download();
      return DownloadOp{d.tensor(), d.offset(), d.length()};
    }
    case v1::Op::kFill: return FillOp{op.fill().tensor(), op.fill().value()};
    case v1::Op::kCopy: return CopyOp{op.copy().src(), op.copy().dst()};
    case v1::Op::kBinary: {
      const auto& b = op.binary();
      backend::BinaryOp kind;
      switch (b.kind()) {
        case v1::ADD: kind = backend::BinaryOp::kAdd; break;
        case v1::SUB: kind = backend::BinaryOp::kSub; break;
        case v1::MUL: kind = backend::BinaryOp::kMul; break;
        case v1::DIV: kind = backend::BinaryOp::kDiv; break;
        default: return Malformed("binary: invalid kind");
      }
      return BinaryOpArgs{kind, b.a(), b.b(), b.out()};
    }
    case v1::Op::kScale: return ScaleOp{op.scale().x(), op.scale().alpha(), op.scale().out()};
    case v1::Op::kAxpy: return AxpyOp{op.axpy().alpha(), op.axpy().x(), op.axpy().y()};
    case v1::Op::kReduceSum: return ReduceSumOp{op.reduce_sum().in(), op.reduce_sum().out()};
    case v1::Op::kGemm: {
      const auto& g = op.gemm();
      return GemmOp{g.a(), g.b(), g.c(), g.trans_a(), g.trans_b(), g.alpha(), g.beta()};
    }
    case v1::Op::KIND_NOT_SET: break;
  }
  return Malformed("op has no kind this daemon knows");
}

}  // namespace

session::SubmitRequest ToSubmitRequest(std::shared_ptr<const v1::ClientMessage> message) {
  session::SubmitRequest req;
  const v1::Submit& submit = message->submit();
  req.submit_id = submit.submit_id();
  req.ops.reserve(submit.ops_size());
  for (const v1::Op& op : submit.ops()) req.ops.push_back(FromProto(op));
  req.payload = std::move(message);
  return req;
}

void ToProto(const Status& status, v1::Error* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_kind(static_cast<v1::ErrorKind>(status.kind()));
  out->set_message(status.message());
  out->set_op_index(status.op_index());
}

void ToProto(const session::SessionStatsSnapshot& s, v1::SessionStats* out) {
  out->set_submits(s.submits);
  out->set_failed_submits(s.failed_submits);
  out->set_ops(s.ops);
  out->set_kernel_launches(s.kernel_launches);
  out->set_bytes_uploaded(s.bytes_uploaded);
  out->set_bytes_downloaded(s.bytes_downloaded);
  out->set_tensors_created(s.tensors_created);
  out->set_peak_device_bytes(s.peak_device_bytes);
  out->set_device_busy_ns(s.device_busy_ns);
}

}  // namespace ferry::rpc
