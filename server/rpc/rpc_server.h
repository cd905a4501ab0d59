// RpcServer: the daemon's gRPC side, which the Daemon (server/daemon.h) composes: the
// services, the endpoints (TCP bound by gRPC with TLS and the token; Unix sockets listened on
// and accepted by ferryd itself, LocalConnections says why), health and reflection. Every
// grpc:: type of the daemon stays in server/rpc/. Two gRPC servers serve the same services:
// one binds the TCP endpoints, the other takes the Unix endpoints' connections, so that the
// channel arguments of each can differ (gRPC's bandwidth probe is for remote clients only).
//
// Life: Prepare (check and open the endpoints, make the services), then Start (build and
// start the gRPC servers, accept on the Unix endpoints), then StopAccepting and Shutdown at
// the drain. Not thread-safe except SetAccepting (any thread: the serving hook).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "rpc/auth.h"
#include "rpc/local_connections.h"

namespace grpc {
class Server;
class ServerBuilder;
class ServerCredentials;
}  // namespace grpc

namespace ferry::rpc {

struct SessionServiceContext;
class SessionService;
class AdminService;
namespace systemd {
class SocketAcceptor;
}

struct RpcServerOptions {
  std::vector<std::string> listen;
  std::vector<int> inherited_listen_fds;
  bool allow_insecure_remote = false;
  TlsFiles tls;
  std::string token_file;
  uint64_t max_message_bytes = 64ull << 20;
  // TCP endpoints only: gRPC's BDP probe grows every stream's HTTP/2 receive window to 16 MiB
  // or the measured bandwidth-delay product, and gRPC takes that much from a client even on
  // a stream the daemon has stopped reading (backpressure): 16-22 MiB of daemon memory per
  // held stream, measured. Off, a stream's window is 64 KiB beyond the message being read
  // (about 1 MiB per held stream, measured): the cost is a round trip between large
  // messages, which made remote inline uploads 6-24 % slower (operations.md). Unix
  // endpoints never probe: local clients move their bulk bytes through shared memory, and
  // measured no slower without it.
  bool bandwidth_probe = true;
  // TCP endpoints only: a connection that carries no call for this long, or has not finished
  // its handshake (TLS, then the client's HTTP/2 SETTINGS) by then, is closed (0: gRPC's
  // defaults, no idle limit and 120 s). gRPC accepts TCP connections itself and cannot count
  // them, so this bounds how long one that never authenticates (its calls are refused) holds
  // a descriptor; a client reconnects when it next calls. Unix endpoints' connections are
  // counted instead (LocalConnections).
  std::chrono::milliseconds tcp_idle_timeout{60000};
  // Unix endpoints' connections held at once, in all and per uid (LocalConnections).
  LocalConnectionLimits local_connections;
  // Root is exempt from local_connections (config `admins` lists root).
  bool root_exempt = true;
};

class RpcServer {
 public:
  /// Check every endpoint and open the Unix ones (TCP ones are bound by Start); load the
  /// token (setting context->access.token); make the services over `context`, which must
  /// outlive the server. Takes the inherited fds over, even when it fails.
  static Result<std::unique_ptr<RpcServer>> Prepare(const RpcServerOptions& options,
                                                    SessionServiceContext* context,
                                                    std::chrono::steady_clock::time_point started);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  /// The first Unix endpoint's path ("" when there is none): the slab socket goes beside it.
  std::string first_unix_path() const;
  /// Build and start the gRPC server, then accept on the Unix endpoints (setting
  /// context->parts.local_connections).
  Status Start();

  /// The endpoints actually bound, with TCP port 0 resolved ("tcp:127.0.0.1:40123").
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  /// Say (grpc.health.v1) whether new sessions are accepted. Any thread.
  void SetAccepting(bool accepting);
  /// Call `fn` (from a gRPC thread) when a client asks the daemon to drain.
  void SetDrainHandler(std::function<void()> fn);
  /// Unix endpoints: no new connections; remove the socket files made here.
  void StopAccepting();
  /// End health watches and shut the gRPC server down (a short deadline: idle client
  /// connections must not hold the daemon up).
  void Shutdown();

 private:
  RpcServer() = default;
  // The steps of Prepare. Both gRPC servers' builders, with their services and channel
  // arguments.
  void MakeBuilders(const RpcServerOptions& options, std::chrono::steady_clock::time_point started);
  // Systemd's listening sockets: Unix ones are adopted, any other is refused (and closed).
  Status AdoptInheritedListeners(const std::vector<int>& fds);
  // Endpoint `i` of options.listen: a Unix socket opened, or a TCP port added to the remote
  // server (refused where it would authenticate no client, unless allowed).
  Status AddEndpoint(const RpcServerOptions& options, size_t i,
                     const std::shared_ptr<grpc::ServerCredentials>& tcp_credentials);
  // The token check (TCP) and the sessionless-call count, on every method of both servers.
  void SetInterceptors();

  struct UnixListener {
    std::string path;
    int fd;
  };
  std::vector<std::string> listen_;  // as given, for endpoints()
  std::vector<int> inherited_fds_;
  std::vector<int> ports_;                    // per listen_ entry: the TCP port gRPC bound
  std::vector<UnixListener> unix_listeners_;  // owned until Start hands them to acceptors
  SessionServiceContext* context_ = nullptr;
  std::unique_ptr<TokenChecker> token_;
  // One gRPC server and its services: remote_ for the TCP endpoints, local_ for the Unix
  // endpoints' connections (channel arguments are per server; see Prepare).
  struct Served {
    std::unique_ptr<grpc::ServerBuilder> builder;  // until Start
    std::unique_ptr<SessionService> session_service;
    std::unique_ptr<AdminService> admin_service;
    std::unique_ptr<grpc::Server> server;
  };
  Served remote_, local_;
  // Accept the Unix endpoints' connections (own and inherited listening sockets).
  LocalConnectionLimits local_limits_;
  bool root_exempt_ = true;
  std::unique_ptr<LocalConnections> local_connections_;
  std::vector<std::unique_ptr<systemd::SocketAcceptor>> acceptors_;
  std::vector<std::string> owned_socket_paths_;  // bound here: removed at StopAccepting
  std::vector<std::string> endpoints_;
};

}  // namespace ferry::rpc
