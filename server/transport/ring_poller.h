// RingPoller: the one thread of a daemon that takes records out of its sessions' submit
// rings (transport/submit_ring.h) and hands them to their sessions.
//
// Each ring is registered with a handler. Arm(n, bytes) lets the poller take up to n records
// and, past the first, only while those taken come to less than `bytes`: at its next look at
// the ring it takes those already there (within both) and hands them over in one call, in ring
// order; it takes more only once Arm is called again, the way a gRPC stream has one read
// outstanding. This is how a session applies backpressure to its ring: it arms only while it
// can accept more messages, and for no more than it can accept (by count and by the bytes it
// may still hold: what it holds at any time is bounded by that and one record). Handing a pipelined
// client's queued records over together saves a hand-off between threads per record.
//
// Waiting: after a record, the poller keeps polling every armed ring for `spin` (a client
// that submits again within it is seen within a microsecond, with no thread wake-up), then
// marks every ring asleep and sleeps in epoll on the rings' doorbells and its own wake-up
// eventfd (Arm and Add ring it), at most kSleepMax at a time. The cost is one core while clients
// submit, like the CUDA backend's completion watcher; an idle daemon sleeps.
//
// Doorbell storms: a doorbell that wakes the poller while its ring has nothing to take (no
// record, or not armed) is an empty wake-up. A ring whose doorbell wakes the poller empty
// kStormWakes times within kStormWindow is muted: its doorbell leaves the epoll set for
// kMuteFirst, doubling with each mute that follows (up to kMuteMax) and reset once the ring
// goes a window without a storm. A muted ring is still polled: at every pass (any other ring's
// record, any Arm) and at least every kSleepMax, so its records are never lost, only seen
// later; the storm costs its own session latency, not the poller's core.
//
// Handlers run on the poller thread and must not block: they parse and hand the record on.
// A handler may call Arm and Remove (of any registration). After Remove returns, the
// poller starts no new call of the handler; one already running on the poller thread may
// still finish. The poller keeps the ring (and its mapping) until it has dropped the
// registration.
//
// Thread-safety: Add, Arm and Remove from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/status.h"
#include "transport/submit_ring.h"

namespace ferry::transport {

class RingPoller {
 public:
  /// Records taken out of a ring in one look (in ring order; at most what Arm allowed); and,
  /// when `broken` is set, why the ring is broken after them (no record will follow).
  struct Taken {
    std::vector<std::string> records;
    std::string broken;
    // No other ring had a record in this pass or the one before: the poller is not needed
    // elsewhere now, so the handler may spend a few microseconds on these records.
    bool quiet = false;
  };
  using Handler = std::function<void(Taken)>;

  class Registration {
   public:
    /// Allow the poller to take up to `records` more records (at least 1), handed over in one
    /// call, or to report the ring broken; past the first record, only while the records taken
    /// come to less than `bytes` (their lengths).
    void Arm(uint32_t records = 1, uint64_t bytes = UINT64_MAX);
    /// Stop handing this ring's records over; idempotent.
    void Remove();

   private:
    friend class RingPoller;
    struct Shared;
    Registration(std::shared_ptr<Shared> shared, std::shared_ptr<SubmitRing> ring, Handler handler)
        : shared_(std::move(shared)), ring_(std::move(ring)), handler_(std::move(handler)) {}
    std::shared_ptr<Shared> shared_;  // outlives the poller while a registration is held
    std::shared_ptr<SubmitRing> ring_;
    Handler handler_;
    // Armed, and its ring holds a record the poller has not taken (seq_cst: Sleep's check).
    bool Ready() const { return credits_.load() > 0 && ring_->HasRecord(); }
    std::atomic<uint32_t> credits_{0};       // records the poller may take; 0: not armed
    std::atomic<uint64_t> byte_credits_{0};  // set with credits_, before it
    std::atomic<bool> removed_{false};
    // Poller thread only.
    bool in_epoll_ = false;
    bool muted_ = false;  // doorbell left out of the epoll set until muted_until_
    std::chrono::steady_clock::time_point muted_until_{};
    std::chrono::milliseconds mute_for_{0};  // the next mute's length (0: kMuteFirst)
    std::chrono::steady_clock::time_point window_start_{};
    uint32_t empty_wakes_ = 0;  // in the window from window_start_
  };

  /// The longest the poller sleeps without a doorbell before it looks at the rings again.
  static constexpr std::chrono::milliseconds kSleepMax{50};
  /// Doorbell storm limits (see the top of this file).
  static constexpr uint32_t kStormWakes = 64;
  static constexpr std::chrono::milliseconds kStormWindow{100};
  static constexpr std::chrono::milliseconds kMuteFirst{10};
  static constexpr std::chrono::milliseconds kMuteMax{1000};

  /// `sleep_max`: the longest sleep without a doorbell (kSleepMax; a test passes a long one,
  /// so that only a doorbell can wake the poller within it).
  static Result<std::unique_ptr<RingPoller>> Start(std::chrono::microseconds spin,
                                                   std::chrono::milliseconds sleep_max = kSleepMax);
  /// Stop the thread; registrations left are dropped (their handlers are not called again;
  /// Arm and Remove on them stay safe and do nothing).
  ~RingPoller();
  RingPoller(const RingPoller&) = delete;
  RingPoller& operator=(const RingPoller&) = delete;

  /// Poll `ring`, handing its records to `handler` once armed. Keep the result to Arm and
  /// Remove it; the poller's destructor drops what is still registered.
  std::shared_ptr<Registration> Add(std::shared_ptr<SubmitRing> ring, Handler handler);

  /// Records handed over since the start (all rings).
  uint64_t records_total() const { return records_total_.load(std::memory_order_relaxed); }
  /// Times a ring's doorbell was muted for a storm of empty wake-ups (all rings).
  uint64_t doorbell_mutes_total() const { return mutes_total_.load(std::memory_order_relaxed); }
  /// Rings registered now.
  size_t rings() const;
  /// Whether an armed ring holds a record the poller has not taken yet (a drain waits for
  /// them: the client sent them before it).
  bool records_waiting() const;

 private:
  RingPoller(std::chrono::microseconds spin, std::chrono::milliseconds sleep_max)
      : spin_(spin), sleep_max_(sleep_max) {}
  void Run();
  // Take the records of each armed ring that has some; return how many rings handed over.
  size_t PollOnce(std::vector<std::shared_ptr<Registration>>& regs);
  // Sleep until a doorbell or a wake-up rings, unless an armed ring has a record already or
  // the registrations changed since `generation`.
  void Sleep(std::vector<std::shared_ptr<Registration>>& regs, uint64_t generation);
  // Make the list of live registrations current (drops removed ones, adds new ones).
  void Refresh(std::vector<std::shared_ptr<Registration>>& regs);
  // Count an empty wake-up of `reg`'s doorbell; mute it when they come as a storm.
  void CountEmptyWake(Registration& reg, std::chrono::steady_clock::time_point now);
  // Put muted doorbells whose time is up back in the epoll set; return the earliest time a
  // muted one is due (max() when none is muted).
  std::chrono::steady_clock::time_point Unmute(std::vector<std::shared_ptr<Registration>>& regs,
                                               std::chrono::steady_clock::time_point now);

  const std::chrono::microseconds spin_;
  const std::chrono::milliseconds sleep_max_;
  int epoll_ = -1;
  std::shared_ptr<Registration::Shared> shared_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> records_total_{0};
  std::atomic<uint64_t> mutes_total_{0};
  size_t handed_last_pass_ = 0;  // poller thread only
};

}  // namespace ferry::transport
