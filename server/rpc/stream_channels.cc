#include "rpc/stream_channels.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <utility>

#include "rpc/session_context.h"

namespace ferry::rpc {

Status StreamChannels::Open(const v1::Open& open, session::Session& session, LastSlabs& last,
                            RingIntake& ring, const transport::RingPoller::Handler& handler,
                            v1::Opened* opened, bool* successes_on_board) {
  auto channels = std::make_shared<transport::SessionChannels>();
  channels->slabs = std::make_shared<pool::SessionSlabs>(context_->parts.slab_pool,
                                                         context_->limits.session_pinned_quota);
  pool::SessionSlabs& slabs = *channels->slabs;
  slabs.SetCharge(context_->parts.registry->AccountOf(session.id()));  // the uid's pinned limit
  channels_ = channels;
  *successes_on_board = false;
  if (kept_board_ && kept_ring_ && ring.attached()) {
    // A kept stream: the last session's board (reset) and ring, which the client has mapped;
    // the ring's registration with the poller is the same.
    channels->board = std::move(kept_board_);
    channels->ring = std::move(kept_ring_);
    opened->set_completion_board(true);
    *successes_on_board = open.successes_on_board();
    opened->set_submit_ring(true);
    opened->set_channels_kept(true);
  } else {
    ring.Drop();  // a kept ring without its board (none is kept apart)
    kept_board_.reset();
    kept_ring_.reset();
    OpenNew(open, session.id(), *channels, ring, handler, opened, successes_on_board);
  }
  opened->set_successes_on_board(*successes_on_board);
  if (const auto& board = channels->board) {
    // Where the client announces its sleeps on the board in its ring, the board wakes its
    // futex only then (on a kept stream, as this session's Open asks).
    const auto& shared_ring = channels->ring;
    board->WakeOnlyAnnounced(open.board_sleeps_announced() && shared_ring
                                 ? std::shared_ptr<const std::atomic<uint32_t>>(
                                       shared_ring, shared_ring->board_sleepers())
                                 : nullptr);
  }
  if (last.slabs) {
    // The slabs the last session on this stream kept for this one (docs/protocol.md, "Kept
    // slabs"): the same client, which has them mapped.
    for (uint64_t id : slabs.AdoptKept(*last.slabs)) {
      opened->add_kept_slabs(id);
      ++context_->gauges.slabs_kept_total;
    }
  }
  session.AttachSlabs(transport::SessionChannels::SlabsOf(channels));
  auto token = context_->parts.slab_broker->IssueToken(channels, uid_);
  if (!token.ok()) {
    spdlog::error("session {}: {}", session.id(), token.status().message());
    return Status(ErrorKind::kUnavailable, token.status().message());
  }
  slab_token_ = std::move(*token);
  opened->set_slab_socket(context_->parts.slab_broker->path());
  opened->set_slab_token(slab_token_);
  opened->set_slab_size(context_->parts.slab_pool->slab_size());
  return Status::Ok();
}

void StreamChannels::OpenNew(const v1::Open& open, uint64_t session_id,
                             transport::SessionChannels& channels, RingIntake& ring,
                             const transport::RingPoller::Handler& handler, v1::Opened* opened,
                             bool* successes_on_board) {
  transport::ChannelStock::Channels made =
      context_->parts.channel_stock
          ? context_->parts.channel_stock->Take()
          : transport::ChannelStock::Make(context_->limits.submit_ring_bytes);
  // A completion board, where the client sees its submits complete without waiting for
  // Completed (a session without one still works; only its waits are slower).
  if (auto& board = made.board; board.ok()) {
    channels.board = std::move(*board);
    opened->set_completion_board(true);
    *successes_on_board = open.successes_on_board();
  } else {
    spdlog::warn("session {}: no completion board: {}", session_id, board.status().message());
  }
  // And a submit ring, through which the client may send its messages without gRPC.
  if (context_->parts.ring_poller && context_->limits.submit_ring_bytes > 0) {
    if (auto& made_ring = made.ring; made_ring.ok()) {
      std::shared_ptr<transport::SubmitRing> shared = std::move(*made_ring);
      channels.ring = shared;
      ring.Attach(context_->parts.ring_poller->Add(std::move(shared), handler));
      opened->set_submit_ring(true);
    } else {
      spdlog::warn("session {}: no submit ring: {}", session_id, made_ring.status().message());
    }
  }
}

void StreamChannels::KeepForNext(RingIntake& ring) {
  // The board (reset to nothing completed) and the ring go to the next session: the client
  // keeps them mapped, and the ring stays registered with the poller (not armed until the
  // next Open). What the poller took after the Close is dropped.
  if (channels_ && channels_->board && channels_->ring && ring.attached()) {
    kept_board_ = channels_->board;
    kept_ring_ = channels_->ring;
    kept_board_->Reset();
    ring.ClearBacklog();
  } else {
    ring.Drop();
  }
  // With the slabs it kept for the next session (and its channels, as its slab set kept them).
  last_slabs_ = channels_ ? transport::SessionChannels::SlabsOf(channels_) : nullptr;
  channels_.reset();
  if (!slab_token_.empty()) {  // never used, or spent: either way no longer good
    context_->parts.slab_broker->RevokeToken(slab_token_);
    slab_token_.clear();
  }
}

void StreamChannels::Release() {
  if (!slab_token_.empty()) context_->parts.slab_broker->RevokeToken(slab_token_);
  slab_token_.clear();
  // Kept slabs (docs/protocol.md, "Kept slabs") go back with the stream.
  if (channels_) channels_->slabs->ReleaseKept();
  if (last_slabs_) last_slabs_->ReleaseKept();
  last_slabs_.reset();
}

}  // namespace ferry::rpc
