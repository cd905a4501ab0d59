#include "rpc/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "rpc/admin_service.h"
#include "rpc/health_service.h"
#include "rpc/local_connections.h"
#include "rpc/session_service.h"
#include "rpc/systemd_notify.h"

namespace ferry::rpc {
namespace {

// How long the ring poller keeps polling after a message before it sleeps: longer than a
// local client's usual gap between submits (an 8 MiB transfer's ~170 µs on the H200), so
// that a client submitting one transfer after another finds the poller awake.
constexpr std::chrono::microseconds kRingPollerSpin{250};

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

Result<std::unique_ptr<Daemon>> Daemon::Start(std::unique_ptr<session::DeviceSupervisor> device,
                                              const DaemonOptions& options) {
  if (options.listen.empty() && options.inherited_listen_fds.empty()) {
    return Status(ErrorKind::kInvalidArgument, "no endpoint to listen on");
  }
  std::unique_ptr<Daemon> d(new Daemon());
  d->started_at_ = std::chrono::steady_clock::now();
  d->device_ = std::move(device);
  uint64_t cap =
      options.device_bytes_cap ? options.device_bytes_cap : d->device_->info().total_memory;
  d->registry_ = std::make_unique<session::SessionRegistry>(cap, options.max_sessions);
  d->registry_->SetUidLimits(options.uid_limits, options.slab_pool.budget,
                             static_cast<uint32_t>(::geteuid()));
  d->registry_->SetUsageIdentityLimit(options.metrics_max_identities);

  if (options.copy_turns > 0 || options.device_turns > 0) {
    d->copy_turns_ = std::make_unique<session::CopyTurns>(
        options.copy_turns, options.copy_turn_bytes, options.device_turns);
    d->copy_turns_->SetWeights(options.uid_weights);
  }

  d->context_ = std::make_unique<SessionServiceContext>();
  SessionServiceContext& ctx = *d->context_;
  ctx.parts.device = d->device_.get();
  ctx.parts.registry = d->registry_.get();
  ctx.parts.copy_turns = d->copy_turns_.get();
  ctx.parts.io = &d->io_;
  ctx.limits.defaults = options.session_defaults;
  ctx.limits.max_device_bytes_quota =
      std::max(options.max_device_bytes_quota, options.session_defaults.device_bytes_quota);
  ctx.limits.max_in_flight_submits =
      std::max(options.max_in_flight_submits, options.session_defaults.max_in_flight_submits);
  ctx.limits.max_message_bytes = options.max_message_bytes;
  ctx.access.allow_remote_raw_kernels = options.allow_remote_raw_kernels;
  FERRY_ASSIGN_OR_RETURN(ctx.access.raw_kernels, AccessList::Parse(options.raw_kernels));
  if (!options.admin_group.empty()) {
    FERRY_ASSIGN_OR_RETURN(gid_t admin_gid, ResolveGroup(options.admin_group));
    ctx.access.admin = AdminPolicy(admin_gid);
  }
  ctx.latency.submit_latency = &d->submit_latency_;
  ctx.latency.transfer_latency = &d->transfer_latency_;
  if (!options.token_file.empty()) {
    FERRY_ASSIGN_OR_RETURN(d->token_, TokenChecker::Load(options.token_file));
    ctx.access.token = d->token_.get();
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> tcp_credentials,
                         MakeTcpCredentials(options.tls));

  d->session_service_ = std::make_unique<SessionService>(d->context_.get());
  d->admin_service_ = std::make_unique<AdminService>(d->context_.get(), d->started_at_);

  // grpc.health.v1 (status follows draining) and server reflection, for operators' tools.
  EnableHealthService();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // Sessions are long-lived streams; keep idle connections open.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Unix endpoints: listening sockets of ferryd's own, or inherited from systemd. ferryd
  // accepts their connections itself (LocalConnections says why).
  struct UnixListener {
    std::string path;
    int fd;
  };
  std::vector<UnixListener> unix_listeners;
  // Close what was made so far when Start fails half way.
  struct CloseOnFailure {
    std::vector<UnixListener>* listeners;
    std::vector<std::string>* owned;
    bool armed = true;
    ~CloseOnFailure() {
      if (!armed) return;
      for (const UnixListener& l : *listeners) ::close(l.fd);
      for (const std::string& p : *owned) ::unlink(p.c_str());
    }
  } close_on_failure{&unix_listeners, &d->owned_socket_paths_};
  for (int fd : options.inherited_listen_fds) {
    std::string ep = systemd::SocketEndpoint(fd);
    if (ep.rfind("unix:", 0) != 0) {
      ::close(fd);
      return Status(ErrorKind::kInvalidArgument,
                    "socket activation: inherited fd " + std::to_string(fd) + " is " + ep +
                        "; ferryd adopts Unix stream sockets only (a TCP endpoint needs the "
                        "TLS and token checks of --listen tcp:HOST:PORT)");
    }
    unix_listeners.push_back({ep.substr(5), fd});
  }
  std::vector<int> ports(options.listen.size(), 0);
  for (size_t i = 0; i < options.listen.size(); ++i) {
    const std::string& ep = options.listen[i];
    if (ep.rfind("unix:", 0) == 0) {
      std::string path = ep.substr(5);
      if (path.empty()) return Status(ErrorKind::kInvalidArgument, "empty unix socket path");
      std::error_code ec;
      std::filesystem::path parent = std::filesystem::path(path).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent, ec);
      FERRY_ASSIGN_OR_RETURN(int fd, ListenUnix(path));
      unix_listeners.push_back({path, fd});
      d->owned_socket_paths_.push_back(path);
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
      builder.AddListeningPort(tcp.host + ":" + tcp.port, tcp_credentials, &ports[i]);
    } else {
      return Status(ErrorKind::kInvalidArgument,
                    "endpoint must be unix:PATH or tcp:HOST:PORT, got " + ep);
    }
  }
  builder.RegisterService(d->session_service_.get());
  builder.RegisterService(d->admin_service_.get());
  if (d->token_) {
    // Every method of a TCP endpoint, gRPC's health and reflection included, needs the token.
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeTokenInterceptorFactory(d->token_.get()));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }

  d->work_ =
      std::make_unique<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
          d->io_.get_executor());
  int threads = options.executor_threads > 0
                    ? options.executor_threads
                    : std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  for (int i = 0; i < threads; ++i) {
    d->threads_.emplace_back([io = &d->io_] {
      pthread_setname_np(pthread_self(), "ferry-exec");
      io->run();
    });
  }

  if (options.slab_pool_enabled && !unix_listeners.empty()) {
    // Slabs are registered with whatever device is current; a rebuilt device gets them all
    // registered again.
    session::DeviceSupervisor* sup = d->device_.get();
    pool::HostRegistration reg;
    reg.register_memory = [sup](void* p, uint64_t n) -> Status {
      backend::Device* dev = sup->device();
      return dev ? dev->RegisterHostMemory(p, n) : Status::Ok();  // rebuilding: the hook will
    };
    reg.unregister_memory = [sup](void* p) {
      if (backend::Device* dev = sup->device()) (void)dev->UnregisterHostMemory(p);
    };
    FERRY_ASSIGN_OR_RETURN(d->slab_pool_, pool::SlabPool::Create(options.slab_pool, reg));
    sup->SetRebuiltHook([pool = d->slab_pool_.get()] { pool->ReregisterAll(); });
    const std::string slab_path = unix_listeners[0].path + ".slabs";
    FERRY_ASSIGN_OR_RETURN(int slab_fd, ListenUnix(slab_path));
    FERRY_ASSIGN_OR_RETURN(d->slab_broker_,
                           pool::SlabBroker::Start(slab_path, slab_fd, options.slab_broker));
    ctx.parts.slab_pool = d->slab_pool_.get();
    ctx.parts.slab_broker = d->slab_broker_.get();
    ctx.limits.session_pinned_quota = options.session_pinned_quota;
    if (options.submit_ring_bytes > 0) {
      FERRY_ASSIGN_OR_RETURN(d->ring_poller_, transport::RingPoller::Start(kRingPollerSpin));
      ctx.parts.ring_poller = d->ring_poller_.get();
      ctx.limits.submit_ring_bytes = options.submit_ring_bytes;
    }
    if (options.staging_slabs > 0) {
      d->staging_ = std::make_unique<pool::StagingArea>(d->slab_pool_.get(), options.staging_slabs);
      ctx.parts.staging = d->staging_.get();
    }
  }
  d->server_ = builder.BuildAndStart();
  if (!d->server_) {
    return Status(ErrorKind::kUnavailable, "could not bind the listening endpoints");
  }
  for (size_t i = 0; i < options.listen.size(); ++i) {  // in the order they were given
    const std::string& ep = options.listen[i];
    if (ep.rfind("tcp:", 0) != 0) {
      d->endpoints_.push_back(ep);
      continue;
    }
    if (ports[i] == 0) return Status(ErrorKind::kUnavailable, "could not bind " + ep);
    auto tcp = *ParseHostPort(ep.substr(4));
    d->endpoints_.push_back("tcp:" + tcp.host + ":" + std::to_string(ports[i]));
  }
  for (int fd : options.inherited_listen_fds) d->endpoints_.push_back(systemd::SocketEndpoint(fd));
  d->local_connections_ = std::make_unique<LocalConnections>();
  ctx.parts.local_connections = d->local_connections_.get();
  close_on_failure.armed = false;  // each acceptor owns its listening fd from here on
  for (size_t i = 0; i < unix_listeners.size(); ++i) {
    const UnixListener& l = unix_listeners[i];
    std::string endpoint = "unix:" + l.path;
    auto acceptor = systemd::SocketAcceptor::Start(
        l.fd, [server = d->server_.get(), local = d->local_connections_.get(), endpoint](
                  int conn, const systemd::PeerCredentials& peer) {
          local->Add(conn, endpoint, peer);  // before gRPC can start a stream on it
          grpc::AddInsecureChannelFromFd(server, conn);
        });
    if (!acceptor.ok()) {
      for (size_t j = i; j < unix_listeners.size(); ++j) ::close(unix_listeners[j].fd);
      return acceptor.status();  // ~Daemon removes the socket files made so far
    }
    d->acceptors_.push_back(std::move(*acceptor));
  }
  if (!options.metrics_listen.empty()) {
    FERRY_ASSIGN_OR_RETURN(
        d->metrics_,
        MetricsServer::Start(options.metrics_listen, [ctx = d->context_.get(), t = d->started_at_] {
          return RenderMetrics(*ctx, t);
        }));
  }
  SetAcceptingSessions(d->server_.get(), true);
  // grpc.health.v1 follows device loss: NOT_SERVING while the device is rebuilt.
  d->device_->SetServingHook([server = d->server_.get(), ctx = d->context_.get()](bool up) {
    SetAcceptingSessions(server, up && !ctx->gauges.draining);
  });
  return d;
}

void Daemon::SetDrainHandler(std::function<void()> fn) {
  admin_service_->SetDrainHandler(std::move(fn));
}

void Daemon::Shutdown(std::chrono::milliseconds grace) {
  std::call_once(shutdown_once_, [&] {
    // New sessions are refused from here on; open ones are told (Draining). Work already
    // accepted runs on: wait, up to the grace period, until no submit is in flight and
    // everything it produced (downloads, completions) is written, then end every stream.
    context_->gauges.draining = true;
    SetAcceptingSessions(server_.get(), false);
    auto grace_end = std::chrono::steady_clock::now() + grace;
    BroadcastDraining(context_.get(), static_cast<uint64_t>(grace.count()));
    // Messages sent before the drain count as accepted: those taken and not yet handled, and
    // those waiting in a ring the poller may take from now.
    auto busy = [this] {
      return registry_->Totals().submits_in_flight > 0 || context_->gauges.unsent > 0 ||
             context_->gauges.messages_in_hand > 0 ||
             (ring_poller_ && ring_poller_->records_waiting());
    };
    while (busy() && std::chrono::steady_clock::now() < grace_end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    acceptors_.clear();  // Unix endpoints: no new connections
    for (const std::string& path : owned_socket_paths_) ::unlink(path.c_str());
    if (server_) {
      ShutdownHealth(server_.get());
      // A short deadline: idle client connections must not hold the daemon up.
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
      spdlog::debug("gRPC server shut down");
    }
    // Cancelled sessions finish their in-flight work and release their memory on the
    // executor; wait for that before the device goes away.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (registry_->Totals().sessions_open > 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (registry_->Totals().sessions_open > 0) {
      spdlog::error("{} sessions did not finish within 30 s of shutdown",
                    registry_->Totals().sessions_open);
    }
    spdlog::debug("all sessions released");
    work_.reset();
    io_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  });
}

Daemon::~Daemon() {
  Shutdown(std::chrono::milliseconds(0));
  // A device rebuild still running calls the serving hook, which reaches server_ and
  // context_; device_ is destroyed last (it is the first member), after them. (Found by TSan:
  // RebuildPaths/DeviceFaultTest.)
  if (device_) device_->JoinRebuild();
}

}  // namespace ferry::rpc
