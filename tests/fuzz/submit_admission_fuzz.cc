// Fuzz target: a submit from the wire to the admission decision, as the daemon handles every
// ClientMessage that reaches it by the stream or the submit ring: parse the bytes as a
// ferry.v1.ClientMessage, convert it (rpc::ToSubmitRequest, server/rpc/convert.cc), and
// admit it (session::AdmitSubmit, server/session/admission.cc) against a session that holds
// a few tensors and two slabs.
//
// What must hold for any bytes: no crash, no out-of-bounds read, no undefined behaviour
// (overflowing sizes and offsets are the classic); a refused submit names a typed error and
// the op it refused; an admitted one stays inside the session's device quota.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "ferry/v1/session.pb.h"
#include "fuzz_check.h"
#include "pool/session_slabs.h"
#include "pool/slab_pool.h"
#include "rpc/convert.h"
#include "session/admission.h"

using namespace ferry;

namespace {

void Check(bool ok, const char* what) {
  ferry::fuzz::CheckOrAbort(ok, "submit_admission_fuzz", what);
}

struct World {
  session::HandleTable table;
  session::AdmissionLimits limits;
  std::unique_ptr<pool::SlabPool> pool;
  std::unique_ptr<pool::SessionSlabs> slabs;

  World() {
    auto add = [this](uint64_t handle, DType dtype, Shape shape) {
      session::TensorRecord r;
      r.dtype = dtype;
      r.shape = shape;
      r.ptr = 0x10000 * handle;
      r.bytes = *session::TensorBytes(dtype, shape, &r.elements);
      r.generation = handle;
      table.Insert(handle, r);
    };
    add(1, DType::kF32, Shape({16}));
    add(2, DType::kF32, Shape({4, 4}));
    add(3, DType::kF64, Shape({2, 3}));
    add(4, DType::kU8, Shape({64}));
    add(5, DType::kI32, Shape({0}));
    limits.device_bytes_quota = 1 << 20;
    limits.max_ops_per_submit = 1024;
    limits.max_download_bytes = 1 << 20;
    limits.max_modules = 4;
    limits.max_graphs = 4;
    pool::SlabPoolOptions options;
    options.slab_size = 64 << 10;
    options.budget = 1 << 20;
    options.initial_slabs = 0;
    auto p = pool::SlabPool::Create(options, {});
    Check(p.ok(), "SlabPool::Create failed");
    pool = std::move(*p);
    slabs = std::make_unique<pool::SessionSlabs>(pool.get());
    slabs->Bind(0);
    for (int i = 0; i < 2; ++i) Check(slabs->Acquire().ok(), "slab Acquire failed");
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World();  // shared by every input; AdmitSubmit changes nothing
  auto message = std::make_shared<v1::ClientMessage>();
  if (!message->ParseFromArray(data, static_cast<int>(size))) return 0;
  session::SubmitRequest request = rpc::ToSubmitRequest(message);
  Check(request.ops.size() == static_cast<size_t>(message->submit().ops_size()), "ops lost");
  // Without slabs (a remote session) and with them (a local one).
  for (const pool::SessionSlabs* slabs : {static_cast<pool::SessionSlabs*>(nullptr),
                                          static_cast<pool::SessionSlabs*>(world->slabs.get())}) {
    Result<session::AdmissionResult> r =
        session::AdmitSubmit(request, world->table, world->limits, slabs);
    if (r.ok()) {
      Check(r->peak_device_bytes <= world->limits.device_bytes_quota, "admitted past the quota");
      Check(r->inline_download_bytes <= world->limits.max_download_bytes,
            "admitted past the download limit");
    } else {
      Check(r.status().kind() != ErrorKind::kNone, "a refusal without a kind");
      Check(r.status().op_index() < 0 ||
                r.status().op_index() < static_cast<int64_t>(request.ops.size()),
            "a refusal naming an op the submit does not have");
    }
  }
  return 0;
}
