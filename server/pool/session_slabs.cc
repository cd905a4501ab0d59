#include "pool/session_slabs.h"

#include <string>

namespace ferry::pool {

bool SessionSlabs::Bind(uid_t uid) {
  std::lock_guard lock(mu_);
  if (uid_ || closed_) return false;
  uid_ = uid;
  return true;
}

Result<SlabRef> SessionSlabs::Acquire() {
  std::lock_guard lock(mu_);
  if (closed_) return Status(ErrorKind::kSessionClosed, "the session is closed");
  if (!uid_) return Status(ErrorKind::kInternal, "no uid bound to the session's slabs");
  if (pinned_quota_ && (slabs_.size() + 1) * pool_->slab_size() > pinned_quota_) {
    return Status(ErrorKind::kQuotaExceeded, "the session's pinned-memory quota (" +
                                                 std::to_string(pinned_quota_) +
                                                 " bytes, --session-pinned-quota) is held by its " +
                                                 std::to_string(slabs_.size()) + " slabs");
  }
  if (charge_) FERRY_RETURN_IF_ERROR(charge_->TryCharge(pool_->slab_size()));
  Result<SlabRef> ref = pool_->Acquire(*uid_);
  if (!ref.ok()) {
    if (charge_) charge_->Refund(pool_->slab_size());
    return ref.status();
  }
  slabs_[ref->id].ref = *ref;
  return ref;
}

Status SessionSlabs::Check(const SlabRange& r) const {
  std::lock_guard lock(mu_);
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
  // The busy range starting last before `end` is the only candidate for an overlap.
  auto b = h.busy.lower_bound(end);
  if (b != h.busy.begin()) {
    --b;
    if (b->second > r.offset) {
      return Status(
          ErrorKind::kBusy,
          std::string(h.quarantined ? "a failed copy quarantined" : "a copy in flight uses") +
              " bytes [" + std::to_string(b->first) + ", " + std::to_string(b->second) +
              ") of slab " + std::to_string(r.slab));
    }
  }
  return Status::Ok();
}

char* SessionSlabs::MarkBusy(const SlabRange& r) {
  std::lock_guard lock(mu_);
  Held& h = slabs_.at(r.slab);
  if (r.length) h.busy[r.offset] = r.offset + r.length;
  return h.ref.data + r.offset;
}

void SessionSlabs::Finish(const SlabRange& r, bool failed) {
  std::lock_guard lock(mu_);
  auto it = slabs_.find(r.slab);
  if (it == slabs_.end() || r.length == 0) return;
  if (failed) {
    it->second.quarantined = true;  // the range stays busy for good
  } else {
    it->second.busy.erase(r.offset);
  }
}

void SessionSlabs::Close() {
  std::map<uint64_t, Held> slabs;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    slabs.swap(slabs_);
  }
  for (auto& [id, h] : slabs) {
    pool_->Release(id, h.quarantined);
    if (charge_) charge_->Refund(pool_->slab_size());
  }
}

size_t SessionSlabs::slab_count() const {
  std::lock_guard lock(mu_);
  return slabs_.size();
}

}  // namespace ferry::pool
