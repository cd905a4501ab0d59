// ferry.v1.Admin: daemon status, the open sessions, drain. Read-only except Drain.
//
// Access: Status is open to every caller that reached the daemon (health checks need it).
// ListSessions shows an admin (AdminPolicy: root, the daemon's uid, admin-group) every
// session, any other local caller its own uid's sessions only, a remote caller none. Drain
// is for local admins only (PERMISSION_DENIED otherwise). Handlers run on gRPC threads and
// may look up the caller's groups in the user database.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <mutex>

#include "ferry/mutex.h"
#include "ferry/v1/admin.grpc.pb.h"
#include "rpc/session_service.h"

namespace ferry::rpc {

class AdminService final : public v1::Admin::CallbackService {
 public:
  /// `tcp`: this instance serves the TCP endpoints (see SessionService).
  AdminService(SessionServiceContext* context, std::chrono::steady_clock::time_point started_at,
               bool tcp)
      : context_(context), started_at_(started_at), tcp_(tcp) {}

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const v1::StatusRequest* request,
                                   v1::StatusReply* reply) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsReply* reply) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const v1::DrainRequest* request,
                                  v1::DrainReply* reply) override;

  void SetDrainHandler(std::function<void()> fn) {
    MutexLock lock(&mu_);
    drain_handler_ = std::move(fn);
  }

 private:
  SessionServiceContext* context_;
  std::chrono::steady_clock::time_point started_at_;
  const bool tcp_;
  Mutex mu_;
  std::function<void()> drain_handler_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::rpc
