// Transfers: pinned buffers, pending transfers, and the blocking uploads and downloads
// (through the staging buffer in shared memory, or inline in messages).
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "ferry/client.h"
#include "ferry/trace_points.h"
#include "parallel_copy.h"
#include "session_state.h"

namespace ferry {
namespace internal {
namespace {
constexpr uint64_t kUploadChunkBytes = 1ull << 20;     // bytes per Upload op
constexpr uint64_t kUploadSubmitBytes = 8ull << 20;    // upload bytes per submit message
constexpr uint64_t kDownloadSubmitBytes = 8ull << 20;  // download bytes per submit
}  // namespace
}  // namespace internal

// --- PinnedBuffer, PendingTransfer ----------------------------------------------------------

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept : block_(std::move(o.block_)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) block_ = std::move(o.block_);
  return *this;
}
PinnedBuffer::~PinnedBuffer() = default;
void* PinnedBuffer::data() { return block_ ? block_->data : nullptr; }
const void* PinnedBuffer::data() const { return block_ ? block_->data : nullptr; }
uint64_t PinnedBuffer::size() const { return block_ ? block_->size : 0; }
bool PinnedBuffer::is_shared() const { return block_ && block_->slab; }

PendingTransfer::PendingTransfer(PendingTransfer&& o) noexcept : state_(std::move(o.state_)) {}
PendingTransfer& PendingTransfer::operator=(PendingTransfer&& o) noexcept {
  if (this != &o) {
    Detach();
    state_ = std::move(o.state_);
  }
  return *this;
}
PendingTransfer::~PendingTransfer() { Detach(); }

void PendingTransfer::Detach() {
  if (!state_ || state_->waited) return;
  if (state_->first_id != 0) {
    if (auto s = state_->session.lock()) s->Detach(std::move(state_));
  }
  state_.reset();
}

Result<bool> PendingTransfer::is_ready() const {
  if (!state_ || state_->waited) {
    return Status(ErrorKind::kInvalidArgument, "no transfer: moved from or already waited for");
  }
  if (state_->first_id == 0) return state_->refused;
  auto s = state_->session.lock();
  if (!s) return Status(ErrorKind::kSessionClosed, "the session is gone");
  Status outcome;
  if (!s->Outcome(state_->first_id, state_->last_id, &outcome)) return false;
  if (!outcome.ok()) return outcome;
  return true;
}

Transfer PendingTransfer::wait() {
  Transfer t;
  if (!state_ || state_->waited) {
    t.status = Status(ErrorKind::kInvalidArgument, "no transfer: moved from or already waited for");
    return t;
  }
  if (state_->first_id == 0) {
    t.status = state_->refused;
  } else if (auto s = state_->session.lock()) {
    FERRY_TRACE(trace::kWait0, state_->last_id);
    t.status = s->WaitOutcome(state_->first_id, state_->last_id);
    FERRY_TRACE(trace::kWait1, state_->last_id);
  } else {
    t.status = Status(ErrorKind::kSessionClosed, "the session is gone");
  }
  state_->waited = true;
  t.tensor = std::move(state_->tensor);
  t.buffer = std::move(state_->buffer);
  state_.reset();
  return t;
}

// --- Session: shared memory and pending transfers ----------------------------------------

Result<PinnedBuffer> Session::pinned_buffer(uint64_t bytes) { return state_->Allocate(bytes); }

uint64_t Session::slab_size() const { return state_->slab_size(); }

namespace {

// Check what a pending transfer is given; OK means it may be sent.
Status CheckTransfer(const std::shared_ptr<internal::SessionState>& session,
                     const std::weak_ptr<internal::SessionState>& tensor_session,
                     const Tensor& tensor, const PinnedBuffer& buffer) {
  if (!tensor.valid()) {
    return Status(ErrorKind::kInvalidHandle, "the tensor was moved from (or never created)");
  }
  if (!buffer.valid()) {
    return Status(ErrorKind::kInvalidArgument, "the buffer was moved from (or never allocated)");
  }
  if (tensor_session.lock() != session) {
    return Status(ErrorKind::kInvalidHandle, "the tensor belongs to another session");
  }
  if (buffer.size() < tensor.byte_size()) {
    return Status(ErrorKind::kOutOfRange, "a buffer of " + std::to_string(buffer.size()) +
                                              " bytes cannot hold tensor " +
                                              std::to_string(tensor.handle()) + " of " +
                                              std::to_string(tensor.byte_size()) + " bytes");
  }
  return Status::Ok();
}

// SHAPE_MISMATCH unless a blocking transfer of `bytes` covers all of `t` (an invalid tensor
// is the daemon's to refuse). `what`: "upload of" / "download of"; `to`: "into" / "from".
Status CoversTensor(const Tensor& t, uint64_t bytes, const char* what, const char* to) {
  if (!t.valid() || bytes == t.byte_size()) return Status::Ok();
  return Status(ErrorKind::kShapeMismatch,
                std::string(what) + " " + std::to_string(bytes) + " bytes " + to + " tensor " +
                    std::to_string(t.handle()) + " of " + std::to_string(t.byte_size()));
}

// Point a slab op (UploadFromSlab or DownloadToSlab) at `length` bytes of tensor `tensor`
// from `offset`, in slab `slab` from `slab_offset`.
template <typename SlabOp>
void SetSlabRange(SlabOp* op, uint64_t tensor, uint64_t offset, uint64_t slab, uint64_t slab_offset,
                  uint64_t length) {
  op->set_tensor(tensor);
  op->set_offset(offset);
  op->set_slab(slab);
  op->set_slab_offset(slab_offset);
  op->set_length(length);
}

// The bytes a blocking download of `bytes` through the staging buffer asks for per submit,
// each chunk into one half (`half` bytes) of it: a quarter of the transfer, at most a half
// and at least what the client copies out with several threads (kParallelCopyMinBytes). In
// chunks the copy out of one overlaps the DMA of the next, so a download of a few MiB is not
// a DMA and then a copy (8 and 16 MiB downloads 10-45 % faster on the H200;
// docs/performance.md). Uploads keep halves: in chunks, 8 MiB uploads were slower.
uint64_t StagingChunkBytes(uint64_t bytes, uint64_t half) {
  return std::clamp<uint64_t>((bytes + 3) / 4, std::min(internal::kParallelCopyMinBytes, half),
                              half);
}

// Record inline Upload ops (at most kUploadChunkBytes each) for t's bytes from `off` up to
// kUploadSubmitBytes more (or `bytes`, the end); return where they stop.
uint64_t RecordUploadWindow(Session& session, const Tensor& t, const char* data, uint64_t off,
                            uint64_t bytes) {
  const uint64_t window_end = std::min(bytes, off + internal::kUploadSubmitBytes);
  do {
    const uint64_t n = std::min(internal::kUploadChunkBytes, window_end - off);
    session.write_bytes(t, off, data + off, n);
    off += n;
  } while (off < window_end);
  return off;
}

// Send a pending transfer of `bytes` as tracked submits, one per part: `record_part(off,
// &downloads)` records the ops of the part from byte `off` (and where its downloaded bytes
// go) and returns where the next part starts. Stops at the first submit that fails; when
// part of the transfer was sent already, that error is not the transfer's refusal: the
// outcome of what was sent decides.
template <typename RecordPart>
void SendPendingParts(internal::SessionState& state, internal::PendingState& p, uint64_t bytes,
                      RecordPart record_part) {
  uint64_t off = 0;
  do {
    std::vector<std::pair<uint32_t, std::pair<void*, uint64_t>>> downloads;
    off = record_part(off, &downloads);
    auto id = state.Submit(std::move(downloads), true);
    if (!id.ok()) {
      p.refused = id.status();
      break;
    }
    if (!p.first_id) p.first_id = *id;
    p.last_id = *id;
  } while (off < bytes);
  if (!p.refused.ok() && p.first_id) p.refused = Status::Ok();
}

// Wait for every submit from `first` to `last` (none when first is 0); the first failure
// among them, or OK.
Status WaitSubmits(internal::SessionState& state, uint64_t first, uint64_t last) {
  Status result;
  for (uint64_t id = first; id && id <= last; ++id) {
    Status s = state.WaitSubmit(id);
    if (result.ok() && !s.ok()) result = s;
  }
  return result;
}

}  // namespace

PendingUpload Session::upload_pending(PinnedBuffer&& buffer, Tensor&& tensor) {
  auto p = std::make_shared<internal::PendingState>();
  p->session = state_;
  p->tensor = std::move(tensor);
  p->buffer = std::move(buffer);
  p->refused = CheckTransfer(state_, p->tensor.session_, p->tensor, p->buffer);
  if (p->refused.ok()) p->refused = state_->Submit().status();  // what was recorded first
  if (!p->refused.ok()) return PendingUpload(std::move(p));
  const uint64_t bytes = p->tensor.byte_size();
  const uint64_t h = p->tensor.handle();
  const char* data = static_cast<const char*>(p->buffer.data());
  SendPendingParts(*state_, *p, bytes, [&](uint64_t off, auto*) -> uint64_t {
    if (p->buffer.is_shared()) {
      SetSlabRange(state_->Record()->mutable_upload_from_slab(), h, 0, p->buffer.block_->slab->id,
                   p->buffer.block_->slab_offset, bytes);
      return bytes;
    }
    // Inline, 1 MiB per op, a few MiB per submit.
    return RecordUploadWindow(*this, p->tensor, data, off, bytes);
  });
  return PendingUpload(std::move(p));
}

PendingDownload Session::download_pending(Tensor&& tensor, PinnedBuffer&& buffer) {
  auto p = std::make_shared<internal::PendingState>();
  p->session = state_;
  p->tensor = std::move(tensor);
  p->buffer = std::move(buffer);
  p->refused = CheckTransfer(state_, p->tensor.session_, p->tensor, p->buffer);
  if (p->refused.ok()) p->refused = state_->Submit().status();
  if (!p->refused.ok()) return PendingDownload(std::move(p));
  const uint64_t bytes = p->tensor.byte_size();
  const uint64_t h = p->tensor.handle();
  char* out = static_cast<char*>(p->buffer.data());
  SendPendingParts(*state_, *p, bytes, [&](uint64_t off, auto* targets) -> uint64_t {
    if (p->buffer.is_shared()) {
      SetSlabRange(state_->Record()->mutable_download_to_slab(), h, 0, p->buffer.block_->slab->id,
                   p->buffer.block_->slab_offset, bytes);
      return bytes;
    }
    // The bytes come inline, written by the reader straight into the buffer.
    uint64_t n = std::min(internal::kDownloadSubmitBytes, bytes - off);
    auto* d = state_->Record()->mutable_download();
    d->set_tensor(h);
    d->set_offset(off);
    d->set_length(n);
    targets->push_back({0u, {out + off, n}});
    return off + n;
  });
  return PendingDownload(std::move(p));
}

Status Session::upload_bytes(const Tensor& t, const void* data, uint64_t bytes) {
  FERRY_RETURN_IF_ERROR(CoversTensor(t, bytes, "upload of", "into"));
  if (state_->local() && bytes > 0) {
    if (PinnedBuffer* staging = state_->Staging()) {
      // Through shared memory: copy a half of the staging buffer while the daemon DMAs
      // from the other one. (Smaller chunks, as downloads use, made 8 MiB uploads slower.)
      FERRY_RETURN_IF_ERROR(state_->Submit().status());
      const uint64_t half = staging->size() / 2;
      char* base = static_cast<char*>(staging->data());
      uint64_t ids[2] = {0, 0};
      Status result;
      uint64_t k = 0;
      for (uint64_t off = 0; off < bytes && result.ok(); off += half, k ^= 1) {
        if (ids[k]) {
          Status s = state_->WaitSubmit(ids[k]);
          ids[k] = 0;
          if (!s.ok()) {
            result = s;
            break;
          }
        }
        uint64_t n = std::min(half, bytes - off);
        internal::ParallelCopy(base + k * half, static_cast<const char*>(data) + off, n);
        SetSlabRange(state_->Record()->mutable_upload_from_slab(), t.handle(), off,
                     staging->block_->slab->id, staging->block_->slab_offset + k * half, n);
        auto id = state_->Submit();
        if (!id.ok()) {
          result = id.status();
          break;
        }
        ids[k] = *id;
        state_->CountStagedUpload(n);
      }
      for (uint64_t id : {std::min(ids[0], ids[1]), std::max(ids[0], ids[1])}) {
        if (!id) continue;
        Status s = state_->WaitSubmit(id);
        if (result.ok() && !s.ok()) result = s;
      }
      return result;
    }
  }
  // Flush what is recorded, then send the bytes in submits of a few MiB each, each made of
  // Upload ops of at most 1 MiB; wait for all of them.
  FERRY_RETURN_IF_ERROR(state_->Submit().status());
  const char* p = static_cast<const char*>(data);
  uint64_t first = 0, last = 0;
  uint64_t off = 0;
  do {
    off = RecordUploadWindow(*this, t, p, off, bytes);
    FERRY_ASSIGN_OR_RETURN(last, state_->Submit());
    if (!first) first = last;
  } while (off < bytes);
  return WaitSubmits(*state_, first, last);
}

Status Session::download_bytes(const Tensor& t, void* out, uint64_t bytes) {
  FERRY_RETURN_IF_ERROR(CoversTensor(t, bytes, "download of", "from"));
  if (state_->local() && bytes > 0) {
    if (PinnedBuffer* staging = state_->Staging()) {
      // Through shared memory: the daemon fills a chunk into one half while the last chunk
      // is copied out of the other.
      FERRY_RETURN_IF_ERROR(state_->Submit().status());
      const uint64_t half = staging->size() / 2;
      const uint64_t chunk = StagingChunkBytes(bytes, half);
      char* base = static_cast<char*>(staging->data());
      struct Chunk {
        uint64_t id = 0, off = 0, n = 0;
      } chunks[2];
      Status result;
      uint64_t next = 0;
      auto send = [&](int k) -> Status {
        uint64_t n = std::min(chunk, bytes - next);
        SetSlabRange(state_->Record()->mutable_download_to_slab(), t.handle(), next,
                     staging->block_->slab->id, staging->block_->slab_offset + k * half, n);
        FERRY_ASSIGN_OR_RETURN(chunks[k].id, state_->Submit());
        state_->CountStagedDownload(n);
        chunks[k].off = next;
        chunks[k].n = n;
        next += n;
        return Status::Ok();
      };
      for (int k = 0; k < 2 && next < bytes && result.ok(); ++k) result = send(k);
      for (int k = 0; chunks[k].id; k ^= 1) {
        Status s = state_->WaitSubmit(chunks[k].id);
        chunks[k].id = 0;
        if (result.ok() && !s.ok()) result = s;
        if (result.ok()) {
          internal::ParallelCopy(static_cast<char*>(out) + chunks[k].off, base + k * half,
                                 chunks[k].n);
          if (next < bytes) result = send(k);
        }
        if (!chunks[k ^ 1].id) break;
      }
      return result;
    }
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
  return WaitSubmits(*state_, first, last);
}

}  // namespace ferry
