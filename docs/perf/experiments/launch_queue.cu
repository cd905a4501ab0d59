// How many launches of a long kernel a stream takes before cudaLaunchKernel waits, and
// whether a full stream holds other streams' launches.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
__global__ void spin(long long cycles) {
  long long t = clock64();
  while (clock64() - t < cycles) {
  }
}
__global__ void tiny(float* p) { p[0] += 1; }
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
int main() {
  cudaFree(0);
  float* d;
  cudaMalloc(&d, 4);
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  const long long cyc = 200000;  // ~100 us each
  // 1. launches into one stream
  {
    auto t0 = clk::now();
    int first_slow = -1;
    double slow_us = 0;
    for (int i = 0; i < 6000; ++i) {
      auto s = clk::now();
      spin<<<1, 1, 0, a>>>(cyc);
      auto e = clk::now();
      if (first_slow < 0 && us(s, e) > 50) {
        first_slow = i;
        slow_us = us(s, e);
      }
    }
    auto t1 = clk::now();
    cudaStreamSynchronize(a);
    auto t2 = clk::now();
    printf(
        "1. 6000 x 100us kernels on one stream: launching took %.0f us, first slow launch #%d "
        "(%.0f us), rest %.0f us\n",
        us(t0, t1), first_slow, slow_us, us(t1, t2));
  }
  // 2. one thread fills stream a; another launches tiny work on stream b
  {
    std::atomic<bool> go{false};
    std::thread filler([&] {
      go = true;
      for (int i = 0; i < 6000; ++i) spin<<<1, 1, 0, a>>>(cyc);
    });
    while (!go) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int k = 0; k < 3; ++k) {
      auto s = clk::now();
      tiny<<<1, 1, 0, b>>>(d);
      auto l = clk::now();
      cudaStreamSynchronize(b);
      auto e = clk::now();
      printf("2. while a is full: tiny launch on b %.0f us, done after %.0f us\n", us(s, l),
             us(s, e));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    filler.join();
    cudaStreamSynchronize(a);
  }
  // 2b. 16 streams each filled by its own thread, then b
  {
    std::vector<cudaStream_t> ss(16);
    for (auto& s : ss) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    std::vector<std::thread> th;
    for (auto s : ss)
      th.emplace_back([s] {
        for (int i = 0; i < 3000; ++i) spin<<<1, 1, 0, s>>>(cyc);
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int k = 0; k < 3; ++k) {
      auto s = clk::now();
      tiny<<<1, 1, 0, b>>>(d);
      auto l = clk::now();
      cudaStreamSynchronize(b);
      auto e = clk::now();
      printf("2b. 16 full streams: tiny launch on b %.0f us, done after %.0f us\n", us(s, l),
             us(s, e));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (auto& t : th) t.join();
    cudaDeviceSynchronize();
  }
  // 2c. N streams each holding 512 (or 1024+) commands, each filled by its own thread; then b
  for (int per : {512, 2000})
    for (int n : {16, 64}) {
      std::vector<cudaStream_t> ss(n);
      for (auto& s : ss) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      std::vector<std::thread> th;
      for (auto s : ss)
        th.emplace_back([s, per] {
          for (int i = 0; i < per; ++i) spin<<<1, 1, 0, s>>>(cyc);
        });
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      double worst_l = 0, worst_e = 0;
      for (int k = 0; k < 5; ++k) {
        auto s = clk::now();
        tiny<<<1, 1, 0, b>>>(d);
        auto l = clk::now();
        cudaStreamSynchronize(b);
        auto e = clk::now();
        worst_l = std::max(worst_l, us(s, l));
        worst_e = std::max(worst_e, us(s, e));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      for (auto& t : th) t.join();
      auto j = clk::now();
      cudaDeviceSynchronize();
      printf(
          "2c. %d streams x %d x 100us queued: tiny launch on b worst %.0f us, done worst %.0f us "
          "(drain %.0f ms)\n",
          n, per, worst_l, worst_e, us(j, clk::now()) / 1000);
      for (auto& s : ss) cudaStreamDestroy(s);
    }
  // 3. a graph of N spin nodes, launched
  for (int n : {1000, 4000}) {
    cudaGraph_t g;
    cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < n; ++i) spin<<<1, 1, 0, a>>>(cyc);
    cudaStreamEndCapture(a, &g);
    cudaGraphExec_t x;
    cudaGraphInstantiate(&x, g, 0);
    for (int r = 0; r < 3; ++r) {
      auto s = clk::now();
      cudaGraphLaunch(x, a);
      auto l = clk::now();
      cudaStreamSynchronize(a);
      auto e = clk::now();
      printf("3. graph of %d x 100us: launch call %.0f us, done %.0f us\n", n, us(s, l), us(s, e));
    }
    // several launches of the graph back to back
    {
      auto s = clk::now();
      for (int r = 0; r < 8; ++r) cudaGraphLaunch(x, a);
      auto l = clk::now();
      cudaStreamSynchronize(a);
      auto e = clk::now();
      printf("3b. 8 launches of graph %d back to back: calls %.0f us, done %.0f us\n", n, us(s, l),
             us(s, e));
    }
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
  }
  // 4. cudaMemsetAsync large (800 MiB) many times
  {
    void* big;
    if (cudaMalloc(&big, 800ull << 20) == cudaSuccess) {
      auto t0 = clk::now();
      int first_slow = -1;
      for (int i = 0; i < 3000; ++i) {
        auto s = clk::now();
        cudaMemsetAsync(big, i, 800ull << 20, a);
        if (first_slow < 0 && us(s, clk::now()) > 50) first_slow = i;
      }
      auto t1 = clk::now();
      cudaStreamSynchronize(a);
      auto t2 = clk::now();
      printf("4. 3000 memsets of 800 MiB: calls %.0f us, first slow #%d, rest %.0f us\n",
             us(t0, t1), first_slow, us(t1, t2));
      cudaFree(big);
    }
  }
  printf("err: %s\n", cudaGetErrorString(cudaGetLastError()));
}
