// The client's state behind Client, Session and their objects. Internal to libferry.
//
// SessionState is shared by the Session object and its Tensors (weakly). Recording and
// writes happen on the owner's thread; the reader thread (reader.cc) delivers events; the
// members below say which side owns each.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "completion_board.h"
#include "ferry/client.h"
#include "ferry/mutex.h"
#include "ferry/v1/session.grpc.pb.h"
#include "ring_writer.h"
#include "slab_arena.h"
#include "slab_socket.h"

namespace ferry::internal {

inline constexpr uint64_t kBufferAlign = 256;
inline constexpr uint64_t kStagingBytes = 16ull << 20;  // blocking transfers: two halves

inline uint64_t AlignUp(uint64_t v) { return (v + kBufferAlign - 1) / kBufferAlign * kBufferAlign; }

class SessionState;

// A pending transfer: its submits [first_id, last_id] (0: refused before sending), and the
// values it holds until the outcome is known.
struct PendingState {
  uint64_t first_id = 0, last_id = 0;
  Status refused;
  Tensor tensor;
  PinnedBuffer buffer;
  std::weak_ptr<SessionState> session;
  bool waited = false;
};

// A session stream (one gRPC call) with its context: a session's, or kept by the client
// for its next session after the daemon kept it open (Closed.stream_kept).
struct SessionCall {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream;
  std::chrono::steady_clock::time_point usable_until;  // kept: the daemon still waits for Open
  // Kept: the last session's completion board and submit ring, still mapped, which the next
  // session on this stream takes over when the daemon says so (Opened.channels_kept).
  std::unique_ptr<CompletionBoard> board;
  std::unique_ptr<RingWriter> ring;
  // Kept: the last session's slabs that no buffer used, still mapped, which the next session
  // takes over where the daemon says so (Opened.kept_slabs; docs/protocol.md, "Kept slabs").
  std::vector<std::shared_ptr<SlabMapping>> slabs;
  // End the call at once (cancelled) and let gRPC finish it.
  void Cancel() {
    context.TryCancel();
    (void)stream->Finish();
  }
};

class ClientState {
 public:
  ~ClientState();

  std::string target;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::SessionService::Stub> stub;

  /// The stream the last closed session left open for the next Open, if it is still good
  /// for a while; null otherwise. Thread-safe.
  std::unique_ptr<SessionCall> TakeKeptCall();
  /// Keep `call` (its session closed; the daemon waits `kept_ms` for the next Open, 0: no
  /// limit) for the next open_session. One is kept: an older one is ended. Thread-safe.
  void KeepCall(std::unique_ptr<SessionCall> call, uint64_t kept_ms);

  /// The longest a kept stream is used after its session closed; at most half the daemon's
  /// wait, so that an Open sent on it arrives in time.
  static constexpr std::chrono::milliseconds kKeptCallMaxAge{2000};

 private:
  Mutex kept_mu_;
  std::unique_ptr<SessionCall> kept_ ABSL_GUARDED_BY(kept_mu_);
};

class SessionState {
 public:
  using Stream = grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>;

  ~SessionState();

  Status Open(std::shared_ptr<ClientState> client, const SessionOptions& options);
  /// Open went out on a stream a closed session left (ClientState::TakeKeptCall): if it
  /// failed, the daemon may have ended that stream meanwhile, and a new one may do.
  bool on_kept_stream() const { return on_kept_stream_; }

  const v1::Opened& opened() const { return opened_; }
  bool draining() const { return draining_; }

  // --- recording (owner thread) -----------------------------------------------------
  uint64_t NextHandle() { return next_handle_++; }
  v1::Op* Record() { return pending_.add_ops(); }
  size_t recorded() const { return pending_.ops_size(); }
  bool closed() const { return closed_; }

  /// Send the recorded ops as one Submit; `downloads` are where Download op bytes go;
  /// `track`: keep its outcome for a pending transfer.
  Result<uint64_t> Submit(
      std::vector<std::pair<uint32_t, std::pair<void*, uint64_t>>> downloads = {},
      bool track = false);

  /// Wait for submit `id`'s completion and return its outcome (consuming it).
  Status WaitSubmit(uint64_t id);

  Status Synchronize();

  Result<SessionStats> Close();

  /// End the stream without waiting for the device; idempotent.
  void Shutdown();

  // --- pending transfers ------------------------------------------------------------
  /// Return whether submits [first, last] have all completed, and the first failure.
  bool Outcome(uint64_t first, uint64_t last, Status* status);
  /// Wait for submits [first, last]; return their first failure, consuming it.
  Status WaitOutcome(uint64_t first, uint64_t last);
  void Detach(std::shared_ptr<PendingState> p);
  /// Release detached transfers whose completion arrived (owner thread).
  void ReapDetached();

  // --- shared memory ---------------------------------------------------------------
  bool local() const { return !opened_.slab_socket().empty(); }
  uint64_t slab_size() const { return opened_.slab_size(); }

  Result<PinnedBuffer> Allocate(uint64_t bytes);

  /// The reused buffer blocking transfers stage through; invalid when none can be had.
  PinnedBuffer* Staging();
  /// Count `bytes` a blocking upload or download sent through Staging(); Close reports the
  /// sums (SessionStats::staged_upload_bytes, staged_download_bytes).
  void CountStagedUpload(uint64_t bytes) { staged_upload_bytes_ += bytes; }
  void CountStagedDownload(uint64_t bytes) { staged_download_bytes_ += bytes; }

 private:
  // Ask the daemon for one more slab over the slab socket and map it.
  Status AcquireSlab();
  // Send `m` after Open: numbered, through the submit ring when the session has one and the
  // message is not too large for it, else through the stream. A full ring is waited on, the
  // way a stream's write waits for flow control: the daemon takes records only while the
  // session is below its in-flight limit. False when the stream is gone.
  bool Send(v1::ClientMessage& m);

  // Whether submits [first, last] have all completed and everything the client learns of
  // them in messages (failures' errors, Download bytes) has come: from the messages alone,
  // which come in submit order, or from the completion board plus the messages it says are
  // owed (docs/protocol.md, "Successes on the board"). True when first > last.
  bool CompletedLocked(uint64_t first, uint64_t last) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Wait (below) until CompletedLocked(first, last) or the stream has ended; return
  // CompletedLocked(first, last).
  bool WaitCompletedLocked(uint64_t first, uint64_t last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // CompletedLocked for [first, last] and, if so, the first failure among its tracked
  // submits; the stream's end when it ended before they completed.
  bool OutcomeLocked(uint64_t first, uint64_t last, Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Status StreamFailure(const char* what);
  Status DeadOr(const char* what);

  // Wait until `done()` (evaluated with mu_ held, as the caller holds it). For up to the
  // client's wait_spin, poll the reader's message count and the completion board instead of
  // sleeping, so an answer that comes quickly is seen without waking this thread; then, with
  // a board and `board_last` (not 0), sleep on the board's futex until it has posted
  // `board_last`, and then (or without a board) on cv_, which the reader signals. Drops mu_
  // while it polls or sleeps; returns with mu_ held. Defined in session_state.cc, its only
  // user.
  template <typename Done>
  void Wait(Done done, uint64_t board_last = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The longest a wait sleeps on the board before it looks at the messages' side again.
  static constexpr std::chrono::nanoseconds kBoardSleep{1'000'000};

  // The reader thread's body (reader.cc): apply the daemon's messages until the stream ends.
  void ReadLoop();
  // Let the reader thread, started while Open waits for Opened, read (`read`) or end.
  void StartReader(bool read);

  // Open's steps, in order. Take the stream the last closed session left open, or make a
  // new one (call_, stream_, on_kept_stream_).
  void AttachStream();
  // Start the reader thread; it waits for StartReader before it reads.
  void StartReaderThread();
  // Read the daemon's answer to Open (noting a draining announcement before it) into
  // opened_; on a refusal or a wrong answer, shut down and return the error.
  Status AwaitOpened();
  // For a local session: the slab socket, the completion board and submit ring (the kept
  // stream's, or mapped now), and the kept slabs the daemon handed on to this session.
  void TakeLocalResources();

  std::shared_ptr<ClientState> client_;
  std::unique_ptr<SessionCall> call_;  // the session's stream
  Stream* stream_ = nullptr;           // call_->stream
  bool on_kept_stream_ = false;
  std::thread reader_;
  v1::Opened opened_;

  // Owner thread only.
  v1::Submit pending_;
  uint64_t next_handle_ = 1;
  uint64_t next_submit_id_ = 1;
  uint64_t last_submitted_ = 0;
  bool closed_ = false;
  bool shut_down_ = false;

  // Shared with the reader thread.
  Mutex mu_;
  CondVar cv_;
  uint64_t last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> answers_{0};  // messages the reader applied, for Wait
  // The last submit a Synchronize covered.
  uint64_t synchronized_through_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Status> failures_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::map<uint32_t, std::pair<void*, uint64_t>>> download_targets_
      ABSL_GUARDED_BY(mu_);
  std::optional<SessionStats> closed_stats_ ABSL_GUARDED_BY(mu_);
  // Closed said the stream is kept (Closed.stream_kept; the reader then stops), and for how
  // long the daemon waits for the next Open on it.
  bool stream_kept_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t kept_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether the reader thread may read: it is started before Opened is read (its start then
  // costs the open nothing) and waits for Open's verdict.
  enum class ReaderStart : uint8_t { kWait, kRead, kEnd };
  ReaderStart reader_start_ ABSL_GUARDED_BY(mu_) = ReaderStart::kWait;
  Status dead_ ABSL_GUARDED_BY(mu_);   // set once the stream ends
  std::atomic<bool> draining_{false};  // the daemon said it is draining
  // Pending transfers' submits and, once completed, their outcome.
  std::map<uint64_t, std::optional<Status>> tracked_ ABSL_GUARDED_BY(mu_);

  // Shared memory and pending transfers (owner thread).
  std::shared_ptr<SlabArena> arena_ = std::make_shared<SlabArena>();
  // The slab socket (null: a remote daemon); made at Open.
  std::unique_ptr<SlabSocket> slab_socket_;
  // The completion board (read-only shared memory; null: none). Mapped at Open, unmapped
  // when the state is destroyed (no waiter is left to read it).
  std::unique_ptr<CompletionBoard> board_;
  // The submit ring (null: none), and the next message's sequence number.
  std::unique_ptr<RingWriter> ring_;
  uint64_t next_sequence_ = 1;
  PinnedBuffer staging_;
  // The slabs Close asked the daemon to keep (Close.keep_slabs), out of the arena: the kept
  // stream's next session takes them over, or they are unmapped with the last buffer.
  std::vector<std::shared_ptr<SlabMapping>> closing_slabs_;
  bool staging_failed_ = false;
  uint64_t staged_upload_bytes_ = 0;
  uint64_t staged_download_bytes_ = 0;
  std::vector<std::shared_ptr<PendingState>> detached_;
};

}  // namespace ferry::internal
