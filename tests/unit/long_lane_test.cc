#include "session/long_lane.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "session/serial_executor.h"

namespace ferry::session {
namespace {

constexpr auto kTimeout = std::chrono::seconds(10);

// One tenant whose sessions each hold a long-lane thread (a large graph's instantiation, for
// seconds) holds at most all of the lane's threads but one: another tenant's long work (a
// module load) starts at once on the one left, while the first tenant's next waits.
TEST(LongLaneTest, OneIdentityLeavesAThreadForAnother) {
  boost::asio::io_context shared_io, long_io;
  auto long_work = boost::asio::make_work_guard(long_io);
  LongLane lane(long_io, 3);
  EXPECT_EQ(lane.per_identity(), 2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) threads.emplace_back([&] { long_io.run(); });

  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> tenant_a_running{0}, tenant_a_ran{0};
  std::promise<int> b_saw;  // how many of tenant A's were running when B's started
  // Three sessions of tenant A (three executors: one function of each may run at once), and
  // one of tenant B; each yields its work to the long lane, as a session's EndGraph does.
  std::vector<std::unique_ptr<SerialExecutor>> executors;
  for (int i = 0; i < 3; ++i) {
    executors.push_back(std::make_unique<SerialExecutor>(shared_io, &lane, "uid:1001"));
  }
  auto b = std::make_unique<SerialExecutor>(shared_io, &lane, "uid:1002");
  for (auto& ex : executors) {
    ex->Post([&, ex = ex.get()] {
      ex->Yield(
          [&] {
            ++tenant_a_running;
            released.wait_for(kTimeout);
            --tenant_a_running;
            ++tenant_a_ran;
          },
          "tenant A", SerialExecutor::Lane::kLong);
    });
  }
  shared_io.run();  // the three Yields: two of A's start, the third waits
  shared_io.restart();
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (tenant_a_running < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(tenant_a_running, 2);
  EXPECT_EQ(lane.waiting(), 1u) << "tenant A's third did not wait for its turn";

  b->Post([&] {
    b->Yield([&] { b_saw.set_value(tenant_a_running); }, "tenant B", SerialExecutor::Lane::kLong);
  });
  shared_io.run();
  shared_io.restart();
  std::future<int> b_started = b_saw.get_future();
  ASSERT_EQ(b_started.wait_for(kTimeout), std::future_status::ready)
      << "tenant B's long work waited behind tenant A's";
  EXPECT_EQ(b_started.get(), 2) << "tenant B's ran after tenant A's, not beside them";

  release.set_value();
  while (tenant_a_ran < 3 && std::chrono::steady_clock::now() < deadline + kTimeout) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(tenant_a_ran, 3) << "tenant A's third never ran";
  EXPECT_EQ(lane.waiting(), 0u);
  long_work.reset();
  for (auto& t : threads) t.join();
}

// Functions waiting for a thread start identity by identity in turn, each identity's in the
// order posted: a tenant with many queued delays another's next by one function, not by all
// of its own.
TEST(LongLaneTest, WaitingFunctionsStartIdentityByIdentityInTurn) {
  boost::asio::io_context io;  // run by this thread, one function at a time
  LongLane lane(io, 1);
  std::vector<std::string> order;
  auto post = [&](const std::string& identity, const std::string& name) {
    lane.Post(identity, [&order, name] { order.push_back(name); });
  };
  post("uid:1", "a1");  // starts: the thread was free
  post("uid:1", "a2");
  post("uid:1", "a3");
  post("uid:2", "b1");
  post("uid:3", "c1");
  post("uid:2", "b2");
  EXPECT_EQ(lane.waiting(), 5u);
  io.run();
  EXPECT_EQ(order, (std::vector<std::string>{"a1", "b1", "c1", "a2", "b2", "a3"}));
  EXPECT_EQ(lane.waiting(), 0u);
}

// A lane of one thread still runs one function of an identity at a time (the bound is never
// below one), and gives the thread back when it returns.
TEST(LongLaneTest, OneThreadRunsEachIdentityInTurn) {
  boost::asio::io_context io;
  LongLane lane(io, 1);
  EXPECT_EQ(lane.per_identity(), 1);
  int ran = 0;
  lane.Post("uid:1", [&] { ++ran; });
  EXPECT_EQ(io.run(), 1u);
  io.restart();
  lane.Post("uid:1", [&] { ++ran; });  // the thread is free again: it starts at once
  EXPECT_EQ(lane.waiting(), 0u);
  EXPECT_EQ(io.run(), 1u);
  EXPECT_EQ(ran, 2);
}

}  // namespace
}  // namespace ferry::session
