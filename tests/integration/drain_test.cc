// Drain: SIGTERM stops new sessions, tells open ones (Draining), finishes the work already
// accepted, writes its results, then exits 0. Nothing accepted is lost.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "ferry/client.h"
#include "ferryd_process.h"

namespace ferry {
namespace {

TEST(DrainTest, WorkAcceptedBeforeTheDrainCompletesAndIsDelivered) {
  testing::FerrydProcess daemon({"--drain-timeout", "60000"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  // The default connect timeout (5 s): under TSan on a loaded machine a connect took more
  // than the 500 ms this test once allowed, and how long it takes is not what it checks.
  auto client = Client::connect(daemon.unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString() << "\n" << daemon.log();
  auto s = client->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // Enough work that the drain starts while it runs: 30 GEMMs of 256^3 on the host backend.
  const int n = 256;
  Tensor a = s->create_tensor<double>({n, n});
  Tensor c = s->create_tensor<double>({n, n});
  s->fill(a, 1.0);
  s->fill(c, 0.0);
  for (int i = 0; i < 30; ++i) s->gemm(a, a, c, {.alpha = 1.0, .beta = 1.0});
  ASSERT_TRUE(s->submit().ok());
  // The download is accepted too before the signal: it is recorded and sent now.
  std::thread drain([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(daemon.pid(), SIGTERM);
  });
  auto v = s->download<double>(c);
  drain.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString() << "\n" << daemon.log();
  // Every element is 30 * n (each GEMM adds a row of n ones times a column of n ones).
  for (double x : *v) ASSERT_EQ(x, 30.0 * n);
  // New sessions are refused while draining or after.
  auto late = client->open_session();
  EXPECT_FALSE(late.ok());
  EXPECT_EQ(daemon.Stop(), 0) << daemon.log();
  // The host backend's GEMM of this size takes long enough that the drain began before
  // the work finished: the session was told.
  if (testing::TestBackend() == "host") EXPECT_TRUE(s->draining());
}

}  // namespace
}  // namespace ferry
