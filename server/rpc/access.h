// Who may do what: the local uids and gids that config lists for raw kernels (raw-kernels)
// and admin calls (admins, admin-group), and the groups a uid belongs to.
//
// Local peers are known by the uid SO_PEERCRED gave at accept; their groups are looked up
// in the user database (getpwuid_r, getgrouplist: the uid's primary gid and supplementary
// groups), which may block on a network name service: call from an executor or a gRPC
// thread, never while holding a lock others wait on. A uid with no user-database entry has no
// groups: only its uid can match.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/status.h"

namespace ferry::rpc {

/// A set of local uids and gids. Immutable after Parse; thread-safe.
class AccessList {
 public:
  AccessList() = default;

  /// Parse "uid:1000,gid:gpuadmin,uid:root" (uids and gids by number or by name; spaces
  /// around entries ignored; "" is the empty list). Names are resolved now: an unknown user
  /// or group is INVALID_ARGUMENT, as is any entry not of the form uid:X or gid:X.
  static Result<AccessList> Parse(std::string_view text);

  bool empty() const { return uids_.empty() && gids_.empty(); }
  /// True when it lists groups: Admits(uid) then looks the uid's groups up (which may block).
  bool lists_groups() const { return !gids_.empty(); }
  /// True when `uid`, or one of `groups`, is listed.
  bool Admits(uid_t uid, const std::vector<gid_t>& groups) const;
  /// True when `uid`, or a group it belongs to (GroupsOfUid), is listed.
  bool Admits(uid_t uid) const;

 private:
  std::set<uid_t> uids_;
  std::set<gid_t> gids_;
};

/// Return the groups of `uid`: its primary gid and its supplementary groups from the user
/// database; empty when the uid has no entry.
std::vector<gid_t> GroupsOfUid(uid_t uid);

/// Resolve a group given by name or number; INVALID_ARGUMENT when there is no such group
/// name (a number is taken as it is).
Result<gid_t> ResolveGroup(std::string_view name_or_number);

/// The callers trusted with admin calls (Drain, the full session list): the daemon's own uid
/// always (it can stop the daemon anyway, and a container's preStop drain runs as it), and
/// the local peers of `admins` (config `admins`, default uid:0; root is no admin where the
/// list leaves it out: a container running as root is uid 0 to SO_PEERCRED). Remote peers are
/// never asked. Immutable; thread-safe.
class AdminPolicy {
 public:
  /// Root and the daemon's uid.
  AdminPolicy();
  explicit AdminPolicy(AccessList admins, uid_t daemon_uid = ::geteuid())
      : daemon_uid_(daemon_uid), admins_(std::move(admins)) {}
  /// True when local peer `uid` is an admin (looks up its groups when `admins` lists a gid).
  bool IsAdmin(uid_t uid) const;

 private:
  uid_t daemon_uid_;
  AccessList admins_;
};

}  // namespace ferry::rpc
