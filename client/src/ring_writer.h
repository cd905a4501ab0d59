// RingWriter: the client's side of the session's submit ring (docs/protocol.md, "Submit
// ring"; the daemon's side is server/transport/submit_ring.h, which documents the layout).
// Internal to libferry. Header-only on purpose: Write is on every submit's path and stays
// inlinable into its caller.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "ferry/v1/session.pb.h"

namespace ferry::internal {

// The session's submit ring, mapped read-write (docs/protocol.md, "Submit ring"): the owner
// thread writes numbered messages into it, and the daemon's ring poller takes them, instead of
// the stream's gRPC write. Owner thread only, but AnnounceBoardSleep (any thread). Owns `map`
// (kHeaderBytes + capacity bytes, unmapped at destruction) and `doorbell` (closed).
class RingWriter {
 public:
  RingWriter(char* map, uint64_t capacity, int doorbell)
      : map_(map),
        capacity_(capacity),
        doorbell_(doorbell),
        doorbell_is_socket_(IsSocket(doorbell)) {}
  ~RingWriter() {
    ::munmap(map_, kHeaderBytes + capacity_);
    ::close(doorbell_);
  }
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  static constexpr uint64_t kHeaderBytes = 4096;

  enum class Wrote { kWritten, kFull, kTooLarge };
  /// Write `m` (its sequence set) as the next record and ring the doorbell when the daemon's
  /// poller may be asleep. kFull, writing nothing, while the daemon has not taken enough
  /// records yet (try again); kTooLarge for a message over a quarter of the ring (the stream
  /// carries it).
  Wrote Write(const v1::ClientMessage& m) {
    const uint64_t n = m.ByteSizeLong();
    if (n > capacity_ / 4) return Wrote::kTooLarge;
    const uint64_t bytes = 8 + ((n + 7) & ~uint64_t{7});
    uint64_t at = head_ & (capacity_ - 1);
    const uint64_t skip = at + bytes > capacity_ ? capacity_ - at : 0;
    const uint64_t tail = Word64(kTailOffset)->load(std::memory_order_acquire);
    if (head_ + skip + bytes - tail > capacity_) return Wrote::kFull;
    char* data = map_ + kHeaderBytes;
    if (skip) {
      const uint32_t marker = 0xFFFFFFFFu;
      std::memcpy(data + at, &marker, sizeof(marker));
      head_ += skip;
      at = 0;
    }
    const uint32_t header[2] = {static_cast<uint32_t>(n), 0};
    std::memcpy(data + at, header, sizeof(header));
    m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(data + at + 8));
    head_ += bytes;
    Word64(kHeadOffset)->store(head_, std::memory_order_release);
    // Pairs with the poller, which marks the ring asleep and then looks at head again.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (reinterpret_cast<std::atomic<uint32_t>*>(map_ + kAsleepOffset)
            ->load(std::memory_order_relaxed)) {
      const uint64_t one = 1;
      // An eventfd (write: it raises no SIGPIPE); a daemon of 2026-12-04 or 12-05 hands a
      // socket instead (send with MSG_NOSIGNAL: no SIGPIPE when that daemon is gone).
      if (doorbell_is_socket_) {
        (void)::send(doorbell_, &one, sizeof(one), MSG_NOSIGNAL | MSG_DONTWAIT);
      } else {
        (void)!::write(doorbell_, &one, sizeof(one));
      }
    }
    return Wrote::kWritten;
  }

  /// Count one more (+1) or one fewer (-1) of the client's threads asleep on the session's
  /// completion board, for the daemon, which wakes the board's futex only while some are
  /// (Open.board_sleeps_announced). Sequentially consistent: raised before the sleep's
  /// FUTEX_WAIT reads the board. Any thread, while the writer lives.
  void AnnounceBoardSleep(int delta) const {
    reinterpret_cast<std::atomic<uint32_t>*>(map_ + kBoardSleepersOffset)
        ->fetch_add(static_cast<uint32_t>(delta), std::memory_order_seq_cst);
  }

 private:
  static constexpr uint64_t kHeadOffset = 0, kTailOffset = 64, kAsleepOffset = 128,
                            kBoardSleepersOffset = 192;
  static bool IsSocket(int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
  }
  std::atomic<uint64_t>* Word64(uint64_t offset) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(map_ + offset);
  }
  char* map_;
  uint64_t capacity_;
  int doorbell_;
  bool doorbell_is_socket_;
  uint64_t head_ = 0;  // bytes written so far
};

}  // namespace ferry::internal
