// CompletionBoard: the client's read-only view of the session's completion board
// (docs/protocol.md, "Completion board"): [0] completed_through, [1] last_failed, posted by
// the daemon. Internal to libferry.
//
// Thread-safety: Read and SaysSucceeded are lock-free and may run on any thread (a waiter
// reads while the reader thread applies messages); the board is unmapped at destruction,
// once no waiter is left to read it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ferry::internal {

// Submits [first, last], as far as the board may answer for them.
struct BoardRange {
  uint64_t first = 0, last = 0;
};

class CompletionBoard {
 public:
  /// Take over `map` (`bytes` long, at least 16, mapped read-only).
  CompletionBoard(void* map, uint64_t bytes)
      : map_(map), bytes_(bytes), board_(static_cast<const std::atomic<uint64_t>*>(map)) {}
  ~CompletionBoard();
  CompletionBoard(const CompletionBoard&) = delete;
  CompletionBoard& operator=(const CompletionBoard&) = delete;

  // What the board says of the submits of `r`: not all completed yet (`*through`, when
  // given, is the completed_through read), all completed and succeeded, or completed with a
  // failure among them or after them (its error comes only in a message). Lock-free.
  enum class Answer { kNotYet, kSucceeded, kAskTheMessages };
  Answer Read(const BoardRange& r, uint64_t* through = nullptr) const {
    // The daemon writes last_failed before completed_through (release).
    const uint64_t completed = board_[0].load(std::memory_order_acquire);
    if (through) *through = completed;
    if (completed < r.last) return Answer::kNotYet;
    return board_[1].load(std::memory_order_relaxed) < r.first ? Answer::kSucceeded
                                                               : Answer::kAskTheMessages;
  }
  bool SaysSucceeded(const BoardRange& r) const { return Read(r) == Answer::kSucceeded; }

  /// Sleep on the board's futex while completed_through's low word still equals `through`
  /// (the daemon wakes it at every post), for at most `timeout` (under a second).
  void Sleep(uint64_t through, std::chrono::nanoseconds timeout) const;

 private:
  void* map_;
  uint64_t bytes_;
  const std::atomic<uint64_t>* board_;
};

}  // namespace ferry::internal
