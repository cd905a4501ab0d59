// CompletionBoard: the client's read-only view of the session's completion board
// (docs/protocol.md, "Completion board"): [0] completed_through, [1] last_failed, posted by
// the daemon. Internal to libferry.
//
// Thread-safety: CompletedThrough is lock-free and may run on any thread (a waiter
// reads while the reader thread applies messages); the board is unmapped at destruction,
// once no waiter is left to read it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ferry::internal {

class CompletionBoard {
 public:
  /// Take over `map` (`bytes` long, at least 16, mapped read-only).
  CompletionBoard(void* map, uint64_t bytes)
      : map_(map), bytes_(bytes), board_(static_cast<const std::atomic<uint64_t>*>(map)) {}
  ~CompletionBoard();
  CompletionBoard(const CompletionBoard&) = delete;
  CompletionBoard& operator=(const CompletionBoard&) = delete;

  /// completed_through: every submit up to it has completed. With `last_failed`, also the
  /// highest submit that failed, read after it: every failure up to the returned value is at
  /// most that one. Lock-free.
  uint64_t CompletedThrough(uint64_t* last_failed = nullptr) const {
    // The daemon writes last_failed before completed_through (release).
    const uint64_t completed = board_[0].load(std::memory_order_acquire);
    if (last_failed) *last_failed = board_[1].load(std::memory_order_relaxed);
    return completed;
  }

  /// Sleep on the board's futex while completed_through's low word still equals `through`
  /// (the daemon wakes it at every post), for at most `timeout` (under a second).
  void Sleep(uint64_t through, std::chrono::nanoseconds timeout) const;

 private:
  void* map_;
  uint64_t bytes_;
  const std::atomic<uint64_t>* board_;
};

}  // namespace ferry::internal
