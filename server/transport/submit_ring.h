// SubmitRing: shared memory through which a local client sends its session's messages to the
// daemon without gRPC (docs/protocol.md, "Submit ring"). The client writes serialized
// ClientMessages into it; the daemon's RingPoller takes them out.
//
// Why: a gRPC message from a client to the daemon on the same machine costs a write, a
// socket hop, the daemon's HTTP/2 read and a thread wake-up (20–40 µs on a VM). A transfer of
// 8 MiB at a time pays it once per transfer (docs/performance.md); through the ring, with the
// poller awake, it costs a copy of a few hundred bytes.
//
// Layout of the memfd (kHeaderBytes + capacity bytes, all integers little-endian):
//   [0]    u64 head    the client: bytes written so far; stored (release) after the record
//   [64]   u64 tail    the daemon: bytes taken so far; the client may reuse what is below
//   [128]  u32 asleep  the daemon: 1 while the poller may sleep; the client then writes its
//                      doorbell (sends 8 bytes on its socket) after it stores head
//   [192]  u32 board_sleepers  the client: how many of its threads are (about to be) asleep
//                      on the session's completion board (CompletionBoard::WakeOnlyAnnounced)
//   [4096] data, `capacity` bytes (a power of two)
// A record starts at an 8-aligned position p = (bytes so far) mod capacity: u32 length, u32 0,
// then `length` bytes of one serialized ClientMessage; the next starts at the next multiple
// of 8. A record never wraps: when it does not fit before the end, the client writes the
// length 0xFFFFFFFF at p (skip to the start) and the record at 0.
//
// The client can write anything, at any time, into the whole mapping. The daemon keeps its
// own tail (it only publishes it), reads head once per Take, checks it and every length, and
// copies a record's bytes out before anything parses them: nothing the client writes makes
// the daemon read outside the mapping or parse bytes that change under it. A ring that breaks
// a rule is broken for good (Take says why; the session ends with PROTOCOL_VIOLATION).
//
// The doorbell is an eventfd that the daemon never reads: the ring poller watches it
// edge-triggered (EPOLLET), so each client write wakes it once, and the counter is left to
// grow. The client gets the same open file (SCM_RIGHTS), so whatever it does with it (clears
// O_NONBLOCK, reads it, writes it full) changes only what its own reads and writes do: the
// daemon makes no call on it but epoll_ctl. And an eventfd carries no descriptors. (It was a
// Unix socket pair from 2026-12-04, and before that an eventfd the poller read. A socket
// took descriptors with its bytes, SCM_RIGHTS, and the poller's recv, with no room for them,
// made the kernel close them on the poller's thread: a client that passed a TCP socket with
// unsent bytes and SO_LINGER held that thread, every session's ring with it, for as long as
// it asked. A read of an eventfd blocks once a client clears the O_NONBLOCK they share.)
// The client rings by writing u64 1: an eventfd raises no SIGPIPE when the daemon is gone.
//
// Thread-safety: Take and SetAsleep from one thread at a time (the poller's);
// HasRecord and the fds anywhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "ferry/status.h"

namespace ferry::transport {

class SubmitRing {
 public:
  static constexpr uint64_t kHeaderBytes = 4096;
  static constexpr uint64_t kHeadOffset = 0;
  static constexpr uint64_t kTailOffset = 64;
  static constexpr uint64_t kAsleepOffset = 128;
  static constexpr uint64_t kBoardSleepersOffset = 192;
  static constexpr uint32_t kSkipToStart = 0xFFFFFFFFu;
  static constexpr uint64_t kMinCapacity = 4096;
  static constexpr uint64_t kMaxCapacity = 16ull << 20;

  /// A ring of `capacity` data bytes: a power of two in [kMinCapacity, kMaxCapacity].
  static Result<std::unique_ptr<SubmitRing>> Create(uint64_t capacity);
  ~SubmitRing();
  SubmitRing(const SubmitRing&) = delete;
  SubmitRing& operator=(const SubmitRing&) = delete;

  enum class Took { kEmpty, kRecord, kBroken };
  /// Take the next record into `*record` (kRecord); kEmpty when the client has written
  /// nothing more; kBroken (and `*why`) when what it wrote breaks the layout's rules, now or
  /// before.
  Took Take(std::string* record, std::string* why);
  /// True when the client has written past what was taken and the ring is not broken (one
  /// load; no checks). Any thread.
  bool HasRecord() const;
  /// Tell the client whether to ring the doorbell after a write.
  void SetAsleep(bool asleep);
  /// The client's count of its threads asleep on the completion board (any value: the
  /// client writes it). Any thread; valid while the ring lives.
  const std::atomic<uint32_t>* board_sleepers() const { return board_sleepers_; }

  uint64_t capacity() const { return capacity_; }
  uint64_t map_bytes() const { return kHeaderBytes + capacity_; }
  /// The memfd (read-write, sealed against resizing) and the doorbell, for handing to the
  /// client; owned by the ring.
  int memfd() const { return memfd_; }
  int doorbell_for_client() const { return doorbell_; }
  /// The same eventfd, for the poller's epoll set: watch it with EPOLLET and never read it
  /// (above).
  int doorbell_to_watch() const { return doorbell_; }

 private:
  SubmitRing() = default;

  char* map_ = nullptr;
  uint64_t capacity_ = 0;
  int memfd_ = -1;
  int doorbell_ = -1;
  std::atomic<uint64_t>* head_ = nullptr;
  std::atomic<uint64_t>* tail_word_ = nullptr;
  std::atomic<uint32_t>* asleep_ = nullptr;
  std::atomic<uint32_t>* board_sleepers_ = nullptr;
  // The daemon's own tail (what the client writes at kTailOffset is ignored): written by the
  // poller thread, read by HasRecord on any.
  std::atomic<uint64_t> tail_{0};
  std::string broken_;                  // poller thread only
  std::atomic<bool> is_broken_{false};  // set with broken_
};

}  // namespace ferry::transport
