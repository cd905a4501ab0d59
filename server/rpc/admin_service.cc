#include "rpc/admin_service.h"

#include <optional>

#include "ferry/version.h"
#include "ferry/wire.h"
#include "rpc/convert.h"

namespace ferry::rpc {
namespace {

// Finish the call with CheckToken's status (UNAUTHENTICATED, by its contract) when a call on
// a TCP endpoint (`tcp`) lacks the bearer token; null when it may go on.
grpc::ServerUnaryReactor* RejectUnauthenticated(const SessionServiceContext& context,
                                                grpc::CallbackServerContext* ctx, bool tcp) {
  ferry::Status s = CheckToken(context.access.token, *ctx, tcp);
  if (s.ok()) return nullptr;
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message()));
  return reactor;
}

// Who is calling: a local peer's uid (from its connection's SO_PEERCRED), or none for a
// call on a TCP endpoint (`tcp`) or one whose connection is not known.
std::optional<uid_t> CallerUid(const SessionServiceContext& context,
                               const grpc::CallbackServerContext& ctx, bool tcp) {
  if (tcp || !context.parts.local_connections) return std::nullopt;
  session::PeerIdentity id = context.parts.local_connections->Identify(ctx.peer());
  if (!id.uid) return std::nullopt;
  return static_cast<uid_t>(*id.uid);
}

}  // namespace

grpc::ServerUnaryReactor* AdminService::Status(grpc::CallbackServerContext* ctx,
                                               const v1::StatusRequest*, v1::StatusReply* reply) {
  if (auto* rejected = RejectUnauthenticated(*context_, ctx, tcp_)) return rejected;
  const backend::DeviceInfo info = context_->parts.device->info();
  session::DaemonTotals t = context_->parts.registry->Totals();
  reply->set_version(std::string(kVersion) + "+" + kGitCommit);
  reply->set_backend(info.backend);
  reply->set_device_ordinal(info.ordinal);
  reply->set_device_name(info.name);
  reply->set_device_uuid(info.uuid);
  reply->set_driver_version(info.driver_version);
  reply->set_device_total_bytes(info.total_memory);
  reply->set_device_free_bytes(context_->parts.device->free_memory());
  reply->set_device_bytes_in_use(context_->parts.device->bytes_in_use());
  reply->set_uptime_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - started_at_)
                           .count());
  reply->set_sessions_open(static_cast<uint32_t>(t.sessions_open));
  reply->set_sessions_total(t.sessions_total);
  reply->set_submits_in_flight(t.submits_in_flight);
  reply->set_submits_total(t.submits);
  reply->set_ops_total(t.ops);
  reply->set_bytes_uploaded_total(t.bytes_uploaded);
  reply->set_bytes_downloaded_total(t.bytes_downloaded);
  reply->set_draining(context_->gauges.draining);
  reply->set_live_tensors(t.live_tensors);
  reply->set_device_resets(context_->parts.device->resets());
  reply->set_last_fault(context_->parts.device->last_fault());
  reply->set_last_recovery_ms(context_->parts.device->last_recovery_ms());
  if (context_->parts.slab_pool) {
    pool::SlabPoolStats p = context_->parts.slab_pool->stats();
    reply->set_slabs_total(p.slabs_total);
    reply->set_slabs_in_use(p.slabs_in_use);
    reply->set_slabs_kept(p.slabs_kept);
    reply->set_slab_bytes(p.bytes_total);
    reply->set_slab_fds_open(p.fds_open);
    reply->set_slab_size(context_->parts.slab_pool->slab_size());
  }
  if (context_->parts.slab_broker)
    reply->set_slab_connections(context_->parts.slab_broker->connections());
  if (context_->parts.staging) {
    pool::StagingStats st = context_->parts.staging->stats();
    reply->set_staging_slabs(st.slabs);
    reply->set_staging_bytes_in_use(st.bytes_in_use);
    reply->set_staged_bytes_total(st.staged_total);
    reply->set_staging_fallbacks_total(st.fallbacks_total);
  }
  if (context_->parts.ring_poller) {
    reply->set_submit_rings(context_->parts.ring_poller->rings());
    reply->set_submit_ring_messages_total(context_->parts.ring_poller->records_total());
  }
  if (context_->parts.copy_turns) {
    session::CopyTurns::Stats t = context_->parts.copy_turns->stats();
    reply->set_copy_turns(context_->parts.copy_turns->turns());
    reply->set_copy_turns_waiting(t.waiting);
    reply->set_copy_turn_waits_total(t.waits);
  }
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListSessions(grpc::CallbackServerContext* ctx,
                                                     const v1::ListSessionsRequest*,
                                                     v1::ListSessionsReply* reply) {
  if (auto* rejected = RejectUnauthenticated(*context_, ctx, tcp_)) return rejected;
  // An admin sees every session; any other local caller only its own uid's, and a remote
  // caller none (it has no uid here, and a token may be shared by many tenants).
  const std::optional<uid_t> caller = CallerUid(*context_, *ctx, tcp_);
  const bool admin = caller && context_->access.admin.IsAdmin(*caller);
  auto now = std::chrono::steady_clock::now();
  for (const session::SessionEntry& e : context_->parts.registry->List()) {
    if (!admin && !(caller && e.peer.uid && *e.peer.uid == *caller)) continue;
    v1::SessionInfo* s = reply->add_sessions();
    const session::SessionCounters& c = *e.counters;
    s->set_session_id(e.id);
    s->set_client_name(e.client_name);
    s->set_peer(e.peer.address);
    if (e.peer.uid) s->set_uid(*e.peer.uid);
    if (e.peer.pid) s->set_pid(*e.peer.pid);
    s->set_identity(session::IdentityOf(e.peer));
    s->set_age_ms(std::chrono::duration_cast<std::chrono::milliseconds>(now - e.opened_at).count());
    s->set_submits_in_flight(c.submits_in_flight);
    s->set_device_bytes(c.device_bytes);
    s->set_live_tensors(c.live_tensors);
    wire::StatsToProto(session::SnapshotOf(c), s->mutable_stats());
  }
  // The same rule for usage: a non-admin sees only its own identity's.
  const std::string own_identity = caller ? "uid:" + std::to_string(*caller) : std::string();
  for (const session::UidUsage& u : context_->parts.registry->UsageByUid()) {
    if (!admin && u.identity != own_identity) continue;
    v1::UidUsage* p = reply->add_usage();
    p->set_identity(u.identity);
    p->set_sessions(u.sessions);
    p->set_device_bytes(u.device_bytes);
    p->set_pinned_bytes(u.pinned_bytes);
    p->set_submits_in_flight(u.inflight);
    p->set_max_sessions(u.limits.sessions);
    p->set_max_device_bytes(u.limits.device_bytes);
    p->set_max_pinned_bytes(u.limits.pinned_bytes);
    p->set_max_submits_in_flight(u.limits.inflight);
    p->set_in_flight_bytes(u.in_flight_bytes);
    p->set_max_in_flight_bytes(u.limits.in_flight_bytes);
    p->set_objects(u.objects);
    p->set_max_objects(u.limits.objects);
    p->set_queued_commands(u.queued_commands);
    p->set_max_queued_commands(u.limits.queued_commands);
  }
  const std::string own_uid = caller ? std::to_string(*caller) : std::string();
  for (const session::IdentityUsage& u : context_->parts.registry->UsageByIdentity()) {
    if (!admin && (own_uid.empty() || u.uid != own_uid)) continue;
    v1::IdentityUsage* p = reply->add_identities();
    p->set_uid(u.uid);
    p->set_client(u.client);
    p->set_sessions_open(u.sessions_open);
    p->set_sessions_total(u.sessions_total);
    p->set_device_busy_ns(u.device_busy_ns);
    p->set_h2d_bytes(u.h2d_bytes);
    p->set_h2d_ns(u.h2d_ns);
    p->set_d2h_bytes(u.d2h_bytes);
    p->set_d2h_ns(u.d2h_ns);
    p->set_device_bytes(u.device_bytes);
  }
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::Drain(grpc::CallbackServerContext* ctx,
                                              const v1::DrainRequest*, v1::DrainReply*) {
  if (auto* rejected = RejectUnauthenticated(*context_, ctx, tcp_)) return rejected;
  // A drain ends every tenant's work: admins only (the daemon's uid and config `admins`).
  const std::optional<uid_t> caller = CallerUid(*context_, *ctx, tcp_);
  if (!caller || !context_->access.admin.IsAdmin(*caller)) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        caller ? "drain is for the daemon's uid and the admins its config lists; uid " +
                     std::to_string(*caller) + " is none of them"
               : std::string("drain is for local admins only (the daemon's uid and "
                             "config admins), never for a remote peer")));
    return reactor;
  }
  context_->gauges.draining = true;
  std::function<void()> handler;
  {
    MutexLock lock(&mu_);
    handler = drain_handler_;
  }
  if (handler) handler();
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace ferry::rpc
