#include "session/ops.h"

#include <limits>

namespace ferry::session {
namespace {

// Lengths come from the wire (admission checks them later): add without wrapping.
void AddSaturating(uint64_t& sum, uint64_t n) {
  sum = n > std::numeric_limits<uint64_t>::max() - sum ? std::numeric_limits<uint64_t>::max()
                                                       : sum + n;
}

}  // namespace

void SubmitSummary::Add(OpKind kind, uint64_t copy_bytes, uint64_t inline_bytes) {
  ++ops_;
  kinds_ |= Bit(kind);
  switch (Traits(kind).copy) {
    case CopyDirection::kToDevice:
      AddSaturating(to_device_, copy_bytes);
      AddSaturating(to_device_inline_, inline_bytes);
      break;
    case CopyDirection::kToHost:
      AddSaturating(to_host_, copy_bytes);
      AddSaturating(to_host_inline_, inline_bytes);
      break;
    case CopyDirection::kNone:
      break;
  }
  if (kind == OpKind::kBeginGraph) {
    recording_ = true;
  } else if (kind == OpKind::kEndGraph) {
    recording_ = false;
    ++objects_;  // the graph
  } else if (recording_ || kind == OpKind::kCreateTensor || kind == OpKind::kLoadModule) {
    ++objects_;  // an op recorded into it, a tensor or a module
  }
}

SubmitSummary Summarize(const std::vector<Op>& ops) {
  SubmitSummary summary;
  for (const Op& op : ops) {
    uint64_t inline_bytes = 0;
    if (const auto* up = std::get_if<UploadOp>(&op)) inline_bytes = up->data.size();
    if (const auto* down = std::get_if<DownloadOp>(&op)) inline_bytes = down->length;
    summary.Add(KindOf(op), CopyBytes(op), inline_bytes);
  }
  return summary;
}

}  // namespace ferry::session
