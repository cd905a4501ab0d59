#include "rpc/metrics.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <limits>
#include <list>
#include <optional>
#include <sstream>
#include <thread>

#include "ferry/version.h"
#include "rpc/auth.h"
#include "rpc/local_connections.h"
#include "rpc/session_service.h"

namespace ferry::rpc {

// --- LatencyHistogram ----------------------------------------------------------------------

void LatencyHistogram::Record(std::chrono::nanoseconds latency) {
  double s = std::chrono::duration<double>(latency).count();
  size_t i = 0;
  while (i < kBoundsSeconds.size() && s > kBoundsSeconds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, latency.count())),
                    std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::snapshot() const {
  Snapshot s;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.buckets[i];  // consistent with the buckets, unlike count_ mid-record
  }
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

// --- exposition ----------------------------------------------------------------------------

namespace {

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

class Exposition {
 public:
  // Values print with every digit a double has (the stream's default of 6 would turn a day of
  // device seconds, 86400.123, into 86400.1).
  explicit Exposition(std::string labels) : labels_(std::move(labels)) {
    out_.precision(std::numeric_limits<double>::max_digits10);
  }

  void Family(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void Sample(const std::string& name, double value, const std::string& extra_labels = "") {
    out_ << name << "{" << labels_ << (extra_labels.empty() ? "" : "," + extra_labels) << "} ";
    if (value == static_cast<double>(static_cast<uint64_t>(value)) && value >= 0 && value < 1e18) {
      out_ << static_cast<uint64_t>(value);
    } else {
      out_ << value;
    }
    out_ << "\n";
  }
  void Metric(const char* name, const char* type, const char* help, double value) {
    Family(name, type, help);
    Sample(name, value);
  }
  std::string str() const { return out_.str(); }

 private:
  std::string labels_;
  std::ostringstream out_;
};

// The exposition's part about the daemon: its build, uptime, drain and sessions.
void RenderDaemonState(Exposition& e, const SessionServiceContext& c,
                       const backend::DeviceInfo& info, const session::DaemonTotals& t,
                       std::chrono::steady_clock::time_point started_at) {
  e.Family("ferry_build_info", "gauge", "ferryd's version and device backend (always 1).");
  e.Sample("ferry_build_info", 1,
           "version=\"" + EscapeLabel(kVersion) + "\",commit=\"" + EscapeLabel(kGitCommit) +
               "\",backend=\"" + EscapeLabel(info.backend) + "\",device_name=\"" +
               EscapeLabel(info.name) + "\"");
  e.Metric("ferry_uptime_seconds", "gauge", "Seconds since ferryd started serving.",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at).count());
  e.Metric("ferry_draining", "gauge", "1 while the daemon drains (refuses new sessions).",
           c.gauges.draining ? 1 : 0);
  e.Metric("ferry_sessions_open", "gauge", "Sessions open now.", t.sessions_open);
  e.Metric("ferry_sessions_total", "counter", "Sessions opened since start.", t.sessions_total);
}

// The exposition's part about session streams and the connections that carry them.
void RenderStreams(Exposition& e, const SessionServiceContext& c) {
  // Streams that carry no session: before their Open, or ended and not yet closed by their
  // client (rpc/sessionless_streams.h).
  uint64_t sessionless = 0, refused_per_uid = 0, refused_in_all = 0;
  if (const SessionlessStreams* u = c.parts.sessionless_streams) {
    sessionless = u->count();
    refused_per_uid = u->refused_per_identity();
    refused_in_all = u->refused_total_limit();
  }
  e.Metric("ferry_streams_sessionless", "gauge",
           "Session streams that carry no session: before their Open (new, or kept after their "
           "last session's Close), or ended and not yet closed by their client.",
           sessionless);
  e.Metric("ferry_streams_started_total", "counter",
           "Session streams taken (admitted past the sessionless limits), since start.",
           c.gauges.streams_started_total.load());
  e.Metric("ferry_streams_kept_total", "counter",
           "Sessions closed whose stream was kept open for the client's next Open "
           "(Close.keep_stream), since start.",
           c.gauges.streams_kept_total.load());
  e.Metric("ferry_slabs_kept_total", "counter",
           "Slabs a session started with because the last session on its kept stream kept "
           "them (Close.keep_slabs), instead of fresh ones, since start.",
           c.gauges.slabs_kept_total.load());
  e.Family(
      "ferry_streams_refused_total", "counter",
      "Session streams reset at once, past a limit on streams without a session, since start.");
  e.Sample("ferry_streams_refused_total", refused_per_uid, "reason=\"max_sessionless_per_uid\"");
  e.Sample("ferry_streams_refused_total", refused_in_all, "reason=\"max_sessionless\"");
  const uint64_t unauthenticated =
      c.parts.unauthenticated_streams ? c.parts.unauthenticated_streams->count() : 0;
  e.Metric("ferry_streams_unauthenticated", "gauge",
           "Session streams refused for their bearer token that gRPC still keeps (at most 64; "
           "further ones are reset).",
           unauthenticated);
  // Connections to the Unix endpoints (rpc/local_connections.h).
  if (const LocalConnections* l = c.parts.local_connections) {
    // One look at each connection (an fstat) gives both the total and the uids' counts.
    const std::vector<std::pair<uint32_t, uint64_t>> by_uid = l->CountByUid();
    uint64_t total = 0;
    for (const auto& [uid, n] : by_uid) total += n;
    e.Metric("ferry_local_connections", "gauge",
             "Connections to the Unix endpoints that gRPC holds now.", total);
    e.Family("ferry_uid_local_connections", "gauge",
             "Connections to the Unix endpoints that gRPC holds now, per uid holding any.");
    for (const auto& [uid, n] : by_uid) {
      e.Sample("ferry_uid_local_connections", n, "identity=\"uid:" + std::to_string(uid) + "\"");
    }
    e.Family("ferry_local_connections_refused_total", "counter",
             "Connections to the Unix endpoints closed at once, past a limit, since start.");
    e.Sample("ferry_local_connections_refused_total", l->refused_per_uid(),
             "reason=\"max_local_connections_per_uid\"");
    e.Sample("ferry_local_connections_refused_total", l->refused_total_limit(),
             "reason=\"max_local_connections\"");
  }
  e.Metric("ferry_streams_open_timeouts_total", "counter",
           "Session streams ended because they sent no Open within open-timeout, since start.",
           c.gauges.open_timeouts_total.load());
  e.Metric("ferry_streams_finish_timeouts_total", "counter",
           "Session streams cancelled because, their session ended, their last writes were not "
           "read within open-timeout, since start.",
           c.gauges.finish_timeouts_total.load());
}

// The exposition's part about work done, and the device: its memory and its faults.
void RenderWorkAndDevice(Exposition& e, const SessionServiceContext& c,
                         const backend::DeviceInfo& info, const session::DaemonTotals& t) {
  e.Metric("ferry_submits_total", "counter", "Submits accepted since start.", t.submits);
  e.Metric("ferry_submits_in_flight", "gauge", "Submits accepted and not yet completed.",
           t.submits_in_flight);
  e.Metric("ferry_ops_total", "counter", "Ops executed since start.", t.ops);
  e.Metric("ferry_live_tensors", "gauge", "Tensors all sessions hold.", t.live_tensors);
  const uint64_t free_bytes = c.parts.device->free_memory();
  e.Metric("ferry_device_memory_total_bytes", "gauge", "Device memory.", info.total_memory);
  e.Metric("ferry_device_memory_free_bytes", "gauge", "Device memory free (driver's view).",
           free_bytes);
  e.Metric("ferry_device_memory_used_bytes", "gauge", "Device memory used (total - free).",
           info.total_memory >= free_bytes ? info.total_memory - free_bytes : 0);
  e.Metric("ferry_device_memory_allocated_bytes", "gauge",
           "Device memory allocated through sessions and not yet released.",
           c.parts.device->bytes_in_use());
  e.Metric("ferry_device_memory_reserved_bytes", "gauge",
           "Device memory reserved under the daemon-wide cap.", t.device_bytes_reserved);
  e.Metric("ferry_device_memory_cap_bytes", "gauge",
           "The most device memory all sessions together may hold.",
           c.parts.registry->device_bytes_cap());
  // Every device fault rebuilds the device (in process, or by re-executing ferryd), so the
  // two counters move together; both are exported for alerting rules' sake.
  e.Metric("ferry_device_faults_total", "counter",
           "Sticky device faults since the first start (carried across a fault restart).",
           c.parts.device->resets());
  e.Metric("ferry_device_resets_total", "counter",
           "Device contexts rebuilt after a fault (carried across a fault restart).",
           c.parts.device->resets());
  e.Metric("ferry_device_last_recovery_seconds", "gauge",
           "Fault to rebuilt device, for the last fault (0: none).",
           static_cast<double>(c.parts.device->last_recovery_ms()) / 1000.0);
}

// The exposition's part about the shared-memory slabs and the slab socket.
void RenderSlabs(Exposition& e, const SessionServiceContext& c) {
  pool::SlabPoolStats p;
  uint64_t slab_size = 0, slab_connections = 0;
  if (c.parts.slab_pool) {
    p = c.parts.slab_pool->stats();
    slab_size = c.parts.slab_pool->slab_size();
  }
  if (c.parts.slab_broker) slab_connections = c.parts.slab_broker->connections();
  e.Metric("ferry_slab_pool_slabs", "gauge", "Shared-memory slabs that exist (free or held).",
           p.slabs_total);
  e.Metric("ferry_slab_pool_slabs_in_use", "gauge", "Shared-memory slabs sessions hold.",
           p.slabs_in_use);
  e.Metric("ferry_slab_pool_slabs_kept", "gauge",
           "Of the slabs sessions hold: slabs closed sessions keep for the next session on "
           "their kept stream (Close.keep_slabs).",
           p.slabs_kept);
  e.Metric("ferry_slab_pool_bytes", "gauge", "Bytes of all shared-memory slabs.", p.bytes_total);
  e.Metric("ferry_slab_pool_slab_size_bytes", "gauge", "Size of one slab.", slab_size);
  e.Metric("ferry_slab_pool_fds_open", "gauge", "memfds the slab pool holds open.", p.fds_open);
  e.Metric("ferry_slab_pool_made_total", "counter", "Shared-memory slabs made since start.",
           p.made_total);
  e.Metric("ferry_slab_pool_made_on_grant_total", "counter",
           "Slab acquires that found no slab made ahead and waited for one to be made.",
           p.made_on_grant_total);
  e.Metric("ferry_slab_pool_connections", "gauge", "Connections open on the slab socket.",
           slab_connections);
  transport::SlabBrokerStats bs;
  if (c.parts.slab_broker) bs = c.parts.slab_broker->stats();
  e.Family("ferry_slab_connections_closed_total", "counter",
           "Slab-socket connections the daemon closed for a bound, since start, by reason.");
  e.Sample("ferry_slab_connections_closed_total", bs.refused_over_cap,
           "reason=\"max_connections\"");
  e.Sample("ferry_slab_connections_closed_total", bs.refused_uid_pending,
           "reason=\"max_pending_per_uid\"");
  e.Sample("ferry_slab_connections_closed_total", bs.hello_timeouts, "reason=\"hello_timeout\"");
  e.Metric("ferry_slab_acquires_waiting", "gauge",
           "Slab acquires queued for or being answered by the grant threads.", bs.acquires_waiting);
  e.Metric("ferry_slab_accept_backoffs_total", "counter",
           "Times the slab socket stopped accepting for a while: out of file descriptors.",
           bs.accept_backoffs);
}

// The exposition's part about what each identity holds now, against its limits.
void RenderIdentityLimits(Exposition& e, const SessionServiceContext& c) {
  // Per identity (uid:N, remote:NAME or remote): usage and limits (0: no limit), for those holding
  // anything now.
  const std::vector<session::UidUsage> usage = c.parts.registry->UsageByUid();
  auto per_uid = [&](const char* name, const char* help, auto field) {
    e.Family(name, "gauge", help);
    for (const session::UidUsage& u : usage) {
      e.Sample(name, field(u), "identity=\"" + EscapeLabel(u.identity) + "\"");
    }
  };
  per_uid("ferry_uid_sessions", "Sessions open now, per identity.",
          [](const session::UidUsage& u) { return u.sessions; });
  per_uid("ferry_uid_device_bytes", "Device bytes held now, per identity.",
          [](const session::UidUsage& u) { return u.device_bytes; });
  per_uid("ferry_uid_pinned_bytes", "Slab (pinned) bytes held now, per identity.",
          [](const session::UidUsage& u) { return u.pinned_bytes; });
  per_uid("ferry_uid_submits_in_flight", "Submits in flight now, per identity.",
          [](const session::UidUsage& u) { return u.inflight; });
  per_uid("ferry_uid_max_sessions", "Session limit per identity (0: none).",
          [](const session::UidUsage& u) { return u.limits.sessions; });
  per_uid("ferry_uid_max_device_bytes", "Device-byte limit per identity (0: none).",
          [](const session::UidUsage& u) { return u.limits.device_bytes; });
  per_uid("ferry_uid_max_pinned_bytes", "Pinned-byte limit per identity (0: none).",
          [](const session::UidUsage& u) { return u.limits.pinned_bytes; });
  per_uid("ferry_uid_max_submits_in_flight", "In-flight submit limit per identity (0: none).",
          [](const session::UidUsage& u) { return u.limits.inflight; });
  per_uid("ferry_uid_in_flight_bytes",
          "Bytes the identity's accepted submits hold in the daemon until answered.",
          [](const session::UidUsage& u) { return u.in_flight_bytes; });
  per_uid("ferry_uid_max_in_flight_bytes", "In-flight byte limit per identity (0: none).",
          [](const session::UidUsage& u) { return u.limits.in_flight_bytes; });
  per_uid("ferry_uid_objects",
          "Live tensors, modules, graphs and recorded graph ops, per identity.",
          [](const session::UidUsage& u) { return u.objects; });
  per_uid("ferry_uid_max_objects", "Object limit per identity (0: none).",
          [](const session::UidUsage& u) { return u.limits.objects; });
  per_uid("ferry_uid_queued_commands",
          "Device commands queued on the streams of the identity's sessions.",
          [](const session::UidUsage& u) { return u.queued_commands; });
  per_uid("ferry_uid_max_queued_commands",
          "Queued device command limit per identity (its share of queued-commands; 0: none).",
          [](const session::UidUsage& u) { return u.limits.queued_commands; });
}

// The exposition's part about device time and copies per usage identity, and over all sessions.
void RenderIdentityUsage(Exposition& e, const SessionServiceContext& c,
                         const session::DaemonTotals& t) {
  // Per usage identity (uid and client name, folded past metrics-max-identities), kept
  // after its sessions close until it expires (metrics-identity-idle-timeout): device time
  // and copies measured on the device (backend.h, Usage), and the device memory its open
  // sessions hold. An expired identity's series are gone from the next scrape; the
  // ferry_daemon_* counters below keep what it used.
  const std::vector<session::IdentityUsage> identities = c.parts.registry->UsageByIdentity();
  auto who = [](const session::IdentityUsage& u) {
    return "uid=\"" + EscapeLabel(u.uid) + "\",client=\"" + EscapeLabel(u.client) + "\"";
  };
  e.Family("ferry_device_seconds_total", "counter",
           "Device time of an identity's work, measured on the device (sessions that run at "
           "once each count their own time).");
  for (const session::IdentityUsage& u : identities) {
    e.Sample("ferry_device_seconds_total", static_cast<double>(u.device_busy_ns) / 1e9, who(u));
  }
  e.Family("ferry_transfer_bytes_total", "counter",
           "Bytes copied between host and device for an identity, by direction (upload: host "
           "to device).");
  for (const session::IdentityUsage& u : identities) {
    e.Sample("ferry_transfer_bytes_total", u.h2d_bytes, who(u) + ",direction=\"upload\"");
    e.Sample("ferry_transfer_bytes_total", u.d2h_bytes, who(u) + ",direction=\"download\"");
  }
  e.Family("ferry_transfer_seconds_total", "counter",
           "Device time of an identity's copies between host and device, by direction (part "
           "of ferry_device_seconds_total).");
  for (const session::IdentityUsage& u : identities) {
    e.Sample("ferry_transfer_seconds_total", static_cast<double>(u.h2d_ns) / 1e9,
             who(u) + ",direction=\"upload\"");
    e.Sample("ferry_transfer_seconds_total", static_cast<double>(u.d2h_ns) / 1e9,
             who(u) + ",direction=\"download\"");
  }
  e.Family("ferry_device_memory_bytes", "gauge",
           "Device memory an identity's open sessions hold now (live tensors).");
  for (const session::IdentityUsage& u : identities) {
    e.Sample("ferry_device_memory_bytes", u.device_bytes, who(u));
  }
  // The same over every session since start, expired identities' included: these never go
  // down, where a sum over the per-identity series drops when one expires.
  e.Metric("ferry_daemon_device_seconds_total", "counter",
           "Device time of all sessions' work since start (ferry_device_seconds_total over "
           "every identity, expired ones included).",
           static_cast<double>(t.device_busy_ns) / 1e9);
  e.Family("ferry_daemon_transfer_bytes_total", "counter",
           "Bytes copied between host and device by all sessions since start, by direction.");
  e.Sample("ferry_daemon_transfer_bytes_total", t.h2d_bytes, "direction=\"upload\"");
  e.Sample("ferry_daemon_transfer_bytes_total", t.d2h_bytes, "direction=\"download\"");
  e.Family("ferry_daemon_transfer_seconds_total", "counter",
           "Device time of all sessions' copies between host and device since start, by "
           "direction.");
  e.Sample("ferry_daemon_transfer_seconds_total", static_cast<double>(t.h2d_ns) / 1e9,
           "direction=\"upload\"");
  e.Sample("ferry_daemon_transfer_seconds_total", static_cast<double>(t.d2h_ns) / 1e9,
           "direction=\"download\"");
  e.Metric("ferry_usage_identities", "gauge",
           "Usage identities kept now, each with series of its own (at most "
           "metrics-max-identities, and one uid=\"other\").",
           identities.size());
  e.Metric("ferry_usage_identities_folded_total", "counter",
           "Sessions accounted to uid=\"other\" or client=\"other\": past "
           "metrics-max-identities, or past a uid's 16 client names.",
           c.parts.registry->usage_folds());
  e.Metric("ferry_usage_identities_expired_total", "counter",
           "Usage identities forgotten since start, none of their sessions open for "
           "metrics-identity-idle-timeout.",
           c.parts.registry->usage_expiries());
}

// The exposition's part about how work is let onto the device: queued commands, lanes, copy turns,
// rings.
void RenderScheduling(Exposition& e, const SessionServiceContext& c) {
  e.Metric("ferry_queued_commands", "gauge",
           "Device commands all sessions keep queued on the device now (see queued-commands).",
           c.parts.registry->launch_room().queued());
  e.Metric("ferry_queued_commands_limit", "gauge", "queued-commands (0: no limit).",
           c.parts.registry->launch_room().limit());
  e.Metric("ferry_enqueue_pauses_total", "counter",
           "Times a submit stopped enqueueing because its session (session-queued-commands) "
           "or all sessions (queued-commands) had their most commands on the device (it goes "
           "on as earlier work completes), since start.",
           c.parts.registry->enqueue_pauses());
  e.Metric("ferry_enqueue_yields_total", "counter",
           "Times a long submit stopped enqueueing at the end of its slice (about 2 ms), to go "
           "on after other sessions' queued work, since start.",
           c.parts.registry->enqueue_yields());
  e.Metric("ferry_long_lane_turns_total", "counter",
           "Times a session's work went on on the long lane (threads no other session's "
           "work waits for) for work no slice cuts: a graph of more than 1024 recorded ops "
           "instantiated, inline transfers copied without staging, a submit that loads a "
           "module or has more than 65536 ops read and admitted, since start.",
           c.parts.registry->long_lane_turns());
  e.Metric("ferry_long_lane_waiting", "gauge",
           "Long-lane work waiting now for a long-lane thread, or for its identity's turn (one "
           "identity runs at most the long-lane threads less one at once).",
           c.parts.long_lane ? c.parts.long_lane->waiting() : 0);
  session::CopyTurns::Stats turns;
  if (c.parts.copy_turns) turns = c.parts.copy_turns->stats();
  e.Metric("ferry_copy_turn_waits_total", "counter",
           "Large-copy submits that waited for a copy turn, since start.", turns.waits);
  e.Metric("ferry_copy_turns_waiting", "gauge", "Large-copy submits waiting for a turn now.",
           turns.waiting);
  e.Family("ferry_copy_turns_held", "gauge", "Copy turns taken now, per direction.");
  e.Sample("ferry_copy_turns_held", turns.held_to_device, "direction=\"upload\"");
  e.Sample("ferry_copy_turns_held", turns.held_to_host, "direction=\"download\"");
  uint64_t rings = 0, ring_messages = 0;
  if (c.parts.ring_poller) {
    rings = c.parts.ring_poller->rings();
    ring_messages = c.parts.ring_poller->records_total();
  }
  e.Metric("ferry_submit_rings", "gauge", "Submit rings of open local sessions.", rings);
  e.Metric("ferry_submit_ring_messages_total", "counter",
           "Messages taken from local sessions' submit rings, since start.", ring_messages);
}

// The exposition's part about what the daemon holds for clients, and this endpoint's evictions.
void RenderBackpressure(Exposition& e, const SessionServiceContext& c,
                        const MetricsEndpointStats& endpoint) {
  e.Metric("ferry_stream_unanswered_messages", "gauge",
           "Submit and Synchronize messages accepted whose answer is not yet written, all "
           "streams (each session's counts toward its max-in-flight).",
           static_cast<double>(std::max<int64_t>(0, c.gauges.unanswered.load())));
  e.Metric("ferry_stream_in_flight_bytes", "gauge",
           "Bytes sessions' submits are charged from being read until their Completed is "
           "written, all streams (each session's counts toward session-in-flight-bytes).",
           static_cast<double>(std::max<int64_t>(0, c.gauges.bytes_in_flight.load())));
  e.Metric("ferry_in_flight_bytes", "gauge",
           "Bytes accepted submits of all sessions hold in the daemon until answered "
           "(in-flight-bytes bounds it; refused submits are not counted).",
           static_cast<double>(c.parts.registry->in_flight_bytes()));
  e.Metric("ferry_in_flight_bytes_limit", "gauge", "The daemon's in-flight-bytes limit (0: none).",
           static_cast<double>(c.parts.registry->in_flight_bytes_limit()));
  e.Metric("ferry_objects", "gauge",
           "Objects all sessions hold (live tensors, modules, graphs, recorded graph ops), "
           "with the reservations of submits being enqueued.",
           static_cast<double>(c.parts.registry->objects()));
  e.Metric("ferry_objects_limit", "gauge", "The daemon's max-objects limit (0: none).",
           static_cast<double>(c.parts.registry->objects_limit()));
  e.Metric("ferry_stream_unsent_messages", "gauge",
           "Server messages queued and not yet written, all streams.",
           static_cast<double>(std::max<int64_t>(0, c.gauges.unsent.load())));
  e.Metric("ferry_stream_unsent_bytes", "gauge",
           "Bytes of server messages queued and not yet written (download bytes plus an "
           "estimate per message), all streams.",
           static_cast<double>(std::max<int64_t>(0, c.gauges.unsent_bytes.load())));
  e.Metric("ferry_streams_paused", "gauge",
           "Session streams whose reading a limit stops now (backpressure).",
           static_cast<double>(std::max<int64_t>(0, c.gauges.streams_paused.load())));
  e.Metric("ferry_stream_read_pauses_total", "counter",
           "Times a session stream stopped reading at a limit, since start.",
           static_cast<double>(c.gauges.read_pauses_total.load()));
  e.Metric("ferry_submit_ring_doorbell_mutes_total", "counter",
           "Times a ring's doorbell was muted for a storm of empty wake-ups, since start.",
           c.parts.ring_poller ? c.parts.ring_poller->doorbell_mutes_total() : 0);
  e.Family("ferry_metrics_connections_evicted_total", "counter",
           "Connections to this metrics endpoint closed to make room for a new one (it holds "
           "at most 64), since start, by what they were doing: waiting for their request, or "
           "answering it.");
  e.Sample("ferry_metrics_connections_evicted_total", endpoint.evicted_waiting,
           "state=\"waiting\"");
  e.Sample("ferry_metrics_connections_evicted_total", endpoint.evicted_answering,
           "state=\"answering\"");
}

// The exposition's part about the submit latency histograms.
void RenderLatency(Exposition& e, const SessionServiceContext& c) {
  auto histogram = [&e](const LatencyHistogram* hist, const std::string& name, const char* help) {
    if (!hist) return;
    const LatencyHistogram::Snapshot h = hist->snapshot();
    e.Family(name.c_str(), "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < LatencyHistogram::kBoundsSeconds.size(); ++i) {
      cumulative += h.buckets[i];
      std::ostringstream le;
      le << LatencyHistogram::kBoundsSeconds[i];
      e.Sample(name + "_bucket", cumulative, "le=\"" + le.str() + "\"");
    }
    e.Sample(name + "_bucket", h.count, "le=\"+Inf\"");
    e.Sample(name + "_sum", h.sum_seconds);
    e.Sample(name + "_count", h.count);
  };
  histogram(c.latency.submit_latency, "ferry_submit_latency_seconds",
            "Submit round trip inside ferryd: received from the client to completion sent.");
  histogram(c.latency.transfer_latency, "ferry_transfer_latency_seconds",
            "The same, for submits that move bytes (uploads and downloads, inline or through "
            "shared memory).");
}

}  // namespace

std::string RenderMetrics(const SessionServiceContext& c,
                          std::chrono::steady_clock::time_point started_at,
                          const MetricsEndpointStats& endpoint) {
  const backend::DeviceInfo info = c.parts.device->info();
  const session::DaemonTotals t = c.parts.registry->Totals();
  Exposition e("gpu=\"" + std::to_string(info.ordinal) + "\",UUID=\"" + EscapeLabel(info.uuid) +
               "\"");
  RenderDaemonState(e, c, info, t, started_at);
  RenderStreams(e, c);
  RenderWorkAndDevice(e, c, info, t);
  RenderSlabs(e, c);
  RenderIdentityLimits(e, c);
  RenderIdentityUsage(e, c, t);
  RenderScheduling(e, c);
  RenderBackpressure(e, c, endpoint);
  RenderLatency(e, c);
  return e.str();
}

// --- the bearer token -----------------------------------------------------------------------

Result<std::vector<std::string>> LoadMetricsTokens(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::vector<TokenFileLine> lines,
                         ReadTokenFile(path, "metrics token file"));
  std::vector<std::string> tokens;
  for (TokenFileLine& line : lines) {
    if (line.words.size() > 1) {
      return Status(ErrorKind::kInvalidArgument, "metrics token file " + path + " line " +
                                                     std::to_string(line.number) +
                                                     ": expected one token, without blanks");
    }
    tokens.push_back(std::move(line.words[0]));
  }
  return tokens;
}

bool MetricsRequestAuthorized(const std::vector<std::string>& tokens,
                              const std::string_view* authorization) {
  if (!authorization) return false;
  constexpr std::string_view kScheme = "bearer";
  std::string_view value = *authorization;
  if (value.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return false;
  }
  if (value[kScheme.size()] != ' ') return false;
  value.remove_prefix(kScheme.size());
  value.remove_prefix(std::min(value.size(), value.find_first_not_of(' ')));
  bool match = false;
  for (const std::string& token : tokens) match |= ConstantTimeEquals(value, token);
  return match;
}

// --- MetricsServer -------------------------------------------------------------------------

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kMaxRequestBytes = 8192;
// How long a connection is held, from its accept: its request must arrive and its answer be
// written within it, else it is closed.
constexpr auto kRequestTimeout = std::chrono::seconds(5);
// Connections held at once (ConnectionTable): without --metrics-token-file the endpoint has no
// authentication, and with it a connection is still held until its request is read. Each is a
// descriptor: a bound, so that a flood of them cannot take the descriptors every client of the
// daemon needs.
constexpr size_t kMaxConnections = 64;
// After accept fails (out of descriptors), it is tried again this much later, not at once.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

using RenderFunction = std::function<std::string(const MetricsEndpointStats&)>;

class HttpConnection;

// The connections the endpoint holds, in the order they were accepted, and what it counts of
// them. The io thread's alone, like every connection, the acceptor and the render: no lock.
//
// It holds at most kMaxConnections (with, for a moment, the one just accepted). A connection
// accepted while it holds that many takes the place of one it closes (MakeRoom): the oldest
// one still waiting for its request, or, when every one has sent its request, the oldest of
// those (its answer is cut short, so that peers that read their answers slowly cannot hold
// every slot either). So connections that send nothing, or not all of their request, cannot
// keep a scraper out: a new connection always gets in, and one that has sent its request is
// closed only while no connection waits for one. A flood of idle connections turns a scrape
// away only by having kMaxConnections connections accepted after the scraper's and before its
// request is read (fewer while some are being answered); a scraper sends its request as soon
// as it connects. Eviction aside, whatever a connection does, it is closed kRequestTimeout
// after its accept.
class ConnectionTable {
 public:
  using Slot = std::list<HttpConnection*>::iterator;

  // Before one more connection is added: when the table is full, close the connection to
  // evict (which leaves the table at once, its descriptor closed).
  void MakeRoom();
  // Hold `connection` (there must be room), until Remove(the returned slot).
  Slot Add(HttpConnection* connection) { return held_.insert(held_.end(), connection); }
  void Remove(Slot slot) { held_.erase(slot); }

  const MetricsEndpointStats& stats() const { return stats_; }

 private:
  std::list<HttpConnection*> held_;  // oldest first
  MetricsEndpointStats stats_;
};

// One HTTP exchange: read a request (its headers), answer it, close. Held by the handlers it
// has pending (a shared_ptr each), and in its table from its construction until Close or its
// destruction, whichever comes first.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // `table` must have room (MakeRoom); `tokens` empty: no token needed.
  HttpConnection(tcp::socket socket, const RenderFunction* render,
                 const std::vector<std::string>* tokens, ConnectionTable* table)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        request_(kMaxRequestBytes),
        render_(render),
        tokens_(tokens),
        table_(table),
        slot_(table->Add(this)) {}
  ~HttpConnection() { LeaveTable(); }

  void Start() {
    auto self = shared_from_this();
    timer_.expires_after(kRequestTimeout);
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->Close();
    });
    asio::async_read_until(socket_, request_, "\r\n\r\n",
                           [self](const boost::system::error_code& ec, size_t) {
                             // Evicted (closed) after its read completed, before this ran.
                             if (!self->slot_) return;
                             if (ec) {
                               // Too large a request, or the peer went away.
                               if (ec == asio::error::not_found) {
                                 self->answering_ = true;
                                 self->Reply("431 Request Header Fields Too Large", "text/plain",
                                             "request too large\n");
                               } else {
                                 self->Close();
                               }
                               return;
                             }
                             self->answering_ = true;
                             self->HandleRequest();
                           });
  }

  // Whether its request has been read (its answer is being written): the table evicts such a
  // connection only when none is waiting for its request.
  bool answering() const { return answering_; }

  // Close the socket (its pending handlers finish with an error) and leave the table. Safe to
  // call again.
  void Close() {
    boost::system::error_code ec;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    LeaveTable();
  }

 private:
  void HandleRequest() {
    std::istream in(&request_);
    std::string line;
    std::getline(in, line);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream words(line);
    std::string method, target, version;
    words >> method >> target >> version;
    if (version.rfind("HTTP/1.", 0) != 0) {
      return Reply("400 Bad Request", "text/plain", "bad request\n");
    }
    if (!tokens_->empty()) {
      std::optional<std::string> authorization = Authorization(in);
      std::optional<std::string_view> value;
      if (authorization) value = *authorization;
      if (!MetricsRequestAuthorized(*tokens_, value ? &*value : nullptr)) {
        return Reply("401 Unauthorized", "text/plain", "unauthorized\n", std::string::npos,
                     "WWW-Authenticate: Bearer\r\n");
      }
    }
    std::string path = target.substr(0, target.find('?'));
    if (path != "/metrics") return Reply("404 Not Found", "text/plain", "not found\n");
    if (method != "GET" && method != "HEAD") {
      return Reply("405 Method Not Allowed", "text/plain", "GET only\n");
    }
    std::string body = (*render_)(table_->stats());
    Reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", method == "HEAD" ? "" : body,
          body.size());
  }

  // The value of the request's first Authorization header, surrounding whitespace removed;
  // none when it has none. Reads `in` (the headers after the request line) up to their end.
  static std::optional<std::string> Authorization(std::istream& in) {
    std::optional<std::string> value;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) break;  // end of the headers
      const size_t colon = line.find(':');
      if (value || colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (name != "authorization") continue;
      const size_t begin = line.find_first_not_of(" \t", colon + 1);
      const size_t end = line.find_last_not_of(" \t");
      value = begin == std::string::npos ? "" : line.substr(begin, end - begin + 1);
    }
    return value;
  }

  // `headers`: further header lines, each ending in "\r\n".
  void Reply(const std::string& status, const std::string& type, std::string body,
             size_t length = std::string::npos, const std::string& headers = "") {
    response_ = "HTTP/1.1 " + status + "\r\n" + headers + "Content-Type: " + type +
                "\r\nContent-Length: " +
                std::to_string(length == std::string::npos ? body.size() : length) +
                "\r\nConnection: close\r\n\r\n" + body;
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(response_),
                      [self](const boost::system::error_code&, size_t) { self->Close(); });
  }

  void LeaveTable() {
    if (!slot_) return;
    table_->Remove(*slot_);
    slot_.reset();
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf request_;
  std::string response_;
  const RenderFunction* render_;
  const std::vector<std::string>* tokens_;
  ConnectionTable* table_;
  std::optional<ConnectionTable::Slot> slot_;  // none once closed
  bool answering_ = false;
};

void ConnectionTable::MakeRoom() {
  if (held_.size() < kMaxConnections) return;
  auto evicted = std::find_if(held_.begin(), held_.end(),
                              [](const HttpConnection* c) { return !c->answering(); });
  if (evicted != held_.end()) {
    ++stats_.evicted_waiting;
  } else {
    evicted = held_.begin();
    ++stats_.evicted_answering;
  }
  (*evicted)->Close();  // erases it from held_
}

}  // namespace

struct MetricsServer::Impl {
  // Before io: connections still queued in io when it goes take themselves out of it.
  ConnectionTable connections;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  RenderFunction render;
  std::vector<std::string> tokens;  // empty: no token needed
  std::string endpoint;
  std::thread thread;
  asio::steady_timer backoff{io};

  void Accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {  // e.g. out of descriptors: not again at once (it would spin)
        backoff.expires_after(kAcceptBackoff);
        backoff.async_wait([this](const boost::system::error_code& wait) {
          if (!wait) Accept();
        });
        return;
      }
      connections.MakeRoom();
      std::make_shared<HttpConnection>(std::move(socket), &render, &tokens, &connections)->Start();
      Accept();
    });
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host_port,
                                                            RenderFunction render,
                                                            std::vector<std::string> tokens) {
  size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size()) {
    return Status(ErrorKind::kInvalidArgument, "metrics: expected HOST:PORT, got " + host_port);
  }
  std::string host = host_port.substr(0, colon);
  std::string port = host_port.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  impl->tokens = std::move(tokens);
  boost::system::error_code ec;
  tcp::resolver resolver(impl->io);
  auto results = resolver.resolve(host, port, tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return Status(ErrorKind::kInvalidArgument,
                  "metrics: cannot resolve " + host_port + ": " + ec.message());
  }
  tcp::endpoint ep = results.begin()->endpoint();
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(ErrorKind::kUnavailable,
                  "metrics: cannot listen on " + host_port + ": " + ec.message());
  }
  tcp::endpoint bound = impl->acceptor.local_endpoint(ec);
  std::string bound_host = bound.address().to_string();
  if (bound.address().is_v6()) bound_host = "[" + bound_host + "]";
  impl->endpoint = bound_host + ":" + std::to_string(bound.port());
  impl->Accept();
  impl->thread = std::thread([io = &impl->io] {
    pthread_setname_np(pthread_self(), "ferry-metrics");
    io->run();
  });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::~MetricsServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ec;
    impl->acceptor.close(ec);
  });
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

const std::string& MetricsServer::endpoint() const { return impl_->endpoint; }

}  // namespace ferry::rpc
