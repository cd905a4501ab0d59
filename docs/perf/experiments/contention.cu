// Does a thread polling cudaEventQuery slow down kernel launches on another thread?
#include <cuda_runtime.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
using Clock = std::chrono::steady_clock;
int main() {
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *x, *y;
  cudaMalloc(&x, 1024);
  cudaMalloc(&y, 1024);
  const int total = 16384;
  std::vector<cudaEvent_t> pool(512);
  for (auto& e : pool) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  std::mutex mu;
  std::deque<cudaEvent_t> pending;
  std::atomic<bool> stop{false};
  std::atomic<int> mode{0};  // poller: 0 off, 1 spin+yield, 2 sleep 20us, 3 spin on done event
  std::atomic<long> queries{0};
  cudaEvent_t done_event;
  cudaEventCreateWithFlags(&done_event, cudaEventDisableTiming);
  cudaEventRecord(done_event, s);
  cudaStreamSynchronize(s);
  std::thread poller([&] {
    cudaSetDevice(0);
    while (!stop) {
      int m = mode;
      if (m == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      if (m == 3) {
        cudaEventQuery(done_event);
        ++queries;
        sched_yield();
        continue;
      }
      cudaEvent_t head = nullptr;
      {
        std::lock_guard<std::mutex> l(mu);
        if (!pending.empty()) head = pending.front();
      }
      if (head) {
        ++queries;
        if (cudaEventQuery(head) == cudaSuccess) {
          std::lock_guard<std::mutex> l(mu);
          pending.pop_front();
        }
      }
      if (m == 1)
        sched_yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  auto run = [&](int events_every, int pm) {
    mode = pm;
    queries = 0;
    {
      std::lock_guard<std::mutex> l(mu);
      pending.clear();
    }
    int ev = 0;
    auto t0 = Clock::now();
    for (int i = 0; i < total; ++i) {
      axpy<<<1, 256, 0, s>>>(1e-6f, x, y, 256);
      if (events_every && (i + 1) % events_every == 0) {
        cudaEvent_t e = pool[ev++ % pool.size()];
        cudaEventRecord(e, s);
        if (pm == 1 || pm == 2) {
          std::lock_guard<std::mutex> l(mu);
          pending.push_back(e);
        }
      }
    }
    cudaStreamSynchronize(s);
    double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    mode = 0;
    {
      std::lock_guard<std::mutex> l(mu);
      pending.clear();
    }
    return total / (ns / 1e9);
  };
  struct V {
    const char* name;
    int every;
    int pm;
  };
  V vs[] = {{"plain", 0, 0},
            {"event/64", 64, 0},
            {"event/64 + spin poller", 64, 1},
            {"event/64 + 20us poller", 64, 2},
            {"plain + spin on done event", 0, 3},
            {"event/512 + spin poller", 512, 1}};
  for (auto& v : vs) run(v.every, v.pm);  // warm
  for (int round = 0; round < 3; ++round)
    for (auto& v : vs) {
      double r = run(v.every, v.pm);
      printf("%-30s %8.0f k/s  queries %ld\n", v.name, r / 1e3, (long)queries);
    }
  stop = true;
  poller.join();
}
