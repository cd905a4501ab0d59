// Daemon-wide view of the sessions: ids, daemon-wide device-memory cap, totals, and the
// snapshots ferryctl and the Admin service read.
//
// Thread-safe: sessions update it from their executors, the Admin service reads it from
// gRPC threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ferry::session {

/// Counters of one session. Written only by its executor, read by anyone.
struct SessionCounters {
  std::atomic<uint64_t> submits{0};
  std::atomic<uint64_t> failed_submits{0};
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> kernel_launches{0};
  std::atomic<uint64_t> bytes_uploaded{0};
  std::atomic<uint64_t> bytes_downloaded{0};
  std::atomic<uint64_t> tensors_created{0};
  std::atomic<uint64_t> peak_device_bytes{0};
  std::atomic<uint64_t> device_busy_ns{0};
  std::atomic<uint64_t> graph_launches{0};
  std::atomic<uint64_t> kernel_batches{0};
  // Gauges.
  std::atomic<uint64_t> submits_in_flight{0};
  std::atomic<uint64_t> device_bytes{0};
  std::atomic<uint64_t> live_tensors{0};
};

/// Who opened a session: its transport address and, for a local client, the credentials
/// the kernel reported for its Unix-socket connection (SO_PEERCRED).
struct PeerIdentity {
  std::string address;          // "unix:/run/ferry/ferryd-0.sock", "ipv4:127.0.0.1:51234", ...
  std::optional<uint32_t> uid;  // set only for local clients
  std::optional<int32_t> pid;
  /// A client on this machine, reached through a Unix socket: it may use shared memory.
  bool local() const { return uid.has_value(); }
};

/// What the registry knows of one open session.
struct SessionEntry {
  uint64_t id = 0;
  std::string client_name;
  PeerIdentity peer;
  std::chrono::steady_clock::time_point opened_at;
  std::shared_ptr<const SessionCounters> counters;
};

struct DaemonTotals {
  uint64_t sessions_open = 0;
  uint64_t sessions_total = 0;
  uint64_t submits_in_flight = 0;
  uint64_t device_bytes_reserved = 0;
  uint64_t live_tensors = 0;
  uint64_t submits = 0;
  uint64_t ops = 0;
  uint64_t bytes_uploaded = 0;
  uint64_t bytes_downloaded = 0;
};

class SessionRegistry {
 public:
  /// `device_bytes_cap`: the most device memory all sessions together may hold;
  /// `max_sessions`: the most sessions open at once.
  SessionRegistry(uint64_t device_bytes_cap, uint32_t max_sessions)
      : device_bytes_cap_(device_bytes_cap), max_sessions_(max_sessions) {}

  /// Register a new session and return its id, or 0 when max_sessions are open.
  uint64_t Add(std::string client_name, PeerIdentity peer,
               std::shared_ptr<const SessionCounters> counters);
  /// Unregister a session, folding its counters into the daemon totals.
  void Remove(uint64_t id);

  /// Reserve device bytes under the daemon-wide cap; false (nothing reserved) when over.
  bool TryReserveDeviceBytes(uint64_t bytes);
  void ReleaseDeviceBytes(uint64_t bytes);

  std::vector<SessionEntry> List() const;
  DaemonTotals Totals() const;
  uint64_t device_bytes_cap() const { return device_bytes_cap_; }

 private:
  const uint64_t device_bytes_cap_;
  const uint32_t max_sessions_;
  std::atomic<uint64_t> device_bytes_reserved_{0};

  mutable std::mutex mu_;
  std::map<uint64_t, SessionEntry> sessions_;  // guarded by mu_
  uint64_t next_id_ = 1;                       // guarded by mu_
  uint64_t sessions_total_ = 0;                // guarded by mu_
  // Counters of closed sessions, guarded by mu_.
  uint64_t closed_submits_ = 0, closed_ops_ = 0, closed_up_ = 0, closed_down_ = 0;
};

}  // namespace ferry::session
