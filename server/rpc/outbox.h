// Outbox: a session stream's server messages waiting to be written, and its write pump.
//
// gRPC writes one message at a time per stream: the outbox queues the rest, starts the next
// write when one is done, and counts what it holds (messages and bytes, in the stream's and
// the daemon's gauges) for backpressure. A DownloadChunk's bytes may still be in the shared
// staging area when it is queued: they are copied into the message only when it is next to be
// written (CopyOutNext), so copying a large download out overlaps with writing it; where the
// client stops reading, CopyOutStaged copies them all out early, so that staging other
// sessions wait for is not held. For a client that reads ranges (Open.coalesced_completions),
// successful Completed messages of consecutive submits waiting at the front go out as one.
//
// The writer is one method (MessageWriter), so the outbox is tested without gRPC.
// Thread-safety: none; the connection's executor owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>

#include "ferry/v1/session.pb.h"
#include "session/session.h"

namespace ferry::rpc {

struct StreamGauges;

/// Where the outbox's messages are written: one at a time.
class MessageWriter {
 public:
  virtual ~MessageWriter() = default;
  /// Start writing `message`, which stays valid and unchanged until the outbox hears the
  /// write is done (Outbox::WriteDone).
  virtual void StartWrite(const v1::ServerMessage* message) = 0;
};

class Outbox {
 public:
  /// What a queued message counts besides a chunk's bytes (its object, its place).
  static constexpr uint64_t kMessageCost = 256;

  /// `gauges` (may be null) count the daemon's unsent messages and bytes.
  explicit Outbox(StreamGauges* gauges) : gauges_(gauges) {}
  ~Outbox() { DropUnsent(0); }
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  /// Where writes go; null stops them (the stream is finished, or gRPC is done with it).
  void set_writer(MessageWriter* writer) { writer_ = writer; }
  /// Coalesce consecutive successful Completed messages (Open.coalesced_completions).
  void set_coalesce(bool coalesce) { coalesce_ = coalesce; }

  /// Queue `message` and start its write when none is in flight. A DownloadChunk's
  /// `chunk_bytes` may still be in staging (`staged`).
  void Push(std::unique_ptr<v1::ServerMessage> message, session::ChunkBytes staged = {},
            uint64_t chunk_bytes = 0);
  /// The write in flight is done: the message it wrote, taken out of the outbox (null when
  /// none was in flight or it was dropped). Starts no write: call Pump.
  std::unique_ptr<v1::ServerMessage> WriteDone();
  /// Start the next write when none is in flight and a writer is set.
  void Pump();
  /// Drop queued messages, keeping the first `keep` (one gRPC may still be writing).
  void DropUnsent(size_t keep);
  /// Copy every chunk still in staging into its message (a write stalled).
  void CopyOutStaged();

  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  uint64_t bytes() const { return bytes_; }  // chunk bytes and kMessageCost per message
  bool write_in_flight() const { return write_in_flight_; }
  /// Writes started so far (a stalled-write watch compares it).
  uint64_t writes_started() const { return writes_started_; }
  /// Queued messages whose bytes are still in staging.
  size_t chunks_in_staging() const { return chunks_in_staging_; }
  /// The first message queued (the one being written while write_in_flight()).
  const v1::ServerMessage* front() const {
    return queue_.empty() ? nullptr : queue_.front().message.get();
  }

 private:
  struct Outgoing {
    std::unique_ptr<v1::ServerMessage> message;
    session::ChunkBytes staged;
    uint64_t chunk_bytes = 0;  // a DownloadChunk's bytes, staged or not
  };
  // Account for a message leaving the outbox (written or dropped).
  void Unqueue(const Outgoing& o);
  // Put a chunk's staged bytes into its message (copying them out of staging).
  void CopyOut(Outgoing& o);
  // Fold the successful Completed messages after the front one into it.
  void CoalesceCompletions();

  StreamGauges* const gauges_;
  MessageWriter* writer_ = nullptr;
  bool coalesce_ = false;
  std::deque<Outgoing> queue_;
  uint64_t bytes_ = 0;
  bool write_in_flight_ = false;
  uint64_t writes_started_ = 0;
  size_t chunks_in_staging_ = 0;
};

}  // namespace ferry::rpc
