// SlabSocket: the session's second Unix-socket connection to a local daemon, over which slab
// fds, the completion board and the submit ring travel (docs/protocol.md, "Slab socket").
// Internal to libferry.
//
// Thread-safety: none; the session's owner thread uses it (Open, Allocate, Shutdown).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "completion_board.h"
#include "ferry/status.h"
#include "ring_writer.h"
#include "slab_arena.h"

namespace ferry::internal {

class SlabSocket {
 public:
  /// A socket at `path`, presenting the session's one-time `token` when it first connects.
  SlabSocket(std::string path, std::string token)
      : path_(std::move(path)), token_(std::move(token)) {}
  ~SlabSocket() { Close(); }
  SlabSocket(const SlabSocket&) = delete;
  SlabSocket& operator=(const SlabSocket&) = delete;

  /// Close the connection (idempotent); the token is spent, so it cannot be opened again.
  void Close();

  /// Send one request (connecting and presenting the token on first use) and receive its
  /// 24-byte answer and the fd that came with it (-1: none).
  Status Request(uint32_t op, char (&reply)[24], int* fd);

  /// Ask the daemon for one more slab and map it.
  Result<std::shared_ptr<SlabMapping>> AcquireSlab();

  /// What a session maps at open: its completion board (read-only) and its submit ring
  /// (read-write, with its doorbell). Each is null where not asked for or on any error (waits
  /// then take the messages' word only, and every message goes through the stream, as with a
  /// remote daemon).
  struct SessionChannels {
    std::unique_ptr<CompletionBoard> board;
    std::unique_ptr<RingWriter> ring;
  };
  /// Connect and map what is asked for in one round trip: the hello and every request are
  /// sent together (the daemon answers requests in order, docs/protocol.md, "Slab socket").
  SessionChannels MapSessionChannels(bool board, bool ring);

 private:
  Status Error(const std::string& what);
  /// Connect and present the token unless connected; then send `requests` (whole 8-byte
  /// requests, possibly none) in the same write as the hello.
  Status SendRequests(const std::string& requests);
  /// Receive one 24-byte answer and the fd that came with it (-1: none).
  Status ReadAnswer(char (&reply)[24], int* fd);

  const std::string path_;
  const std::string token_;
  int fd_ = -1;
  bool token_used_ = false;
};

}  // namespace ferry::internal
