#include "rpc/access.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

namespace ferry::rpc {
namespace {

Status Invalid(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A decimal id below the (uid_t)-1 that means "none".
bool ParseId(std::string_view s, uint32_t* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out != static_cast<uint32_t>(-1);
}

// getpw*_r / getgr*_r buffer size: sysconf's hint, at least 16 KiB (groups with many members
// need more than the usual hint; ERANGE retries with a larger one).
size_t BufferSize(int name) {
  long n = ::sysconf(name);
  return std::max<size_t>(n > 0 ? static_cast<size_t>(n) : 0, 16384);
}

// A name or number of the user (getpwnam_r, passwd::pw_uid) or group (getgrnam_r,
// group::gr_gid) database: `what` names it in errors, `size_hint` is its sysconf name.
template <typename Entry, typename Id>
Result<Id> ResolveEntry(std::string_view text, const char* what, int size_hint,
                        int (*lookup)(const char*, Entry*, char*, size_t, Entry**), Id Entry::*id) {
  uint32_t number = 0;
  if (ParseId(text, &number)) return static_cast<Id>(number);
  std::string name(text);
  std::vector<char> buf(BufferSize(size_hint));
  for (int tries = 0; tries < 8; ++tries) {
    Entry entry{};
    Entry* found = nullptr;
    int rc = lookup(name.c_str(), &entry, buf.data(), buf.size(), &found);
    if (rc == ERANGE) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (rc != 0 || !found) return Invalid("no such " + std::string(what) + " '" + name + "'");
    return found->*id;
  }
  return Invalid(std::string(what) + " '" + name + "': the " + what +
                 " database entry is too large");
}

Result<uid_t> ResolveUser(std::string_view text) {
  return ResolveEntry<passwd, uid_t>(text, "user", _SC_GETPW_R_SIZE_MAX, ::getpwnam_r,
                                     &passwd::pw_uid);
}

}  // namespace

Result<gid_t> ResolveGroup(std::string_view text) {
  return ResolveEntry<group, gid_t>(text, "group", _SC_GETGR_R_SIZE_MAX, ::getgrnam_r,
                                    &group::gr_gid);
}

Result<AccessList> AccessList::Parse(std::string_view text) {
  AccessList list;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view entry = Trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (entry.empty()) return Invalid("an empty entry (expected uid:X or gid:X)");
    if (entry.rfind("uid:", 0) == 0) {
      FERRY_ASSIGN_OR_RETURN(uid_t uid, ResolveUser(Trim(entry.substr(4))));
      list.uids_.insert(uid);
    } else if (entry.rfind("gid:", 0) == 0) {
      FERRY_ASSIGN_OR_RETURN(gid_t gid, ResolveGroup(Trim(entry.substr(4))));
      list.gids_.insert(gid);
    } else {
      return Invalid("'" + std::string(entry) + "': expected uid:USER or gid:GROUP");
    }
  }
  return list;
}

bool AccessList::Admits(uid_t uid, const std::vector<gid_t>& groups) const {
  if (uids_.count(uid)) return true;
  return std::any_of(groups.begin(), groups.end(), [&](gid_t g) { return gids_.count(g) > 0; });
}

bool AccessList::Admits(uid_t uid) const {
  if (uids_.count(uid)) return true;
  if (gids_.empty()) return false;
  return Admits(uid, GroupsOfUid(uid));
}

std::vector<gid_t> GroupsOfUid(uid_t uid) {
  std::vector<char> buf(BufferSize(_SC_GETPW_R_SIZE_MAX));
  passwd pw{};
  passwd* found = nullptr;
  for (int tries = 0; tries < 8; ++tries) {
    int rc = ::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found);
    if (rc != ERANGE) break;
    buf.resize(buf.size() * 2);
    found = nullptr;
  }
  if (!found) return {};
  std::vector<gid_t> groups(64);
  for (int tries = 0; tries < 8; ++tries) {
    int n = static_cast<int>(groups.size());
    if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) >= 0) {
      groups.resize(static_cast<size_t>(n));
      return groups;
    }
    // Too small: n now holds the number needed.
    groups.resize(static_cast<size_t>(std::max(n, static_cast<int>(groups.size()) * 2)));
  }
  return {found->pw_gid};
}

AdminPolicy::AdminPolicy() : daemon_uid_(::geteuid()) {
  Result<AccessList> root = AccessList::Parse("uid:0");
  if (root.ok()) admins_ = *std::move(root);
}

bool AdminPolicy::IsAdmin(uid_t uid) const { return uid == daemon_uid_ || admins_.Admits(uid); }

}  // namespace ferry::rpc
