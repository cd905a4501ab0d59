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
  /// Map the session's submit ring (read-write) and take its doorbell; null on any error
  /// (every message then goes through the stream, unnumbered).
  std::unique_ptr<RingWriter> MapSubmitRing();
  /// Map the session's completion board (read-only); null on any error (waits then take
  /// the messages' word only, as with a remote daemon).
  std::unique_ptr<CompletionBoard> MapCompletionBoard();

 private:
  Status Error(const std::string& what);

  const std::string path_;
  const std::string token_;
  int fd_ = -1;
  bool token_used_ = false;
};

}  // namespace ferry::internal
