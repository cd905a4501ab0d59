#include "rpc/convert.h"

#include <cstring>

#include "ferry/wire.h"
#include "session/admission.h"

namespace ferry::rpc {
namespace {

session::Op Malformed(std::string why) {
  return session::MalformedOp{Status(ErrorKind::kInvalidArgument, std::move(why))};
}

session::Op FromProto(const v1::Op& op) {
  using namespace session;
  switch (op.kind_case()) {
    case v1::Op::kCreateTensor: {
      const auto& c = op.create_tensor();
      DType dtype = wire::FromProto(c.dtype());
      if (dtype == DType::kInvalid) return Malformed("create_tensor: invalid dtype");
      if (static_cast<size_t>(c.shape_size()) > Shape::kMaxRank) {
        return session::MalformedOp{
            Status(ErrorKind::kShapeMismatch,
                   "create_tensor: rank above " + std::to_string(Shape::kMaxRank))};
      }
      return CreateTensorOp{c.handle(), dtype,
                            Shape(std::vector<int64_t>(c.shape().begin(), c.shape().end()))};
    }
    case v1::Op::kFreeTensor:
      return FreeTensorOp{op.free_tensor().handle()};
    case v1::Op::kUpload: {
      const auto& u = op.upload();
      return UploadOp{u.tensor(), u.offset(), std::string_view(u.data())};
    }
    case v1::Op::kDownload: {
      const auto& d = op.download();
      return DownloadOp{d.tensor(), d.offset(), d.length()};
    }
    case v1::Op::kFill:
      return FillOp{op.fill().tensor(), op.fill().value()};
    case v1::Op::kCopy:
      return CopyOp{op.copy().src(), op.copy().dst()};
    case v1::Op::kBinary: {
      const auto& b = op.binary();
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
      return BinaryOpArgs{kind, b.a(), b.b(), b.out()};
    }
    case v1::Op::kScale:
      return ScaleOp{op.scale().x(), op.scale().alpha(), op.scale().out()};
    case v1::Op::kAxpy:
      return AxpyOp{op.axpy().alpha(), op.axpy().x(), op.axpy().y()};
    case v1::Op::kReduceSum:
      return ReduceSumOp{op.reduce_sum().in(), op.reduce_sum().out()};
    case v1::Op::kGemm: {
      const auto& g = op.gemm();
      return GemmOp{g.a(), g.b(), g.c(), g.trans_a(), g.trans_b(), g.alpha(), g.beta()};
    }
    case v1::Op::kLoadModule: {
      const auto& m = op.load_module();
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
      return LoadModuleOp{m.handle(), format, std::string_view(m.image())};
    }
    case v1::Op::kUnloadModule:
      return UnloadModuleOp{op.unload_module().handle()};
    case v1::Op::kLaunch: {
      const auto& l = op.launch();
      LaunchOp out;
      out.module = l.module();
      out.function = l.function();
      if (l.grid_size() < 1 || l.grid_size() > 3 || l.block_size() < 1 || l.block_size() > 3) {
        return Malformed("launch: grid and block need 1 to 3 dimensions");
      }
      for (int i = 0; i < l.grid_size(); ++i) out.config.grid[i] = l.grid(i);
      for (int i = 0; i < l.block_size(); ++i) out.config.block[i] = l.block(i);
      out.config.shared_bytes = l.shared_bytes();
      if (l.args_size() > static_cast<int>(kMaxKernelArgs)) {
        return Malformed("launch: too many arguments");
      }
      for (const v1::KernelArg& a : l.args()) {
        LaunchArg arg;
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
    case v1::Op::kBeginGraph:
      return BeginGraphOp{op.begin_graph().handle()};
    case v1::Op::kEndGraph:
      return EndGraphOp{};
    case v1::Op::kLaunchGraph:
      return LaunchGraphOp{op.launch_graph().graph()};
    case v1::Op::kFreeGraph:
      return FreeGraphOp{op.free_graph().handle()};
    case v1::Op::kUploadFromSlab: {
      const auto& u = op.upload_from_slab();
      return UploadFromSlabOp{u.tensor(), u.offset(), u.slab(), u.slab_offset(), u.length()};
    }
    case v1::Op::kDownloadToSlab: {
      const auto& d = op.download_to_slab();
      return DownloadToSlabOp{d.tensor(), d.offset(), d.slab(), d.slab_offset(), d.length()};
    }
    case v1::Op::KIND_NOT_SET:
      break;
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

std::optional<session::OpKind> KindOf(const v1::Op& op) {
  using session::OpKind;
  switch (op.kind_case()) {
    case v1::Op::kCreateTensor:
      return OpKind::kCreateTensor;
    case v1::Op::kFreeTensor:
      return OpKind::kFreeTensor;
    case v1::Op::kUpload:
      return OpKind::kUpload;
    case v1::Op::kDownload:
      return OpKind::kDownload;
    case v1::Op::kFill:
      return OpKind::kFill;
    case v1::Op::kCopy:
      return OpKind::kCopy;
    case v1::Op::kBinary:
      return OpKind::kBinary;
    case v1::Op::kScale:
      return OpKind::kScale;
    case v1::Op::kAxpy:
      return OpKind::kAxpy;
    case v1::Op::kReduceSum:
      return OpKind::kReduceSum;
    case v1::Op::kGemm:
      return OpKind::kGemm;
    case v1::Op::kLoadModule:
      return OpKind::kLoadModule;
    case v1::Op::kUnloadModule:
      return OpKind::kUnloadModule;
    case v1::Op::kLaunch:
      return OpKind::kLaunch;
    case v1::Op::kBeginGraph:
      return OpKind::kBeginGraph;
    case v1::Op::kEndGraph:
      return OpKind::kEndGraph;
    case v1::Op::kLaunchGraph:
      return OpKind::kLaunchGraph;
    case v1::Op::kFreeGraph:
      return OpKind::kFreeGraph;
    case v1::Op::kUploadFromSlab:
      return OpKind::kUploadFromSlab;
    case v1::Op::kDownloadToSlab:
      return OpKind::kDownloadToSlab;
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
