#include "parallel_copy.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "ferry/mutex.h"

namespace ferry::internal {
namespace {

constexpr int kMaxThreads = 16;
// Smallest piece handed to another thread: a 2 MiB chunk of a blocking transfer goes to 4.
constexpr uint64_t kPieceBytes = 512ull << 10;

// One ParallelCopy call that helper threads work on: its bytes and the size of the pieces
// they are cut into. Immutable; lives on the caller's stack until every piece is copied.
struct Job {
  char* dst;
  const char* src;
  uint64_t piece;
  uint64_t n;
};

// Helper threads, shared by every copy of the process. Leaked on purpose: they may still be
// blocked in a wait when static destructors run. One copy at a time has the helpers (job_);
// a copy that starts meanwhile copies alone.
class Pool {
 public:
  static Pool& Get() {
    static std::once_flag once;
    std::call_once(once, [] {
      current_ = new Pool();
      pthread_atfork(&Pool::BeforeFork, &Pool::AfterForkInParent, &Pool::AfterForkInChild);
    });
    return *current_;
  }

  void Copy(char* dst, const char* src, uint64_t n, int threads) {
    const Job job{dst, src, std::max<uint64_t>(kPieceBytes, (n + threads - 1) / threads), n};
    bool alone = false;
    {
      MutexLock lock(&mu_);
      // While another copy runs, this one copies alone: copies at once (sessions of one
      // process moving bytes together) each keep their own thread, so none gets the helpers
      // at the others' expense (sharing them, 64 sessions' rates differed up to 55-73x on the
      // H200; docs/performance.md).
      alone = job_ != nullptr;
      if (!alone) {
        StartLocked(threads - 1);
        job_ = &job;
        next_ = 0;
      }
    }
    if (alone) {
      std::memcpy(dst, src, n);
      return;
    }
    work_.NotifyAll();
    // The caller copies too, so the copy finishes even when no helper thread runs (after a
    // fork, in a child the threads were not copied into).
    MutexLock lock(&mu_);
    while (next_ < job.n) {
      const uint64_t at = TakeLocked();
      lock.Unlock();
      std::memcpy(dst + at, src + at, std::min(job.piece, n - at));
      lock.Lock();
    }
    done_.Wait(&mu_, [&] {
      mu_.AssertHeld();
      return running_ == 0;
    });
    job_ = nullptr;
  }

 private:
  // Take the next piece of job_ (which has one).
  uint64_t TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t at = next_;
    next_ = std::min(job_->n, at + job_->piece);
    return at;
  }

  void StartLocked(int wanted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (; started_ < wanted; ++started_) {
      std::thread([this] { Run(); }).detach();
    }
  }

  // A fork while a helper thread holds mu_ (it takes it after every piece) would leave the
  // child's copy of mu_ locked for good: the parent holds it across the fork, from BeforeFork
  // to AfterForkInParent (a lock held across two functions, which the analysis cannot follow).
  static void BeforeFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { current_->mu_.Lock(); }
  static void AfterForkInParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { current_->mu_.Unlock(); }
  // The child starts from a new pool. Its copy of the old one is unusable: the condition
  // variables still count the parent's waiting helper threads, which do not exist in the
  // child, and glibc's notify can wait for those waiters for ever (a forked child hung in
  // CI). The old pool is leaked: its mutex is held and its threads are gone.
  static void AfterForkInChild() { current_ = new Pool(); }

  void Run() {
    pthread_setname_np(pthread_self(), "ferry-copy");
    MutexLock lock(&mu_);
    for (;;) {
      work_.Wait(&mu_, [&] {
        mu_.AssertHeld();
        return job_ != nullptr && next_ < job_->n;
      });
      // job_ stays while running_ counts this thread: its caller waits for running_ == 0.
      const Job job = *job_;
      const uint64_t at = TakeLocked();
      ++running_;
      lock.Unlock();
      std::memcpy(job.dst + at, job.src + at, std::min(job.piece, job.n - at));
      lock.Lock();
      if (--running_ == 0 && next_ >= job.n) done_.NotifyAll();
    }
  }

  Mutex mu_;
  CondVar work_;  // job_ was set
  CondVar done_;  // running_ dropped to 0 with every piece of job_ taken
  const Job* job_ ABSL_GUARDED_BY(mu_) = nullptr;  // the copy the helpers work on, if any
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;         // job_'s first byte not yet taken
  int running_ ABSL_GUARDED_BY(mu_) = 0;           // job_'s pieces being copied by helpers
  int started_ ABSL_GUARDED_BY(mu_) = 0;           // helper threads started

  static inline Pool* current_ = nullptr;  // set once; replaced in a forked child only
};

}  // namespace

int ParallelCopyThreads() {
  static const int n = [] {
    if (const char* env = std::getenv("FERRY_COPY_THREADS")) {
      const int v = std::atoi(env);
      if (v >= 1) return std::min(v, kMaxThreads);
    }
    return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 4);
  }();
  return n;
}

void ParallelCopy(void* dst, const void* src, uint64_t n, int threads) {
  if (n == 0) return;  // memcpy's pointers must be valid even then; an empty vector's are null
  threads = std::min(threads, kMaxThreads);
  if (n < kParallelCopyMinBytes || threads < 2) {
    std::memcpy(dst, src, n);
    return;
  }
  Pool::Get().Copy(static_cast<char*>(dst), static_cast<const char*>(src), n, threads);
}

}  // namespace ferry::internal
