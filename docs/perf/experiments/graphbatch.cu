// What does it cost to run a submit of 64 tiny kernels as one graph launch instead of 64
// launches, when the graph is kept and only its kernels' parameters change? And does a
// thread spinning on another CPU slow a launching thread down (hyperthread siblings)?
//
// Build: nvcc -O2 -arch=sm_90 -o graphbatch graphbatch.cu -lpthread
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

using Clock = std::chrono::steady_clock;
constexpr int kPerSubmit = 64;
constexpr int kSubmits = 256;
constexpr int kN = 256;

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

struct Bench {
  cudaStream_t s;
  float *x, *y;
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaGraphNode_t> nodes;

  Bench() {
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&x, kN * 4));
    CK(cudaMalloc(&y, kN * 4));
    CK(cudaMemset(x, 0, kN * 4));
    CK(cudaMemset(y, 0, kN * 4));
  }
  double Rate(double seconds) { return kPerSubmit * kSubmits / seconds / 1e3; }

  double Launches(bool set_device) {
    auto t0 = Clock::now();
    for (int j = 0; j < kSubmits; ++j) {
      for (int k = 0; k < kPerSubmit; ++k) {
        if (set_device) CK(cudaSetDevice(0));
        axpy<<<1, kN, 0, s>>>(1e-6f * k, x, y, kN);
        CK(cudaGetLastError());
      }
    }
    CK(cudaStreamSynchronize(s));
    return Rate(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  cudaGraph_t Capture(float base) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < kPerSubmit; ++k) axpy<<<1, kN, 0, s>>>(base * k, x, y, kN);
    CK(cudaStreamEndCapture(s, &g));
    return g;
  }

  void MakeExec() {
    cudaGraph_t g = Capture(1e-6f);
    CK(cudaGraphInstantiate(&exec, g, 0));
    // A captured chain: walk it from the root in order.
    size_t count = 0;
    CK(cudaGraphGetRootNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> roots(count);
    CK(cudaGraphGetRootNodes(g, roots.data(), &count));
    cudaGraphNode_t n = roots[0];
    nodes.clear();
    while (true) {
      nodes.push_back(n);
      size_t deps = 0;
      CK(cudaGraphNodeGetDependentNodes(n, nullptr, nullptr, &deps));
      if (deps == 0) break;
      std::vector<cudaGraphNode_t> next(deps);
      CK(cudaGraphNodeGetDependentNodes(n, next.data(), nullptr, &deps));
      n = next[0];
    }
    if (nodes.size() != kPerSubmit) std::printf("chain has %zu nodes\n", nodes.size());
  }

  // Every submit: set every node's parameters (alpha changes), then one graph launch.
  double GraphSetParams() {
    float a;
    const float* xp = x;
    float* yp = y;
    int n = kN;
    void* args[] = {&a, &xp, &yp, &n};
    cudaKernelNodeParams p = {};
    p.func = reinterpret_cast<void*>(axpy);
    p.gridDim = dim3(1);
    p.blockDim = dim3(kN);
    p.kernelParams = args;
    auto t0 = Clock::now();
    for (int j = 0; j < kSubmits; ++j) {
      for (int k = 0; k < kPerSubmit; ++k) {
        a = 1e-6f * k + j * 1e-9f;
        CK(cudaGraphExecKernelNodeSetParams(exec, nodes[k], &p));
      }
      CK(cudaGraphLaunch(exec, s));
    }
    CK(cudaStreamSynchronize(s));
    return Rate(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  // Every submit: one graph launch, parameters unchanged (the lower bound).
  double GraphOnly() {
    auto t0 = Clock::now();
    for (int j = 0; j < kSubmits; ++j) CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    return Rate(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  // Every submit: capture again, cudaGraphExecUpdate, launch.
  double GraphCaptureUpdate() {
    auto t0 = Clock::now();
    for (int j = 0; j < kSubmits; ++j) {
      cudaGraph_t g = Capture(1e-6f + j * 1e-9f);
      cudaGraphExecUpdateResultInfo info;
      CK(cudaGraphExecUpdate(exec, g, &info));
      if (info.result != cudaGraphExecUpdateSuccess) std::printf("update failed\n");
      CK(cudaGraphDestroy(g));
      CK(cudaGraphLaunch(exec, s));
    }
    CK(cudaStreamSynchronize(s));
    return Rate(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  // Every submit: capture and instantiate a new graph.
  double GraphInstantiate() {
    auto t0 = Clock::now();
    for (int j = 0; j < kSubmits; ++j) {
      cudaGraph_t g = Capture(1e-6f);
      cudaGraphExec_t fresh;
      CK(cudaGraphInstantiate(&fresh, g, 0));
      CK(cudaGraphLaunch(fresh, s));
      CK(cudaGraphExecDestroy(fresh));
      CK(cudaGraphDestroy(g));
    }
    CK(cudaStreamSynchronize(s));
    return Rate(std::chrono::duration<double>(Clock::now() - t0).count());
  }
};

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

int main() {
  CK(cudaSetDevice(0));
  Bench b;
  b.MakeExec();
  b.Launches(false);  // warm up
  b.GraphSetParams();
  std::printf("k ops/s, %d submits of %d axpy(%d f32), one stream; 5 rounds\n", kSubmits,
              kPerSubmit, kN);
  std::printf("%-40s %8s %8s %8s %8s %8s\n", "arm", "r1", "r2", "r3", "r4", "r5");
  const char* names[] = {
      "64 launches",        "64 launches, cudaSetDevice each",      "graph: 64 SetParams + launch",
      "graph: launch only", "graph: capture + ExecUpdate + launch", "graph: capture + instantiate"};
  double r[6][5];
  for (int round = 0; round < 5; ++round) {
    r[0][round] = b.Launches(false);
    r[1][round] = b.Launches(true);
    r[2][round] = b.GraphSetParams();
    r[3][round] = b.GraphOnly();
    r[4][round] = b.GraphCaptureUpdate();
    r[5][round] = b.GraphInstantiate();
  }
  for (int a = 0; a < 6; ++a) {
    std::printf("%-40s", names[a]);
    for (int round = 0; round < 5; ++round) std::printf(" %8.1f", r[a][round]);
    std::printf("\n");
  }

  // Launch thread pinned to CPU 0; a spinner pinned to CPU j (none, 1..n-1).
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  std::printf(
      "\nlaunching thread pinned to cpu 0, a spinning thread pinned to cpu j (k ops/s, 3 "
      "rounds)\n");
  Pin(0);
  for (int j = 0; j < cpus; ++j) {
    std::atomic<bool> stop{false};
    std::thread spinner;
    if (j > 0) {
      spinner = std::thread([&, j] {
        Pin(j);
        volatile unsigned long v = 0;
        while (!stop.load(std::memory_order_relaxed)) ++v;
      });
    }
    std::printf("spinner on %-6s", j == 0 ? "none" : std::to_string(j).c_str());
    for (int round = 0; round < 3; ++round) std::printf(" %8.1f", b.Launches(false));
    std::printf("\n");
    stop = true;
    if (spinner.joinable()) spinner.join();
  }
  return 0;
}
