#include "rpc/outbox.h"

#include <utility>

#include "rpc/convert.h"
#include "rpc/session_context.h"

namespace ferry::rpc {

void Outbox::Push(std::unique_ptr<v1::ServerMessage> message, session::ChunkBytes staged,
                  uint64_t chunk_bytes) {
  const uint64_t bytes = chunk_bytes + kMessageCost;
  bytes_ += bytes;
  if (staged.keep) ++chunks_in_staging_;
  queue_.push_back(Outgoing{std::move(message), std::move(staged), chunk_bytes});
  if (gauges_) {
    gauges_->unsent_bytes += static_cast<int64_t>(bytes);
    ++gauges_->unsent;
  }
  Pump();
}

std::unique_ptr<v1::ServerMessage> Outbox::WriteDone() {
  const bool wrote = write_in_flight_;
  write_in_flight_ = false;
  if (!wrote || queue_.empty()) return nullptr;
  Outgoing& o = queue_.front();
  Unqueue(o);
  std::unique_ptr<v1::ServerMessage> written = std::move(o.message);
  queue_.pop_front();
  return written;
}

void Outbox::Pump() {
  if (write_in_flight_ || queue_.empty() || writer_ == nullptr) return;
  write_in_flight_ = true;
  ++writes_started_;
  CoalesceCompletions();
  CopyOut(queue_.front());
  writer_->StartWrite(queue_.front().message.get());
  // Copy the next chunk out of staging while gRPC writes this one.
  if (queue_.size() > 1) CopyOut(queue_[1]);
}

void Outbox::DropUnsent(size_t keep) {
  while (queue_.size() > keep) {
    Unqueue(queue_.back());
    queue_.pop_back();
  }
}

void Outbox::CopyOutStaged() {
  for (Outgoing& o : queue_) CopyOut(o);
}

void Outbox::Unqueue(const Outgoing& o) {
  if (o.staged.keep) --chunks_in_staging_;
  bytes_ -= o.chunk_bytes + kMessageCost;
  if (gauges_) {
    --gauges_->unsent;
    gauges_->unsent_bytes -= static_cast<int64_t>(o.chunk_bytes + kMessageCost);
  }
}

void Outbox::CopyOut(Outgoing& o) {
  if (!o.staged.keep) return;
  *o.message->mutable_download_chunk()->mutable_data() = o.staged.Take();
  --chunks_in_staging_;
}

// gRPC writes one message at a time per stream, so a pipelined session's completions queue up
// behind the write in flight; one write per submit bounded 1-op submits to about 25 k/s on the
// H200 (docs/performance.md).
void Outbox::CoalesceCompletions() {
  if (!coalesce_ || !queue_.front().message->has_completed()) return;
  v1::Completed* run = queue_.front().message->mutable_completed();
  while (queue_.size() > 1 && AbsorbCompletion(run, *queue_[1].message)) {
    Unqueue(queue_[1]);
    queue_.erase(queue_.begin() + 1);
  }
}

}  // namespace ferry::rpc
