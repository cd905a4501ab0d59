// 64 sessions at once, each mixing transfers, elementwise ops and GEMMs (and raw kernels on
// the CUDA backend), every result checked against a CPU reference.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "ferry/client.h"
#include "ferryd_process.h"

namespace ferry {
namespace {

constexpr const char* kNegate = R"(
extern "C" __global__ void negate(double* x, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) x[i] = -x[i];
}
)";

// Run one session's workload; return an empty string on success, else what went wrong.
std::string Workload(Client& client, int index) {
  auto s = client.open_session();
  if (!s.ok()) return "open: " + s.status().ToString();
  std::mt19937 rng(index);
  std::uniform_real_distribution<double> dist(-1, 1);
  const int m = 48 + index % 7, k = 33, n = 40;
  std::vector<double> a(m * k), b(k * n), big(1 << 17);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  for (auto& x : big) x = dist(rng);
  Tensor ta = s->create_tensor<double>({m, k});
  Tensor tb = s->create_tensor<double>({k, n});
  Tensor tc = s->create_tensor<double>({m, n});
  Tensor tbig = s->create_tensor<double>({1 << 17});
  if (Status st = s->upload(ta, a); !st.ok()) return "upload a: " + st.ToString();
  if (Status st = s->upload(tb, b); !st.ok()) return "upload b: " + st.ToString();
  if (Status st = s->upload(tbig, big); !st.ok()) return "upload big: " + st.ToString();
  for (int round = 0; round < 5; ++round) {
    s->gemm(ta, tb, tc);
    s->scale(tbig, -1.0, tbig);
    if (Status st = s->submit(); !st.ok()) return "submit: " + st.ToString();
  }
  bool cuda = s->backend() == "cuda";
  std::optional<Module> neg;
  if (cuda) {  // one more negation through a raw kernel: an even number in all
    neg = s->load_module(ModuleFormat::kCudaSource, kNegate);
    s->launch(*neg, "negate", {(1u << 17) / 256}, {256},
              {KernelArg::tensor(tbig), KernelArg::u64(1u << 17)});
  } else {
    s->scale(tbig, -1.0, tbig);
  }
  auto c = s->download<double>(tc);
  if (!c.ok()) return "download c: " + c.status().ToString();
  auto back = s->download<double>(tbig);
  if (!back.ok()) return "download big: " + back.status().ToString();
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int p = 0; p < k; ++p) ref += a[i * k + p] * b[p * n + j];
      if (std::abs((*c)[i * n + j] - ref) > 1e-12 * k) return "gemm mismatch";
    }
  }
  if (*back != big) return "transfer/negate mismatch";
  auto stats = s->close();
  if (!stats.ok()) return "close: " + stats.status().ToString();
  return "";
}

TEST(ConcurrencyTest, SixtyFourSessionsMixingTransfersKernelsAndGemms) {
  testing::FerrydProcess daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  auto client = Client::connect(daemon.unix_target());
  ASSERT_TRUE(client.ok());
  constexpr int kSessions = 64;
  std::vector<std::string> errors(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] { errors[i] = Workload(*client, i); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(errors[i], "") << "session " << i;
  auto s = daemon.WaitIdle();
  EXPECT_EQ(s.sessions_total(), static_cast<uint64_t>(kSessions));
  EXPECT_EQ(s.device_bytes_in_use(), 0u);
}

}  // namespace
}  // namespace ferry
