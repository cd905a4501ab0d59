// Mutex, MutexLock and CondVar (common/include/ferry/mutex.h), the annotated wrappers over
// std::mutex and std::condition_variable: a waiter wakes for a notification once its
// predicate holds, a timed wait that is never satisfied returns false with the lock held,
// and a MutexLock that Unlocks lets another thread in.
#include "ferry/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace ferry {
namespace {

struct Shared {
  Mutex mu;
  CondVar cv;
  int value ABSL_GUARDED_BY(mu) = 0;
};

TEST(MutexTest, AWaiterWakesOnceItsPredicateHolds) {
  Shared s;
  std::thread setter([&] {
    for (int i = 1; i <= 3; ++i) {
      {
        MutexLock lock(&s.mu);
        s.value = i;
      }
      s.cv.NotifyAll();
    }
  });
  {
    MutexLock lock(&s.mu);
    s.cv.Wait(&s.mu, [&] {
      s.mu.AssertHeld();
      return s.value == 3;
    });
    EXPECT_EQ(s.value, 3);
  }
  setter.join();
}

TEST(MutexTest, ATimedWaitNeverSatisfiedReturnsFalseHoldingTheLock) {
  Shared s;
  MutexLock lock(&s.mu);
  EXPECT_FALSE(s.cv.WaitFor(&s.mu, std::chrono::milliseconds(1), [&] {
    s.mu.AssertHeld();
    return s.value != 0;
  }));
  s.value = 7;  // still held: no other thread could have taken it
  EXPECT_TRUE(s.cv.WaitFor(&s.mu, std::chrono::milliseconds(1), [&] {
    s.mu.AssertHeld();
    return s.value == 7;
  }));
}

TEST(MutexTest, UnlockingAMutexLockLetsAnotherThreadIn) {
  Shared s;
  MutexLock lock(&s.mu);
  lock.Unlock();
  std::thread other([&] {
    MutexLock inner(&s.mu);
    s.value = 42;
  });
  other.join();  // would never return if the lock were still held
  lock.Lock();
  EXPECT_EQ(s.value, 42);
}

}  // namespace
}  // namespace ferry
