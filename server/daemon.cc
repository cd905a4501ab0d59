#include "daemon.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "rpc/access.h"
#include "rpc/local_connections.h"
#include "rpc/protobuf_log.h"
#include "rpc/rpc_server.h"
#include "rpc/session_service.h"

namespace ferry {

int ExecutorThreadCount(int configured) {
  // A quarter of the cores: the daemon's other busy threads (the completion watcher and the
  // ring poller spin, gRPC's) need cores too, and a handler posted to fewer, busier threads
  // waits less for a wake-up; on the H200's 16 cores 4 threads beat 16 on most rows
  // (docs/performance.md, changelog, 2026-12-01).
  return configured > 0 ? configured
                        : std::max(2, static_cast<int>(std::thread::hardware_concurrency()) / 4);
}
namespace {

// How long the ring poller keeps polling after a message before it sleeps: longer than a
// local client's usual gap between submits (an 8 MiB transfer's ~170 µs on the H200), so
// that a client submitting one transfer after another finds the poller awake.
constexpr std::chrono::microseconds kRingPollerSpin{250};
// Local sessions' boards and rings kept made ahead (transport/channel_stock.h): enough for a
// few opens in a row; a larger burst makes the rest as it opens.
constexpr size_t kChannelStockDepth = 4;

}  // namespace

Result<std::unique_ptr<Daemon>> Daemon::Start(std::unique_ptr<session::DeviceSupervisor> device,
                                              const DaemonOptions& options) {
  if (options.listen.empty() && options.inherited_listen_fds.empty()) {
    return Status(ErrorKind::kInvalidArgument, "no endpoint to listen on");
  }
  // The metrics endpoint's tokens, read before anything is opened or served.
  std::vector<std::string> metrics_tokens;
  if (!options.metrics_listen.empty() && !options.metrics_token_file.empty()) {
    FERRY_ASSIGN_OR_RETURN(metrics_tokens, rpc::LoadMetricsTokens(options.metrics_token_file));
  }
  rpc::RouteProtobufLogs();
  std::unique_ptr<Daemon> d(new Daemon());
  d->started_at_ = std::chrono::steady_clock::now();
  d->device_ = std::move(device);
  // Descriptors bound what connections and sessions the daemon can take: limits not
  // configured are derived from them (rpc/local_connections.h).
  const rpc::DescriptorLimit descriptors = rpc::CurrentDescriptorLimit();
  const uint32_t max_sessions =
      options.max_sessions.value_or(rpc::DeriveMaxSessions(descriptors.soft));
  FERRY_ASSIGN_OR_RETURN(rpc::AccessList admin_list, d->MakeRegistry(options, max_sessions));
  const bool root_trusted = admin_list.Admits(0);
  const int threads = ExecutorThreadCount(options.executor_threads);
  FERRY_RETURN_IF_ERROR(d->MakeContext(options, std::move(admin_list), threads));
  // The gRPC side: endpoints checked and the Unix ones opened now, served from below.
  rpc::RpcServerOptions rpc_options;
  rpc_options.listen = options.listen;
  rpc_options.inherited_listen_fds = options.inherited_listen_fds;
  rpc_options.allow_insecure_remote = options.allow_insecure_remote;
  rpc_options.tls = options.tls;
  rpc_options.token_file = options.token_file;
  rpc_options.max_message_bytes = options.max_message_bytes;
  rpc_options.bandwidth_probe = options.rpc_bandwidth_probe;
  rpc_options.tcp_idle_timeout = options.tcp_idle_timeout;
  rpc_options.local_connections =
      rpc::ResolveLocalConnectionLimits(options.local_connections, descriptors.soft);
  spdlog::info("at most {} sessions, {} local connections in all and {} per uid ({} descriptors)",
               max_sessions, rpc_options.local_connections.total,
               rpc_options.local_connections.per_uid, descriptors.soft);
  rpc_options.root_exempt = root_trusted;
  FERRY_ASSIGN_OR_RETURN(d->rpc_,
                         rpc::RpcServer::Prepare(rpc_options, d->context_.get(), d->started_at_));
  d->StartThreads(threads);
  FERRY_RETURN_IF_ERROR(d->StartSharedMemory(options));
  FERRY_RETURN_IF_ERROR(d->StartServing(options, std::move(metrics_tokens)));
  return d;
}

Result<rpc::AccessList> Daemon::MakeRegistry(const DaemonOptions& options, uint32_t max_sessions) {
  uint64_t cap = options.device_bytes_cap ? options.device_bytes_cap : device_->info().total_memory;
  registry_ = std::make_unique<session::SessionRegistry>(cap, max_sessions);
  registry_->SetInFlightBytesLimit(options.in_flight_bytes);
  registry_->SetObjectsLimit(options.max_objects);
  registry_->launch_room().SetLimit(options.queued_commands);
  registry_->SetGroupLookup(rpc::GroupsOfUid);  // gid: rules match the user database's
  // Admins: config `admins` (and `admin-group`). Root is trusted, exempt from the per-uid
  // and connection limits like the daemon's uid, only while it is an admin.
  std::string admins = options.admins;
  if (!options.admin_group.empty()) {
    admins += (admins.empty() ? "gid:" : ",gid:") + options.admin_group;
  }
  FERRY_ASSIGN_OR_RETURN(rpc::AccessList admin_list, rpc::AccessList::Parse(admins));
  registry_->SetUidLimits(options.uid_limits, options.slab_pool.budget,
                          static_cast<uint32_t>(::geteuid()), admin_list.Admits(0));
  registry_->SetUsageIdentityLimit(options.metrics_max_identities);
  registry_->SetUsageIdleTimeout(options.metrics_identity_idle_timeout);
  if (options.copy_turns > 0 || options.device_turns > 0) {
    copy_turns_ = std::make_unique<session::CopyTurns>(options.copy_turns, options.copy_turn_bytes,
                                                       options.device_turns);
    copy_turns_->SetWeights(options.uid_weights);
  }
  return admin_list;
}

Status Daemon::MakeContext(const DaemonOptions& options, rpc::AccessList admin_list, int threads) {
  context_ = std::make_unique<rpc::SessionServiceContext>();
  rpc::SessionServiceContext& ctx = *context_;
  ctx.parts.device = device_.get();
  ctx.parts.registry = registry_.get();
  ctx.parts.copy_turns = copy_turns_.get();
  ctx.parts.io = &io_;
  // As many long-lane threads as executor threads (StartThreads): sessions that each
  // instantiate a large graph at once hold as many long-lane threads as that, and share the
  // cores as the kernel schedules them, while none of the executor threads, which every
  // session needs, is held; one identity's hold at most all but one of them (LongLane).
  long_lane_ = std::make_unique<session::LongLane>(long_lane_io_, threads);
  ctx.parts.long_lane = long_lane_.get();
  sessionless_streams_ = std::make_unique<rpc::SessionlessStreams>(options.sessionless_streams);
  ctx.parts.sessionless_streams = sessionless_streams_.get();
  // Streams refused for their token, whose client has not closed them: 64 are told why
  // (UNAUTHENTICATED); further ones are reset. They never count against the limits above,
  // which peers with the token share.
  unauthenticated_streams_ = std::make_unique<rpc::SessionlessStreams>(
      rpc::SessionlessStreamLimits{/*total=*/64, /*per_identity=*/0});
  ctx.parts.unauthenticated_streams = unauthenticated_streams_.get();
  ctx.limits.open_timeout = options.open_timeout;
  ctx.limits.defaults = options.session_defaults;
  ctx.limits.max_device_bytes_quota =
      std::max(options.max_device_bytes_quota, options.session_defaults.device_bytes_quota);
  ctx.limits.max_in_flight_submits =
      std::max(options.max_in_flight_submits, options.session_defaults.max_in_flight_submits);
  ctx.limits.max_message_bytes = options.max_message_bytes;
  ctx.access.allow_remote_raw_kernels = options.allow_remote_raw_kernels;
  FERRY_ASSIGN_OR_RETURN(ctx.access.raw_kernels, rpc::AccessList::Parse(options.raw_kernels));
  ctx.access.admin = rpc::AdminPolicy(std::move(admin_list));
  ctx.latency.submit_latency = &submit_latency_;
  ctx.latency.transfer_latency = &transfer_latency_;
  return Status::Ok();
}

void Daemon::StartThreads(int threads) {
  // Every session stream arms a timer (its open timeout) on io_: make Asio's timer machinery
  // (an epoll set, an eventfd, a timerfd) now, so that its descriptors are there from the
  // start rather than appearing with the first stream.
  { boost::asio::steady_timer(io_).cancel(); }
  work_ =
      std::make_unique<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
          io_.get_executor());
  long_lane_work_ =
      std::make_unique<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
          long_lane_io_.get_executor());
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([io = &io_] {
      pthread_setname_np(pthread_self(), "ferry-exec");
      io->run();
    });
    threads_.emplace_back([io = &long_lane_io_] {
      pthread_setname_np(pthread_self(), "ferry-long");
      io->run();
    });
  }
}

Status Daemon::StartSharedMemory(const DaemonOptions& options) {
  rpc::SessionServiceContext& ctx = *context_;
  const std::string first_unix_path = rpc_->first_unix_path();
  // The slab pool backs local clients' shared memory (with a Unix endpoint) and the pinned
  // staging every session's inline transfers go through: a daemon that listens on TCP alone
  // needs it too, or its remote sessions' inline downloads would copy into ordinary memory,
  // which holds an executor thread until the stream's earlier work is done.
  const bool local_clients = !first_unix_path.empty();
  if (options.slab_pool_enabled && (local_clients || options.staging_slabs > 0)) {
    // Slabs are registered with whatever device is current; a rebuilt device gets them all
    // registered again.
    session::DeviceSupervisor* sup = device_.get();
    pool::HostRegistration reg;
    reg.register_memory = [sup](void* p, uint64_t n) -> Status {
      backend::Device* dev = sup->device();
      return dev ? dev->RegisterHostMemory(p, n) : Status::Ok();  // rebuilding: the hook will
    };
    reg.unregister_memory = [sup](void* p) {
      if (backend::Device* dev = sup->device()) (void)dev->UnregisterHostMemory(p);
    };
    FERRY_ASSIGN_OR_RETURN(slab_pool_, pool::SlabPool::Create(options.slab_pool, reg));
    sup->SetRebuiltHook([pool = slab_pool_.get()] { pool->ReregisterAll(); });
    ctx.parts.slab_pool = slab_pool_.get();
  }
  if (slab_pool_ && local_clients) {
    const std::string slab_path = first_unix_path + ".slabs";
    FERRY_ASSIGN_OR_RETURN(int slab_fd, rpc::ListenUnix(slab_path));
    FERRY_ASSIGN_OR_RETURN(slab_broker_,
                           transport::SlabBroker::Start(slab_path, slab_fd, options.slab_broker));
    ctx.parts.slab_broker = slab_broker_.get();
    ctx.limits.session_pinned_quota = options.session_pinned_quota;
    if (options.submit_ring_bytes > 0) {
      FERRY_ASSIGN_OR_RETURN(ring_poller_, transport::RingPoller::Start(kRingPollerSpin));
      ctx.parts.ring_poller = ring_poller_.get();
      ctx.limits.submit_ring_bytes = options.submit_ring_bytes;
    }
    // Local sessions' boards and rings, made ahead on the io threads.
    channel_stock_ = transport::ChannelStock::Create(
        ctx.limits.submit_ring_bytes, kChannelStockDepth,
        [io = &io_](std::function<void()> fn) { boost::asio::post(*io, std::move(fn)); });
    ctx.parts.channel_stock = channel_stock_.get();
  }
  if (slab_pool_ && options.staging_slabs > 0) {
    staging_ = std::make_unique<pool::StagingArea>(slab_pool_.get(), options.staging_slabs);
    ctx.parts.staging = staging_.get();
  }
  return Status::Ok();
}

Status Daemon::StartServing(const DaemonOptions& options, std::vector<std::string> metrics_tokens) {
  FERRY_RETURN_IF_ERROR(rpc_->Start());
  if (!options.metrics_listen.empty()) {
    FERRY_ASSIGN_OR_RETURN(
        metrics_,
        rpc::MetricsServer::Start(
            options.metrics_listen,
            [ctx = context_.get(), t = started_at_](const rpc::MetricsEndpointStats& endpoint) {
              return rpc::RenderMetrics(*ctx, t, endpoint);
            },
            std::move(metrics_tokens)));
  }
  rpc_->SetAccepting(true);
  // grpc.health.v1 follows device loss: NOT_SERVING while the device is rebuilt.
  device_->SetServingHook([rpc = rpc_.get(), ctx = context_.get()](bool up) {
    rpc->SetAccepting(up && !ctx->gauges.draining);
    // A drain that began meanwhile may have said NOT_SERVING before this said SERVING: say
    // it again (Shutdown sets draining before it does).
    if (up && ctx->gauges.draining) rpc->SetAccepting(false);
  });
  return Status::Ok();
}

const std::vector<std::string>& Daemon::endpoints() const { return rpc_->endpoints(); }

void Daemon::SetDrainHandler(std::function<void()> fn) { rpc_->SetDrainHandler(std::move(fn)); }

void Daemon::Shutdown(std::chrono::milliseconds grace) {
  std::call_once(shutdown_once_, [&] {
    // New sessions are refused from here on; open ones are told (Draining). Work already
    // accepted runs on: wait, up to the grace period, until no submit is in flight and
    // everything it produced (downloads, completions) is written, then end every stream.
    context_->gauges.draining = true;
    if (rpc_) rpc_->SetAccepting(false);
    auto grace_end = std::chrono::steady_clock::now() + grace;
    rpc::BroadcastDraining(context_.get(), static_cast<uint64_t>(grace.count()));
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
    if (rpc_) {
      rpc_->StopAccepting();  // Unix endpoints: no new connections, socket files removed
      rpc_->Shutdown();
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
    long_lane_work_.reset();
    io_.stop();
    long_lane_io_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  });
}

Daemon::~Daemon() {
  Shutdown(std::chrono::milliseconds(0));
  // A device rebuild still running calls the serving hook, which reaches rpc_ and
  // context_; device_ is destroyed last (it is the first member), after them. (Found by TSan:
  // RebuildPaths/DeviceFaultTest.)
  if (device_) device_->JoinRebuild();
}

}  // namespace ferry
