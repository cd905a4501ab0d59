#include "session/serial_executor.h"

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <utility>

namespace ferry::session {

SerialExecutor::SerialExecutor(boost::asio::io_context& io, LongLane* long_lane,
                               std::string identity)
    : state_(std::make_shared<State>(io, long_lane, std::move(identity))) {}

void SerialExecutor::Post(std::function<void()> fn, const char* name, Lane lane) const {
  MutexLock lock(&state_->mu);
  state_->queue.push_back({std::move(fn), /*is_short=*/false, name, OnLongLane(lane)});
  if (!state_->active) {
    state_->active = true;
    ScheduleOrIdleLocked(state_);  // on the lane of the queue's first: this one
  }
}

void SerialExecutor::PostAfter(std::chrono::milliseconds delay, std::function<void()> fn,
                               const char* name) const {
  auto timer = std::make_shared<boost::asio::steady_timer>(state_->io, delay);
  timer->async_wait([timer, self = *this, fn = std::move(fn),
                     name](const boost::system::error_code& error) mutable {
    if (!error) self.Post(std::move(fn), name);
  });
}

void SerialExecutor::Yield(std::function<void()> fn, const char* name, Lane lane) const {
  bool misused = false;
  {
    MutexLock lock(&state_->mu);
    state_->queue.push_back({std::move(fn), /*is_short=*/false, name, OnLongLane(lane)});
    if (state_->runner == std::this_thread::get_id()) {
      state_->yielding = true;  // the running function's runner ends its turn (active stays)
    } else {
      // Not from a function of this executor: no turn of its to end here, so `fn` is
      // queued as Post queues it (never left unscheduled, nor another thread's turn cut).
      misused = true;
      if (!state_->active) {
        state_->active = true;
        ScheduleOrIdleLocked(state_);
      }
    }
  }
  if (misused) {
    spdlog::error("SerialExecutor::Yield('{}') called outside a function of its executor",
                  name != nullptr ? name : "unnamed");
  }
}

void SerialExecutor::RunOrPost(std::function<void()> fn, Followers followers) const {
  {
    MutexLock lock(&state_->mu);
    if (state_->active) {  // running or scheduled: keep the order
      state_->queue.push_back({std::move(fn), /*is_short=*/true});
      return;
    }
    state_->active = true;
    state_->runner = std::this_thread::get_id();
    state_->runner_on_long_lane = false;
  }
  RunTaken(std::move(fn), followers);
}

namespace {
// How deep this thread is in RunTaken (functions run on a RunOrPost's or TryRun's caller's
// thread); an io_context thread draining a queue may be inside one only through a nested
// RunOrPost.
thread_local int callers_thread_runs = 0;
struct CallersThreadRun {
  CallersThreadRun() { ++callers_thread_runs; }
  ~CallersThreadRun() { --callers_thread_runs; }
};
}  // namespace

bool SerialExecutor::RunningOnCallersThread() { return callers_thread_runs > 0; }

namespace {
// When the executor turn running on this thread began (TurnStart); a nested turn (a
// RunOrPost run inside another executor's function) has its own, and the outer one's comes
// back after it.
thread_local std::chrono::steady_clock::time_point turn_start;
struct Turn {
  Turn() : outer(std::exchange(turn_start, std::chrono::steady_clock::now())) {}
  ~Turn() { turn_start = outer; }
  const std::chrono::steady_clock::time_point outer;
};
}  // namespace

std::chrono::steady_clock::time_point SerialExecutor::TurnStart() { return turn_start; }

void SerialExecutor::RunTaken(std::function<void()> fn, Followers followers) const {
  CallersThreadRun on_callers_thread;
  Turn turn;
  fn();
  for (int ran = 1;; ++ran) {
    {
      MutexLock lock(&state_->mu);
      const bool run_next = followers == Followers::kRunHere && ran < kBatch && !state_->yielding &&
                            !state_->queue.empty() && state_->queue.front().is_short;
      if (!run_next) {
        state_->yielding = false;
        state_->runner = std::thread::id();
        ScheduleOrIdleLocked(state_);  // the rest runs on the io_context
        return;
      }
      fn = std::move(state_->queue.front().fn);
      state_->queue.pop_front();
    }
    fn();
  }
}

bool SerialExecutor::TryRun(std::function<void()>& fn, Followers followers) const {
  {
    MutexLock lock(&state_->mu);
    if (state_->active) return false;
    state_->active = true;
    state_->runner = std::this_thread::get_id();
    state_->runner_on_long_lane = false;
  }
  RunTaken(std::move(fn), followers);
  return true;
}

bool SerialExecutor::running_in_this_thread() const {
  MutexLock lock(&state_->mu);
  return state_->runner == std::this_thread::get_id();
}

bool SerialExecutor::running_on_long_lane() const {
  MutexLock lock(&state_->mu);
  return state_->runner == std::this_thread::get_id() && state_->runner_on_long_lane;
}

void SerialExecutor::Drain(const std::shared_ptr<State>& state, bool on_long_lane) {
  Turn turn;
  for (int i = 0; i < kBatch; ++i) {
    std::function<void()> fn;
    const char* name = nullptr;
    {
      MutexLock lock(&state->mu);
      // The next function is for the other lane: hand on (below).
      if (state->queue.empty() || state->queue.front().long_lane != on_long_lane) break;
      fn = std::move(state->queue.front().fn);
      name = state->queue.front().name;
      state->queue.pop_front();
      state->runner = std::this_thread::get_id();
      state->runner_on_long_lane = on_long_lane;
    }
    if (name == nullptr) {
      fn();
    } else {  // a named Post: worth two clock reads (short functions are never named)
      const auto start = std::chrono::steady_clock::now();
      fn();
      const auto took = std::chrono::steady_clock::now() - start;
      if (took > kSlowHandler) {
        spdlog::warn("executor handler '{}' ran {} ms", name,
                     std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
      }
    }
    MutexLock lock(&state->mu);
    state->runner = std::thread::id();
    if (std::exchange(state->yielding, false)) break;  // the rest after others' work
  }
  MutexLock lock(&state->mu);
  ScheduleOrIdleLocked(state);
}

void SerialExecutor::ScheduleOrIdleLocked(const std::shared_ptr<State>& state) {
  if (state->queue.empty()) {
    state->active = false;
    return;
  }
  // Stays active.
  if (state->queue.front().long_lane) {
    state->long_lane->Post(state->identity, [state] { Drain(state, /*on_long_lane=*/true); });
  } else {
    boost::asio::post(state->io, [state] { Drain(state, /*on_long_lane=*/false); });
  }
}

}  // namespace ferry::session
