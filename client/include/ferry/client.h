// libferry: connect to a ferry daemon and open sessions on its GPU.
//
//   auto client = ferry::Client::connect("unix:/run/ferry/ferryd-0.sock");
//   auto session = client->open_session();
//   ferry::Tensor x = session->create_tensor<float>({1024});
//   ...
//
// A Client is cheap to copy and thread-safe: it holds one connection (a gRPC channel) that
// every session opened from it shares. Sessions themselves have one owner each.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <type_traits>

#include "ferry/session.h"
#include "ferry/status.h"

namespace ferry {

namespace internal {
class ClientState;
}  // namespace internal

struct ClientOptions {
  /// Shown in the daemon's logs and `ferryctl sessions`.
  std::string client_name = "libferry";
  /// How long connect() waits for the daemon to answer.
  std::chrono::milliseconds connect_timeout{5000};
  // Remote access (tcp: targets only; unix: targets ignore these). Each PEM field takes a
  // file path or the PEM text itself.
  /// CA that signed the daemon's certificate; set: speak TLS to the daemon.
  std::string tls_ca_cert;
  /// Client certificate and key, for a daemon that requires mutual TLS.
  std::string tls_client_cert;
  std::string tls_client_key;
  /// Sent as "authorization: Bearer <token>" on every call when not empty.
  std::string bearer_token;
  /// How long a waiting call (synchronize(), a blocking transfer, PendingTransfer::wait())
  /// polls for the daemon's answer before it sleeps. Polling saves the wake-up of a sleeping
  /// thread (10–20 µs) on answers that come quickly, at the price of one busy core while it
  /// lasts; 0 sleeps at once.
  std::chrono::microseconds wait_spin{200};
};

class Client {
 public:
  /// Connect to a daemon at `target`: "unix:PATH" or "tcp:HOST:PORT". UNAVAILABLE when it
  /// does not answer within options.connect_timeout.
  static Result<Client> connect(const std::string& target, const ClientOptions& options = {});

  /// Open a session. While the daemon is restarting or rebuilding its device after a fault,
  /// retries for up to options.connect_timeout. UNAVAILABLE when the daemon is gone or
  /// draining, QUOTA_EXCEEDED when it holds its maximum number of sessions.
  Result<Session> open_session(const SessionOptions& options = {});

  /// Open a session, run fn(session), close it; return fn's failure, else close()'s.
  /// fn returns a Status (or void).
  template <typename Fn>
  Status with_session(Fn&& fn, const SessionOptions& options = {}) {
    auto session = open_session(options);
    if (!session.ok()) return session.status();
    Status body;
    if constexpr (std::is_void_v<std::invoke_result_t<Fn, Session&>>) {
      fn(*session);
    } else {
      body = fn(*session);
    }
    auto closed = session->close();
    if (!body.ok()) return body;
    return closed.status();
  }

  const std::string& target() const;

 private:
  explicit Client(std::shared_ptr<internal::ClientState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::ClientState> state_;
};

}  // namespace ferry
