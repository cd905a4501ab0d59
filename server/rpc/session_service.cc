#include "rpc/session_service.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <string_view>
#include <utility>

#include "rpc/message_intake.h"
#include "rpc/session_connection.h"

namespace ferry::rpc {
namespace {

// The stream's messages are read as bytes: the connection scans and bounds each before it is
// parsed (rpc/message_intake.h); its answers are written as messages.
using Reactor = SessionReactorBase;

class SessionReactor final : public Reactor {
 public:
  SessionReactor(SessionServiceContext* context, session::PeerIdentity peer,
                 SessionlessStreams::Ticket sessionless, grpc::CallbackServerContext* call)
      : connection_(std::make_shared<SessionConnection>(context, this, std::move(peer),
                                                        std::move(sessionless), call)) {
    // Start only registers the stream and starts its first read: on this gRPC thread.
    RunOrPost([](SessionConnection& c) { c.Start(); });
  }

  void OnReadDone(bool ok) override {
    std::shared_ptr<IncomingMessage> message;
    if (ok) {
      // Scanned, bounded and only then parsed (rpc/message_intake.h).
      grpc::ByteBuffer* bytes = connection_->read_buffer();
      message = TakeClientMessage(*bytes, connection_->intake_bounds());
      bytes->Clear();
      ++connection_->context()->gauges.messages_in_hand;  // until HandleRead has handled it
    }
    const v1::ClientMessage* m = message ? message->message : nullptr;
    // An Open is handled here too while the device serves (it then waits for nothing): the
    // hand-off to an io thread was a quarter of an open's time. So is the end of a stream
    // the intake refused (it only queues the answer).
    const bool quick =
        message && (!m || IsQuick(*message) ||
                    (m->has_open() && connection_->context()->parts.device->serving()));
    const bool long_submit = m && m->has_submit() && message->refusal.ok() &&
                             message->scan.ops > session::Session::kLongSubmitOps;
    auto handle = [message = std::move(message)](SessionConnection& c) mutable {
      c.HandleRead(std::move(message));
    };
    if (quick) {
      RunOrPost(std::move(handle));  // on this gRPC thread when the session is idle
    } else if (long_submit && connection_->executor().has_long_lane()) {
      // Its conversion and admission are not cut into slices: on the long lane (its enqueue
      // goes on in slices on the shared one, Session::StartLane).
      connection_->context()->parts.registry->CountLongLaneTurn();
      Post(std::move(handle), "stream message (long lane)", session::SerialExecutor::Lane::kLong);
    } else {
      Post(std::move(handle), "stream message");
    }
  }
  void OnWriteDone(bool ok) override {
    RunOrPost([ok](SessionConnection& c) { c.HandleWriteDone(ok); });
  }
  void OnCancel() override {
    Post([](SessionConnection& c) { c.HandleCancel(); }, "stream cancel");
  }
  void OnDone() override {
    connection_->ForgetCall();
    Post([](SessionConnection& c) { c.HandleDone(); }, "stream done");
    delete this;
  }

 private:
  template <typename F>
  void Post(F&& f, const char* name,
            session::SerialExecutor::Lane lane = session::SerialExecutor::Lane::kShared) {
    connection_->executor().Post([c = connection_, f = std::forward<F>(f)]() mutable { f(*c); },
                                 name, lane);
  }
  template <typename F>
  void RunOrPost(F&& f) {
    // gRPC's threads are many and this one would otherwise go back to waiting: it also runs
    // what queued behind `f` (a completion arriving while a submit's handler finishes).
    connection_->executor().RunOrPost(
        [c = connection_, f = std::forward<F>(f)]() mutable { f(*c); },
        session::SerialExecutor::Followers::kRunHere);
  }

  std::shared_ptr<SessionConnection> connection_;
};

}  // namespace

namespace {

// Who is calling: a local peer by its connection's SO_PEERCRED (LocalConnections), a TCP peer
// as remote, and, where it sent a named tenant's token, as that tenant (its own limits).
session::PeerIdentity PeerOf(SessionServiceContext* context, bool tcp,
                             const grpc::ServerContextBase& call) {
  session::PeerIdentity peer = !tcp && context->parts.local_connections
                                   ? context->parts.local_connections->Identify(call.peer())
                                   : session::PeerIdentity{call.peer()};
  peer.tcp = tcp;
  if (tcp && context->access.token) peer.tenant = context->access.token->TenantOf(call);
  return peer;
}

class SessionlessCallInterceptor final : public grpc::experimental::Interceptor {
 public:
  SessionlessCallInterceptor(SessionServiceContext* context, bool tcp,
                             grpc::experimental::ServerRpcInfo* info)
      : context_(context), tcp_(tcp), info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      TakePlace();
    }
    methods->Proceed();
  }

 private:
  void TakePlace() {
    if (info_->type() == grpc::experimental::ServerRpcInfo::Type::UNARY) return;
    if (std::string_view(info_->method()) == "/ferry.v1.SessionService/Session") return;
    SessionlessStreams* streams = context_->parts.sessionless_streams;
    grpc::ServerContextBase* call = info_->server_context();
    if (!streams || !call) return;
    const session::PeerIdentity peer = PeerOf(context_, tcp_, *call);
    auto admitted = streams->Admit(session::IdentityOf(peer));
    if (!admitted.ok()) {
      spdlog::debug("{} from {} refused: {}", info_->method(), peer.address,
                    admitted.status().message());
      grpc_call_cancel_with_status(call->c_call(), GRPC_STATUS_RESOURCE_EXHAUSTED,
                                   admitted.status().message().c_str(), nullptr);
      return;
    }
    place_ = std::move(*admitted);
  }

  SessionServiceContext* context_;
  const bool tcp_;
  grpc::experimental::ServerRpcInfo* info_;
  SessionlessStreams::Ticket place_;  // given back when the call ends (and this with it)
};

class SessionlessCallInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  SessionlessCallInterceptorFactory(SessionServiceContext* context, bool tcp)
      : context_(context), tcp_(tcp) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new SessionlessCallInterceptor(context_, tcp_, info);
  }

 private:
  SessionServiceContext* context_;
  const bool tcp_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeSessionlessCallsInterceptorFactory(SessionServiceContext* context, bool tcp) {
  return std::make_unique<SessionlessCallInterceptorFactory>(context, tcp);
}

void BroadcastDraining(SessionServiceContext* context, uint64_t grace_ms) {
  std::vector<std::shared_ptr<DrainListener>> streams;
  {
    MutexLock lock(&context->gauges.streams_mu);
    for (auto& [key, weak] : context->gauges.streams) {
      if (auto s = weak.lock()) streams.push_back(std::move(s));
    }
  }
  for (auto& s : streams) s->NotifyDraining(grace_ms);
}

// Ends a stream the daemon will not serve (a TCP peer without the bearer token, a stream
// past the sessionless streams' limits).
//
// gRPC keeps a call the daemon has finished until the client closes its side too: 10,000
// refused streams whose client kept them unread held 140 MiB of ferryd's memory (measured).
// So a refusal either holds a ticket (`held`, given back when gRPC is done with the call)
// and tells the client `status`, or, where there is no ticket to hold, is also cancelled at
// once: the client then sees CANCELLED instead of `status` (libferry's open_session retries
// either), and the call is gone as soon as gRPC has sent its reset.
class RejectedReactor final : public Reactor {
 public:
  RejectedReactor(const grpc::Status& status, SessionlessStreams::Ticket held)
      : held_(std::move(held)) {
    Finish(status);
  }
  RejectedReactor(const grpc::Status& status, grpc::CallbackServerContext* call) {
    Finish(status);
    call->TryCancel();
  }
  void OnDone() override {
    held_.Release();
    delete this;
  }

 private:
  SessionlessStreams::Ticket held_;
};

SessionService::SessionService(SessionServiceContext* context, bool tcp)
    : context_(context), tcp_(tcp) {
  MarkMethodRawCallback(
      0, new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, v1::ServerMessage>(
             [this](grpc::CallbackServerContext* call) { return Session(call); }));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, v1::ServerMessage>* SessionService::Session(
    grpc::CallbackServerContext* context) {
  if (Status s = CheckToken(context_->access.token, *context, tcp_); !s.ok()) {
    const grpc::Status status(static_cast<grpc::StatusCode>(s.code()), s.message());
    // A few such streams are told why; past them (a flood) they are reset.
    if (SessionlessStreams* rejected = context_->parts.unauthenticated_streams) {
      if (auto held = rejected->Admit("unauthenticated"); held.ok()) {
        return new RejectedReactor(status, std::move(*held));
      }
    }
    return new RejectedReactor(status, context);
  }
  session::PeerIdentity peer = PeerOf(context_, tcp_, *context);
  SessionlessStreams::Ticket sessionless;
  if (SessionlessStreams* streams = context_->parts.sessionless_streams) {
    auto admitted = streams->Admit(session::IdentityOf(peer));
    if (!admitted.ok()) {
      spdlog::debug("stream from {} refused: {}", peer.address, admitted.status().message());
      return new RejectedReactor(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, admitted.status().message()), context);
    }
    sessionless = std::move(*admitted);
  }
  return new SessionReactor(context_, std::move(peer), std::move(sessionless), context);
}

}  // namespace ferry::rpc
