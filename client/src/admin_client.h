// AdminClient: the daemon's Admin service and grpc.health.v1, for ferryctl. Internal to
// libferry (ferryctl links libferry and includes this header); it keeps every gRPC type in
// client/src: calls answer with an RpcStatus, replies are ferry.v1 messages.
//
// Thread-safety: one thread at a time per AdminClient.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ferry/client.h"
#include "ferry/v1/admin.pb.h"

namespace ferry::internal {

/// How a call ended: gRPC's status code (0: OK; the numbers of ferry::Code) and message.
struct RpcStatus {
  int code = 0;
  std::string message;
  bool ok() const { return code == 0; }
};

class AdminClient {
 public:
  /// A client of the daemon at `target` (ferry's syntax, as Client::connect takes it), with
  /// the channel set-up of `options` (TLS, bearer token; see MakeChannel); every call has
  /// `timeout` as its deadline. Does not wait for the connection.
  static Result<std::unique_ptr<AdminClient>> Create(const std::string& target,
                                                     const ClientOptions& options,
                                                     std::chrono::milliseconds timeout);
  ~AdminClient();

  RpcStatus GetStatus(v1::StatusReply* reply);
  RpcStatus ListSessions(v1::ListSessionsReply* reply);
  RpcStatus Drain(v1::DrainReply* reply);
  /// Ask grpc.health.v1.Health/Check about `service` through a generic call (no generated
  /// code needed). Set the status number (1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN).
  RpcStatus HealthCheck(const std::string& service, int* serving_status);

 private:
  struct Impl;
  explicit AdminClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::internal
