// libferry's Client: connecting to a daemon and opening sessions. The rest of libferry's
// implementation, by concern: channel.cc (channel, TLS, token), admin_client.cc (ferryctl's
// Admin calls), session_state.cc (the session's stream, submits and waits), reader.cc (its
// reader thread), ring_writer.h (the submit ring), completion_board.cc (the completion
// board and its futex), slab_socket.cc and slab_arena.cc (shared memory), recording.cc (ops
// into messages), transfers.cc (pinned buffers and transfers), parallel_copy.cc (large
// copies). Proto conversions: proto/include/ferry/wire.h.
#include "ferry/client.h"

#include <chrono>
#include <thread>

#include "channel.h"
#include "session_state.h"

namespace ferry {

Result<Client> Client::connect(const std::string& target, const ClientOptions& options) {
  auto state = std::make_shared<internal::ClientState>();
  state->target = target;
  state->options = options;
  FERRY_ASSIGN_OR_RETURN(state->channel, internal::MakeChannel(target, options));
  if (!state->channel->WaitForConnected(std::chrono::system_clock::now() +
                                        options.connect_timeout)) {
    return Status(ErrorKind::kUnavailable, "no ferry daemon answers at " + target);
  }
  state->stub = v1::SessionService::NewStub(state->channel);
  return Client(std::move(state));
}

Result<Session> Client::open_session(const SessionOptions& options) {
  // A daemon that is restarting or rebuilding its device (after a device fault) answers
  // UNAVAILABLE for a moment: retry, reconnecting, for up to the connect timeout.
  auto deadline = std::chrono::system_clock::now() + state_->options.connect_timeout;
  for (;;) {
    if (state_->channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
      state_->channel->WaitForConnected(deadline);
    }
    auto state = std::make_shared<internal::SessionState>();
    Status opened = state->Open(state_, options);
    if (opened.ok()) return Session(std::move(state));
    // Open on a kept stream the daemon has ended since (a restart, a drain): again on a new
    // stream, at once.
    if (state->on_kept_stream() && std::chrono::system_clock::now() < deadline) continue;
    if (opened.kind() != ErrorKind::kUnavailable || std::chrono::system_clock::now() >= deadline) {
      return opened;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

const std::string& Client::target() const { return state_->target; }

}  // namespace ferry
