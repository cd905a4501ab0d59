// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with Clang's
// thread-safety annotations (Abseil's macros), so that `ABSL_GUARDED_BY(mu_)` and
// `ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)` are checked at compile time (tests/run.sh's `tsa`
// phase builds the daemon and libferry with -Werror=thread-safety). libstdc++'s std::mutex
// is not annotated as a capability, hence these thin wrappers (LevelDB's port::Mutex is the
// model). They add nothing at run time: each call is the std:: one.
//
// Conventions: a member that a lock guards says so with ABSL_GUARDED_BY; a function called
// with the lock held ends in `Locked` and says ABSL_EXCLUSIVE_LOCKS_REQUIRED; a lambda run
// with the lock held (a CondVar predicate) starts with `mu_.AssertHeld()`.
#pragma once

#include <absl/base/thread_annotations.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace ferry {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  /// Tell the analysis that the calling code holds the lock (no run-time check).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

/// Hold `mu` for the scope; Unlock and Lock in between (as std::unique_lock's unlock and
/// lock) for code that drops the lock for a while.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

/// std::condition_variable over a Mutex: each wait is std::condition_variable's, on the
/// Mutex's std::mutex, which the caller holds (released while asleep, held on return).
class CondVar {
 public:
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  template <typename Predicate>
  void Wait(Mutex* mu, Predicate done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, std::move(done));
    lock.release();
  }
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout, Predicate done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool met = cv_.wait_for(lock, timeout, std::move(done));
    lock.release();
    return met;
  }
  template <typename Rep, typename Period>
  std::cv_status WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const std::cv_status status = cv_.wait_for(lock, timeout);
    lock.release();
    return status;
  }
  template <typename Clock, typename Duration, typename Predicate>
  bool WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline,
                 Predicate done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool met = cv_.wait_until(lock, deadline, std::move(done));
    lock.release();
    return met;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace ferry
