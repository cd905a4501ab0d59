#include "session/copy_turns.h"

#include <limits>
#include <type_traits>
#include <utility>

namespace ferry::session {
namespace {

// Lengths come from the wire (admission checks them later): add without wrapping.
void AddSaturating(uint64_t& sum, uint64_t n) {
  sum = n > std::numeric_limits<uint64_t>::max() - sum ? std::numeric_limits<uint64_t>::max()
                                                       : sum + n;
}

int Index(uint8_t direction) { return direction == CopyTurns::kToDevice ? 0 : 1; }

}  // namespace

uint8_t CopyTurns::Needs(const std::vector<Op>& ops) const {
  if (turns_ == 0) return kNone;
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
  uint8_t mask = kNone;
  if (to_device >= min_bytes_ && to_device > 0) mask |= kToDevice;
  if (to_host >= min_bytes_ && to_host > 0) mask |= kToHost;
  return mask;
}

bool CopyTurns::FreeLocked(uint8_t mask) const {
  for (uint8_t d : {kToDevice, kToHost}) {
    if ((mask & d) && held_[Index(d)] >= turns_) return false;
  }
  return true;
}

void CopyTurns::TakeLocked(uint8_t mask) {
  for (uint8_t d : {kToDevice, kToHost}) {
    if (mask & d) ++held_[Index(d)];
  }
}

bool CopyTurns::TryTake(uint8_t mask) {
  if (mask == kNone || turns_ == 0) return true;
  MutexLock lock(&mu_);
  for (const Waiter& w : waiters_) {
    if (w.mask & mask) return false;  // never jump an earlier request of the same direction
  }
  if (!FreeLocked(mask)) return false;
  TakeLocked(mask);
  return true;
}

void CopyTurns::Wait(uint8_t mask, std::function<void()> granted) {
  std::vector<std::function<void()>> go;
  {
    MutexLock lock(&mu_);
    ++waits_;
    waiters_.push_back(Waiter{mask, std::move(granted)});
    go = GrantLocked();
  }
  for (auto& fn : go) fn();
}

void CopyTurns::Give(uint8_t mask) {
  if (mask == kNone || turns_ == 0) return;
  std::vector<std::function<void()>> go;
  {
    MutexLock lock(&mu_);
    for (uint8_t d : {kToDevice, kToHost}) {
      if ((mask & d) && held_[Index(d)] > 0) --held_[Index(d)];
    }
    go = GrantLocked();
  }
  for (auto& fn : go) fn();
}

std::vector<std::function<void()>> CopyTurns::GrantLocked() {
  std::vector<std::function<void()>> go;
  uint8_t blocked = kNone;  // directions an earlier waiter still waits for
  for (auto it = waiters_.begin(); it != waiters_.end() && blocked != (kToDevice | kToHost);) {
    if ((it->mask & blocked) == 0 && FreeLocked(it->mask)) {
      TakeLocked(it->mask);
      go.push_back(std::move(it->granted));
      it = waiters_.erase(it);
    } else {
      blocked |= it->mask;
      ++it;
    }
  }
  return go;
}

CopyTurns::Stats CopyTurns::stats() const {
  MutexLock lock(&mu_);
  Stats s;
  s.waits = waits_;
  s.waiting = waiters_.size();
  s.held_to_device = held_[0];
  s.held_to_host = held_[1];
  return s;
}

}  // namespace ferry::session
