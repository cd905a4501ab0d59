// ChannelStock: completion boards and submit rings made ahead of the sessions that take
// them, so that a local session's open hands out a ready pair instead of making two memfds
// (with their seals, mappings and the ring's doorbell) while the client waits: ~40 µs of
// each open on the development machine, more on a VM.
//
// Every board and ring is made for one session and handed out once; nothing is reused, so
// no session ever sees what another wrote. The stock keeps at most `depth` pairs (a few
// pages of memory and four fds each); each Take that leaves it below that posts, through
// `run_later` (the daemon's io threads), the making of what is missing. A Take from an empty
// stock (a burst of opens) makes its pair itself, as before.
//
// Thread-safety: Take on any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "transport/completion_board.h"
#include "transport/submit_ring.h"

namespace ferry::transport {

class ChannelStock : public std::enable_shared_from_this<ChannelStock> {
 public:
  /// A session's pair; either may have failed (the session then works without it).
  struct Channels {
    Result<std::unique_ptr<CompletionBoard>> board;
    Result<std::unique_ptr<SubmitRing>> ring;  // an error when ring_bytes is 0
  };

  /// Rings of `ring_bytes` (0: boards only); `run_later` runs a function soon, elsewhere.
  static std::shared_ptr<ChannelStock> Create(uint64_t ring_bytes, size_t depth,
                                              std::function<void(std::function<void()>)> run_later);

  /// A fresh pair: from the stock (posting its refill), or made now when it is empty.
  Channels Take();

  /// Pairs ready now (for tests).
  size_t ready() const;

  /// A fresh pair made now (what Take makes when the stock is empty; also for a daemon
  /// without a stock).
  static Channels Make(uint64_t ring_bytes);

 private:
  ChannelStock(uint64_t ring_bytes, size_t depth,
               std::function<void(std::function<void()>)> run_later)
      : ring_bytes_(ring_bytes), depth_(depth), run_later_(std::move(run_later)) {}
  void Refill();

  const uint64_t ring_bytes_;
  const size_t depth_;
  const std::function<void(std::function<void()>)> run_later_;
  mutable Mutex mu_;
  std::deque<Channels> ready_ ABSL_GUARDED_BY(mu_);
  bool refill_posted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry::transport
