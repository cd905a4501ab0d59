#include "rpc/rpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>

#include "rpc/admin_service.h"
#include "rpc/health_service.h"
#include "rpc/local_connections.h"
#include "rpc/session_service.h"
#include "rpc/systemd_notify.h"

namespace ferry::rpc {
namespace {

struct TcpEndpoint {
  std::string host;
  std::string port;
};

Result<TcpEndpoint> ParseHostPort(const std::string& hp) {
  size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) {
    return Status(ErrorKind::kInvalidArgument, "expected tcp:HOST:PORT, got tcp:" + hp);
  }
  TcpEndpoint e{hp.substr(0, colon), hp.substr(colon + 1)};
  for (char c : e.port) {
    if (c < '0' || c > '9') return Status(ErrorKind::kInvalidArgument, "bad port in " + hp);
  }
  return e;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

}  // namespace

Result<std::unique_ptr<RpcServer>> RpcServer::Prepare(
    const RpcServerOptions& options, SessionServiceContext* context,
    std::chrono::steady_clock::time_point started) {
  std::unique_ptr<RpcServer> r(new RpcServer());
  r->context_ = context;
  r->listen_ = options.listen;
  r->inherited_fds_ = options.inherited_listen_fds;
  r->local_limits_ = options.local_connections;
  r->root_exempt_ = options.root_exempt;
  // Until they are checked below, the inherited fds are listeners to close on failure.
  if (!options.token_file.empty()) {
    FERRY_ASSIGN_OR_RETURN(r->token_, TokenChecker::Load(options.token_file));
    context->access.token = r->token_.get();
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> tcp_credentials,
                         MakeTcpCredentials(options.tls));

  r->MakeBuilders(options, started);
  FERRY_RETURN_IF_ERROR(r->AdoptInheritedListeners(options.inherited_listen_fds));
  r->ports_.assign(options.listen.size(), 0);
  for (size_t i = 0; i < options.listen.size(); ++i) {
    FERRY_RETURN_IF_ERROR(r->AddEndpoint(options, i, tcp_credentials));
  }
  r->SetInterceptors();
  return r;
}

void RpcServer::MakeBuilders(const RpcServerOptions& options,
                             std::chrono::steady_clock::time_point started) {
  // grpc.health.v1 (status follows draining) and server reflection, for operators' tools.
  EnableHealthService();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Two gRPC servers with the same services: one for the TCP endpoints, one for the Unix
  // endpoints' connections, because channel arguments are per server and the BDP probe
  // (RpcServerOptions::bandwidth_probe) is for remote clients only.
  for (Served* served : {&remote_, &local_}) {
    const bool tcp = served == &remote_;
    served->session_service = std::make_unique<SessionService>(context_, tcp);
    served->admin_service = std::make_unique<AdminService>(context_, started, tcp);
    served->builder = std::make_unique<grpc::ServerBuilder>();
    grpc::ServerBuilder& b = *served->builder;
    b.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
    b.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
    // Sessions are long-lived streams; keep idle connections open.
    b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    // What a stream the daemon stops reading may still make it buffer (RpcServerOptions):
    // local clients never probe.
    if (served == &local_ || !options.bandwidth_probe) {
      b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    }
    if (served == &remote_ && options.tcp_idle_timeout.count() > 0) {
      const int ms = static_cast<int>(options.tcp_idle_timeout.count());
      b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms);
      b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, ms);
    }
    b.RegisterService(served->session_service.get());
    b.RegisterService(served->admin_service.get());
  }
}

Status RpcServer::AdoptInheritedListeners(const std::vector<int>& fds) {
  // Unix endpoints: listening sockets of ferryd's own, or inherited from systemd. ferryd
  // accepts their connections itself (LocalConnections says why).
  for (int fd : fds) {
    std::string ep = systemd::SocketEndpoint(fd);
    if (ep.rfind("unix:", 0) != 0) {
      ::close(fd);
      return Status(ErrorKind::kInvalidArgument,
                    "socket activation: inherited fd " + std::to_string(fd) + " is " + ep +
                        "; ferryd adopts Unix stream sockets only (a TCP endpoint needs the "
                        "TLS and token checks of --listen tcp:HOST:PORT)");
    }
    (void)RefusePassedDescriptors(fd);  // connections queued before this keep what they had
    unix_listeners_.push_back({ep.substr(5), fd});
  }
  return Status::Ok();
}

Status RpcServer::AddEndpoint(const RpcServerOptions& options, size_t i,
                              const std::shared_ptr<grpc::ServerCredentials>& tcp_credentials) {
  const std::string& ep = options.listen[i];
  if (ep.rfind("unix:", 0) == 0) {
    std::string path = ep.substr(5);
    if (path.empty()) return Status(ErrorKind::kInvalidArgument, "empty unix socket path");
    std::error_code ec;
    std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    FERRY_ASSIGN_OR_RETURN(int fd, ListenUnix(path));
    unix_listeners_.push_back({path, fd});
    owned_socket_paths_.push_back(path);
  } else if (ep.rfind("tcp:", 0) == 0) {
    FERRY_ASSIGN_OR_RETURN(TcpEndpoint tcp, ParseHostPort(ep.substr(4)));
    // Loopback is no exception: any local uid can reach it, not only the Unix socket's group.
    const bool authenticates_clients =
        !options.token_file.empty() || !options.tls.client_ca.empty();
    if (!authenticates_clients && !options.allow_insecure_remote) {
      return Status(ErrorKind::kInvalidArgument,
                    "refusing " + ep +
                        ": a TCP endpoint must authenticate its clients with --token-file or "
                        "mutual TLS (--tls-cert/--tls-key with --tls-client-ca); "
                        "--allow-insecure-remote lets every peer that reaches it in, loopback "
                        "included (any local uid), for development only");
    }
    if (!authenticates_clients) {
      spdlog::warn(
          "{} authenticates no client (--allow-insecure-remote): every peer that "
          "reaches it gets sessions and the Admin service",
          ep);
    }
    if (!IsLoopback(tcp.host) && !options.tls.enabled()) {
      spdlog::warn(
          "{} is plaintext TCP on a non-loopback address: the bearer token and every "
          "byte travel unencrypted; configure --tls-cert/--tls-key",
          ep);
    }
    remote_.builder->AddListeningPort(tcp.host + ":" + tcp.port, tcp_credentials, &ports_[i]);
  } else {
    return Status(ErrorKind::kInvalidArgument,
                  "endpoint must be unix:PATH or tcp:HOST:PORT, got " + ep);
  }
  return Status::Ok();
}

void RpcServer::SetInterceptors() {
  for (Served* served : {&remote_, &local_}) {
    const bool tcp = served == &remote_;
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    // Every method of a TCP endpoint, gRPC's health and reflection included, needs the token.
    if (tcp && token_) creators.push_back(MakeTokenInterceptorFactory(token_.get()));
    // Streams without a session (Health/Watch, reflection) are counted like sessionless ones.
    creators.push_back(MakeSessionlessCallsInterceptorFactory(context_, tcp));
    served->builder->experimental().SetInterceptorCreators(std::move(creators));
  }
}

RpcServer::~RpcServer() {
  // Listeners Start did not hand to an acceptor (Prepare or Start failed half way).
  for (const UnixListener& l : unix_listeners_) ::close(l.fd);
  if (!local_.server) {
    for (const std::string& p : owned_socket_paths_) ::unlink(p.c_str());
  }
}

std::string RpcServer::first_unix_path() const {
  return unix_listeners_.empty() ? std::string() : unix_listeners_[0].path;
}

Status RpcServer::Start() {
  for (Served* served : {&remote_, &local_}) {
    served->server = served->builder->BuildAndStart();
    served->builder.reset();
    if (!served->server) {
      return Status(ErrorKind::kUnavailable, "could not bind the listening endpoints");
    }
  }
  for (size_t i = 0; i < listen_.size(); ++i) {  // in the order they were given
    const std::string& ep = listen_[i];
    if (ep.rfind("tcp:", 0) != 0) {
      endpoints_.push_back(ep);
      continue;
    }
    if (ports_[i] == 0) return Status(ErrorKind::kUnavailable, "could not bind " + ep);
    auto tcp = *ParseHostPort(ep.substr(4));
    endpoints_.push_back("tcp:" + tcp.host + ":" + std::to_string(ports_[i]));
  }
  for (int fd : inherited_fds_) endpoints_.push_back(systemd::SocketEndpoint(fd));
  local_connections_ = std::make_unique<LocalConnections>(
      local_limits_, static_cast<uint32_t>(::geteuid()), root_exempt_);
  context_->parts.local_connections = local_connections_.get();
  // Each acceptor owns its listening fd from here on.
  std::vector<UnixListener> listeners = std::move(unix_listeners_);
  unix_listeners_.clear();
  for (size_t i = 0; i < listeners.size(); ++i) {
    const UnixListener& l = listeners[i];
    std::string endpoint = "unix:" + l.path;
    auto acceptor = systemd::SocketAcceptor::Start(
        l.fd, [server = local_.server.get(), local = local_connections_.get(), endpoint](
                  int conn, const systemd::PeerCredentials& peer) {
          // Recorded before gRPC can start a stream on it; past a limit closed at once.
          if (!local->Admit(conn, endpoint, peer)) {
            ::close(conn);
            return;
          }
          grpc::AddInsecureChannelFromFd(server, conn);
        });
    if (!acceptor.ok()) {
      for (size_t j = i; j < listeners.size(); ++j) ::close(listeners[j].fd);
      return acceptor.status();  // the Daemon's shutdown removes the socket files made so far
    }
    acceptors_.push_back(std::move(*acceptor));
  }
  return Status::Ok();
}

void RpcServer::SetAccepting(bool accepting) {
  for (Served* served : {&remote_, &local_}) {
    if (served->server) SetAcceptingSessions(served->server.get(), accepting);
  }
}

void RpcServer::SetDrainHandler(std::function<void()> fn) {
  remote_.admin_service->SetDrainHandler(fn);
  local_.admin_service->SetDrainHandler(std::move(fn));
}

void RpcServer::StopAccepting() {
  acceptors_.clear();  // Unix endpoints: no new connections
  for (const std::string& path : owned_socket_paths_) ::unlink(path.c_str());
}

void RpcServer::Shutdown() {
  // A short deadline: idle client connections must not hold the daemon up.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(100);
  for (Served* served : {&remote_, &local_}) {
    if (!served->server) continue;
    ShutdownHealth(served->server.get());
    served->server->Shutdown(deadline);
  }
  spdlog::debug("gRPC servers shut down");
}

}  // namespace ferry::rpc
