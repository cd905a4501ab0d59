// StreamChannels: a local session stream's shared memory (docs/protocol.md, "Slab socket",
// "Kept streams", "Kept slabs"): its session's slab set with the completion board and the
// submit ring, the one-time token that binds a slab-socket connection to that set, and what a
// kept stream carries from one session to the next (the board, reset; the ring, still
// registered with the poller; the slabs the last session asked to keep).
//
// Thread-safety: none; the connection's executor owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/v1/session.pb.h"
#include "pool/session_slabs.h"
#include "rpc/ring_intake.h"
#include "session/session.h"
#include "transport/completion_board.h"
#include "transport/session_channels.h"
#include "transport/submit_ring.h"

namespace ferry::rpc {

struct SessionServiceContext;

class StreamChannels {
 public:
  /// `uid`: the local peer's, whom the slab token binds.
  StreamChannels(SessionServiceContext* context, uint32_t uid) : context_(context), uid_(uid) {}
  ~StreamChannels() { Release(); }
  StreamChannels(const StreamChannels&) = delete;
  StreamChannels& operator=(const StreamChannels&) = delete;

  /// The slabs the last session on a kept stream kept for the next one, taken at an Open:
  /// what the Open does not adopt goes back to the pool when this goes, whatever happens.
  struct LastSlabs {
    std::shared_ptr<pool::SessionSlabs> slabs;
    LastSlabs() = default;
    LastSlabs(LastSlabs&&) = default;
    LastSlabs& operator=(LastSlabs&&) = delete;
    ~LastSlabs() {
      if (slabs) slabs->ReleaseKept();
    }
  };
  LastSlabs TakeLastSlabs() {
    LastSlabs last;
    last.slabs = std::move(last_slabs_);
    return last;
  }

  /// Give `session` (local, of a daemon with a slab pool) its shared memory and fill the
  /// Opened's fields for it: a slab set with the board and ring a kept stream carries, else a
  /// new board and ring (ring registered with the poller through `ring` and `handler`), the
  /// slabs `last` holds, and a slab token. `successes_on_board` is what the Open asked for, and
  /// holds only where the session has a board. UNAVAILABLE when no token can be issued.
  Status Open(const v1::Open& open, session::Session& session, LastSlabs& last, RingIntake& ring,
              const transport::RingPoller::Handler& handler, v1::Opened* opened,
              bool* successes_on_board);
  /// Close.keep_slabs: the slabs the client asks to keep for its next session.
  void KeepAtClose(const std::vector<uint64_t>& ids) {
    if (channels_) channels_->slabs->KeepAtClose(ids);
  }
  /// The session closed and its stream is kept: its board (reset) and ring (backlog dropped)
  /// go to the next session where it had both, its slab set with the slabs it kept; the
  /// token is revoked. A ring without a board is dropped.
  void KeepForNext(RingIntake& ring);
  /// The session closed and no session follows on the stream: the slabs it kept go back.
  void ReleaseKept() {
    if (channels_) channels_->slabs->ReleaseKept();
  }
  /// The stream is done: the token is revoked and every slab kept goes back.
  void Release();
  /// The session's completion board (null: none).
  transport::CompletionBoard* board() const { return channels_ ? channels_->board.get() : nullptr; }

 private:
  // A new board and ring (made ahead by ChannelStock, or now), put in `channels` and
  // announced in `opened`.
  void OpenNew(const v1::Open& open, uint64_t session_id, transport::SessionChannels& channels,
               RingIntake& ring, const transport::RingPoller::Handler& handler, v1::Opened* opened,
               bool* successes_on_board);

  SessionServiceContext* const context_;
  const uint32_t uid_;
  std::shared_ptr<transport::SessionChannels> channels_;  // the session's
  std::string slab_token_;                                // issued at Open; revoked at its end
  // On a kept stream between sessions: the last session's slab set (holding the slabs it
  // kept, with the rest of its channels), its board and its ring.
  std::shared_ptr<pool::SessionSlabs> last_slabs_;
  std::shared_ptr<transport::CompletionBoard> kept_board_;
  std::shared_ptr<transport::SubmitRing> kept_ring_;
};

}  // namespace ferry::rpc
