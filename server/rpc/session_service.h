// The gRPC session stream: one ServerBidiReactor per session, speaking ferry.v1.Session.
//
// Threading: all connection and session state is touched on the connection's serial
// executor (session::SerialExecutor), shared with its session. A reaction hands its work to
// it, running it on the gRPC thread itself when the executor is idle and the work is short
// (a small submit, a Synchronize, a write done), else posting it to the executor's threads. One
// write in flight at a time; reads (of the stream and of the submit ring) stop while the
// session's in-flight limits are reached or its outbox is full (backpressure on the client):
// docs/protocol.md, "Backpressure".
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "ferry/v1/session.grpc.pb.h"
#include "rpc/session_context.h"

namespace ferry::rpc {

/// Send Draining to every open session stream.
void BroadcastDraining(SessionServiceContext* context, uint64_t grace_ms);

/// The session stream's service. Its method reads the client's messages as bytes and writes
/// ServerMessages: each message is scanned and bounded before it is parsed
/// (rpc/message_intake.h), which a method that reads ClientMessages could not do (gRPC parses
/// those before the reactor sees them). The generated WithRawCallbackMethod_Session registers
/// the same handler with bytes both ways.
class SessionService final : public v1::SessionService::Service {
 public:
  /// `tcp`: this instance serves the TCP endpoints (every call needs the token, and its peer
  /// is remote); else the Unix endpoints' connections (RpcServer runs one of each).
  SessionService(SessionServiceContext* context, bool tcp);

  grpc::ServerBidiReactor<grpc::ByteBuffer, v1::ServerMessage>* Session(
      grpc::CallbackServerContext* context);

 private:
  SessionServiceContext* context_;
  const bool tcp_;
};

/// An interceptor for every call of a server (the Unix endpoints' or the TCP endpoints'):
/// a streaming call other than SessionService/Session (gRPC's Health/Watch, server reflection)
/// carries no session, so it takes a place among its identity's sessionless streams
/// (rpc/sessionless_streams.h) for as long as it lasts, or is cancelled with
/// RESOURCE_EXHAUSTED past the limits. (Session streams take theirs in the service; unary
/// calls end with their handler.) `context` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeSessionlessCallsInterceptorFactory(SessionServiceContext* context, bool tcp);

}  // namespace ferry::rpc
