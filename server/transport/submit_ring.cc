#include "transport/submit_ring.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cstring>

#include "ferry/sys_error.h"

namespace ferry::transport {

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the ring's words are shared memory");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the ring's words are shared memory");
static_assert(std::endian::native == std::endian::little, "the layout is little-endian");

constexpr uint64_t RoundUp8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

}  // namespace

Result<std::unique_ptr<SubmitRing>> SubmitRing::Create(uint64_t capacity) {
  if (capacity < kMinCapacity || capacity > kMaxCapacity || !std::has_single_bit(capacity)) {
    return Status(ErrorKind::kInvalidArgument,
                  "a submit ring's capacity is a power of two from 4 KiB to 16 MiB, got " +
                      std::to_string(capacity));
  }
  std::unique_ptr<SubmitRing> ring(new SubmitRing());
  ring->capacity_ = capacity;
  ring->memfd_ = ::memfd_create("ferry-submit-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ring->memfd_ < 0) return SysError("memfd_create");
  if (::ftruncate(ring->memfd_, static_cast<off_t>(ring->map_bytes())) != 0) {
    return SysError("ftruncate of a submit ring");
  }
  // Sealed against resizing: a client cannot shrink the pages under the daemon's mapping.
  if (::fcntl(ring->memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return SysError("sealing a submit ring");
  }
  void* p = ::mmap(nullptr, ring->map_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ring->memfd_, 0);
  if (p == MAP_FAILED) return SysError("mmap of a submit ring");
  ring->map_ = static_cast<char*>(p);
  ring->head_ = new (ring->map_ + kHeadOffset) std::atomic<uint64_t>(0);
  ring->tail_word_ = new (ring->map_ + kTailOffset) std::atomic<uint64_t>(0);
  ring->asleep_ = new (ring->map_ + kAsleepOffset) std::atomic<uint32_t>(0);
  ring->board_sleepers_ = new (ring->map_ + kBoardSleepersOffset) std::atomic<uint32_t>(0);
  ring->doorbell_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ring->doorbell_ < 0) return SysError("eventfd for a submit ring's doorbell");
  return ring;
}

SubmitRing::~SubmitRing() {
  if (map_) ::munmap(map_, map_bytes());
  // A client may keep the memfd (or its mapping) after the session: the pages go now, so that
  // those the daemon wrote (the header) stay charged to it no longer. Its mapping reads zeros.
  if (memfd_ >= 0) {
    (void)::fallocate(memfd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                      static_cast<off_t>(map_bytes()));
  }
  if (memfd_ >= 0) ::close(memfd_);
  if (doorbell_ >= 0) ::close(doorbell_);
}

bool SubmitRing::HasRecord() const {
  return !is_broken_.load(std::memory_order_relaxed) &&
         head_->load(std::memory_order_relaxed) != tail_.load(std::memory_order_relaxed);
}

SubmitRing::Took SubmitRing::Take(std::string* record, std::string* why) {
  auto broken = [&](std::string what) {
    if (broken_.empty()) broken_ = std::move(what);
    is_broken_.store(true, std::memory_order_relaxed);
    *why = broken_;
    return Took::kBroken;
  };
  if (!broken_.empty()) return broken("");
  const uint64_t head = head_->load(std::memory_order_acquire);  // read once
  uint64_t tail = tail_.load(std::memory_order_relaxed);
  for (int pass = 0; pass < 2; ++pass) {  // at most one skip marker, then a record
    if (head == tail) return Took::kEmpty;
    const uint64_t available = head - tail;
    if (available > capacity_ || head % 8 != 0) {
      return broken("submit ring: head " + std::to_string(head) + " is not within " +
                    std::to_string(capacity_) + " bytes after tail " + std::to_string(tail) +
                    " at a multiple of 8");
    }
    const uint64_t at = tail & (capacity_ - 1);
    uint32_t length = 0;
    std::memcpy(&length, map_ + kHeaderBytes + at, sizeof(length));  // read once
    if (length == kSkipToStart) {
      const uint64_t skip = capacity_ - at;
      if (skip > available) return broken("submit ring: a skip marker past head");
      tail += skip;
      tail_.store(tail, std::memory_order_relaxed);
      tail_word_->store(tail, std::memory_order_release);
      continue;
    }
    const uint64_t bytes = 8 + RoundUp8(length);
    if (bytes > available || at + 8 + length > capacity_) {
      return broken("submit ring: a record of " + std::to_string(length) +
                    " bytes goes past head or the end of the ring");
    }
    record->assign(map_ + kHeaderBytes + at + 8, length);
    tail += bytes;
    tail_.store(tail, std::memory_order_relaxed);
    tail_word_->store(tail, std::memory_order_release);
    return Took::kRecord;
  }
  return broken("submit ring: two skip markers in a row");
}

void SubmitRing::SetAsleep(bool asleep) {
  asleep_->store(asleep ? 1 : 0, std::memory_order_seq_cst);
}

}  // namespace ferry::transport
