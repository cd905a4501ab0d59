// How far a session stream has ended (SessionConnection, rpc/session_service.cc): kOpen;
// kFinishing once an end is asked for (its status is the first one asked for; nothing more
// is taken from the stream or the ring; the outbox drains); kFinished once the outbox has
// drained and gRPC's Finish was called, exactly once.
#pragma once

#include <cstdint>

namespace ferry::rpc {

enum class StreamEnd : uint8_t { kOpen, kFinishing, kFinished };

enum class StreamEndEvent : uint8_t {
  kFinishAsked,  // FinishWith: an error, Close answered, the client gone, a drain
  kDrained,      // no write in flight, the outbox empty: Finish may be called
};

/// The state `event` leads to from `state`; an event that does not apply keeps the state (a
/// second FinishWith, a drain before any end was asked for).
constexpr StreamEnd NextStreamEnd(StreamEnd state, StreamEndEvent event) {
  switch (event) {
    case StreamEndEvent::kFinishAsked:
      return state == StreamEnd::kOpen ? StreamEnd::kFinishing : state;
    case StreamEndEvent::kDrained:
      return state == StreamEnd::kFinishing ? StreamEnd::kFinished : state;
  }
  return state;
}

}  // namespace ferry::rpc
