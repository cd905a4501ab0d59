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

// Waiting requests in rank order, ranked as far as GrantLocked has needed: a merge of the
// identities' queues by projected start (an identity's k-th waiting request at its pass plus k
// strides), ties in arrival order. Within an identity the starts grow, so its requests rank in
// arrival order; the heap holds each identity's next request not yet ranked.
struct CopyTurns::Ranking {
  struct Ranked {
    uint64_t start;
    uint64_t ticket;
    uint32_t who;
    uint32_t k;  // its place in the identity's queue
  };
  static bool Later(const Ranked& a, const Ranked& b) {
    return a.start > b.start || (a.start == b.start && a.ticket > b.ticket);
  }
  static constexpr size_t kNoOne = ~size_t{0};
  std::vector<Ranked> heads;  // a heap by Later
  std::vector<Ranked> order;  // ranked so far
};

void CopyTurns::SetWeights(std::map<std::string, uint32_t> weights) {
  MutexLock lock(&mu_);
  weights_ = std::move(weights);
  for (Identity& id : identities_) id.weight = WeightLocked(id.name);
}

uint32_t CopyTurns::WeightLocked(const std::string& who) const {
  auto it = weights_.find(who);
  return it == weights_.end() || it->second == 0 ? 1 : it->second;
}

uint32_t CopyTurns::InternLocked(const std::string& who) {
  if (auto it = identity_of_.find(who); it != identity_of_.end()) return it->second;
  const auto x = static_cast<uint32_t>(identities_.size());
  identity_of_.emplace(who, x);
  Identity& id = identities_.emplace_back();
  id.name = who;
  id.weight = WeightLocked(who);
  return x;
}

uint64_t CopyTurns::PassLocked(const Identity& id) const { return std::max(id.pass, vtime_); }

uint8_t CopyTurns::Needs(const SubmitSummary& submit) const {
  uint8_t mask = device_turns_ > 0 && submit.ops() > 0 ? kDevice : kNone;
  if (turns_ == 0) return mask;
  const uint64_t to_device = submit.to_device_bytes(), to_host = submit.to_host_bytes();
  if (to_device >= min_bytes_ && to_device > 0) mask |= kToDevice;
  if (to_host >= min_bytes_ && to_host > 0) mask |= kToHost;
  return mask;
}

uint32_t CopyTurns::LimitOf(uint8_t direction) const {
  return direction == kDevice ? device_turns_ : turns_;
}

uint32_t CopyTurns::WithinHalfLocked(const Identity& id, int i) const {
  return id.name.empty() ? id.held[i] : std::min(id.held[i], Half(LimitOf(kAll[i])));
}

void CopyTurns::AddHeldLocked(uint32_t who, int i, int delta) {
  Identity& id = identities_[who];
  held_within_halves_[i] -= WithinHalfLocked(id, i);
  id.held[i] += delta;
  held_[i] += delta;
  held_within_halves_[i] += WithinHalfLocked(id, i);
}

bool CopyTurns::UpdateAtHalfLocked(uint32_t who) {
  Identity& id = identities_[who];
  uint8_t at_half = kNone;
  if (!id.name.empty()) {  // no identity, no half
    for (uint8_t d : kAll) {
      const uint32_t limit = LimitOf(d);
      if (limit > 0 && id.held[Index(d)] >= Half(limit)) at_half |= d;
    }
  }
  if (at_half == id.at_half) return false;
  id.at_half = at_half;
  return true;
}

void CopyTurns::RecountBorrowingLocked(uint32_t who) {
  Identity& id = identities_[who];
  for (int i = 0; i < 3; ++i) ordinary_waiting_[i] -= id.ordinary[i];
  id.ordinary = {};
  id.borrowed = kNone;
  uint8_t wants = kNone;
  for (Waiter& w : id.waiting) {
    if (w.taken) continue;
    wants |= w.mask;
    w.borrows = (w.mask & (id.borrowed | id.at_half)) != 0;
    if (w.borrows) {
      id.borrowed |= w.mask;
      continue;
    }
    for (uint8_t d : kAll) {
      if (w.mask & d) ++id.ordinary[Index(d)];
    }
  }
  for (int i = 0; i < 3; ++i) ordinary_waiting_[i] += id.ordinary[i];
  SetWantsLocked(id, wants);
}

void CopyTurns::SetWantsLocked(Identity& id, uint8_t wants) {
  for (int bit = 0; bit < 8; ++bit) {
    const uint8_t b = 1u << bit;
    if ((wants & b) && !(id.wants & b)) ++wanting_bit_[bit];
    if (!(wants & b) && (id.wants & b)) --wanting_bit_[bit];
  }
  id.wants = wants;
}

void CopyTurns::CountWaitingLocked(const Waiter& w, int delta) {
  waiting_ += delta;
  if (w.mask == kNone) waiting_for_none_ += delta;
}

void CopyTurns::UnqueueLocked(uint32_t who) {
  Identity& id = identities_[who];
  const size_t at = id.queued_at;
  queued_[at] = queued_.back();
  identities_[queued_[at]].queued_at = at;
  queued_.pop_back();
  id.queued_at = kNotQueued;
}

bool CopyTurns::FitsLocked(uint8_t mask, const Identity& id, uint8_t others) const {
  for (uint8_t d : kAll) {
    const uint32_t limit = LimitOf(d);
    if ((mask & d) == 0 || limit == 0) continue;
    if (id.at_half & d) {  // it borrows d
      if ((others & d) || held_[Index(d)] >= limit) return false;
    } else if (held_within_halves_[Index(d)] >= limit) {
      return false;
    }
  }
  return true;
}

void CopyTurns::TakeLocked(uint8_t mask, uint32_t who) {
  for (uint8_t d : kAll) {
    if (mask & d) AddHeldLocked(who, Index(d), +1);
  }
  Identity& id = identities_[who];
  const uint64_t start = PassLocked(id);
  id.pass = start + kStride / id.weight;
  vtime_ = start;
}

bool CopyTurns::TryTake(uint8_t mask, const std::string& who) {
  if (mask == kNone) return true;
  MutexLock lock(&mu_);
  for (int bit = 0; bit < 8; ++bit) {
    // Never jump a waiting request of the same direction.
    if ((mask & (1u << bit)) && wanting_bit_[bit] > 0) return false;
  }
  const uint32_t id = InternLocked(who);
  // Nobody waits for these directions, so no ordinary request of another identity either.
  if (!FitsLocked(mask, identities_[id], kNone)) return false;
  TakeLocked(mask, id);
  if (UpdateAtHalfLocked(id)) RecountBorrowingLocked(id);
  return true;
}

uint64_t CopyTurns::Wait(uint8_t mask, std::function<void()> granted, const std::string& who) {
  std::vector<std::function<void()>> go;
  uint64_t ticket = 0;
  {
    MutexLock lock(&mu_);
    ticket = ++waits_;
    const uint32_t x = InternLocked(who);
    Identity& id = identities_[x];
    // Last in its identity's queue: it borrows if its identity holds its half of a direction
    // it wants, or a borrowing request ahead of it wants one of them.
    Waiter& w = id.waiting.emplace_back(
        Waiter{mask, (mask & (id.borrowed | id.at_half)) != 0, false, ticket, std::move(granted)});
    if (w.borrows) {
      id.borrowed |= mask;
    } else {
      for (uint8_t d : kAll) {
        if ((mask & d) == 0) continue;
        ++id.ordinary[Index(d)];
        ++ordinary_waiting_[Index(d)];
      }
    }
    CountWaitingLocked(w, +1);
    SetWantsLocked(id, id.wants | mask);
    if (id.queued_at == kNotQueued) {
      id.queued_at = queued_.size();
      queued_.push_back(x);
    }
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
    bool found = false;
    for (uint32_t x : queued_) {
      std::deque<Waiter>& waiting = identities_[x].waiting;
      if (ticket < waiting.front().ticket || ticket > waiting.back().ticket) continue;
      auto it = std::find_if(waiting.begin(), waiting.end(),
                             [ticket](const Waiter& w) { return w.ticket == ticket; });
      if (it == waiting.end()) continue;
      dropped = std::move(it->granted);
      CountWaitingLocked(*it, -1);
      waiting.erase(it);
      RecountBorrowingLocked(x);
      if (waiting.empty()) UnqueueLocked(x);
      found = true;
      break;
    }
    if (!found) return false;
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
    auto named = identity_of_.find(who);
    for (uint8_t d : kAll) {
      const int i = Index(d);
      if ((mask & d) == 0) continue;
      uint32_t holder = 0;
      if (named != identity_of_.end() && identities_[named->second].held[i] > 0) {
        holder = named->second;
      } else {
        // The identity holding the most, the first by name of those holding as much.
        const Identity* most = nullptr;
        for (const Identity& id : identities_) {
          if (id.held[i] > 0 && (most == nullptr || id.held[i] > most->held[i] ||
                                 (id.held[i] == most->held[i] && id.name < most->name))) {
            most = &id;
          }
        }
        if (most == nullptr) continue;  // none held
        holder = static_cast<uint32_t>(most - identities_.data());
      }
      AddHeldLocked(holder, i, -1);
      if (UpdateAtHalfLocked(holder)) RecountBorrowingLocked(holder);
    }
    go = GrantLocked();
  }
  for (auto& fn : go) fn();
}

std::vector<std::function<void()>> CopyTurns::GrantLocked() {
  std::vector<std::function<void()>> go;
  if (waiting_ == 0) return go;
  Ranking ranking;
  ranking.heads.reserve(queued_.size());
  for (uint32_t x : queued_) {
    const Identity& id = identities_[x];
    ranking.heads.push_back(Ranking::Ranked{PassLocked(id), id.waiting.front().ticket, x, 0});
  }
  std::make_heap(ranking.heads.begin(), ranking.heads.end(), Ranking::Later);
  // One at a time, so that each request is judged by what is held and waiting when it is:
  // a grant can make a borrowing request ranked before it ordinary, or let it borrow.
  std::vector<uint32_t> granted_to;
  for (;;) {
    const size_t p = NextLocked(ranking);
    if (p == Ranking::kNoOne) break;
    const Ranking::Ranked r = ranking.order[p];
    Identity& id = identities_[r.who];
    Waiter& w = id.waiting[r.k];
    w.taken = true;
    if (id.taken++ == 0) granted_to.push_back(r.who);
    CountWaitingLocked(w, -1);
    go.push_back(std::move(w.granted));
    TakeLocked(w.mask, r.who);
    UpdateAtHalfLocked(r.who);
    RecountBorrowingLocked(r.who);  // without w, and with what it took
  }
  for (uint32_t x : granted_to) {
    Identity& id = identities_[x];
    // Mostly the first ones of its queue (within an identity requests rank in arrival order).
    while (!id.waiting.empty() && id.waiting.front().taken) {
      id.waiting.pop_front();
      --id.taken;
    }
    if (id.taken > 0) {
      id.waiting.erase(std::remove_if(id.waiting.begin(), id.waiting.end(),
                                      [](const Waiter& w) { return w.taken; }),
                       id.waiting.end());
      id.taken = 0;
    }
    if (id.waiting.empty()) UnqueueLocked(x);
  }
  return go;
}

size_t CopyTurns::NextLocked(Ranking& ranking) {
  const uint64_t scan = ++scans_;
  // By bit: the identities with requests that neither their own borrowing requests ranked
  // earlier hold back, nor (below) ordinary ones; once none is left, no request may go.
  std::array<uint32_t, 8> open_by_bit = wanting_bit_;
  uint8_t open = kNone;
  for (int bit = 0; bit < 8; ++bit) {
    if (open_by_bit[bit] > 0) open |= 1u << bit;
  }
  uint8_t blocked = kNone;  // directions an ordinary request ranked earlier wants
  for (size_t p = 0;; ++p) {
    // Every request left wants a direction an earlier one holds back (a kNone one never does).
    if (waiting_for_none_ == 0 && (open & ~blocked) == kNone) return Ranking::kNoOne;
    if (p == ranking.order.size()) {
      if (ranking.heads.empty()) return Ranking::kNoOne;
      std::pop_heap(ranking.heads.begin(), ranking.heads.end(), Ranking::Later);
      const Ranking::Ranked r = ranking.heads.back();
      ranking.heads.pop_back();
      ranking.order.push_back(r);
      const Identity& id = identities_[r.who];
      if (r.k + 1 < id.waiting.size()) {
        ranking.heads.push_back(Ranking::Ranked{r.start + kStride / id.weight,
                                                id.waiting[r.k + 1].ticket, r.who, r.k + 1});
        std::push_heap(ranking.heads.begin(), ranking.heads.end(), Ranking::Later);
      }
    }
    const Ranking::Ranked& r = ranking.order[p];
    Identity& id = identities_[r.who];
    const Waiter& w = id.waiting[r.k];
    if (w.taken) continue;
    if (id.scan != scan) {
      id.scan = scan;
      id.held_back = kNone;
    }
    uint8_t others = kNone;  // an ordinary request of another identity waits for these
    for (uint8_t d : kAll) {
      if (ordinary_waiting_[Index(d)] > id.ordinary[Index(d)]) others |= d;
    }
    if ((w.mask & (blocked | id.held_back)) == 0 && FitsLocked(w.mask, id, others)) return p;
    // It waits: an ordinary request for everyone ranked after it, a borrowing one for its own
    // identity's later requests only.
    if (!w.borrows) {
      blocked |= w.mask;
      continue;
    }
    const uint8_t closed = w.mask & ~id.held_back;  // of id.wants
    id.held_back |= w.mask;
    for (int bit = 0; bit < 8; ++bit) {
      if ((closed & (1u << bit)) && --open_by_bit[bit] == 0) open &= ~(1u << bit);
    }
  }
}

CopyTurns::Stats CopyTurns::stats() const {
  MutexLock lock(&mu_);
  Stats s;
  s.waits = waits_;
  s.waiting = waiting_;
  s.held_to_device = held_[0];
  s.held_to_host = held_[1];
  s.held_device = held_[2];
  return s;
}

}  // namespace ferry::session
