// Built and run by hand: nvcc -O2 -arch=sm_90 -cudart static -o slab_stall slab_stall.cu &&
// ./slab_stall Results: docs/perf/2026-12-01-h200-c0aad46-slab-stall.txt (performance.md, "Known
// bounds", slabs). Which slab-pool operation stalls a concurrent stream? Foreground: rounds of 64
// tiny kernels + 1 MiB H2D + D2H (pinned) + sync. Background: one kind of slab work, repeated.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
static double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
#define CK(x)                                        \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e) {                                         \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                       \
    }                                                \
  } while (0)
const size_t kSlab = 64ull << 20;
struct Slab {
  int fd;
  char* p;
};
Slab Make(bool populate_mmap, bool fallocate_first) {
  int fd = memfd_create("s", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ftruncate(fd, kSlab);
  if (fallocate_first) fallocate(fd, 0, 0, kSlab);
  char* p = (char*)mmap(nullptr, kSlab, PROT_READ | PROT_WRITE,
                        MAP_SHARED | (populate_mmap ? MAP_POPULATE : 0), fd, 0);
  return {fd, p};
}
void Destroy(Slab s) {
  fallocate(s.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kSlab);
  munmap(s.p, kSlab);
  close(s.fd);
}
int main() {
  CK(cudaSetDevice(0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  float *x, *y;
  char* d;
  char* h;
  CK(cudaMalloc(&x, 1024));
  CK(cudaMalloc(&y, 1024));
  CK(cudaMalloc(&d, 1 << 20));
  CK(cudaMallocHost(&h, 1 << 20));
  const char* arms[] = {"none",       "mmap-populate", "fallocate+mmap",   "register",
                        "unregister", "punch+munmap",  "make-all(ferryd)", "destroy-all(ferryd)"};
  for (int arm = 0; arm < 8; ++arm) {
    // Prepare slabs the arm needs.
    std::vector<Slab> slabs;
    const int K = 8;
    if (arm == 3 || arm == 4 || arm == 5 || arm == 7)
      for (int i = 0; i < K; ++i) slabs.push_back(Make(true, false));
    if (arm == 4 || arm == 7)
      for (auto& s : slabs) CK(cudaHostRegister(s.p, kSlab, cudaHostRegisterPortable));
    std::atomic<bool> done{false};
    std::vector<double> bg;
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int i = 0; i < K; ++i) {
        auto a = Clock::now();
        switch (arm) {
          case 0:
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            break;
          case 1: {
            Slab s = Make(true, false);
            auto b = Clock::now();
            bg.push_back(Us(a, b));
            munmap(s.p, kSlab);
            close(s.fd);
            a = Clock::now();
            break;
          }
          case 2: {
            Slab s = Make(false, true);
            auto b = Clock::now();
            bg.push_back(Us(a, b));
            munmap(s.p, kSlab);
            close(s.fd);
            a = Clock::now();
            break;
          }
          case 3:
            CK(cudaHostRegister(slabs[i].p, kSlab, cudaHostRegisterPortable));
            break;
          case 4:
            CK(cudaHostUnregister(slabs[i].p));
            break;
          case 5:
            Destroy(slabs[i]);
            break;
          case 6: {
            Slab s = Make(true, false);
            CK(cudaHostRegister(s.p, kSlab, cudaHostRegisterPortable));
            slabs.push_back(s);
            break;
          }
          case 7:
            CK(cudaHostUnregister(slabs[i].p));
            Destroy(slabs[i]);
            break;
        }
        if (arm != 1 && arm != 2) bg.push_back(Us(a, Clock::now()));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = true;
    });
    std::vector<double> rounds;
    while (!done) {
      auto a = Clock::now();
      for (int k = 0; k < 64; ++k) axpy<<<1, 256, 0, st>>>(1e-6f, x, y, 256);
      CK(cudaMemcpyAsync(d, h, 1 << 20, cudaMemcpyHostToDevice, st));
      CK(cudaMemcpyAsync(h, d, 1 << 20, cudaMemcpyDeviceToHost, st));
      CK(cudaStreamSynchronize(st));
      rounds.push_back(Us(a, Clock::now()));
    }
    t.join();
    if (arm == 3)
      for (auto& s : slabs) {
        CK(cudaHostUnregister(s.p));
      }
    if (arm == 3 || arm == 4)
      for (auto& s : slabs) Destroy(s);
    if (arm == 6)
      for (auto& s : slabs) {
        CK(cudaHostUnregister(s.p));
        Destroy(s);
      }
    std::sort(rounds.begin(), rounds.end());
    std::sort(bg.begin(), bg.end());
    auto q = [](std::vector<double>& v, double f) {
      return v.empty() ? 0 : v[std::min(v.size() - 1, (size_t)(f * v.size()))];
    };
    printf("%-20s rounds %5zu  p50 %8.1f us  p99 %9.1f  max %9.1f | bg op p50 %9.1f us max %9.1f\n",
           arms[arm], rounds.size(), q(rounds, .5), q(rounds, .99), rounds.back(), q(bg, .5),
           bg.empty() ? 0 : bg.back());
  }
  return 0;
}
