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

bool CopyTurns::FreeLocked(uint8_t mask) const {
  for (uint8_t d : kAll) {
    const uint32_t limit = d == kDevice ? device_turns_ : turns_;
    if ((mask & d) && limit > 0 && held_[Index(d)] >= limit) return false;
  }
  return true;
}

void CopyTurns::TakeLocked(uint8_t mask, const std::string& who) {
  for (uint8_t d : kAll) {
    if (mask & d) ++held_[Index(d)];
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
  if (!FreeLocked(mask)) return false;
  TakeLocked(mask, who);
  return true;
}

void CopyTurns::Wait(uint8_t mask, std::function<void()> granted, const std::string& who) {
  std::vector<std::function<void()>> go;
  {
    MutexLock lock(&mu_);
    ++waits_;
    waiters_.push_back(Waiter{mask, std::move(granted), who});
    go = GrantLocked();
  }
  for (auto& fn : go) fn();
}

void CopyTurns::Give(uint8_t mask) {
  if (mask == kNone) return;
  std::vector<std::function<void()>> go;
  {
    MutexLock lock(&mu_);
    for (uint8_t d : kAll) {
      if ((mask & d) && held_[Index(d)] > 0) --held_[Index(d)];
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
  std::vector<bool> taken(waiters_.size(), false);
  uint8_t blocked = kNone;  // directions a better-ranked waiter still waits for
  for (const Ranked& r : ranked) {
    Waiter& w = waiters_[r.arrival];
    if ((w.mask & blocked) == 0 && FreeLocked(w.mask)) {
      TakeLocked(w.mask, w.who);
      go.push_back(std::move(w.granted));
      taken[r.arrival] = true;
    } else {
      blocked |= w.mask;
    }
  }
  std::deque<Waiter> rest;
  for (size_t i = 0; i < waiters_.size(); ++i) {
    if (!taken[i]) rest.push_back(std::move(waiters_[i]));
  }
  waiters_.swap(rest);
  return go;
}

CopyTurns::Stats CopyTurns::stats() const {
  MutexLock lock(&mu_);
  Stats s;
  s.waits = waits_;
  s.waiting = waiters_.size();
  s.held_to_device = held_[0];
  s.held_to_host = held_[1];
  s.held_device = held_[2];
  return s;
}

}  // namespace ferry::session
