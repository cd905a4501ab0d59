#include "session/serial_executor.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <chrono>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ferry::session {
namespace {

class SerialExecutorTest : public ::testing::Test {
 protected:
  SerialExecutorTest() : work_(io_.get_executor()) {
    for (int i = 0; i < 4; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  ~SerialExecutorTest() override {
    work_.reset();
    for (auto& t : threads_) t.join();
  }
  // Wait until everything accepted by `ex` so far has run.
  void Flush(const SerialExecutor& ex) {
    std::promise<void> done;
    ex.Post([&] { done.set_value(); });
    done.get_future().wait();
  }

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
};

TEST_F(SerialExecutorTest, RunOrPostRunsOnTheCallerWhenIdle) {
  SerialExecutor ex(io_);
  std::thread::id ran_on;
  bool inside = false;
  ex.RunOrPost([&] {
    ran_on = std::this_thread::get_id();
    inside = ex.running_in_this_thread();
  });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(inside);
  EXPECT_FALSE(ex.running_in_this_thread());
}

// TryRun runs on the caller when idle; when busy it leaves the function to the caller, which
// may try again once the executor is free.
TEST_F(SerialExecutorTest, TryRunRunsWhenIdleAndLeavesTheFunctionWhenBusy) {
  SerialExecutor ex(io_);
  std::thread::id ran_on;
  std::function<void()> fn = [&] { ran_on = std::this_thread::get_id(); };
  ASSERT_TRUE(ex.TryRun(fn));
  EXPECT_EQ(ran_on, std::this_thread::get_id());

  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> running{false};
  ex.Post([&] {
    running = true;
    released.wait();
  });
  while (!running) std::this_thread::yield();
  int calls = 0;
  std::function<void()> second = [&] { ++calls; };
  EXPECT_FALSE(ex.TryRun(second));
  ASSERT_TRUE(second) << "a refused function stays with the caller";
  release.set_value();
  Flush(ex);
  // Flush returns once its function has run; the executor goes idle just after that, so the
  // first TryRun may still find it busy (it did under ASan in tests/run.sh). Bounded retry.
  bool ran = false;
  for (int i = 0; i < 2000 && !ran; ++i) {
    ran = ex.TryRun(second);
    if (!ran) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(ran);
  EXPECT_EQ(calls, 1);
}

TEST_F(SerialExecutorTest, RunOrPostQueuesBehindWorkInProgress) {
  SerialExecutor ex(io_);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first_running{false};
  std::vector<int> order;  // touched only by the executor's functions
  ex.Post([&] {
    first_running = true;
    released.wait();
    order.push_back(1);
  });
  while (!first_running) std::this_thread::yield();
  std::thread::id ran_on;
  ex.RunOrPost([&] {
    ran_on = std::this_thread::get_id();
    order.push_back(2);
  });
  ex.Post([&] { order.push_back(3); });
  release.set_value();
  Flush(ex);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_NE(ran_on, std::this_thread::get_id()) << "ran inline while the executor was busy";
}

// With Followers::kRunHere, the caller that ran its function inline (RunOrPost, or TryRun
// as the ring poller does) also runs the short functions (RunOrPost) that queued behind it,
// in order, and stops at a posted one: that one, and what follows it, runs on the
// io_context's threads.
TEST_F(SerialExecutorTest, RunHereRunsShortFollowersOnTheCaller) {
  for (bool try_run : {false, true}) {
    for (auto followers : {SerialExecutor::Followers::kRunHere, SerialExecutor::Followers::kPost}) {
      SerialExecutor ex(io_);
      const std::thread::id caller = std::this_thread::get_id();
      std::vector<std::pair<int, bool>> ran;  // (which, on the caller); touched by ex only
      std::function<void()> first = [&] {
        ran.emplace_back(1, std::this_thread::get_id() == caller);
        // Queued from other threads while this one runs.
        std::thread([&] {
          ex.RunOrPost([&] { ran.emplace_back(2, std::this_thread::get_id() == caller); });
          ex.RunOrPost([&] { ran.emplace_back(3, std::this_thread::get_id() == caller); });
          ex.Post([&] { ran.emplace_back(4, std::this_thread::get_id() == caller); });
          ex.RunOrPost([&] { ran.emplace_back(5, std::this_thread::get_id() == caller); });
        }).join();
      };
      if (try_run) {
        ASSERT_TRUE(ex.TryRun(first, followers));
      } else {
        ex.RunOrPost(first, followers);
      }
      Flush(ex);
      const bool here = followers == SerialExecutor::Followers::kRunHere;
      EXPECT_EQ(ran, (std::vector<std::pair<int, bool>>{
                         {1, true}, {2, here}, {3, here}, {4, false}, {5, false}}))
          << (try_run ? "TryRun, " : "RunOrPost, ") << (here ? "kRunHere" : "kPost");
    }
  }
}

// Many threads mixing Post and RunOrPost: no two functions overlap, and each thread's
// functions run in the order it gave them.
TEST_F(SerialExecutorTest, NeverConcurrentAndOrderedPerCaller) {
  SerialExecutor ex(io_);
  constexpr int kCallers = 4, kEach = 2000;
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::vector<std::vector<int>> seen(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int i = 0; i < kEach; ++i) {
        auto fn = [&, c, i] {
          if (inside.fetch_add(1) != 0) overlapped = true;
          seen[c].push_back(i);
          inside.fetch_sub(1);
        };
        if (i % 3 == 1) {
          ex.RunOrPost(fn);
        } else if (i % 3 == 2) {
          ex.RunOrPost(fn, SerialExecutor::Followers::kRunHere);
        } else {
          ex.Post(fn);
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  Flush(ex);
  EXPECT_FALSE(overlapped);
  for (int c = 0; c < kCallers; ++c) {
    ASSERT_EQ(seen[c].size(), static_cast<size_t>(kEach));
    for (int i = 0; i < kEach; ++i) ASSERT_EQ(seen[c][i], i) << "caller " << c;
  }
}

// A named Post that runs longer than kSlowHandler is logged with its name, so a handler that
// holds a session up can be found; an unnamed one is not timed.
// PostAfter posts once the delay has passed (not before), on the executor, in turn with
// what else it runs.
TEST_F(SerialExecutorTest, PostAfterPostsOnceTheDelayHasPassed) {
  SerialExecutor ex(io_);
  std::promise<std::chrono::steady_clock::time_point> ran;
  std::atomic<bool> on_executor{false};
  const auto start = std::chrono::steady_clock::now();
  ex.PostAfter(std::chrono::milliseconds(30), [&] {
    on_executor = ex.running_in_this_thread();
    ran.set_value(std::chrono::steady_clock::now());
  });
  auto done = ran.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_GE(done.get() - start, std::chrono::milliseconds(30));
  EXPECT_TRUE(on_executor);
}

TEST_F(SerialExecutorTest, ASlowNamedHandlerIsLoggedByName) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  SerialExecutor ex(io_);
  const auto slow = SerialExecutor::kSlowHandler + std::chrono::milliseconds(20);
  ex.Post([slow] { std::this_thread::sleep_for(slow); }, "deliberately slow");
  ex.Post([slow] { std::this_thread::sleep_for(slow); });  // unnamed: not timed
  Flush(ex);
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  EXPECT_NE(text.find("executor handler 'deliberately slow' ran"), std::string::npos) << text;
  EXPECT_EQ(text.find("executor handler"), text.rfind("executor handler")) << "one line: " << text;
}

// Yield ends the executor's turn on its thread: the continuation runs after what other
// executors queued on the io_context meanwhile (a Post would run it in the same turn), and
// behind what its own executor had queued.
TEST(SerialExecutorYieldTest, AYieldingFunctionGoesOnAfterOtherExecutorsQueuedWork) {
  boost::asio::io_context io;  // run by this thread alone, below
  SerialExecutor long_work(io), other(io);
  std::vector<std::string> order;
  long_work.Post([&] {
    order.push_back("slice 1");
    other.Post([&] { order.push_back("other"); });
    long_work.Yield([&] { order.push_back("slice 2"); });
  });
  long_work.Post([&] { order.push_back("after"); });
  io.run();
  EXPECT_EQ(order, (std::vector<std::string>{"slice 1", "other", "after", "slice 2"}));
}

// Yield is for a function of its own executor. Called from elsewhere (here a function of
// another executor, while its own is idle or only scheduled) it is a Post: its function
// runs, and it cuts no turn of the executor's (whose queued functions run in one turn).
TEST(SerialExecutorYieldTest, AYieldFromOutsideItsExecutorIsAPost) {
  boost::asio::io_context io;  // run by this thread alone
  SerialExecutor ex(io), other(io), third(io);
  std::vector<std::string> order;
  other.Post([&] { ex.Yield([&] { order.push_back("yielded while idle"); }); });
  io.run();
  EXPECT_EQ(order, std::vector<std::string>{"yielded while idle"}) << "the function was lost";

  io.restart();
  order.clear();
  other.Post([&] {
    ex.Yield([&] { order.push_back("yielded"); });  // ex is scheduled, not running
    third.Post([&] { order.push_back("third's work"); });
    ex.Post([&] { order.push_back("posted"); });
  });
  ex.Post([&] { order.push_back("queued"); });
  io.run();
  EXPECT_EQ(order, (std::vector<std::string>{"queued", "yielded", "posted", "third's work"}))
      << "the yield ended a turn of its executor that it did not run in";
}

// On a caller's thread (RunOrPost) a yield hands the continuation to the io_context too, and
// the executor's next turns run as many functions as before.
TEST(SerialExecutorYieldTest, AYieldOnTheCallersThreadGoesOnOnTheIoContext) {
  boost::asio::io_context io;
  SerialExecutor ex(io), other(io);
  std::vector<std::string> order;
  ex.RunOrPost(
      [&] {
        order.push_back("slice 1");
        ex.Yield([&] {
          order.push_back("slice 2");
          other.Post([&] { order.push_back("other"); });
          ex.Post([&] { order.push_back("after"); });
        });
      },
      SerialExecutor::Followers::kRunHere);
  EXPECT_EQ(order, std::vector<std::string>{"slice 1"}) << "the continuation ran on the caller";
  io.run();
  // "after" in the same turn as slice 2: the yield was over once its function returned.
  EXPECT_EQ(order, (std::vector<std::string>{"slice 1", "slice 2", "after", "other"}));
}

// A turn's functions share its start (TurnStart: a slice is measured from it); a yield's
// continuation runs in a turn of its own.
TEST(SerialExecutorYieldTest, FunctionsOfOneTurnShareItsStartAndAYieldStartsAnother) {
  boost::asio::io_context io;
  SerialExecutor ex(io);
  std::vector<std::chrono::steady_clock::time_point> starts;
  ex.Post([&] {
    starts.push_back(SerialExecutor::TurnStart());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  ex.Post([&] {
    starts.push_back(SerialExecutor::TurnStart());
    ex.Yield([&] { starts.push_back(SerialExecutor::TurnStart()); });
  });
  io.run();
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_NE(starts[0], std::chrono::steady_clock::time_point());
  EXPECT_EQ(starts[1], starts[0]) << "the second function of the turn got a turn of its own";
  EXPECT_GE(starts[2] - starts[0], std::chrono::milliseconds(2));
  EXPECT_EQ(SerialExecutor::TurnStart(), std::chrono::steady_clock::time_point())
      << "no turn runs on this thread now";
}

// A function yielded to the long lane runs on the long lane's io_context, in its place in the
// executor's order (behind what the executor had queued), and what comes after it runs on the
// shared lane again.
TEST(SerialExecutorLaneTest, AFunctionYieldedToTheLongLaneRunsThereInItsPlace) {
  boost::asio::io_context io, long_lane;  // each run by this thread, below
  LongLane lane(long_lane, 1);
  SerialExecutor ex(io, &lane, "uid:1");
  ASSERT_TRUE(ex.has_long_lane());
  std::vector<std::string> order;
  ex.Post([&] {
    order.push_back(ex.running_on_long_lane() ? "a on the long lane" : "a");
    ex.Yield(
        [&] { order.push_back(ex.running_on_long_lane() ? "long" : "long on the shared lane"); },
        "test", SerialExecutor::Lane::kLong);
  });
  ex.Post([&] { order.push_back("b"); });
  io.run();
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b"}))
      << "the yielded function ran on the shared lane";
  EXPECT_EQ(long_lane.run(), 1u);
  ex.Post([&] { order.push_back(ex.running_on_long_lane() ? "c on the long lane" : "c"); });
  long_lane.restart();  // it ran out of work above, which stops it
  EXPECT_EQ(long_lane.run(), 0u) << "a later function went to the long lane";
  io.restart();
  io.run();
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "long", "c"}));
}

// While a long-lane function runs, other executors' work runs on the shared lane (even with
// one shared thread), and its own executor's later functions wait for it.
TEST(SerialExecutorLaneTest, WhileALongLaneFunctionRunsOthersUseTheSharedThreads) {
  boost::asio::io_context io, long_lane;
  auto work = boost::asio::make_work_guard(io);
  auto long_work = boost::asio::make_work_guard(long_lane);
  std::thread shared_thread([&] { io.run(); });  // the only shared-lane thread
  std::thread long_thread([&] { long_lane.run(); });
  LongLane lane(long_lane, 1);
  SerialExecutor ex(io, &lane, "uid:1"), other(io);
  std::promise<void> other_ran, long_done, after_ran;
  std::atomic<bool> long_running{false}, overlapped{false};
  ex.Post([&] {
    ex.Yield(
        [&] {
          long_running = true;
          // Holds its thread until the other executor's function ran on the shared thread.
          const bool ran = other_ran.get_future().wait_for(std::chrono::seconds(10)) ==
                           std::future_status::ready;
          EXPECT_TRUE(ran) << "the long-lane function held the shared thread";
          long_running = false;
          long_done.set_value();
        },
        "test", SerialExecutor::Lane::kLong);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!long_running && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(long_running) << "the long-lane function never ran";
  // Both posted while the long-lane function runs: the executor's own waits behind it (it
  // must not run beside it), the other executor's needs the shared thread meanwhile.
  ex.Post([&] {
    if (long_running) overlapped = true;
    after_ran.set_value();
  });
  other.Post([&] { other_ran.set_value(); });
  EXPECT_EQ(long_done.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(after_ran.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(overlapped) << "the executor ran two functions at once";
  work.reset();
  long_work.reset();
  shared_thread.join();
  long_thread.join();
}

// Without a long lane, a function yielded to it runs on the shared lane, in order.
TEST(SerialExecutorLaneTest, WithoutALongLaneTheLongLaneIsTheSharedOne) {
  boost::asio::io_context io;
  SerialExecutor ex(io);
  EXPECT_FALSE(ex.has_long_lane());
  std::vector<std::string> order;
  ex.Post([&] {
    order.push_back("a");
    ex.Yield([&] { order.push_back(ex.running_on_long_lane() ? "long lane" : "long"); }, "test",
             SerialExecutor::Lane::kLong);
  });
  ex.Post([&] { order.push_back("b"); });
  io.run();
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "long"}));
}

}  // namespace
}  // namespace ferry::session
