// grpc.health.v1.Health for ferryd, through gRPC's built-in health-check service: the
// overall status ("") and ferry.v1.SessionService follow whether the daemon accepts new
// sessions (NOT_SERVING while draining or after the device is lost); ferry.v1.Admin stays
// SERVING while the server runs, so operators can still ask a draining daemon what it does.
#pragma once

#include <string>

namespace grpc {
class Server;
}

namespace ferry::rpc {

/// Service names reported by the health service (besides "", the whole server).
inline constexpr const char* kSessionServiceName = "ferry.v1.SessionService";
inline constexpr const char* kAdminServiceName = "ferry.v1.Admin";

/// Turn on gRPC's built-in grpc.health.v1.Health service for every gRPC server built after
/// this call (a process-wide gRPC switch), and make sure grpc.health.v1's descriptor is in
/// the generated pool, so that server reflection describes the service (a reflection-driven
/// health check resolves it). Call before ServerBuilder::BuildAndStart, from one thread: gRPC
/// does not make the switch thread-safe.
void EnableHealthService();

/// Report whether `server` accepts new sessions: sets "" and ferry.v1.SessionService to
/// SERVING or NOT_SERVING, and ferry.v1.Admin to SERVING. Thread-safe (gRPC serializes
/// status changes); a no-op when the server has no health service.
void SetAcceptingSessions(grpc::Server* server, bool accepting);

/// Report every service NOT_SERVING and freeze the statuses (server shutting down). Watchers
/// are told before the server stops. Idempotent.
void ShutdownHealth(grpc::Server* server);

}  // namespace ferry::rpc
