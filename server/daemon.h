// The daemon as one object, its composition root: the device, the registry, the executor
// threads that run sessions, the slab pool and the transport, the metrics, and the gRPC side
// (rpc::RpcServer, which keeps every grpc:: type in server/rpc/). main.cc builds one from
// flags; tests can build one too.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "ferry/status.h"
#include "pool/slab_pool.h"
#include "pool/staging.h"
#include "rpc/access.h"
#include "rpc/auth.h"
#include "rpc/local_connections.h"
#include "rpc/metrics.h"
#include "rpc/sessionless_streams.h"
#include "session/device_supervisor.h"
#include "session/registry.h"
#include "session/session.h"
#include "transport/channel_stock.h"
#include "transport/ring_poller.h"
#include "transport/slab_broker.h"

namespace ferry {
namespace rpc {
struct SessionServiceContext;
class RpcServer;
}  // namespace rpc

struct DaemonOptions {
  /// Endpoints: "unix:PATH" or "tcp:HOST:PORT" (port 0 picks a free port).
  std::vector<std::string> listen;
  /// Listening Unix sockets inherited through socket activation (systemd's LISTEN_FDS).
  /// The daemon accepts on them itself and owns them from Start on; any other kind of
  /// socket is refused (TCP goes through `listen`, with its TLS and token checks).
  std::vector<int> inherited_listen_fds;
  /// Allow TCP on addresses other than loopback without TLS (development only).
  bool allow_insecure_remote = false;
  /// TLS for every TCP endpoint (unix endpoints stay plain); mutual with tls.client_ca.
  rpc::TlsFiles tls;
  /// A file holding the bearer token TCP clients must send ("" none).
  std::string token_file;
  /// Let TCP peers load and launch raw kernels (LoadModule/Launch ops).
  bool allow_remote_raw_kernels = false;
  /// The local uids and gids allowed raw kernels: "uid:1000,gid:gpuadmin" (AccessList::Parse);
  /// "" none. Raw kernels run in the shared context and can read every session's memory.
  std::string raw_kernels;
  /// The local uids and gids that may drain the daemon and list every session, besides the
  /// daemon's own uid (AccessList::Parse; "" none but that uid). Root is an admin only while
  /// listed, as it is by default.
  std::string admins = "uid:0";
  /// A group (name or number) added to `admins`, the older form of `admins = ...,gid:G`; ""
  /// none.
  std::string admin_group;
  /// Serve Prometheus metrics over HTTP on "HOST:PORT" (port 0 picks one); "" none.
  std::string metrics_listen;
  /// A file of bearer tokens (rpc/metrics.h, LoadMetricsTokens) every request to the metrics
  /// endpoint must carry one of, as "Authorization: Bearer <token>"; "" none (the endpoint
  /// asks for no credentials). Read at Start when metrics_listen is set: a file that cannot
  /// be read or holds no token fails it.
  std::string metrics_token_file;
  /// Usage identities (uid + client name) kept for accounting and metrics labels; past it
  /// new ones fold into uid "other" (session/registry.h, IdentityUsage).
  uint32_t metrics_max_identities = 256;
  /// A usage identity none of whose sessions has been open for this long is forgotten, its
  /// place freed for a new one (SessionRegistry::SetUsageIdleTimeout); 0: never.
  std::chrono::milliseconds metrics_identity_idle_timeout{600000};
  session::SessionConfig session_defaults;
  uint64_t max_device_bytes_quota = 16ull << 30;
  uint32_t max_in_flight_submits = 1024;
  uint64_t device_bytes_cap = 0;  // 0: the device's total memory
  /// Unset: derived from the descriptors the daemon may open (rpc::DeriveMaxSessions).
  std::optional<uint32_t> max_sessions;
  /// Session streams that carry no session (before their Open, or ended and not yet closed by
  /// their client): the most held at once, per identity and in all (rpc/sessionless_streams.h);
  /// and how long a stream may take to send its Open (0: no deadline).
  rpc::SessionlessStreamLimits sessionless_streams;
  std::chrono::milliseconds open_timeout{5000};
  /// Unix endpoints' connections held at once, in all and per uid (rpc/local_connections.h);
  /// unset ones are derived from the descriptors the daemon may open (RLIMIT_NOFILE).
  rpc::LocalConnectionSettings local_connections;
  /// The most bytes all sessions' submits may hold in the daemon together, read and not yet
  /// answered (inline uploads, downloads, ops); 0: no limit. Each session's own limit is
  /// session_defaults.max_in_flight_bytes; an identity's, its uid-limits inflight-bytes.
  uint64_t in_flight_bytes = 4ull << 30;
  /// The most objects all sessions may hold together (live tensors, modules, graphs and the
  /// ops recorded into graphs: daemon memory no device quota counts); 0: no limit.
  uint64_t max_objects = 4ull << 20;
  /// The most device commands all sessions keep queued together (session/launch_room.h);
  /// 0: no limit.
  uint64_t queued_commands = 896;
  /// Per-identity (uid, gid, remote) limits on sessions, device and pinned bytes, submits
  /// and bytes in flight (session/registry.h); the first rule is the default one.
  std::vector<session::UidLimitRule> uid_limits = {session::DefaultUidLimitRule()};
  /// Copy turns (session/copy_turns.h): submits copying at least copy_turn_bytes one way
  /// that run at once, per direction; 0: no limit.
  uint32_t copy_turns = 4;
  uint64_t copy_turn_bytes = 4ull << 20;
  /// Device turns: submits of all sessions on the device at once (0: no limit); and the
  /// weights by identity that order turns when sessions wait for them (fair shares).
  uint32_t device_turns = 0;
  std::map<std::string, uint32_t> uid_weights;
  /// Data bytes of each local session's submit ring (transport/submit_ring.h); 0: no rings.
  uint64_t submit_ring_bytes = 64 << 10;
  uint64_t max_message_bytes = 64ull << 20;
  /// gRPC's bandwidth-delay-product probe (rpc/rpc_server.h, RpcServerOptions).
  bool rpc_bandwidth_probe = true;
  /// TCP connections without a call, or not through their handshake, for this long are closed
  /// (rpc/rpc_server.h, RpcServerOptions); 0: gRPC's defaults.
  std::chrono::milliseconds tcp_idle_timeout{60000};
  int executor_threads = 0;  // 0: a quarter of the cores, at least 2
  /// The shared-memory slab pool, served on PATH.slabs beside the first Unix endpoint (own
  /// or inherited). No pool without one (remote clients send bytes inline).
  bool slab_pool_enabled = true;
  pool::SlabPoolOptions slab_pool;
  /// Bounds of the slab socket (hello deadline, connection caps).
  transport::SlabBrokerOptions slab_broker;
  /// Daemon-owned slabs (from the pool) that stage remote clients' inline transfers; 0:
  /// remote transfers copy straight between the messages and the device.
  uint32_t staging_slabs = 4;
  /// The most slab bytes one session may hold (0: no limit but --pinned-budget).
  uint64_t session_pinned_quota = 256ull << 20;
};

/// The session executor threads a daemon runs: `configured` (DaemonOptions::executor_threads)
/// when above 0, else a quarter of the cores, at least 2.
int ExecutorThreadCount(int configured);

class Daemon {
 public:
  /// Start serving the supervised device on every endpoint of `options`.
  static Result<std::unique_ptr<Daemon>> Start(std::unique_ptr<session::DeviceSupervisor> device,
                                               const DaemonOptions& options);
  ~Daemon();

  /// The endpoints actually bound, with TCP port 0 resolved ("tcp:127.0.0.1:40123").
  const std::vector<std::string>& endpoints() const;
  /// The metrics endpoint actually bound ("HOST:PORT"), "" when metrics are off.
  std::string metrics_endpoint() const { return metrics_ ? metrics_->endpoint() : ""; }
  const session::DeviceSupervisor& device() const { return *device_; }
  const session::SessionRegistry& registry() const { return *registry_; }

  /// Stop accepting sessions, let open ones run until `deadline`, then cancel them and wait
  /// until every session released its device resources. Idempotent; thread-safe.
  void Shutdown(std::chrono::milliseconds grace);
  /// Call `fn` (from a gRPC thread) when a client asks the daemon to drain.
  void SetDrainHandler(std::function<void()> fn);

 private:
  Daemon() = default;
  // The steps of Start, in order. The registry (limits, admins, copy turns); returns the
  // admin list.
  Result<rpc::AccessList> MakeRegistry(const DaemonOptions& options, uint32_t max_sessions);
  // What every session stream shares (SessionServiceContext), with the long lane of
  // `threads` threads.
  Status MakeContext(const DaemonOptions& options, rpc::AccessList admin_list, int threads);
  // The executor threads and the long lane's, `threads` of each.
  void StartThreads(int threads);
  // The slab pool, the slab socket, submit rings and staging (after rpc_ is prepared: the
  // slab socket sits beside the first Unix endpoint).
  Status StartSharedMemory(const DaemonOptions& options);
  // Serve gRPC and metrics, and follow the device's health.
  Status StartServing(const DaemonOptions& options, std::vector<std::string> metrics_tokens);

  std::unique_ptr<session::DeviceSupervisor> device_;
  std::unique_ptr<session::SessionRegistry> registry_;
  std::unique_ptr<pool::SlabPool> slab_pool_;  // outlives every session
  std::unique_ptr<transport::SlabBroker> slab_broker_;
  std::unique_ptr<pool::StagingArea> staging_;      // gives its slabs back before the pool goes
  std::unique_ptr<session::CopyTurns> copy_turns_;  // outlives every session
  std::unique_ptr<rpc::SessionlessStreams> sessionless_streams_;  // outlives every stream
  std::unique_ptr<rpc::SessionlessStreams> unauthenticated_streams_;
  boost::asio::io_context io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  // The sessions' long lane (session::LongLane, its threads run long_lane_io_).
  boost::asio::io_context long_lane_io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>
      long_lane_work_;
  std::unique_ptr<session::LongLane> long_lane_;
  std::vector<std::thread> threads_;  // the executor threads and the long lane's
  std::unique_ptr<rpc::SessionServiceContext> context_;
  // Local sessions' submit rings; may be null. Declared after the io_context and the context
  // its handlers use, so its thread stops before they go.
  std::unique_ptr<transport::RingPoller> ring_poller_;
  // Boards and rings made ahead for local sessions; may be null. Its refills, posted to the
  // io threads, hold it only weakly.
  std::shared_ptr<transport::ChannelStock> channel_stock_;
  // The gRPC side: services, server, endpoints and their acceptors, the token.
  std::unique_ptr<rpc::RpcServer> rpc_;
  std::chrono::steady_clock::time_point started_at_;
  rpc::LatencyHistogram submit_latency_;
  rpc::LatencyHistogram transfer_latency_;
  std::once_flag shutdown_once_;
  std::unique_ptr<rpc::MetricsServer> metrics_;  // first to go: it reads everything above
};

}  // namespace ferry
