#include "transport/ring_poller.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/sys_error.h"

namespace ferry::transport {

// What the poller and its registrations share; outlives the poller while registrations do.
struct RingPoller::Registration::Shared {
  ~Shared() {
    if (wake >= 0) ::close(wake);
  }
  // Ring the wake-up eventfd when the poller may be asleep. Pairs with Sleep, which stores
  // asleep and then looks at the armed flags, the rings and the generation; callers store
  // an armed flag (or change the registrations) and then look at asleep (both seq_cst).
  void WakeIfAsleep() {
    if (asleep.load(std::memory_order_seq_cst)) {
      const uint64_t one = 1;
      (void)!::write(wake, &one, sizeof(one));
    }
  }
  int wake = -1;  // eventfd: Add, Arm, Remove and the poller's destructor ring it
  std::atomic<bool> asleep{false};
  std::atomic<uint64_t> generation{0};  // bumped by Add and Remove
  Mutex mu;
  std::vector<std::shared_ptr<Registration>> registered ABSL_GUARDED_BY(mu);
};

Result<std::unique_ptr<RingPoller>> RingPoller::Start(std::chrono::microseconds spin,
                                                      std::chrono::milliseconds sleep_max) {
  std::unique_ptr<RingPoller> p(new RingPoller(spin, sleep_max));
  p->shared_ = std::make_shared<Registration::Shared>();
  p->epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (p->epoll_ < 0) return SysError("epoll_create1");
  p->shared_->wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (p->shared_->wake < 0) return SysError("eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the poller's own wake-up
  if (::epoll_ctl(p->epoll_, EPOLL_CTL_ADD, p->shared_->wake, &ev) != 0) {
    return SysError("epoll_ctl");
  }
  p->thread_ = std::thread([raw = p.get()] {
    pthread_setname_np(pthread_self(), "ferry-rings");
    raw->Run();
  });
  return p;
}

RingPoller::~RingPoller() {
  if (thread_.joinable()) {
    stop_.store(true);
    const uint64_t one = 1;
    (void)!::write(shared_->wake, &one, sizeof(one));
    thread_.join();
  }
  if (epoll_ >= 0) ::close(epoll_);
  if (shared_) {
    MutexLock lock(&shared_->mu);
    for (auto& reg : shared_->registered) reg->removed_.store(true);
    shared_->registered.clear();
  }
}

std::shared_ptr<RingPoller::Registration> RingPoller::Add(std::shared_ptr<SubmitRing> ring,
                                                          Handler handler) {
  std::shared_ptr<Registration> reg(new Registration(shared_, std::move(ring), std::move(handler)));
  {
    MutexLock lock(&shared_->mu);
    shared_->registered.push_back(reg);
  }
  shared_->generation.fetch_add(1);
  shared_->WakeIfAsleep();  // the new ring's doorbell joins the epoll set at the next Refresh
  return reg;
}

size_t RingPoller::rings() const {
  MutexLock lock(&shared_->mu);
  return shared_->registered.size();
}

bool RingPoller::records_waiting() const {
  MutexLock lock(&shared_->mu);
  for (const auto& reg : shared_->registered) {
    if (reg->Ready()) return true;
  }
  return false;
}

void RingPoller::Registration::Arm(uint32_t records, uint64_t bytes) {
  byte_credits_.store(bytes, std::memory_order_relaxed);  // published by credits_'s store
  credits_.store(std::max<uint32_t>(records, 1), std::memory_order_seq_cst);
  shared_->WakeIfAsleep();
}

void RingPoller::Registration::Remove() {
  if (removed_.exchange(true)) return;
  credits_.store(0);
  {
    MutexLock lock(&shared_->mu);
    auto& r = shared_->registered;
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (it->get() == this) {
        r.erase(it);
        break;
      }
    }
  }
  shared_->generation.fetch_add(1);
  shared_->WakeIfAsleep();
}

void RingPoller::Refresh(std::vector<std::shared_ptr<Registration>>& regs) {
  std::vector<std::shared_ptr<Registration>> now;
  {
    MutexLock lock(&shared_->mu);
    now = shared_->registered;
  }
  for (auto& reg : regs) {  // dropped ones leave the epoll set; the ring may then go
    if (reg->removed_.load() && reg->in_epoll_) {
      (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, reg->ring_->doorbell_to_watch(), nullptr);
      reg->in_epoll_ = false;
    }
  }
  for (auto& reg : now) {
    if (!reg->in_epoll_ && !reg->muted_) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLET;  // a doorbell is never read (SubmitRing)
      ev.data.ptr = reg.get();
      if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, reg->ring_->doorbell_to_watch(), &ev) == 0) {
        reg->in_epoll_ = true;
      }
    }
  }
  regs = std::move(now);
}

size_t RingPoller::PollOnce(std::vector<std::shared_ptr<Registration>>& regs) {
  size_t handed = 0;
  size_t waiting = 0;  // armed rings with a record, this pass
  for (auto& reg : regs) {
    waiting += reg->Ready();
  }
  for (auto& reg : regs) {
    if (!reg->Ready()) continue;
    if (reg->removed_.load()) continue;
    Taken taken;
    taken.quiet = waiting <= 1 && handed_last_pass_ <= 1;
    const uint32_t credits = reg->credits_.load(std::memory_order_acquire);
    const uint64_t byte_credits = reg->byte_credits_.load(std::memory_order_relaxed);
    uint64_t bytes = 0;
    while (taken.records.size() < credits && (taken.records.empty() || bytes < byte_credits)) {
      std::string record, broken;
      const SubmitRing::Took took = reg->ring_->Take(&record, &broken);
      if (took == SubmitRing::Took::kEmpty) break;
      if (took == SubmitRing::Took::kBroken) {
        taken.broken = std::move(broken);
        break;
      }
      bytes += record.size();
      taken.records.push_back(std::move(record));
    }
    if (taken.records.empty() && taken.broken.empty()) continue;
    reg->credits_.store(0, std::memory_order_relaxed);  // the handler arms again
    // Counted before they are seen (a broken ring's report counts as one).
    records_total_.fetch_add(taken.records.size() + (taken.broken.empty() ? 0 : 1),
                             std::memory_order_relaxed);
    reg->handler_(std::move(taken));
    ++handed;
  }
  handed_last_pass_ = handed;
  return handed;
}

void RingPoller::CountEmptyWake(Registration& reg, std::chrono::steady_clock::time_point now) {
  if (now - reg.window_start_ >= kStormWindow) {
    if (reg.empty_wakes_ < kStormWakes && !reg.muted_) reg.mute_for_ = {};  // calm again
    reg.window_start_ = now;
    reg.empty_wakes_ = 0;
  }
  if (++reg.empty_wakes_ < kStormWakes || reg.muted_ || !reg.in_epoll_) return;
  reg.mute_for_ = reg.mute_for_.count() == 0 ? kMuteFirst : std::min(reg.mute_for_ * 2, kMuteMax);
  (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, reg.ring_->doorbell_to_watch(), nullptr);
  reg.in_epoll_ = false;
  reg.muted_ = true;
  reg.muted_until_ = now + reg.mute_for_;
  reg.empty_wakes_ = 0;
  reg.window_start_ = reg.muted_until_;
  mutes_total_.fetch_add(1, std::memory_order_relaxed);
}

std::chrono::steady_clock::time_point RingPoller::Unmute(
    std::vector<std::shared_ptr<Registration>>& regs, std::chrono::steady_clock::time_point now) {
  auto next = std::chrono::steady_clock::time_point::max();
  for (auto& reg : regs) {
    if (!reg->muted_) continue;
    if (reg->muted_until_ > now) {
      next = std::min(next, reg->muted_until_);
      continue;
    }
    reg->muted_ = false;
    if (reg->removed_.load()) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;  // a doorbell is never read (SubmitRing)
    ev.data.ptr = reg.get();
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, reg->ring_->doorbell_to_watch(), &ev) == 0)
      reg->in_epoll_ = true;
  }
  return next;
}

void RingPoller::Sleep(std::vector<std::shared_ptr<Registration>>& regs, uint64_t generation) {
  for (auto& reg : regs) reg->ring_->SetAsleep(true);
  shared_->asleep.store(true, std::memory_order_seq_cst);
  // Pairs with the client's fence between storing head and reading asleep: either it sees a
  // ring asleep and rings, or the look at the rings below sees its head.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool ready = stop_.load() || shared_->generation.load() != generation;
  for (auto& reg : regs) {
    // A ring whose head moved (HasRecord) after it was marked asleep may not have rung.
    if (reg->Ready()) ready = true;
  }
  if (!ready) {
    using Clock = std::chrono::steady_clock;
    Clock::time_point now = Clock::now();
    // Bounded: a client that writes without ringing its doorbell (libferry always rings), or
    // whose doorbell is muted, is served within kSleepMax, and a drain never waits on it for
    // its whole grace.
    auto timeout = sleep_max_;
    if (Clock::time_point due = Unmute(regs, now); due != Clock::time_point::max()) {
      timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(due - now));
    }
    epoll_event events[64];
    int n = ::epoll_wait(epoll_, events, 64, static_cast<int>(timeout.count()));
    now = Clock::now();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        uint64_t count;
        (void)!::read(shared_->wake, &count, sizeof(count));
      } else {
        auto* reg = static_cast<Registration*>(events[i].data.ptr);
        if (!reg->removed_.load() && !reg->Ready()) CountEmptyWake(*reg, now);
      }
    }
    Unmute(regs, now);
  }
  shared_->asleep.store(false, std::memory_order_seq_cst);
  for (auto& reg : regs) reg->ring_->SetAsleep(false);
}

void RingPoller::Run() {
  using Clock = std::chrono::steady_clock;
  std::vector<std::shared_ptr<Registration>> regs;
  uint64_t seen_generation = ~uint64_t{0};
  Clock::time_point active = Clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    if (const uint64_t g = shared_->generation.load(); g != seen_generation) {
      seen_generation = g;
      Refresh(regs);
    }
    if (PollOnce(regs) > 0) {
      active = Clock::now();
      continue;
    }
    if (Clock::now() - active < spin_) {
      std::this_thread::yield();
      continue;
    }
    Sleep(regs, seen_generation);
    active = Clock::now();
  }
}

}  // namespace ferry::transport
