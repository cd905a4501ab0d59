// SessionChannels: one local session's shared memory, as the slab socket hands it to the
// client: its slab set (pool/, memory and its ranges in use), its completion board and its
// submit ring.
//
// Filled before it is shared with the slab broker (SlabBroker::IssueToken), read-only after;
// the slab set is thread-safe on its own. Held by the session's stream (rpc::StreamChannels)
// and, through SlabsOf, by the session: the broker serves it while either holds it.
#pragma once

#include <memory>

#include "pool/session_slabs.h"
#include "transport/completion_board.h"
#include "transport/submit_ring.h"

namespace ferry::transport {

struct SessionChannels {
  std::shared_ptr<pool::SessionSlabs> slabs;  // never null
  std::shared_ptr<CompletionBoard> board;     // null: the session has none
  std::shared_ptr<SubmitRing> ring;           // likewise (the ring poller holds it too)

  /// The slab set of `channels`, as a pointer that keeps `channels` alive too: what the
  /// session holds, so that its channels live as long as it does, not only as its stream.
  static std::shared_ptr<pool::SessionSlabs> SlabsOf(
      const std::shared_ptr<SessionChannels>& channels) {
    return std::shared_ptr<pool::SessionSlabs>(channels, channels->slabs.get());
  }
};

}  // namespace ferry::transport
