// Built and run by hand: nvcc -O2 -arch=sm_90 -cudart static -o parallel_copy parallel_copy.cu &&
// ./parallel_copy Results: docs/perf/2026-12-01-h200-c0aad46-blocking-copy-threads.txt. Blocking
// transfers from ordinary memory: how fast can a client copy into pinned shared memory with T
// threads, against an in-process pageable cudaMemcpy?
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
int main() {
  const size_t total = 256ull << 20, stage = 16ull << 20;
  char* src = (char*)malloc(total);
  memset(src, 1, total);
  char* dst = (char*)malloc(total);
  memset(dst, 0, total);
  int fd = memfd_create("s", 0);
  ftruncate(fd, 64 << 20);
  char* shm =
      (char*)mmap(nullptr, 64 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  cudaHostRegister(shm, 64 << 20, cudaHostRegisterPortable);
  for (int T : {1, 2, 4, 8}) {
    for (int dir = 0; dir < 2; ++dir) {
      double best = 0;
      for (int rep = 0; rep < 3; ++rep) {
        auto a = Clock::now();
        for (size_t off = 0; off < total; off += stage) {
          std::vector<std::thread> th;
          size_t per = stage / T;
          for (int i = 0; i < T; ++i)
            th.emplace_back([&, i] {
              if (dir == 0)
                memcpy(shm + (off / stage % 2) * stage + i * per, src + off + i * per, per);
              else
                memcpy(dst + off + i * per, shm + (off / stage % 2) * stage + i * per, per);
            });
          for (auto& t : th) t.join();
        }
        double s = std::chrono::duration<double>(Clock::now() - a).count();
        best = std::max(best, total / s / 1e9);
      }
      printf("memcpy %s shm, %d threads: %.1f GB/s\n", dir == 0 ? "into" : "out of", T, best);
    }
  }
  char* d;
  cudaMalloc(&d, total);
  for (int rep = 0; rep < 3; ++rep) {
    auto a = Clock::now();
    cudaMemcpy(d, src, total, cudaMemcpyHostToDevice);
    double s1 = std::chrono::duration<double>(Clock::now() - a).count();
    a = Clock::now();
    cudaMemcpy(dst, d, total, cudaMemcpyDeviceToHost);
    double s2 = std::chrono::duration<double>(Clock::now() - a).count();
    a = Clock::now();
    for (size_t off = 0; off < total; off += 32 << 20)
      cudaMemcpy(d + off, shm, 32 << 20, cudaMemcpyHostToDevice);
    double s3 = std::chrono::duration<double>(Clock::now() - a).count();
    printf("pageable cudaMemcpy 256 MiB: H2D %.1f GB/s, D2H %.1f GB/s; pinned H2D %.1f GB/s\n",
           total / s1 / 1e9, total / s2 / 1e9, total / s3 / 1e9);
  }
  return 0;
}
