#include "session/copy_turns.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "session/registry.h"

namespace ferry::session {
namespace {

// Lengths come from the wire (admission checks them later): add without wrapping.
void AddSaturating(uint64_t& sum, uint64_t n) {
  sum = n > std::numeric_limits<uint64_t>::max() - sum ? std::numeric_limits<uint64_t>::max()
                                                       : sum + n;
}

int Index(uint8_t direction) {
  return direction == CopyTurns::kToDevice ? 0 : direction == CopyTurns::kToHost ? 1 : 2;
}

// An identity's half of a direction's `limit` (> 0) turns: ceil(limit / 2).
uint32_t Half(uint32_t limit) { return limit / 2 + limit % 2; }

constexpr uint8_t kAll[] = {CopyTurns::kToDevice, CopyTurns::kToHost, CopyTurns::kDevice};

}  // namespace

Result<std::map<std::string, uint32_t>> ParseUidWeights(const std::string& text) {
  std::map<std::string, uint32_t> out;
  if (text.empty()) return out;
  auto invalid = [](const std::string& why) {
    return Status(ErrorKind::kInvalidArgument, "uid-weights: " + why);
  };
  auto number = [](const std::string& s, uint64_t max) -> std::optional<uint64_t> {
    if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) {
      return std::nullopt;
    }
    uint64_t v = std::stoull(s);
    if (v > max) return std::nullopt;
    return v;
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string entry =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    while (!entry.empty() && entry.front() == ' ') entry.erase(entry.begin());
    while (!entry.empty() && entry.back() == ' ') entry.pop_back();
    size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      return invalid("expected uid:N=WEIGHT, remote=WEIGHT or remote:NAME=WEIGHT, got '" + entry +
                     "'");
    }
    std::string who = entry.substr(0, eq), weight = entry.substr(eq + 1);
    if (who.rfind("remote:", 0) == 0) {
      if (!IsTenantName(who.substr(7))) {
        return invalid("'" + who + "': a tenant name is 1..32 of A-Z a-z 0-9 _ . -");
      }
    } else if (who != "remote") {
      std::optional<uint64_t> uid;
      if (who.rfind("uid:", 0) == 0) uid = number(who.substr(4), UINT32_MAX);
      if (!uid) return invalid("'" + who + "' is neither uid:N (a number), remote nor remote:NAME");
      who = "uid:" + std::to_string(*uid);
    }
    std::optional<uint64_t> w = number(weight, 1000);
    if (!w || *w == 0) {
      return invalid("the weight of " + who + " must be 1..1000, got '" + weight + "'");
    }
    if (!out.emplace(who, static_cast<uint32_t>(*w)).second) {
      return invalid(who + " is given twice");
    }
  }
  return out;
}

std::string FormatUidWeights(const std::map<std::string, uint32_t>& weights) {
  std::string out;
  for (const auto& [who, w] : weights) {
    if (!out.empty()) out += ",";
    out += who + "=" + std::to_string(w);
  }
  return out;
}

void CopyTurns::SetWeights(std::map<std::string, uint32_t> weights) {
  MutexLock lock(&mu_);
  weights_ = std::move(weights);
}

uint32_t CopyTurns::WeightLocked(const std::string& who) const {
  auto it = weights_.find(who);
  return it == weights_.end() || it->second == 0 ? 1 : it->second;
}

uint64_t CopyTurns::PassLocked(const std::string& who) const {
  auto it = pass_.find(who);
  return it == pass_.end() ? vtime_ : std::max(it->second, vtime_);
}

uint8_t CopyTurns::Needs(const std::vector<Op>& ops) const {
  uint8_t mask = device_turns_ > 0 && !ops.empty() ? kDevice : kNone;
  if (turns_ == 0) return mask;
  uint64_t to_device = 0, to_host = 0;
  for (const Op& op : ops) {
    switch (Traits(KindOf(op)).copy) {
      case CopyDirection::kToDevice:
        AddSaturating(to_device, CopyBytes(op));
        break;
      case CopyDirection::kToHost:
        AddSaturating(to_host, CopyBytes(op));
        break;
      case CopyDirection::kNone:
        break;
    }
  }
  if (to_device >= min_bytes_ && to_device > 0) mask |= kToDevice;
  if (to_host >= min_bytes_ && to_host > 0) mask |= kToHost;
  return mask;
}

uint32_t CopyTurns::LimitOf(uint8_t direction) const {
  return direction == kDevice ? device_turns_ : turns_;
}

uint32_t CopyTurns::HeldLocked(int i) const {
  uint32_t n = 0;
  for (const auto& [who, held] : held_by_) n += held[i];
  return n;
}

uint32_t CopyTurns::HeldWithinHalvesLocked(int i) const {
  const uint32_t half = Half(LimitOf(kAll[i]));
  uint32_t n = 0;
  for (const auto& [who, held] : held_by_) n += who.empty() ? held[i] : std::min(held[i], half);
  return n;
}

uint8_t CopyTurns::AtHalfLocked(uint8_t mask, const std::string& who) const {
  if (who.empty()) return kNone;  // no identity, no half
  auto mine = held_by_.find(who);
  if (mine == held_by_.end()) return kNone;
  uint8_t at_half = kNone;
  for (uint8_t d : kAll) {
    const uint32_t limit = LimitOf(d);
    if ((mask & d) && limit > 0 && mine->second[Index(d)] >= Half(limit)) at_half |= d;
  }
  return at_half;
}

bool CopyTurns::FitsLocked(uint8_t mask, const std::string& who, uint8_t others) const {
  const uint8_t borrow = AtHalfLocked(mask, who);
  for (uint8_t d : kAll) {
    const uint32_t limit = LimitOf(d);
    if ((mask & d) == 0 || limit == 0) continue;
    if (borrow & d) {
      if ((others & d) || HeldLocked(Index(d)) >= limit) return false;
    } else if (HeldWithinHalvesLocked(Index(d)) >= limit) {
      return false;
    }
  }
  return true;
}

void CopyTurns::TakeLocked(uint8_t mask, const std::string& who) {
  std::array<uint32_t, 3>& mine = held_by_[who];
  for (uint8_t d : kAll) {
    if (mask & d) ++mine[Index(d)];
  }
  const uint64_t start = PassLocked(who);
  pass_[who] = start + kStride / WeightLocked(who);
  vtime_ = start;
}

bool CopyTurns::TryTake(uint8_t mask, const std::string& who) {
  if (mask == kNone) return true;
  MutexLock lock(&mu_);
  for (const Waiter& w : waiters_) {
    if (w.mask & mask) return false;  // never jump a waiting request of the same direction
  }
  // Nobody waits for these directions, so no ordinary request of another identity either.
  if (!FitsLocked(mask, who, kNone)) return false;
  TakeLocked(mask, who);
  return true;
}

uint64_t CopyTurns::Wait(uint8_t mask, std::function<void()> granted, const std::string& who) {
  std::vector<std::function<void()>> go;
  uint64_t ticket = 0;
  {
    MutexLock lock(&mu_);
    ticket = ++waits_;
    waiters_.push_back(Waiter{mask, std::move(granted), who, ticket});
    go = GrantLocked();
  }
  for (auto& fn : go) fn();
  return ticket;
}

bool CopyTurns::Cancel(uint64_t ticket) {
  std::function<void()> dropped;  // destroyed after the lock is released
  std::vector<std::function<void()>> go;
  {
    MutexLock lock(&mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [ticket](const Waiter& w) { return w.ticket == ticket; });
    if (it == waiters_.end()) return false;
    dropped = std::move(it->granted);
    waiters_.erase(it);
    go = GrantLocked();  // it may have held back requests ranked after it
  }
  for (auto& fn : go) fn();
  return true;
}

void CopyTurns::Give(uint8_t mask, const std::string& who) {
  if (mask == kNone) return;
  std::vector<std::function<void()>> go;
  {
    MutexLock lock(&mu_);
    for (uint8_t d : kAll) {
      const int i = Index(d);
      if ((mask & d) == 0) continue;
      auto holder = held_by_.find(who);
      if (holder == held_by_.end() || holder->second[i] == 0) {
        holder = std::max_element(
            held_by_.begin(), held_by_.end(),
            [i](const auto& a, const auto& b) { return a.second[i] < b.second[i]; });
      }
      if (holder == held_by_.end() || holder->second[i] == 0) continue;  // none held
      if (--holder->second[i] == 0 && holder->second == std::array<uint32_t, 3>{}) {
        held_by_.erase(holder);
      }
    }
    go = GrantLocked();
  }
  for (auto& fn : go) fn();
}

std::vector<std::function<void()>> CopyTurns::GrantLocked() {
  std::vector<std::function<void()>> go;
  if (waiters_.empty()) return go;
  // Rank the waiters: an identity's k-th waiting request at its pass plus k strides (its
  // projected start), ties in arrival order.
  struct Ranked {
    uint64_t start;
    size_t arrival;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(waiters_.size());
  std::map<std::string, uint64_t> projected;
  for (size_t i = 0; i < waiters_.size(); ++i) {
    const std::string& who = waiters_[i].who;
    auto [it, fresh] = projected.emplace(who, PassLocked(who));
    ranked.push_back(Ranked{it->second, i});
    it->second += kStride / WeightLocked(who);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    return a.start < b.start || (a.start == b.start && a.arrival < b.arrival);
  });
  std::vector<size_t> order;
  order.reserve(ranked.size());
  for (const Ranked& r : ranked) order.push_back(r.arrival);
  // One at a time, so that each request is judged by what is held and waiting when it is:
  // a grant can make a borrowing request ranked before it ordinary, or let it borrow.
  std::vector<bool> taken(waiters_.size(), false);
  for (;;) {
    const size_t i = NextLocked(order, taken);
    if (i == waiters_.size()) break;
    TakeLocked(waiters_[i].mask, waiters_[i].who);
    go.push_back(std::move(waiters_[i].granted));
    taken[i] = true;
  }
  std::deque<Waiter> rest;
  for (size_t i = 0; i < waiters_.size(); ++i) {
    if (!taken[i]) rest.push_back(std::move(waiters_[i]));
  }
  waiters_.swap(rest);
  return go;
}

size_t CopyTurns::NextLocked(const std::vector<size_t>& order,
                             const std::vector<bool>& taken) const {
  // Which requests borrow (see the contract), in arrival order, and the ordinary ones waiting
  // for each direction, in all and by identity: an ordinary request of another identity waits
  // for direction i when ordinary[i] > ordinary_by[who][i].
  std::vector<bool> borrows(waiters_.size(), false);
  std::map<std::string, uint8_t> borrowing;  // by identity: what its borrowing requests want
  std::array<uint32_t, 3> ordinary{};
  std::map<std::string, std::array<uint32_t, 3>> ordinary_by;
  for (size_t i = 0; i < waiters_.size(); ++i) {
    if (taken[i]) continue;
    const Waiter& w = waiters_[i];
    uint8_t& theirs = borrowing[w.who];
    borrows[i] = (w.mask & theirs) != 0 || AtHalfLocked(w.mask, w.who) != kNone;
    if (borrows[i]) {
      theirs |= w.mask;
      continue;
    }
    for (uint8_t d : kAll) {
      if ((w.mask & d) == 0) continue;
      ++ordinary[Index(d)];
      ++ordinary_by[w.who][Index(d)];
    }
  }
  uint8_t blocked = kNone;                   // directions an ordinary request ranked earlier wants
  std::map<std::string, uint8_t> held_back;  // the same of borrowing ones, for their identity
  for (size_t i : order) {
    if (taken[i]) continue;
    const Waiter& w = waiters_[i];
    uint8_t& back = held_back[w.who];
    const std::array<uint32_t, 3>& own = ordinary_by[w.who];
    uint8_t others = kNone;
    for (uint8_t d : kAll) {
      if (ordinary[Index(d)] > own[Index(d)]) others |= d;
    }
    if ((w.mask & (blocked | back)) == 0 && FitsLocked(w.mask, w.who, others)) return i;
    // It waits: an ordinary request for everyone ranked after it, a borrowing one for its own
    // identity's later requests only.
    (borrows[i] ? back : blocked) |= w.mask;
  }
  return waiters_.size();
}

CopyTurns::Stats CopyTurns::stats() const {
  MutexLock lock(&mu_);
  Stats s;
  s.waits = waits_;
  s.waiting = waiters_.size();
  s.held_to_device = HeldLocked(0);
  s.held_to_host = HeldLocked(1);
  s.held_device = HeldLocked(2);
  return s;
}

}  // namespace ferry::session
