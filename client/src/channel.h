// The gRPC channel to a daemon, with its TLS and bearer-token set-up: one place for libferry's
// Client and ferryctl's admin calls (admin_client.h). Internal to libferry; no gRPC type
// leaves client/src.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "ferry/client.h"

namespace ferry::internal {

inline constexpr uint64_t kMaxMessageBytes = 80ull << 20;

/// Return `target` in gRPC's syntax: "tcp:HOST:PORT" becomes "HOST:PORT"; "unix:PATH" and
/// gRPC's own schemes pass through.
std::string GrpcTarget(const std::string& target);

/// Make a channel to `target` (ferry's syntax, as Client::connect takes it) with the TLS
/// and bearer-token settings of `options` (tcp targets only), message limits of
/// kMaxMessageBytes and a quick reconnect. Does not wait for the connection.
/// INVALID_ARGUMENT when a PEM file cannot be read.
Result<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                   const ClientOptions& options);

}  // namespace ferry::internal
