// Is CUDA's launch-queue limit per stream or per hardware work queue (connection)?
// Streams a and b, each given N launches of 100 us kernels from the main thread: how long
// the launching took for each (blocking = the queue was full).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
__global__ void spin(long long cycles) {
  long long t = clock64();
  while (clock64() - t < cycles) {
  }
}
using clk = std::chrono::steady_clock;
static double ms(clk::time_point a, clk::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 700;
  int streams = argc > 2 ? atoi(argv[2]) : 2;
  cudaFree(0);
  spin<<<1, 1>>>(10);
  cudaDeviceSynchronize();
  cudaStream_t s[64];
  for (int i = 0; i < streams; ++i) cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
  const char* c = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  auto t0 = clk::now();
  for (int k = 0; k < streams; ++k) {
    auto a = clk::now();
    for (int i = 0; i < n; ++i) spin<<<1, 1, 0, s[k]>>>(200000);
    printf("connections=%s: stream %d: %d launches took %.1f ms (%.1f ms since start)\n",
           c ? c : "default", k, n, ms(a, clk::now()), ms(t0, clk::now()));
  }
  cudaDeviceSynchronize();
  printf("all done after %.1f ms\n", ms(t0, clk::now()));
}
