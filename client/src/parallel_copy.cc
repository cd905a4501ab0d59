#include "parallel_copy.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace ferry::internal {
namespace {

constexpr int kMaxThreads = 16;
// Smallest piece handed to another thread: a 2 MiB chunk of a blocking transfer goes to 4.
constexpr uint64_t kPieceBytes = 512ull << 10;

// One ParallelCopy call: its pieces not yet taken, and those taken but not finished.
struct Job {
  char* dst;
  const char* src;
  uint64_t piece;
  uint64_t n;
  uint64_t next = 0;  // first byte not yet taken; guarded by Pool::mu_
  int running = 0;    // pieces being copied by helper threads; guarded by Pool::mu_
  std::condition_variable done;
};

// Helper threads, shared by every copy of the process. Leaked on purpose: they may still be
// blocked in wait() when static destructors run.
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
    auto job = std::make_shared<Job>();
    job->dst = dst;
    job->src = src;
    job->n = n;
    job->piece = std::max<uint64_t>(kPieceBytes, (n + threads - 1) / threads);
    bool alone = false;
    {
      std::lock_guard lock(mu_);
      // While another copy runs, this one copies alone: copies at once (sessions of one
      // process moving bytes together) each keep their own thread, so none gets the helpers
      // at the others' expense (sharing them, 64 sessions' rates differed up to 55-73x on the
      // H200; docs/performance.md).
      alone = !jobs_.empty();
      if (!alone) {
        StartLocked(threads - 1);
        jobs_.push_back(job);
      }
    }
    if (alone) {
      std::memcpy(dst, src, n);
      return;
    }
    work_.notify_all();
    // The caller copies too, so the copy finishes even when no helper thread runs (after a
    // fork, in a child the threads were not copied into).
    std::unique_lock lock(mu_);
    while (job->next < job->n) {
      const uint64_t at = Take(*job);
      lock.unlock();
      std::memcpy(dst + at, src + at, std::min(job->piece, n - at));
      lock.lock();
    }
    job->done.wait(lock, [&] { return job->running == 0; });
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), job), jobs_.end());
  }

 private:
  // Take the next piece of `job` (which has one); mu_ held.
  static uint64_t Take(Job& job) {
    const uint64_t at = job.next;
    job.next = std::min(job.n, at + job.piece);
    return at;
  }

  void StartLocked(int wanted) {
    for (; started_ < wanted; ++started_) {
      std::thread([this] { Run(); }).detach();
    }
  }

  // A fork while a helper thread holds mu_ (it takes it after every piece) would leave the
  // child's copy of mu_ locked for good: the parent holds it across the fork.
  static void BeforeFork() { current_->mu_.lock(); }
  static void AfterForkInParent() { current_->mu_.unlock(); }
  // The child starts from a new pool. Its copy of the old one is unusable: the condition
  // variables still count the parent's waiting helper threads, which do not exist in the
  // child, and glibc's notify can wait for those waiters for ever (a forked child hung in
  // CI). The old pool is leaked: its mutex is held and its threads are gone.
  static void AfterForkInChild() { current_ = new Pool(); }

  void Run() {
    pthread_setname_np(pthread_self(), "ferry-copy");
    std::unique_lock lock(mu_);
    for (;;) {
      std::shared_ptr<Job> job;
      // Of the copies with pieces left, help the one with the fewest helpers, so that
      // sessions copying at once share the threads instead of the oldest copy taking them all.
      work_.wait(lock, [&] {
        for (auto& j : jobs_) {
          if (j->next < j->n && (!job || j->running < job->running)) job = j;
        }
        return job != nullptr;
      });
      const uint64_t at = Take(*job);
      ++job->running;
      lock.unlock();
      std::memcpy(job->dst + at, job->src + at, std::min(job->piece, job->n - at));
      lock.lock();
      if (--job->running == 0 && job->next >= job->n) job->done.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::shared_ptr<Job>> jobs_;  // guarded by mu_
  int started_ = 0;                        // guarded by mu_

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
