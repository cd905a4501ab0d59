#include "pool/staging.h"

#include <spdlog/spdlog.h>

namespace ferry::pool {
namespace {
constexpr uint64_t kAlign = 4096;
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

StagingLease& StagingLease::operator=(StagingLease&& o) noexcept {
  if (this != &o) {
    Reset();
    area_ = o.area_;
    holder_ = std::move(o.holder_);
    slab_index_ = o.slab_index_;
    offset_ = o.offset_;
    length_ = o.length_;
    reserved_ = o.reserved_;
    data_ = o.data_;
    o.area_ = nullptr;
    o.data_ = nullptr;
  }
  return *this;
}

void StagingLease::Reset() {
  if (area_ && data_) {
    // Before Free, which wakes the waiters: a holder at its share sees the bytes gone.
    for (StagingHolder* h = holder_.get(); h; h = h->parent.get()) h->held.fetch_sub(reserved_);
    area_->Free(slab_index_, offset_, reserved_);
  }
  area_ = nullptr;
  holder_.reset();
  data_ = nullptr;
}

StagingArea::~StagingArea() {
  MutexLock lock(&mu_);
  if (stats_.bytes_in_use)
    spdlog::error("staging destroyed with {} bytes leased", stats_.bytes_in_use);
  for (Slab& s : slabs_) pool_->Release(s.ref.id, /*quarantined=*/false);
}

StagingArea::Outcome StagingArea::AllocateAll(const std::vector<uint64_t>& sizes,
                                              std::vector<StagingLease>* out,
                                              std::function<void()> wake,
                                              const std::shared_ptr<StagingHolder>& holder) {
  out->clear();
  uint64_t total = 0;
  for (uint64_t n : sizes) {
    if (n == 0 || n > pool_->slab_size()) return Outcome::kNever;
    total += AlignUp(n);
  }
  if (total > max_slabs_ * pool_->slab_size()) return Outcome::kNever;
  // Past a holder's share whatever it holds: the ranges could not be freed until its own
  // earlier work has run, however long that is, and no other session could stage meanwhile.
  if (holder && total > holder_limit_) return Outcome::kNever;
  std::vector<StagingLease> taken;
  MutexLock lock(&mu_);
  // The holder or its parent at its share (half the area): it waits for its own ranges. Checked
  // under the lock that Free takes after a lease's bytes leave `held`, so the wake-up of such a
  // free is not missed.
  for (const StagingHolder* h = holder.get(); h; h = h->parent.get()) {
    const uint64_t held = h->held.load();
    if (held + total > holder_limit_) {
      waiters_.push_back(std::move(wake));
      return Outcome::kWaitOwn;
    }
  }
  for (uint64_t n : sizes) {
    StagingLease lease = AllocateLocked(n);
    if (lease) {
      taken.push_back(std::move(lease));
      continue;
    }
    // Give back what was taken, here under the lock and without waking anyone (a wake-up
    // for these bytes would only make the waiters, this one included, try again in vain).
    for (StagingLease& t : taken) {
      slabs_[t.slab_index_].used.erase(t.offset_);
      stats_.bytes_in_use -= t.reserved_;
      stats_.staged_total -= t.length_;
      t.area_ = nullptr;
      t.data_ = nullptr;
    }
    // Nothing in use but this submit's own ranges, and still no room: the slabs cannot
    // place it, or no slab is to be had (the pinned budget is spent). No free would help.
    if (stats_.bytes_in_use == 0) return Outcome::kNever;
    waiters_.push_back(std::move(wake));
    return Outcome::kWait;
  }
  for (StagingLease& t : taken) {
    for (StagingHolder* h = holder.get(); h; h = h->parent.get()) h->held.fetch_add(t.reserved_);
    t.holder_ = holder;
  }
  *out = std::move(taken);
  return Outcome::kAllocated;
}

StagingLease StagingArea::AllocateLocked(uint64_t bytes) {
  StagingLease lease;
  if (bytes == 0 || bytes > pool_->slab_size()) return lease;
  const uint64_t need = AlignUp(bytes);
  auto place = [&](size_t index) -> bool {
    mu_.AssertHeld();
    Slab& s = slabs_[index];
    uint64_t at = 0;
    for (const auto& [begin, end] : s.used) {
      if (begin - at >= need) break;
      at = end;
    }
    if (at + need > s.ref.size) return false;
    s.used[at] = at + need;
    lease.area_ = this;
    lease.slab_index_ = index;
    lease.offset_ = at;
    lease.length_ = bytes;
    lease.reserved_ = need;
    lease.data_ = s.ref.data + at;
    return true;
  };
  bool placed = false;
  for (size_t i = 0; i < slabs_.size() && !placed; ++i) placed = place(i);
  if (!placed && slabs_.size() < max_slabs_) {
    auto ref = pool_->AcquireDaemon();
    if (ref.ok()) {
      slabs_.push_back(Slab{*ref, {}});
      stats_.slabs = slabs_.size();
      placed = place(slabs_.size() - 1);
    } else {
      spdlog::debug("no slab for staging: {}", ref.status().ToString());
    }
  }
  if (placed) {
    stats_.bytes_in_use += need;
    stats_.staged_total += bytes;
  }
  return lease;
}

void StagingArea::Free(size_t slab_index, uint64_t offset, uint64_t reserved) {
  std::vector<std::function<void()>> wake;
  {
    MutexLock lock(&mu_);
    slabs_[slab_index].used.erase(offset);
    stats_.bytes_in_use -= reserved;
    wake.swap(waiters_);
  }
  for (auto& w : wake) w();
}

void StagingArea::CountFallback() {
  MutexLock lock(&mu_);
  ++stats_.fallbacks_total;
}

StagingStats StagingArea::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ferry::pool
