// CompletionBoard: one page of shared memory per local session where the daemon posts how
// far the session's submits have completed, so that a client waiting on the same machine
// sees a completion without the Completed message's trip through gRPC (a write, a socket
// hop and a read: ~20–40 µs of a tiny op's round trip).
//
// Layout (docs/protocol.md, "Completion board"): two little-endian u64 at offset 0 of a
// 4096-byte sealed memfd:
//   [0] completed_through: every submit with an id <= this has completed (delivered);
//   [8] last_failed: the highest submit id delivered with an error (0: none yet).
// Post writes last_failed before completed_through (release), so a reader that loads
// completed_through (acquire) >= N and then last_failed < F knows that the submits in
// [F, N] all succeeded. Anything else the client learns from the messages, which still
// come for every submit: the board is a shortcut for success, never the only word.
// Each Post also wakes the futex at offset 0 (completed_through's low 32 bits), so a client
// may sleep on the board (FUTEX_WAIT, shared) instead of spinning; or, after
// WakeOnlyAnnounced, only while the client's count of sleepers (a word it writes, in its
// submit ring) is not 0: a wake with nobody asleep is a system call (~0.5 µs) on the
// session's executor at every completion.
//
// The daemon only writes the page, never reads what a client may have written to it (the
// count of sleepers it reads lives in the client's ring, whose every value is harmless). The
// client gets a read-only fd (F_SEAL_FUTURE_WRITE where the kernel has it: no writable
// mapping can be made from any fd), sealed against shrinking, so nothing a client does
// with it can fault the daemon.
//
// Thread-safety: Post from one thread at a time (the session's executor); fd() anywhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "ferry/status.h"

namespace ferry::transport {

class CompletionBoard {
 public:
  static constexpr uint64_t kBytes = 4096;

  static Result<std::unique_ptr<CompletionBoard>> Create();
  ~CompletionBoard();
  CompletionBoard(const CompletionBoard&) = delete;
  CompletionBoard& operator=(const CompletionBoard&) = delete;

  /// Submit `submit_id` was delivered, `ok` or not. Ids must increase across calls (until
  /// Reset).
  void Post(uint64_t submit_id, bool ok);
  /// Back to nothing completed, for the next session of a kept stream (its ids start at 1
  /// again). Only between sessions: no submit of either is being posted or waited on.
  void Reset();
  /// Wake the futex after a post only while `*sleepers` is not 0 (null: after every post).
  /// The client raises it before it sleeps and lowers it after (a sequentially consistent
  /// read-modify-write); Post stores completed_through and then reads it, both sequentially
  /// consistent, so a client either sees the post before it sleeps or is woken. A client
  /// that writes anything else there only delays its own wake-ups. From Post's thread.
  void WakeOnlyAnnounced(std::shared_ptr<const std::atomic<uint32_t>> sleepers) {
    sleepers_ = std::move(sleepers);
  }

  /// A read-only fd of the page, for handing to the client (owned by the board).
  int fd() const { return read_only_fd_; }

 private:
  CompletionBoard() = default;

  std::atomic<uint64_t>* completed_through_ = nullptr;
  std::atomic<uint64_t>* last_failed_ = nullptr;
  std::shared_ptr<const std::atomic<uint32_t>> sleepers_;
  void* page_ = nullptr;
  int read_only_fd_ = -1;
};

}  // namespace ferry::transport
