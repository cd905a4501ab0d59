#include "pool/session_slabs.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

namespace ferry::pool {

BusyRanges::Cover::iterator BusyRanges::Split(uint64_t at) {
  auto next = cover_.upper_bound(at);
  uint32_t count = 0;  // the count of the segment `at` falls in (0 before the first)
  if (next != cover_.begin()) {
    auto here = std::prev(next);
    if (here->first == at) return here;
    count = here->second;
  }
  if (spares_ == 0) return cover_.emplace_hint(next, at, count);
  Cover::node_type node = std::move(spare_[--spares_]);
  node.key() = at;
  node.mapped() = count;
  return cover_.insert(next, std::move(node));
}

void BusyRanges::Merge(uint64_t at) {
  auto it = cover_.find(at);
  if (it == cover_.end()) return;
  const uint32_t before = it == cover_.begin() ? 0 : std::prev(it)->second;
  if (it->second != before) return;
  if (spares_ < kSpareNodes) {
    spare_[spares_++] = cover_.extract(it);
  } else {
    cover_.erase(it);
  }
}

void BusyRanges::Shift(uint64_t begin, uint64_t end, int delta) {
  if (begin >= end) return;
  auto first = Split(begin);
  auto last = Split(end);
  for (auto it = first; it != last; ++it) {
    it->second = static_cast<uint32_t>(static_cast<int64_t>(it->second) + delta);
  }
  // Only the segments at the two ends can now equal their neighbours.
  Merge(end);
  Merge(begin);
}

std::optional<std::pair<uint64_t, uint64_t>> BusyRanges::FindOverlap(uint64_t begin,
                                                                     uint64_t end) const {
  if (begin >= end) return std::nullopt;
  auto it = cover_.upper_bound(begin);
  if (it != cover_.begin()) --it;  // the segment holding `begin`, if any starts at or before it
  for (; it != cover_.end() && it->first < end; ++it) {
    if (it->second == 0) continue;
    auto next = std::next(it);  // exists: the last segment is free
    return std::make_pair(it->first, next == cover_.end() ? UINT64_MAX : next->first);
  }
  return std::nullopt;
}

bool SessionSlabs::Bind(uid_t uid) {
  MutexLock lock(&mu_);
  if (uid_ || closed_) return false;
  uid_ = uid;
  return true;
}

Result<SlabRef> SessionSlabs::Acquire() {
  MutexLock lock(&mu_);
  if (closed_) return Status(ErrorKind::kSessionClosed, "the session is closed");
  if (!uid_) return Status(ErrorKind::kInternal, "no uid bound to the session's slabs");
  const uint64_t counted = slabs_.size() + acquiring_;
  if (pinned_quota_ && (counted + 1) * pool_->slab_size() > pinned_quota_) {
    return Status(ErrorKind::kQuotaExceeded, "the session's pinned-memory quota (" +
                                                 std::to_string(pinned_quota_) +
                                                 " bytes, --session-pinned-quota) is held by its " +
                                                 std::to_string(counted) + " slabs");
  }
  const uid_t uid = *uid_;
  if (charge_) {
    Status charged = charge_->TryCharge(pool_->slab_size());
    if (!charged.ok()) {
      // The uid's own kept slabs may be what holds its limit (not under mu_: giving them
      // back takes other slab sets' locks).
      lock.Unlock();
      while (!charged.ok() && pool_->kept().ReleaseOldest(uid)) {
        charged = charge_->TryCharge(pool_->slab_size());
      }
      lock.Lock();
      FERRY_RETURN_IF_ERROR(charged);
      if (closed_) {
        charge_->Refund(pool_->slab_size());
        return Status(ErrorKind::kSessionClosed, "the session is closed");
      }
    }
  }
  ++acquiring_;
  // Not under mu_: the pool may make the slab now (tens of ms), and the session's executor
  // checks and marks ranges of the slabs it holds meanwhile.
  lock.Unlock();
  Result<SlabRef> ref = pool_->Acquire(uid);
  // The budget held by slabs in use: idle kept slabs, anyone's, go first.
  while (!ref.ok() && ref.status().kind() == ErrorKind::kQuotaExceeded &&
         pool_->kept().ReleaseOldest(std::nullopt)) {
    ref = pool_->Acquire(uid);
  }
  lock.Lock();
  --acquiring_;
  if (ref.ok() && closed_) {  // closed while the slab was made: it goes back at once
    pool_->Release(ref->id, /*quarantined=*/false);
    ref = Status(ErrorKind::kSessionClosed, "the session is closed");
  }
  if (!ref.ok()) {
    if (charge_) charge_->Refund(pool_->slab_size());
    return ref.status();
  }
  slabs_[ref->id].ref = *ref;
  return ref;
}

Result<int> SessionSlabs::DuplicateFd(uint64_t id) const {
  MutexLock lock(&mu_);
  auto it = slabs_.find(id);
  if (it == slabs_.end() || closed_) {
    return Status(ErrorKind::kSessionClosed,
                  "the session no longer holds slab " + std::to_string(id));
  }
  const int fd = ::fcntl(it->second.ref.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    return Status(ErrorKind::kInternal, std::string("dup of a slab fd: ") + std::strerror(errno));
  }
  return fd;
}

Status SessionSlabs::Check(const SlabRange& r) const {
  MutexLock lock(&mu_);
  auto it = slabs_.find(r.slab);
  if (it == slabs_.end() || closed_) {
    return Status(ErrorKind::kInvalidHandle,
                  "slab " + std::to_string(r.slab) + " is not held by this session");
  }
  const Held& h = it->second;
  uint64_t end = 0;
  if (__builtin_add_overflow(r.offset, r.length, &end) || end > h.ref.size) {
    return Status(ErrorKind::kOutOfRange, "bytes [" + std::to_string(r.offset) + ", +" +
                                              std::to_string(r.length) + ") are outside slab " +
                                              std::to_string(r.slab) + " of " +
                                              std::to_string(h.ref.size) + " bytes");
  }
  if (r.length == 0) return Status::Ok();
  if (auto busy = h.busy.FindOverlap(r.offset, end)) {
    return Status(ErrorKind::kBusy,
                  std::string(h.quarantined ? "a failed copy quarantined, or a copy in flight uses,"
                                            : "a copy in flight uses") +
                      " bytes [" + std::to_string(busy->first) + ", " +
                      std::to_string(busy->second) + ") of slab " + std::to_string(r.slab));
  }
  return Status::Ok();
}

char* SessionSlabs::MarkBusy(const SlabRange& r) {
  MutexLock lock(&mu_);
  Held& h = slabs_.at(r.slab);
  h.busy.Add(r.offset, r.offset + r.length);
  return h.ref.data + r.offset;
}

void SessionSlabs::Finish(const SlabRange& r, bool failed) {
  MutexLock lock(&mu_);
  auto it = slabs_.find(r.slab);
  if (it == slabs_.end() || r.length == 0) return;
  if (failed) {
    it->second.quarantined = true;  // the range stays busy for good
  } else {
    it->second.busy.Remove(r.offset, r.offset + r.length);
  }
}

void SessionSlabs::Close() {
  std::map<uint64_t, Held> slabs;
  std::optional<uid_t> kept_by;  // set when this call kept slabs (a later call keeps none)
  {
    MutexLock lock(&mu_);
    closed_ = true;
    slabs.swap(slabs_);
    int64_t kept = 0;
    for (uint64_t id : keep_at_close_) {
      auto it = slabs.find(id);
      // A quarantined slab's bytes are of unknown state, and a busy one is still in use.
      if (it == slabs.end() || it->second.quarantined || !it->second.busy.empty()) continue;
      kept_.emplace(id, it->second.ref);
      slabs.erase(it);
      ++kept;
    }
    keep_at_close_.clear();
    pool_->kept().Count(kept);
    if (kept > 0 && uid_) kept_by = *uid_;
  }
  for (auto& [id, h] : slabs) {
    pool_->Release(id, h.quarantined);
    if (charge_) charge_->Refund(pool_->slab_size());
  }
  // Indexed for grants short of room (a set made without a shared_ptr, as in unit tests,
  // cannot be: its kept slabs go back only as below).
  if (kept_by) {
    if (std::weak_ptr<SessionSlabs> self = weak_from_this(); !self.expired()) {
      pool_->kept().Add(std::move(self), *kept_by);
    }
  }
}

void SessionSlabs::KeepAtClose(std::vector<uint64_t> ids) {
  MutexLock lock(&mu_);
  if (!closed_ && !keeping_over_) keep_at_close_ = std::move(ids);
}

size_t SessionSlabs::ReleaseKept() {
  std::map<uint64_t, SlabRef> kept;
  {
    MutexLock lock(&mu_);
    kept.swap(kept_);
    keep_at_close_.clear();  // a Close still to come gives everything back
    keeping_over_ = true;
  }
  pool_->kept().Count(-static_cast<int64_t>(kept.size()));
  for (auto& [id, ref] : kept) {
    pool_->Release(id, /*quarantined=*/false);
    if (charge_) charge_->Refund(pool_->slab_size());
  }
  return kept.size();
}

std::vector<uint64_t> SessionSlabs::AdoptKept(SessionSlabs& last) {
  std::map<uint64_t, SlabRef> kept;
  std::shared_ptr<PinnedCharge> last_charge;
  {
    MutexLock lock(&last.mu_);
    kept.swap(last.kept_);
    last_charge = last.charge_;
  }
  pool_->kept().Count(-static_cast<int64_t>(kept.size()));  // taken over, or given back
  std::vector<uint64_t> adopted;
  MutexLock lock(&mu_);
  for (auto& [id, ref] : kept) {
    // The charge moves with the slab: nothing to do where both sessions pay the same account.
    bool charged = last_charge == charge_;
    if (!charged) {
      if (last_charge) last_charge->Refund(pool_->slab_size());
      charged = !charge_ || charge_->TryCharge(pool_->slab_size()).ok();
    }
    const bool fits = !pinned_quota_ || (slabs_.size() + 1) * pool_->slab_size() <= pinned_quota_;
    if (closed_ || !charged || !fits) {
      if (charged && charge_) charge_->Refund(pool_->slab_size());
      pool_->Release(id, /*quarantined=*/false);
      continue;
    }
    slabs_[id].ref = ref;
    adopted.push_back(id);
  }
  return adopted;
}

size_t SessionSlabs::slab_count() const {
  MutexLock lock(&mu_);
  return slabs_.size();
}

void KeptSlabsIndex::Add(std::weak_ptr<SessionSlabs> holder, uid_t uid) {
  MutexLock lock(&mu_);
  // Holders gone since (their kept slabs taken over or given back) go now: the index holds
  // at most one entry per slab set alive.
  std::erase_if(holders_, [](const Holder& h) { return h.slabs.expired(); });
  holders_.push_back({std::move(holder), uid});
}

bool KeptSlabsIndex::ReleaseOldest(std::optional<uid_t> uid) {
  for (;;) {
    std::shared_ptr<SessionSlabs> oldest;
    {
      MutexLock lock(&mu_);
      auto it = std::find_if(holders_.begin(), holders_.end(), [&](const Holder& h) {
        return !h.slabs.expired() && (!uid || h.uid == *uid);
      });
      if (it == holders_.end()) return false;
      oldest = it->slabs.lock();
      holders_.erase(it);
    }
    // Not under mu_: ReleaseKept takes the set's lock and the pool's. A set whose slabs the
    // next session took over (or that gave them back) has none: look further.
    if (oldest && oldest->ReleaseKept() > 0) return true;
  }
}

}  // namespace ferry::pool
