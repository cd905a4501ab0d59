// SerialExecutor: runs the functions given to it one at a time, in the order given, like an
// Asio strand; and, unlike a strand, can run one on the calling thread when it is idle.
//
// Why: a tiny op's round trip crosses threads — gRPC's reader, the session's executor, the
// completion watcher, back to the executor — and each crossing is a thread wake-up (5–15 µs
// on a VM). RunOrPost lets the reader and the watcher run the session's handler themselves
// when nothing else of the session runs or waits, saving those wake-ups; Post always hands
// the function to the io_context's threads (for work that may block: module compiles,
// session setup, teardown).
//
// A RunOrPost that finds the executor busy queues its function as a short one. A caller that
// passes Followers::kRunHere then also runs, after its own function, the short functions
// that queued behind it meanwhile (up to kBatch): a completion that arrives while the gRPC
// thread is still finishing the submit's handler runs on that thread at once instead of
// waking an io thread; the ring poller does the same with TryRun when no other ring waits (a
// streaming client's completions, queued while the poller ran its next submits, are then
// delivered without a wake-up: streamed 64 KiB transfers 16-21 -> 11-14 us on the H200). The
// completion thread passes kPost: it must get back to watching.
//
// Lanes: besides the io_context every executor shares (the shared lane), an executor may have
// a second one for long work (the long lane: another io_context with threads of its own). A
// function yielded to the long lane (Yield with Lane::kLong) runs on one of its threads, in
// its place in the executor's order, so that work which holds its thread for long (CUDA: a
// large graph's instantiation, seconds) never holds a thread every session needs; the
// functions queued behind it run on the shared lane again. The long lane is a LongLane, which
// every executor shares, fair between identities: an executor names the identity its turns
// there count for. Without a long lane, kLong is kShared.
//
// Contract: functions of one executor never run concurrently, whatever their lanes, and run
// in the order they were accepted (a RunOrPost that finds the executor busy queues behind
// what is queued). Copies share one executor. Thread-safe.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ferry/mutex.h"
#include "session/long_lane.h"

namespace ferry::session {

class SerialExecutor {
 public:
  /// Which io_context runs a function: the shared one, or the long lane's (see above).
  enum class Lane : uint8_t { kShared, kLong };

  /// `long_lane` (may be null: none) must outlive the executor, as `io` must; the executor's
  /// turns there count for `identity` (LongLane).
  explicit SerialExecutor(boost::asio::io_context& io, LongLane* long_lane = nullptr,
                          std::string identity = {});

  /// Run `fn` later on one of the io_context's threads, after everything accepted before.
  /// `name` (a string literal, or null) names the handler in the log when it runs longer
  /// than kSlowHandler, so that a handler that holds the session up can be found. With
  /// Lane::kLong, `fn` runs on the long lane (see above).
  void Post(std::function<void()> fn, const char* name = nullptr, Lane lane = Lane::kShared) const;
  /// Post `fn` (as Post does) once `delay` has passed. The executor (and the io_context)
  /// must outlive the wait; `fn` should hold weak references to what may be gone by then.
  void PostAfter(std::chrono::milliseconds delay, std::function<void()> fn,
                 const char* name = nullptr) const;
  /// From a function of this executor that gives up its thread for a while (called
  /// elsewhere, a misuse, it logs an error and is a Post): `fn` is queued as Post queues it (behind
  /// what this executor has queued), and once the calling function returns the executor's turn on
  /// this thread ends, so that `fn` (with what else is queued here) runs after the work other
  /// executors queued on the io_context meanwhile. For work cut into slices (a long
  /// enqueue), so that it holds an io thread for one slice at a time, and what its own
  /// executor has queued (a completion, an abort) runs between slices. With Lane::kLong, `fn`
  /// runs on the long lane (the functions queued after it on the shared one).
  void Yield(std::function<void()> fn, const char* name = nullptr, Lane lane = Lane::kShared) const;
  /// True where the executor has a long lane of its own (else kLong runs on the shared one).
  bool has_long_lane() const { return state_->long_lane != nullptr; }
  /// True on the thread running one of this executor's functions now, on its long lane.
  bool running_on_long_lane() const;
  /// What a RunOrPost that ran its function does with the short functions (those queued by
  /// RunOrPost) that queued behind it: run them on this thread too, or hand them on.
  enum class Followers { kPost, kRunHere };

  /// Run `fn` now on this thread when the executor is idle (nothing running or queued),
  /// else queue it (as a short function) like Post. `fn` must not block. The calling thread
  /// must hold no lock `fn` may take.
  void RunOrPost(std::function<void()> fn, Followers followers = Followers::kPost) const;
  /// Run `fn` now on this thread when the executor is idle and return true (what queues
  /// behind it meanwhile is run or handed on as `followers` says); else return false and
  /// leave `fn` as it was.
  bool TryRun(std::function<void()>& fn, Followers followers = Followers::kPost) const;
  /// When the executor turn now running on this thread began: a Drain on an io thread (up
  /// to kBatch functions of one executor), or a RunOrPost's or TryRun's run on the caller's
  /// thread. Work cut into slices measures its slice from here, so that everything one turn
  /// runs (a paused submit's rest, the parked submits it then starts, a ring's run of
  /// submits) shares one slice. The clock's epoch on a thread running no turn.
  static std::chrono::steady_clock::time_point TurnStart();
  /// True on the thread running one of this executor's functions now.
  bool running_in_this_thread() const;
  /// True while this thread runs a function of any executor that a RunOrPost or TryRun ran
  /// on the caller's thread (a gRPC thread, the ring poller, the completion watcher), which
  /// must not block or run long; false on the io_context's threads running what was posted.
  /// A function that finds work it must not do here posts it instead.
  static bool RunningOnCallersThread();

  /// The most functions one io_context turn runs before it yields to other executors.
  static constexpr int kBatch = 16;
  /// A named posted handler that runs longer than this is logged (warning) with its name.
  static constexpr std::chrono::milliseconds kSlowHandler{100};

 private:
  struct Task {
    std::function<void()> fn;
    bool is_short = false;       // queued by RunOrPost: it does not block
    const char* name = nullptr;  // Post's name: timed when set
    bool long_lane = false;      // runs on the long lane (only where there is one)
  };
  struct State {
    State(boost::asio::io_context& io, LongLane* long_lane, std::string identity)
        : io(io), long_lane(long_lane), identity(std::move(identity)) {}
    boost::asio::io_context& io;
    LongLane* const long_lane;  // null: none
    const std::string identity;
    Mutex mu;
    std::deque<Task> queue ABSL_GUARDED_BY(mu);
    // A thread runs or is scheduled to run the queue.
    bool active ABSL_GUARDED_BY(mu) = false;
    std::thread::id runner ABSL_GUARDED_BY(mu);            // the thread running a function now
    bool runner_on_long_lane ABSL_GUARDED_BY(mu) = false;  // that thread is the long lane's
    bool yielding ABSL_GUARDED_BY(mu) = false;             // the running function called Yield
  };
  // Whether a function posted for `lane` runs on the long lane: kLong, where there is one.
  bool OnLongLane(Lane lane) const { return lane == Lane::kLong && state_->long_lane != nullptr; }
  // Run `fn` on this thread, the executor taken for it (active, runner set); then the short
  // functions queued behind it as `followers` says; then hand on the rest or go idle.
  void RunTaken(std::function<void()> fn, Followers followers) const;
  // Run queued functions on a thread of the lane `on_long_lane` says, up to kBatch and while
  // the next is for this lane, then reschedule or go idle.
  static void Drain(const std::shared_ptr<State>& state, bool on_long_lane);
  // Hand the rest of the queue to the io_context of its first function's lane, or go idle;
  // call with mu held.
  static void ScheduleOrIdleLocked(const std::shared_ptr<State>& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu);

  std::shared_ptr<State> state_;
};

}  // namespace ferry::session
