// Daemon-wide view of the sessions: ids, daemon-wide device-memory cap, per-identity (uid)
// limits and usage, totals, and the snapshots ferryctl and the Admin service read.
//
// Per-identity limits: every session is charged to an identity, "uid:N" for a local client
// (its SO_PEERCRED uid), "remote:NAME" for a TCP peer that sent a named tenant's token
// (token-file), or "remote" for every other TCP peer together. Each identity has limits on
// its sessions, device bytes, pinned (slab) bytes, submits in flight, the bytes its
// submits hold in the daemon (in-flight bytes), the objects its sessions hold (live
// tensors, modules, graphs and the ops recorded into them) and the device commands they keep
// queued (its LaunchShare of the LaunchRoom), from the rules of `uid-limits`
// (UidLimitRule; docs/operations.md "Per-uid limits"). The daemon's own uid, and root while
// config `admins` lists it, are exempt unless a uid: rule names them.
//
// Thread-safe: sessions update it from their executors, the Admin service reads it from
// gRPC threads; a UidAccount's counters are atomics any thread may charge.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "pool/session_slabs.h"
#include "pool/staging.h"
#include "session/launch_room.h"

namespace ferry::session {

/// One limit of a uid-limits rule: unset (inherit the default rule's), none (no limit), an
/// amount, or a percentage of the daemon-wide value (max-sessions, the device-memory cap,
/// pinned-budget, in-flight-bytes, max-objects, queued-commands; not for inflight).
struct UidLimit {
  enum class Kind { kUnset, kNone, kAmount, kPercent };
  Kind kind = Kind::kUnset;
  uint64_t value = 0;
  bool operator==(const UidLimit& o) const { return kind == o.kind && value == o.value; }
};

/// One `uid-limits` rule: "SELECTOR:KEY=VALUE[,KEY=VALUE...]" where SELECTOR is default,
/// remote, remote:NAME, uid:N or gid:N and KEY is sessions, device, pinned, inflight,
/// inflight-bytes, objects or queued. A remote rule applies to every remote identity (the
/// shared one and each named tenant, each its own budget) that no remote:NAME rule names.
struct UidLimitRule {
  enum class Match { kDefault, kRemote, kUid, kGid };
  Match match = Match::kDefault;
  uint32_t id = 0;     // the uid or gid
  std::string tenant;  // kRemote: the tenant it names ("": every remote identity)
  UidLimit sessions, device, pinned, inflight, inflight_bytes, objects, queued;
  bool operator==(const UidLimitRule& o) const {
    return match == o.match && id == o.id && tenant == o.tenant && sessions == o.sessions &&
           device == o.device && pinned == o.pinned && inflight == o.inflight &&
           inflight_bytes == o.inflight_bytes && objects == o.objects && queued == o.queued;
  }
};

/// The rule in force when none is configured: each identity may hold half of the sessions,
/// of the device memory cap, of the pinned budget, of the daemon's in-flight bytes, of its
/// objects and of its queued device commands, and 4096 submits in flight.
UidLimitRule DefaultUidLimitRule();
/// Parse one rule (the value of a `uid-limits` line); INVALID_ARGUMENT naming what is wrong.
Result<UidLimitRule> ParseUidLimitRule(const std::string& text);
/// The rule as ParseUidLimitRule reads it back.
std::string FormatUidLimitRule(const UidLimitRule& rule);

/// Limits resolved to amounts; 0: no limit.
struct ResolvedUidLimits {
  uint64_t sessions = 0, device_bytes = 0, pinned_bytes = 0, inflight = 0, in_flight_bytes = 0,
           objects = 0, queued_commands = 0;
};

/// What one identity holds now, against its limits.
struct UidUsage {
  std::string identity;  // "uid:1000", "remote"
  uint64_t sessions = 0, device_bytes = 0, pinned_bytes = 0, inflight = 0, in_flight_bytes = 0,
           objects = 0, queued_commands = 0;
  ResolvedUidLimits limits;
};

/// The usage of one identity and its limits. Shared by the registry and the identity's
/// sessions and slab sets (which may outlive the registry entry of their session); every
/// charge is an atomic check-and-add, so it holds across sessions on different executors.
class UidAccount : public pool::PinnedCharge {
 public:
  UidAccount(std::string identity, ResolvedUidLimits limits)
      : identity_(std::move(identity)), limits_(limits), launch_share_(limits.queued_commands) {}
  const std::string& identity() const { return identity_; }
  const ResolvedUidLimits& limits() const { return limits_; }

  /// QUOTA_EXCEEDED, naming the identity and the limit, when `bytes` more would pass it.
  Status ChargeDeviceBytes(uint64_t bytes);
  void RefundDeviceBytes(uint64_t bytes) { device_bytes_ -= bytes; }
  Status ChargeInflight();
  void RefundInflight() { --inflight_; }
  /// The bytes the identity's submits hold in the daemon, read and not yet answered
  /// (SessionRegistry::ChargeInFlightBytes charges them).
  uint64_t in_flight_bytes() const { return in_flight_bytes_.load(); }
  /// The objects the identity's sessions hold (SessionRegistry::ChargeObjects).
  uint64_t objects() const { return objects_.load(); }
  /// The identity's part of the daemon's LaunchRoom (uid-limits queued).
  LaunchShare& launch_share() { return launch_share_; }
  /// What the identity's sessions hold of staging, against its share (half; StagingArea).
  const std::shared_ptr<pool::StagingHolder>& staging_holder() const { return staging_holder_; }
  Status TryCharge(uint64_t bytes) override;  // pinned bytes
  void Refund(uint64_t bytes) override { pinned_bytes_ -= bytes; }

  UidUsage Usage() const;

 private:
  friend class SessionRegistry;
  Status Charge(std::atomic<uint64_t>& used, uint64_t amount, uint64_t limit, const char* what,
                const char* setting);
  const std::string identity_;
  const ResolvedUidLimits limits_;
  std::atomic<uint64_t> sessions_{0}, device_bytes_{0}, pinned_bytes_{0}, inflight_{0},
      in_flight_bytes_{0}, objects_{0};
  LaunchShare launch_share_;
  const std::shared_ptr<pool::StagingHolder> staging_holder_ =
      std::make_shared<pool::StagingHolder>();
};

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
  std::atomic<uint64_t> device_busy_ns{0};  // from the stream's Usage, after each completion
  std::atomic<uint64_t> h2d_bytes{0}, h2d_ns{0}, d2h_bytes{0}, d2h_ns{0};  // the same
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
  std::optional<uint32_t> gid;  // the peer's gid at connect (SO_PEERCRED); local clients only
  std::string tenant;           // a TCP peer's tenant: the name of the token it sent ("": none)
  bool tcp = false;             // came in on a TCP endpoint (the gRPC server it arrived on says so)
  /// A client on this machine, reached through a Unix socket: it may use shared memory.
  bool local() const { return uid.has_value(); }
};

/// The identity `peer`'s limits and usage are kept under: "uid:N" for a local client,
/// "remote:NAME" for a TCP peer of tenant NAME, "remote" for every other TCP peer together.
std::string IdentityOf(const PeerIdentity& peer);
/// The most bytes of a client's name (Open.client_name) the daemon keeps.
inline constexpr size_t kMaxClientName = 64;
/// A client's name as the daemon keeps, logs and reports it: its first kMaxClientName bytes,
/// each outside printable ASCII replaced by '_' (the name is a tenant's free text: it must
/// not cost the daemon memory, forge log lines or reach a terminal as control sequences).
std::string CleanClientName(std::string_view name);
/// A tenant name: 1..32 of A-Z a-z 0-9 _ . -
bool IsTenantName(std::string_view name);

/// What the registry knows of one open session.
struct SessionEntry {
  uint64_t id = 0;
  std::string client_name;
  PeerIdentity peer;
  std::chrono::steady_clock::time_point opened_at;
  std::shared_ptr<const SessionCounters> counters;
  std::shared_ptr<UidAccount> account;  // the identity it is charged to
  // The usage identity its device time is accounted to (UsageByIdentity), fixed at Open.
  std::string usage_uid, usage_client;
};

/// Device usage accounted to one identity: a uid ("remote" for every TCP peer together) and
/// a client name (Open's client_name), kept after its sessions close until none of them has
/// been open for the idle timeout (SetUsageIdleTimeout). The registry bounds how many it
/// keeps at once (SetUsageIdentityLimit): past the bound a new identity folds into
/// uid "other" (client "other"), and past kMaxClientsPerUid names of one uid a new name
/// folds into client "other" of that uid, so neither a flood of uids nor of client names
/// (free text a tenant chooses) can grow the daemon's memory or the metrics without bound.
/// Expiry frees an identity's place, so the bound counts the identities in use lately, not
/// every one since start; the folded "other" identities expire the same way.
struct IdentityUsage {
  std::string uid;  // "1000", "remote" or "other"
  std::string
      client;  // as the daemon keeps it (CleanClientName: at most kMaxClientName bytes), or "other"
  uint64_t sessions_open = 0, sessions_total = 0;
  // Sums over its sessions, closed and open (SessionCounters).
  uint64_t device_busy_ns = 0, h2d_bytes = 0, h2d_ns = 0, d2h_bytes = 0, d2h_ns = 0;
  uint64_t bytes_uploaded = 0, bytes_downloaded = 0;
  uint64_t device_bytes = 0;  // held now by its open sessions
};

/// The daemon's figures. The counters sum every session since start, open and closed; they
/// are kept apart from the usage identities, so an identity's expiry takes nothing from them.
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
  // SessionCounters' device time and copies, as IdentityUsage has them per identity.
  uint64_t device_busy_ns = 0, h2d_bytes = 0, h2d_ns = 0, d2h_bytes = 0, d2h_ns = 0;
};

class SessionRegistry {
 public:
  /// `device_bytes_cap`: the most device memory all sessions together may hold;
  /// `max_sessions`: the most sessions open at once.
  SessionRegistry(uint64_t device_bytes_cap, uint32_t max_sessions)
      : device_bytes_cap_(device_bytes_cap), max_sessions_(max_sessions) {}

  /// How `gid:` rules learn a local uid's groups: the user database's (rpc::GroupsOfUid, set
  /// by the daemon before SetUidLimits), which the uid cannot choose. Where none is set, or
  /// the uid has no entry, its effective gid at connect (SO_PEERCRED) is matched instead.
  void SetGroupLookup(std::function<std::vector<gid_t>(uid_t)> groups_of_uid) {
    MutexLock lock(&mu_);
    groups_of_uid_ = std::move(groups_of_uid);
  }
  /// Set the per-identity rules (before any session opens), resolving percentages against
  /// max_sessions, the device cap and `pinned_budget`. `daemon_uid` is exempt unless a rule
  /// names it, and so is root while `root_exempt` (config `admins` lists root).
  void SetUidLimits(std::vector<UidLimitRule> rules, uint64_t pinned_budget, uint32_t daemon_uid,
                    bool root_exempt = true);
  /// The most bytes all sessions' submits may hold in the daemon together (in-flight-bytes;
  /// 0: no limit), which inflight-bytes percentages resolve against; call before
  /// SetUidLimits.
  void SetInFlightBytesLimit(uint64_t bytes) { in_flight_bytes_limit_ = bytes; }
  uint64_t in_flight_bytes_limit() const { return in_flight_bytes_limit_; }

  /// Charge a submit's `bytes` (what the daemon holds for it until it is answered) to the
  /// daemon and to `account` (may be null: charged to the daemon only); QUOTA_EXCEEDED,
  /// nothing charged, when either would pass its limit.
  Status ChargeInFlightBytes(UidAccount* account, uint64_t bytes) {
    return ChargeWithIdentity(kInFlightBytes, account, bytes);
  }
  void RefundInFlightBytes(UidAccount* account, uint64_t bytes) {
    RefundWithIdentity(kInFlightBytes, account, bytes);
  }
  /// Whether fewer than `room` bytes are left before the daemon's or `account`'s limit: a
  /// session that holds bytes then stops reading until its own answers free some.
  bool InFlightBytesRoomBelow(const UidAccount* account, uint64_t room) const;
  /// The bytes left before the daemon's or `account`'s (may be null) in-flight limit, whichever
  /// is fewer (UINT64_MAX where neither has one).
  uint64_t InFlightBytesRoom(const UidAccount* account) const;
  uint64_t in_flight_bytes() const { return in_flight_bytes_.load(); }

  /// The most objects all sessions may hold together (max-objects; 0: no limit): live
  /// tensors, modules and graphs, and the ops recorded into graphs, each of which costs
  /// daemon memory no device quota counts. objects percentages resolve against it; call
  /// before SetUidLimits.
  void SetObjectsLimit(uint64_t objects) { objects_limit_ = objects; }
  uint64_t objects_limit() const { return objects_limit_; }
  /// Charge `n` objects to the daemon and to `account` (may be null); QUOTA_EXCEEDED,
  /// nothing charged, when either would pass its limit.
  Status ChargeObjects(UidAccount* account, uint64_t n) {
    return ChargeWithIdentity(kObjects, account, n);
  }
  void RefundObjects(UidAccount* account, uint64_t n) { RefundWithIdentity(kObjects, account, n); }
  uint64_t objects() const { return objects_.load(); }

  /// Register a new session and return its id; QUOTA_EXCEEDED when max_sessions are open or
  /// its identity holds its session limit.
  Result<uint64_t> Open(std::string client_name, PeerIdentity peer,
                        std::shared_ptr<const SessionCounters> counters);
  /// Open, returning 0 when refused.
  uint64_t Add(std::string client_name, PeerIdentity peer,
               std::shared_ptr<const SessionCounters> counters) {
    auto id = Open(std::move(client_name), std::move(peer), std::move(counters));
    return id.ok() ? *id : 0;
  }
  /// The account an open session is charged to (null for an unknown id).
  std::shared_ptr<UidAccount> AccountOf(uint64_t id) const;
  /// The account `peer` is charged to, made on first use.
  std::shared_ptr<UidAccount> AccountFor(const PeerIdentity& peer);
  /// Unregister a session, folding its counters into the daemon totals.
  void Remove(uint64_t id);

  /// Reserve device bytes under the daemon-wide cap; false (nothing reserved) when over.
  bool TryReserveDeviceBytes(uint64_t bytes);
  void ReleaseDeviceBytes(uint64_t bytes);

  std::vector<SessionEntry> List() const;
  DaemonTotals Totals() const;
  /// Identities that hold anything now (a session, bytes, submits), by identity.
  std::vector<UidUsage> UsageByUid() const;

  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxClientsPerUid = 16;
  /// Keep at most `max_identities` (>= 1) usage identities (metrics-max-identities); call
  /// before sessions open.
  void SetUsageIdentityLimit(size_t max_identities);
  /// Forget a usage identity once none of its sessions has been open for `idle`
  /// (metrics-identity-idle-timeout; 0: never, every identity is kept until the daemon
  /// stops); call before sessions open. Its counters leave UsageByIdentity and stay in
  /// Totals(); a later session of the same uid and client starts it again from 0.
  void SetUsageIdleTimeout(std::chrono::milliseconds idle);
  /// Read the time usage expiry goes by from `now` instead of the steady clock.
  void SetClockForTest(std::function<Clock::time_point()> now);
  /// Every usage identity kept now, by uid then client; those idle past the timeout are
  /// forgotten first.
  std::vector<IdentityUsage> UsageByIdentity();
  /// Sessions whose identity was folded into "other" since start.
  uint64_t usage_folds() const;
  /// Usage identities forgotten for being idle (SetUsageIdleTimeout) since start.
  uint64_t usage_expiries() const;
  uint64_t device_bytes_cap() const { return device_bytes_cap_; }
  /// The device commands all sessions keep queued (queued-commands; see LaunchRoom).
  LaunchRoom& launch_room() { return launch_room_; }
  const LaunchRoom& launch_room() const { return launch_room_; }
  /// A session's submit stopped enqueueing for launch-queue room (session-queued-commands or
  /// queued-commands).
  void CountEnqueuePause() { enqueue_pauses_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t enqueue_pauses() const { return enqueue_pauses_.load(std::memory_order_relaxed); }
  /// A session's submit stopped enqueueing at the end of a slice (Session::kEnqueueSlice).
  void CountEnqueueYield() { enqueue_yields_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t enqueue_yields() const { return enqueue_yields_.load(std::memory_order_relaxed); }
  /// A session's work went to its long lane (Session::LaneFor: a large graph's
  /// instantiation, direct-path copies; Session::StartLane: a module load).
  void CountLongLaneTurn() { long_lane_turns_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t long_lane_turns() const { return long_lane_turns_.load(std::memory_order_relaxed); }

 private:
  ResolvedUidLimits Resolve(const PeerIdentity& peer) const;

  // A daemon-wide count with its share per identity (uid-limits), charged together:
  // in-flight bytes, objects.
  struct SharedLimit {
    std::atomic<uint64_t> SessionRegistry::*used;
    uint64_t SessionRegistry::*limit;  // 0: no limit
    std::atomic<uint64_t> UidAccount::*account_used;
    uint64_t ResolvedUidLimits::*account_limit;
    const char* what;     // for messages
    const char* setting;  // the daemon's setting
    const char* key;      // the uid-limits key
  };
  static const SharedLimit kInFlightBytes, kObjects;
  // Charge `amount` to the daemon's count and to `account`'s (may be null), all or nothing;
  // QUOTA_EXCEEDED naming the limit that would be passed.
  Status ChargeWithIdentity(const SharedLimit& l, UidAccount* account, uint64_t amount);
  void RefundWithIdentity(const SharedLimit& l, UidAccount* account, uint64_t amount);

  const uint64_t device_bytes_cap_;
  const uint32_t max_sessions_;
  std::atomic<uint64_t> device_bytes_reserved_{0};
  uint64_t in_flight_bytes_limit_ = 0;  // set before sessions open
  std::atomic<uint64_t> in_flight_bytes_{0};
  uint64_t objects_limit_ = 0;  // set before sessions open
  std::atomic<uint64_t> objects_{0};
  std::atomic<uint64_t> enqueue_pauses_{0};
  std::atomic<uint64_t> enqueue_yields_{0};
  std::atomic<uint64_t> long_lane_turns_{0};
  LaunchRoom launch_room_;

  mutable Mutex mu_;
  std::map<uint64_t, SessionEntry> sessions_ ABSL_GUARDED_BY(mu_);
  // Set before sessions open; none (no per-identity limits) until SetUidLimits. The
  // daemon's options carry DefaultUidLimitRule unless configured otherwise.
  std::vector<UidLimitRule> rules_;
  std::function<std::vector<gid_t>(uid_t)> groups_of_uid_;  // SetGroupLookup
  uint64_t pinned_budget_ = 0;
  uint32_t daemon_uid_ = 0;
  bool root_exempt_ = true;
  std::map<std::string, std::shared_ptr<UidAccount>> accounts_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t sessions_total_ ABSL_GUARDED_BY(mu_) = 0;
  // Counters of closed sessions.
  uint64_t closed_submits_ ABSL_GUARDED_BY(mu_) = 0, closed_ops_ ABSL_GUARDED_BY(mu_) = 0,
                           closed_up_ ABSL_GUARDED_BY(mu_) = 0,
                           closed_down_ ABSL_GUARDED_BY(mu_) = 0;
  // Device time and copies of closed sessions (DaemonTotals); its uid and client stay empty.
  IdentityUsage closed_usage_ ABSL_GUARDED_BY(mu_);

  // Usage identities (uid, client) -> what their closed sessions used; an entry exists for
  // every identity assigned and not yet expired, and so for every open session's.
  using UsageKey = std::pair<std::string, std::string>;
  struct UsageRecord {
    IdentityUsage usage;          // uid, client, sessions_total and the closed sessions' counters
    uint64_t open = 0;            // its sessions open now; it never expires while there are any
    bool counted_in_uid = false;  // counts toward usage_clients_per_uid_[usage.uid]
    // Its place in idle_usage_, while open == 0.
    std::list<std::pair<Clock::time_point, UsageKey>>::iterator idle;
  };
  std::string AssignUsageIdentityLocked(const PeerIdentity& peer, const std::string& client,
                                        std::string* uid_label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record of (uid, client), made (idle, no session) when there is none.
  UsageRecord& UsageRecordLocked(const std::string& uid, const std::string& client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `record` gains an open session (and leaves idle_usage_), or `key`'s record loses one (and
  // joins idle_usage_ when it was the last).
  void UsageOpenedLocked(UsageRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UsageClosedLocked(const UsageKey& key, UsageRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forget the records idle for usage_idle_ or longer at now_().
  void ExpireIdleUsageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t max_usage_identities_ = 256;
  std::chrono::milliseconds usage_idle_ ABSL_GUARDED_BY(mu_){0};  // 0: never expire
  std::function<Clock::time_point()> now_ ABSL_GUARDED_BY(mu_) = [] { return Clock::now(); };
  std::map<UsageKey, UsageRecord> usage_ ABSL_GUARDED_BY(mu_);
  // Records without an open session, oldest idle first: when each became idle and its key.
  // Records become idle in the clock's order, so expiry looks only at the front.
  std::list<std::pair<Clock::time_point, UsageKey>> idle_usage_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> usage_clients_per_uid_ ABSL_GUARDED_BY(mu_);
  uint64_t usage_folds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t usage_expiries_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::session
