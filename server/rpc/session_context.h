// What every session stream shares with the daemon: its gauges, the limits granted at Open,
// the daemon's objects a session uses, who may do what, and where latencies go
// (SessionServiceContext). The daemon owns one; it outlives every stream.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "ferry/mutex.h"
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

namespace ferry::rpc {

/// A session stream, as the drain broadcast sees it.
class DrainListener {
 public:
  virtual ~DrainListener() = default;
  /// Tell the client the daemon is draining; called from any thread.
  virtual void NotifyDraining(uint64_t grace_ms) = 0;
};

/// Counters every stream updates and the drain (Daemon::Shutdown) and the metrics read;
/// atomics, plus the open streams for the drain broadcast under their own lock.
struct StreamGauges {
  /// Open session streams, for the drain broadcast.
  Mutex streams_mu;
  std::map<const DrainListener*, std::weak_ptr<DrainListener>> streams ABSL_GUARDED_BY(streams_mu);
  /// Server messages queued and not yet written, over all streams: a drain waits for 0.
  std::atomic<int64_t> unsent{0};
  /// Client messages taken from a stream or a submit ring and not yet handled by their
  /// session (queued on its executor): a drain waits for 0, so none is lost.
  std::atomic<int64_t> messages_in_hand{0};
  /// Backpressure, over all streams (metrics): Submit and Synchronize messages accepted whose
  /// answer (Completed, Synchronized) is not yet written; the bytes their sessions hold for
  /// them (SessionConfig::max_in_flight_bytes); bytes of server messages queued and not yet
  /// written; streams whose reading a limit stops now, and how often one has stopped.
  std::atomic<int64_t> unanswered{0};
  std::atomic<int64_t> bytes_in_flight{0};
  std::atomic<int64_t> unsent_bytes{0};
  std::atomic<int64_t> streams_paused{0};
  std::atomic<uint64_t> read_pauses_total{0};
  /// Streams ended because they sent no Open within the open timeout, since start.
  std::atomic<uint64_t> open_timeouts_total{0};
  /// Streams cancelled because, with no session left, their last writes were not read within
  /// the open timeout (a client that never reads), since start.
  std::atomic<uint64_t> finish_timeouts_total{0};
  std::atomic<uint64_t> streams_started_total{0};  // session streams the daemon took
  std::atomic<uint64_t> streams_kept_total{0};     // sessions closed with their stream kept
  std::atomic<uint64_t> slabs_kept_total{0};       // slabs a session took over from the last one
  /// Set while draining: new sessions are refused with UNAVAILABLE.
  std::atomic<bool> draining{false};
};

/// What a stream grants at Open: set once by the daemon, read-only afterwards.
struct SessionLimits {
  /// Defaults granted when the client asks for 0, and the most a client may ask for.
  session::SessionConfig defaults;
  uint64_t max_device_bytes_quota = 0;
  uint32_t max_in_flight_submits = 0;
  uint64_t max_message_bytes = 0;
  uint64_t session_pinned_quota = 0;  // slab bytes one session may hold (0: no limit)
  uint64_t submit_ring_bytes = 0;     // each local session's ring (with a poller)
  /// How long a stream may take to send its Open before it is ended (0: no deadline).
  std::chrono::milliseconds open_timeout{0};
};

/// The daemon's objects a session uses (the daemon owns them; they outlive every session).
struct DaemonParts {
  session::DeviceSupervisor* device = nullptr;
  session::SessionRegistry* registry = nullptr;
  boost::asio::io_context* io = nullptr;
  /// The sessions' long lane (session::LongLane): threads no session's other work waits for,
  /// for work no slice cuts; may be null (none: such work runs on `io`).
  session::LongLane* long_lane = nullptr;
  /// The shared-memory pool and its socket; null when the daemon has no local endpoint.
  pool::SlabPool* slab_pool = nullptr;
  transport::SlabBroker* slab_broker = nullptr;
  pool::StagingArea* staging = nullptr;      // stages remote clients' inline transfers; may be null
  session::CopyTurns* copy_turns = nullptr;  // turns for large copies; may be null (none)
  transport::RingPoller* ring_poller = nullptr;  // takes local sessions' submit rings; may be null
  /// Boards and rings made ahead for local sessions; may be null (each open makes its own).
  transport::ChannelStock* channel_stock = nullptr;
  /// Local (Unix-socket) connections and their peers' credentials; may be null.
  const LocalConnections* local_connections = nullptr;
  /// Streams that carry no session, bounded per identity and in all; may be null (no bound).
  SessionlessStreams* sessionless_streams = nullptr;
  /// Streams refused for a missing or wrong bearer token that gRPC still keeps (their client
  /// has not closed them); past its limit they are reset. May be null (every one is reset).
  SessionlessStreams* unauthenticated_streams = nullptr;
};

/// Who may do what: the streams' and the Admin service's checks. Read-only after start.
struct AccessPolicy {
  /// Remote access: the bearer token TCP peers must send (null: none), and whether TCP
  /// peers may load and launch raw kernels.
  const TokenChecker* token = nullptr;
  bool allow_remote_raw_kernels = false;
  /// Local peers allowed raw kernels (everyone else is refused PERMISSION_DENIED).
  AccessList raw_kernels;
  /// Who may call Admin.Drain and see every session in Admin.ListSessions.
  AdminPolicy admin;
};

/// Where streams record latencies for the metrics; each may be null.
struct LatencySinks {
  /// Submit round trips (received to completion sent).
  LatencyHistogram* submit_latency = nullptr;
  /// The same, for submits that move bytes.
  LatencyHistogram* transfer_latency = nullptr;
};

/// What every session stream needs from the daemon, grouped by who writes and who reads
/// it. Outlives all sessions.
struct SessionServiceContext {
  StreamGauges gauges;   // written by every stream; read by the drain and the metrics
  SessionLimits limits;  // read at Open
  DaemonParts parts;     // the objects sessions use
  AccessPolicy access;   // read by the streams' and the Admin service's checks
  LatencySinks latency;  // written by streams, read by the metrics
};

}  // namespace ferry::rpc
