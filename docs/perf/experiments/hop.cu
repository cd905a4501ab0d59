// Kernel launch rate when batches of 64 launches hop between threads (like a session
// executor on an io_context pool) against one thread.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
using Clock = std::chrono::steady_clock;
struct Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;
  bool stop = false;
  std::atomic<bool> ready{false};
  std::thread t;
  bool spin;
  explicit Worker(bool spin_) : spin(spin_) {
    t = std::thread([this] {
      cudaSetDevice(0);
      for (;;) {
        std::function<void()> j;
        if (spin) {
          while (!ready.load(std::memory_order_acquire)) {
            if (stop) return;
          }
          j = std::move(job);
          ready = false;
        } else {
          std::unique_lock<std::mutex> l(mu);
          cv.wait(l, [&] { return stop || job; });
          if (stop && !job) return;
          j = std::move(job);
          job = nullptr;
        }
        j();
      }
    });
  }
  void Give(std::function<void()> j) {
    if (spin) {
      job = std::move(j);
      ready.store(true, std::memory_order_release);
      return;
    }
    {
      std::lock_guard<std::mutex> l(mu);
      job = std::move(j);
    }
    cv.notify_one();
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_one();
    t.join();
  }
};
int main() {
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *x, *y;
  cudaMalloc(&x, 1024);
  cudaMalloc(&y, 1024);
  const int total = 16384;
  auto batch = [&](int n) {
    for (int i = 0; i < n; ++i) axpy<<<1, 256, 0, s>>>(1e-6f, x, y, 256);
  };
  auto one_thread = [&](int per) {
    auto t0 = Clock::now();
    for (int done = 0; done < total; done += per) batch(per);
    cudaStreamSynchronize(s);
    return total / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto hop = [&](int per, int nthreads, bool spin) {
    std::vector<std::unique_ptr<Worker>> w;
    for (int i = 0; i < nthreads; ++i) w.push_back(std::make_unique<Worker>(spin));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> done{0};
    std::mutex m;
    std::condition_variable cv;
    bool fin = false;
    std::function<void(int)> step = [&](int k) {
      batch(per);
      int d = done += per;
      if (d >= total) {
        std::lock_guard<std::mutex> l(m);
        fin = true;
        cv.notify_one();
        return;
      }
      w[(k + 1) % nthreads]->Give([&, k] { step(k + 1); });
    };
    auto t0 = Clock::now();
    w[0]->Give([&] { step(0); });
    {
      std::unique_lock<std::mutex> l(m);
      cv.wait(l, [&] { return fin; });
    }
    cudaStreamSynchronize(s);
    double r = total / std::chrono::duration<double>(Clock::now() - t0).count();
    for (auto& x : w) x->stop = true;
    return r;
  };
  one_thread(64);
  hop(64, 4, false);
  for (int round = 0; round < 3; ++round) {
    printf("one thread, 64/batch          %7.0f k/s\n", one_thread(64) / 1e3);
    printf("hop 16 threads cv, 64/batch   %7.0f k/s\n", hop(64, 16, false) / 1e3);
    printf("hop 16 threads spin, 64/batch %7.0f k/s\n", hop(64, 16, true) / 1e3);
    printf("hop 2 threads cv, 64/batch    %7.0f k/s\n", hop(64, 2, false) / 1e3);
    printf("hop 16 threads cv, 512/batch  %7.0f k/s\n", hop(512, 16, false) / 1e3);
  }
}
