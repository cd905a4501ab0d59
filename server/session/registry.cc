#include "session/registry.h"

#include <algorithm>
#include <charconv>
#include <climits>

namespace ferry::session {
namespace {

Status Invalid(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}

Result<uint64_t> ParseNumber(std::string_view text) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) {
    return Invalid("not a number: '" + std::string(text) + "'");
  }
  return v;
}

// N, or N with a K/M/G suffix (powers of 1024) when `sized`.
Result<uint64_t> ParseAmount(std::string_view text, bool sized) {
  uint64_t mult = 1;
  if (sized && !text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        break;
      default:
        break;
    }
    if (mult != 1) text.remove_suffix(1);
  }
  FERRY_ASSIGN_OR_RETURN(uint64_t v, ParseNumber(text));
  if (v > UINT64_MAX / mult) return Invalid("size overflows");
  return v * mult;
}

std::string FormatAmount(uint64_t v, bool sized) {
  if (sized && v != 0) {
    if (v % (1ull << 30) == 0) return std::to_string(v >> 30) + "G";
    if (v % (1ull << 20) == 0) return std::to_string(v >> 20) + "M";
    if (v % (1ull << 10) == 0) return std::to_string(v >> 10) + "K";
  }
  return std::to_string(v);
}

uint64_t ResolveOne(const UidLimit& limit, uint64_t whole) {
  switch (limit.kind) {
    case UidLimit::Kind::kAmount:
      return limit.value;
    case UidLimit::Kind::kPercent:
      // At least 1: a share that rounds to nothing would refuse everything.
      return std::max<uint64_t>(
          1, static_cast<uint64_t>(static_cast<long double>(whole) * limit.value / 100));
    case UidLimit::Kind::kUnset:
    case UidLimit::Kind::kNone:
      return 0;
  }
  return 0;
}

// `over`'s set limits over `base`'s.
UidLimitRule Overlay(UidLimitRule base, const UidLimitRule& over) {
  auto pick = [](UidLimit& b, const UidLimit& o) {
    if (o.kind != UidLimit::Kind::kUnset) b = o;
  };
  pick(base.sessions, over.sessions);
  pick(base.device, over.device);
  pick(base.pinned, over.pinned);
  pick(base.inflight, over.inflight);
  pick(base.inflight_bytes, over.inflight_bytes);
  pick(base.objects, over.objects);
  pick(base.queued, over.queued);
  return base;
}

}  // namespace

UidLimitRule DefaultUidLimitRule() {
  UidLimitRule r;
  r.match = UidLimitRule::Match::kDefault;
  r.sessions = {UidLimit::Kind::kPercent, 50};
  r.device = {UidLimit::Kind::kPercent, 50};
  r.pinned = {UidLimit::Kind::kPercent, 50};
  r.inflight = {UidLimit::Kind::kAmount, 4096};
  r.inflight_bytes = {UidLimit::Kind::kPercent, 50};
  r.objects = {UidLimit::Kind::kPercent, 50};
  r.queued = {UidLimit::Kind::kPercent, 50};
  return r;
}

namespace {

// The match of a uid-limits rule ("default:", "remote:", "remote:NAME:", "uid:N:", "gid:N:")
// into `rule`, taken off the front of `*rest`.
Status ParseRuleMatch(const std::string& text, std::string_view* rest, UidLimitRule* rule) {
  auto take_id = [&](std::string_view prefix, UidLimitRule::Match m) -> Status {
    rest->remove_prefix(prefix.size());
    size_t colon = rest->find(':');
    if (colon == std::string_view::npos) {
      return Invalid("expected " + std::string(prefix) + "N:KEY=VALUE,...");
    }
    FERRY_ASSIGN_OR_RETURN(uint64_t id, ParseNumber(rest->substr(0, colon)));
    if (id > UINT32_MAX) return Invalid("id out of range: " + std::string(rest->substr(0, colon)));
    rule->match = m;
    rule->id = static_cast<uint32_t>(id);
    rest->remove_prefix(colon + 1);
    return Status::Ok();
  };
  if (rest->rfind("default:", 0) == 0) {
    rule->match = UidLimitRule::Match::kDefault;
    rest->remove_prefix(8);
  } else if (rest->rfind("remote:", 0) == 0) {
    rule->match = UidLimitRule::Match::kRemote;
    rest->remove_prefix(7);
    // remote:NAME:KEY=...: a name holds no '=', a first limit does.
    const size_t colon = rest->find(':');
    if (colon != std::string_view::npos &&
        rest->substr(0, colon).find('=') == std::string_view::npos) {
      std::string_view name = rest->substr(0, colon);
      if (!IsTenantName(name)) {
        return Invalid("a tenant name is 1..32 of A-Z a-z 0-9 _ . -, got '" + std::string(name) +
                       "'");
      }
      rule->tenant = std::string(name);
      rest->remove_prefix(colon + 1);
    }
  } else if (rest->rfind("uid:", 0) == 0) {
    FERRY_RETURN_IF_ERROR(take_id("uid:", UidLimitRule::Match::kUid));
  } else if (rest->rfind("gid:", 0) == 0) {
    FERRY_RETURN_IF_ERROR(take_id("gid:", UidLimitRule::Match::kGid));
  } else {
    return Invalid("a rule starts with default:, remote:, remote:NAME:, uid:N: or gid:N:, got '" +
                   text + "'");
  }
  return Status::Ok();
}

// One KEY=VALUE limit of a uid-limits rule into `rule`.
Status ParseRuleLimit(std::string_view item, UidLimitRule* rule) {
  size_t eq = item.find('=');
  if (eq == std::string_view::npos) {
    return Invalid("expected KEY=VALUE, got '" + std::string(item) + "'");
  }
  std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
  UidLimit* limit = key == "sessions"         ? &rule->sessions
                    : key == "device"         ? &rule->device
                    : key == "pinned"         ? &rule->pinned
                    : key == "inflight"       ? &rule->inflight
                    : key == "inflight-bytes" ? &rule->inflight_bytes
                    : key == "objects"        ? &rule->objects
                    : key == "queued"         ? &rule->queued
                                              : nullptr;
  if (!limit) {
    return Invalid("unknown limit '" + std::string(key) +
                   "' (sessions, device, pinned, inflight, inflight-bytes, objects or queued)");
  }
  if (limit->kind != UidLimit::Kind::kUnset) {
    return Invalid("'" + std::string(key) + "' given twice");
  }
  const bool sized =
      limit == &rule->device || limit == &rule->pinned || limit == &rule->inflight_bytes;
  if (value == "none") {
    *limit = {UidLimit::Kind::kNone, 0};
  } else if (!value.empty() && value.back() == '%') {
    if (limit == &rule->inflight) return Invalid("inflight takes a number, not a percentage");
    FERRY_ASSIGN_OR_RETURN(uint64_t p, ParseNumber(value.substr(0, value.size() - 1)));
    if (p < 1 || p > 100) return Invalid("a percentage is 1%..100%");
    *limit = {UidLimit::Kind::kPercent, p};
  } else {
    FERRY_ASSIGN_OR_RETURN(uint64_t v, ParseAmount(value, sized));
    if (v == 0) return Invalid(std::string(key) + "=0 would refuse everything; 'none' is no limit");
    *limit = {UidLimit::Kind::kAmount, v};
  }
  return Status::Ok();
}

}  // namespace

Result<UidLimitRule> ParseUidLimitRule(const std::string& text) {
  UidLimitRule rule;
  std::string_view rest = text;
  FERRY_RETURN_IF_ERROR(ParseRuleMatch(text, &rest, &rule));
  if (rest.empty()) return Invalid("no limits in '" + text + "'");
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) return Invalid("trailing ','");
    FERRY_RETURN_IF_ERROR(ParseRuleLimit(item, &rule));
  }
  return rule;
}

std::string FormatUidLimitRule(const UidLimitRule& rule) {
  std::string out;
  switch (rule.match) {
    case UidLimitRule::Match::kDefault:
      out = "default:";
      break;
    case UidLimitRule::Match::kRemote:
      out = rule.tenant.empty() ? "remote:" : "remote:" + rule.tenant + ":";
      break;
    case UidLimitRule::Match::kUid:
      out = "uid:" + std::to_string(rule.id) + ":";
      break;
    case UidLimitRule::Match::kGid:
      out = "gid:" + std::to_string(rule.id) + ":";
      break;
  }
  bool first = true;
  auto add = [&](const char* key, const UidLimit& l, bool sized) {
    if (l.kind == UidLimit::Kind::kUnset) return;
    out += first ? "" : ",";
    first = false;
    out += key;
    out += '=';
    if (l.kind == UidLimit::Kind::kNone) {
      out += "none";
    } else if (l.kind == UidLimit::Kind::kPercent) {
      out += std::to_string(l.value) + "%";
    } else {
      out += FormatAmount(l.value, sized);
    }
  };
  add("sessions", rule.sessions, false);
  add("device", rule.device, true);
  add("pinned", rule.pinned, true);
  add("inflight", rule.inflight, false);
  add("inflight-bytes", rule.inflight_bytes, true);
  add("objects", rule.objects, false);
  add("queued", rule.queued, false);
  return out;
}

namespace {
// Add `amount` to `used` unless that would pass `limit` (0: no limit), atomically; false,
// nothing added and what `used` held in `*held`, when it would.
bool AddUnder(std::atomic<uint64_t>& used, uint64_t amount, uint64_t limit, uint64_t* held) {
  uint64_t cur = used.load();
  do {
    if (limit != 0 && (amount > limit || cur > limit - amount)) {
      *held = cur;
      return false;
    }
  } while (!used.compare_exchange_weak(cur, cur + amount));
  return true;
}
}  // namespace

Status UidAccount::Charge(std::atomic<uint64_t>& used, uint64_t amount, uint64_t limit,
                          const char* what, const char* key) {
  uint64_t held = 0;
  if (AddUnder(used, amount, limit, &held)) return Status::Ok();
  return Status(ErrorKind::kQuotaExceeded, identity_ + "'s " + what + " limit (" +
                                               std::to_string(limit) + ", uid-limits " + key +
                                               "=) is reached: it holds " + std::to_string(held) +
                                               ", asks for " + std::to_string(amount) + " more");
}

Status UidAccount::ChargeDeviceBytes(uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  return Charge(device_bytes_, bytes, limits_.device_bytes, "device memory (bytes)", "device");
}

Status UidAccount::ChargeInflight() {
  return Charge(inflight_, 1, limits_.inflight, "submits in flight", "inflight");
}

Status UidAccount::TryCharge(uint64_t bytes) {
  return Charge(pinned_bytes_, bytes, limits_.pinned_bytes, "pinned memory (bytes)", "pinned");
}

UidUsage UidAccount::Usage() const {
  UidUsage u;
  u.identity = identity_;
  u.sessions = sessions_.load();
  u.device_bytes = device_bytes_.load();
  u.pinned_bytes = pinned_bytes_.load();
  u.inflight = inflight_.load();
  u.in_flight_bytes = in_flight_bytes_.load();
  u.objects = objects_.load();
  u.queued_commands = launch_share_.queued.load();
  u.limits = limits_;
  return u;
}

void SessionRegistry::SetUidLimits(std::vector<UidLimitRule> rules, uint64_t pinned_budget,
                                   uint32_t daemon_uid, bool root_exempt) {
  MutexLock lock(&mu_);
  rules_ = std::move(rules);
  pinned_budget_ = pinned_budget;
  daemon_uid_ = daemon_uid;
  root_exempt_ = root_exempt;
  accounts_.clear();
}

ResolvedUidLimits SessionRegistry::Resolve(const PeerIdentity& peer) const {
  UidLimitRule rule;  // every limit unset: none, unless a rule sets it
  for (const UidLimitRule& r : rules_) {
    if (r.match == UidLimitRule::Match::kDefault) rule = r;
  }
  const UidLimitRule* specific = nullptr;
  bool named = false;                         // a uid: rule names this uid
  const UidLimitRule* tenant_rule = nullptr;  // remote:NAME naming this peer's tenant
  for (const UidLimitRule& r : rules_) {
    if (!peer.uid && r.match == UidLimitRule::Match::kRemote) {
      if (r.tenant.empty()) {
        specific = &r;
      } else if (!peer.tenant.empty() && r.tenant == peer.tenant) {
        tenant_rule = &r;
      }
    }
    if (peer.uid && r.match == UidLimitRule::Match::kUid && r.id == *peer.uid) {
      specific = &r;
      named = true;
    }
  }
  if (tenant_rule) specific = tenant_rule;
  if (!specific && peer.uid) {
    // The uid's groups in the user database, not the gid it connected with: a process may
    // switch its effective gid among its groups (sg), and so pick or dodge a gid: rule.
    std::vector<gid_t> groups;
    if (groups_of_uid_) groups = groups_of_uid_(*peer.uid);
    if (groups.empty() && peer.gid) groups.push_back(*peer.gid);  // no lookup, no entry
    for (const UidLimitRule& r : rules_) {  // the first gid: rule that matches
      if (r.match == UidLimitRule::Match::kGid &&
          std::find(groups.begin(), groups.end(), r.id) != groups.end()) {
        specific = &r;
        break;
      }
    }
  }
  if (peer.uid && ((*peer.uid == 0 && root_exempt_) || *peer.uid == daemon_uid_) && !named) {
    return {};  // root (while trusted) and the daemon's own uid: exempt unless named
  }
  if (specific) rule = Overlay(rule, *specific);
  ResolvedUidLimits out;
  out.sessions = ResolveOne(rule.sessions, max_sessions_);
  out.device_bytes = ResolveOne(rule.device, device_bytes_cap_);
  out.pinned_bytes = ResolveOne(rule.pinned, pinned_budget_);
  out.inflight = ResolveOne(rule.inflight, 0);
  // A share of no daemon-wide limit is no limit.
  auto share = [](const UidLimit& limit, uint64_t whole) -> uint64_t {
    if (whole) return ResolveOne(limit, whole);
    return limit.kind == UidLimit::Kind::kAmount ? limit.value : 0;
  };
  out.in_flight_bytes = share(rule.inflight_bytes, in_flight_bytes_limit_);
  out.objects = share(rule.objects, objects_limit_);
  out.queued_commands = share(rule.queued, launch_room_.limit());
  return out;
}

std::string CleanClientName(std::string_view name) {
  std::string clean(name.substr(0, kMaxClientName));
  for (char& ch : clean) {
    if (ch < 0x20 || ch > 0x7e) ch = '_';
  }
  return clean;
}

std::string IdentityOf(const PeerIdentity& peer) {
  if (peer.uid) return "uid:" + std::to_string(*peer.uid);
  return peer.tenant.empty() ? "remote" : "remote:" + peer.tenant;
}

bool IsTenantName(std::string_view name) {
  if (name.empty() || name.size() > 32) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

std::shared_ptr<UidAccount> SessionRegistry::AccountFor(const PeerIdentity& peer) {
  std::string identity = IdentityOf(peer);
  MutexLock lock(&mu_);
  auto& account = accounts_[identity];
  if (!account) account = std::make_shared<UidAccount>(identity, Resolve(peer));
  return account;
}

std::shared_ptr<UidAccount> SessionRegistry::AccountOf(uint64_t id) const {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.account;
}

Result<uint64_t> SessionRegistry::Open(std::string client_name, PeerIdentity peer,
                                       std::shared_ptr<const SessionCounters> counters) {
  std::shared_ptr<UidAccount> account = AccountFor(peer);
  MutexLock lock(&mu_);
  if (sessions_.size() >= max_sessions_) {
    return Status(ErrorKind::kQuotaExceeded, "the daemon holds its maximum number of sessions (" +
                                                 std::to_string(max_sessions_) + ", max-sessions)");
  }
  FERRY_RETURN_IF_ERROR(
      account->Charge(account->sessions_, 1, account->limits().sessions, "sessions", "sessions"));
  uint64_t id = next_id_++;
  ++sessions_total_;
  std::string usage_uid;
  std::string usage_client = AssignUsageIdentityLocked(peer, client_name, &usage_uid);
  UsageRecord& record = usage_.at({usage_uid, usage_client});
  ++record.usage.sessions_total;
  UsageOpenedLocked(record);
  SessionEntry& entry = sessions_[id] = SessionEntry{id,
                                                     std::move(client_name),
                                                     std::move(peer),
                                                     std::chrono::steady_clock::now(),
                                                     std::move(counters),
                                                     std::move(account)};
  entry.usage_uid = std::move(usage_uid);
  entry.usage_client = std::move(usage_client);
  return id;
}

void SessionRegistry::SetUsageIdentityLimit(size_t max_identities) {
  MutexLock lock(&mu_);
  max_usage_identities_ = std::max<size_t>(1, max_identities);
}

void SessionRegistry::SetUsageIdleTimeout(std::chrono::milliseconds idle) {
  MutexLock lock(&mu_);
  usage_idle_ = std::max(idle, std::chrono::milliseconds(0));
}

void SessionRegistry::SetClockForTest(std::function<Clock::time_point()> now) {
  MutexLock lock(&mu_);
  now_ = std::move(now);
}

SessionRegistry::UsageRecord& SessionRegistry::UsageRecordLocked(const std::string& uid,
                                                                 const std::string& client) {
  auto [it, fresh] = usage_.try_emplace({uid, client});
  if (fresh) {
    it->second.usage.uid = uid;
    it->second.usage.client = client;
    it->second.idle = idle_usage_.end();
  }
  return it->second;
}

void SessionRegistry::UsageOpenedLocked(UsageRecord& record) {
  if (record.open++ == 0 && record.idle != idle_usage_.end()) {
    idle_usage_.erase(record.idle);
    record.idle = idle_usage_.end();
  }
}

void SessionRegistry::UsageClosedLocked(const UsageKey& key, UsageRecord& record) {
  if (--record.open == 0) record.idle = idle_usage_.insert(idle_usage_.end(), {now_(), key});
}

void SessionRegistry::ExpireIdleUsageLocked() {
  if (usage_idle_.count() == 0 || idle_usage_.empty()) return;
  const Clock::time_point now = now_();
  while (!idle_usage_.empty() && now - idle_usage_.front().first >= usage_idle_) {
    auto it = usage_.find(idle_usage_.front().second);  // every idle entry's record exists
    idle_usage_.pop_front();
    // Its closed sessions' counters stay in the daemon's totals (closed_usage_).
    if (it->second.counted_in_uid) {
      auto names = usage_clients_per_uid_.find(it->second.usage.uid);
      if (--names->second == 0) usage_clients_per_uid_.erase(names);
    }
    usage_.erase(it);
    ++usage_expiries_;
  }
}

std::string SessionRegistry::AssignUsageIdentityLocked(const PeerIdentity& peer,
                                                       const std::string& client,
                                                       std::string* uid_label) {
  const std::string uid = peer.uid ? std::to_string(*peer.uid) : IdentityOf(peer);
  std::string name = CleanClientName(client);  // a label value: printable ASCII only
  *uid_label = uid;
  // Those idle long enough go first: they make room, and an expired identity that comes
  // back starts again from 0 whether or not anything looked in between.
  ExpireIdleUsageLocked();
  if (usage_.count({uid, name})) return name;
  // A new name of a uid that has used up its names goes to that uid's "other".
  bool folded = false;
  // (find, not []: a uid that folds into "other" must not grow this map either)
  auto names = usage_clients_per_uid_.find(uid);
  if (names != usage_clients_per_uid_.end() && names->second >= kMaxClientsPerUid) {
    name = "other";
    folded = true;
    if (usage_.count({uid, name})) {
      ++usage_folds_;
      return name;
    }
  }
  if (usage_.size() >= max_usage_identities_) {
    ++usage_folds_;
    *uid_label = "other";
    UsageRecordLocked("other", "other");
    return "other";
  }
  if (folded) ++usage_folds_;
  UsageRecordLocked(uid, name).counted_in_uid = true;
  ++usage_clients_per_uid_[uid];
  return name;
}

namespace {

void AddCounters(const SessionCounters& c, IdentityUsage& u) {
  u.device_busy_ns += c.device_busy_ns;
  u.h2d_bytes += c.h2d_bytes;
  u.h2d_ns += c.h2d_ns;
  u.d2h_bytes += c.d2h_bytes;
  u.d2h_ns += c.d2h_ns;
  u.bytes_uploaded += c.bytes_uploaded;
  u.bytes_downloaded += c.bytes_downloaded;
}

}  // namespace

std::vector<IdentityUsage> SessionRegistry::UsageByIdentity() {
  MutexLock lock(&mu_);
  ExpireIdleUsageLocked();
  std::map<UsageKey, IdentityUsage> all;
  for (const auto& [key, record] : usage_) all.emplace(key, record.usage);
  for (const auto& [id, e] : sessions_) {
    // Every open session's record is kept: a record with an open session never expires.
    IdentityUsage& u = all.at({e.usage_uid, e.usage_client});
    AddCounters(*e.counters, u);
    ++u.sessions_open;
    u.device_bytes += e.counters->device_bytes;
  }
  std::vector<IdentityUsage> out;
  out.reserve(all.size());
  for (auto& [key, u] : all) out.push_back(std::move(u));
  return out;
}

uint64_t SessionRegistry::usage_folds() const {
  MutexLock lock(&mu_);
  return usage_folds_;
}

uint64_t SessionRegistry::usage_expiries() const {
  MutexLock lock(&mu_);
  return usage_expiries_;
}

void SessionRegistry::Remove(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  --it->second.account->sessions_;
  const SessionCounters& c = *it->second.counters;
  closed_submits_ += c.submits;
  closed_ops_ += c.ops;
  closed_up_ += c.bytes_uploaded;
  closed_down_ += c.bytes_downloaded;
  AddCounters(c, closed_usage_);
  const UsageKey key{it->second.usage_uid, it->second.usage_client};
  UsageRecord& record = usage_.at(key);
  AddCounters(c, record.usage);
  UsageClosedLocked(key, record);
  sessions_.erase(it);
}

bool SessionRegistry::TryReserveDeviceBytes(uint64_t bytes) {
  uint64_t cur = device_bytes_reserved_.load();
  do {
    if (bytes > device_bytes_cap_ || cur > device_bytes_cap_ - bytes) return false;
  } while (!device_bytes_reserved_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

void SessionRegistry::ReleaseDeviceBytes(uint64_t bytes) { device_bytes_reserved_ -= bytes; }

Status SessionRegistry::ChargeWithIdentity(const SharedLimit& l, UidAccount* account,
                                           uint64_t amount) {
  uint64_t held = 0;
  if (!AddUnder(this->*l.used, amount, this->*l.limit, &held)) {
    return Status(ErrorKind::kQuotaExceeded,
                  "the daemon's sessions hold " + std::to_string(held) + " " + l.what + "; " +
                      std::to_string(amount) + " more would pass its limit of " +
                      std::to_string(this->*l.limit) + " (ferryd --" + l.setting + ")");
  }
  if (account) {
    Status s = account->Charge(account->*l.account_used, amount, account->limits_.*l.account_limit,
                               l.what, l.key);
    if (!s.ok()) {
      this->*l.used -= amount;
      return s;
    }
  }
  return Status::Ok();
}

void SessionRegistry::RefundWithIdentity(const SharedLimit& l, UidAccount* account,
                                         uint64_t amount) {
  this->*l.used -= amount;
  if (account) account->*l.account_used -= amount;
}

const SessionRegistry::SharedLimit SessionRegistry::kInFlightBytes = {
    &SessionRegistry::in_flight_bytes_,
    &SessionRegistry::in_flight_bytes_limit_,
    &UidAccount::in_flight_bytes_,
    &ResolvedUidLimits::in_flight_bytes,
    "in-flight bytes",
    "in-flight-bytes",
    "inflight-bytes"};
const SessionRegistry::SharedLimit SessionRegistry::kObjects = {
    &SessionRegistry::objects_,
    &SessionRegistry::objects_limit_,
    &UidAccount::objects_,
    &ResolvedUidLimits::objects,
    "objects (tensors, modules, graphs and recorded ops)",
    "max-objects",
    "objects"};

uint64_t SessionRegistry::InFlightBytesRoom(const UidAccount* account) const {
  auto room = [](uint64_t used, uint64_t limit) {
    return limit == 0 ? UINT64_MAX : limit - std::min(used, limit);
  };
  uint64_t r = room(in_flight_bytes_.load(), in_flight_bytes_limit_);
  if (account) {
    r = std::min(r, room(account->in_flight_bytes_.load(), account->limits_.in_flight_bytes));
  }
  return r;
}

bool SessionRegistry::InFlightBytesRoomBelow(const UidAccount* account, uint64_t room) const {
  auto below = [room](uint64_t used, uint64_t limit) {
    return limit != 0 && (used >= limit || limit - used < room);
  };
  if (below(in_flight_bytes_.load(), in_flight_bytes_limit_)) return true;
  return account && below(account->in_flight_bytes_.load(), account->limits_.in_flight_bytes);
}

std::vector<SessionEntry> SessionRegistry::List() const {
  MutexLock lock(&mu_);
  std::vector<SessionEntry> out;
  out.reserve(sessions_.size());
  for (const auto& [id, e] : sessions_) out.push_back(e);
  return out;
}

DaemonTotals SessionRegistry::Totals() const {
  MutexLock lock(&mu_);
  DaemonTotals t;
  t.sessions_open = sessions_.size();
  t.sessions_total = sessions_total_;
  t.device_bytes_reserved = device_bytes_reserved_.load();
  t.submits = closed_submits_;
  t.ops = closed_ops_;
  t.bytes_uploaded = closed_up_;
  t.bytes_downloaded = closed_down_;
  IdentityUsage usage = closed_usage_;
  for (const auto& [id, e] : sessions_) {
    const SessionCounters& c = *e.counters;
    t.submits_in_flight += c.submits_in_flight;
    t.live_tensors += c.live_tensors;
    t.submits += c.submits;
    t.ops += c.ops;
    t.bytes_uploaded += c.bytes_uploaded;
    t.bytes_downloaded += c.bytes_downloaded;
    AddCounters(c, usage);
  }
  t.device_busy_ns = usage.device_busy_ns;
  t.h2d_bytes = usage.h2d_bytes;
  t.h2d_ns = usage.h2d_ns;
  t.d2h_bytes = usage.d2h_bytes;
  t.d2h_ns = usage.d2h_ns;
  return t;
}

std::vector<UidUsage> SessionRegistry::UsageByUid() const {
  MutexLock lock(&mu_);
  std::vector<UidUsage> out;
  for (const auto& [identity, account] : accounts_) {
    UidUsage u = account->Usage();
    if (u.sessions || u.device_bytes || u.pinned_bytes || u.inflight || u.in_flight_bytes ||
        u.objects || u.queued_commands) {
      out.push_back(std::move(u));
    }
  }
  return out;
}

}  // namespace ferry::session
