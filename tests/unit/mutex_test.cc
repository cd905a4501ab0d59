// Mutex, MutexLock and CondVar (common/include/ferry/mutex.h), the annotated wrappers over
// std::mutex and std::condition_variable: a waiter wakes for a notification once its
// predicate holds, a timed wait that is never satisfied returns false with the lock held,
// and a MutexLock that Unlocks lets another thread in.
#include "ferry/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
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

// Held on return: another thread that tries to take the lock then waits until it is let go
// (a WaitFor that returned without the lock would let it in at once).
TEST(MutexTest, ATimedWaitNeverSatisfiedReturnsFalseHoldingTheLock) {
  Shared s;
  std::atomic<bool> entered{false};
  std::thread other;
  {
    MutexLock lock(&s.mu);
    EXPECT_FALSE(s.cv.WaitFor(&s.mu, std::chrono::milliseconds(1), [&] {
      s.mu.AssertHeld();
      return s.value != 0;
    }));
    other = std::thread([&] {
      MutexLock inner(&s.mu);
      entered = true;
      s.value = 42;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(entered) << "another thread took the lock the timed wait returned with";
    s.value = 7;
  }
  other.join();  // let in once the lock is released
  EXPECT_TRUE(entered);
  MutexLock lock(&s.mu);
  EXPECT_EQ(s.value, 42) << "the other thread wrote after this one let go";
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
