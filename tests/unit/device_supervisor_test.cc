// DeviceSupervisor: the rebuild after a device fault, on a thread of its own.

#include "session/device_supervisor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"

namespace ferry::session {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<DeviceSupervisor> MakeSupervisor() {
  auto supervisor = DeviceSupervisor::Create(
      [] {
        backend::HostDeviceOptions options;
        options.memory_bytes = 1 << 20;
        return backend::CreateHostDevice(options);
      },
      nullptr);
  EXPECT_TRUE(supervisor.ok()) << supervisor.status().ToString();
  return supervisor.ok() ? std::move(*supervisor) : nullptr;
}

// A supervisor of a host device whose rebuilt hook holds the first rebuild's thread until
// released, and which records the serving hook's calls.
class DeviceSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    supervisor_ = MakeSupervisor();
    ASSERT_NE(supervisor_, nullptr);
    supervisor_->SetServingHook([this](bool up) {
      std::lock_guard lock(mu_);
      serving_calls_.push_back(up);
      cv_.notify_all();
    });
    supervisor_->SetRebuiltHook([this] {
      std::unique_lock lock(mu_);
      const int call = ++hooks_started_;
      cv_.notify_all();
      if (call == 1) cv_.wait(lock, [&] { return release_first_; });  // held until released
      ++hooks_done_;
      cv_.notify_all();
    });
  }
  // Also where a test failed half way: nothing it started outlives it.
  void TearDown() override {
    ReleaseFirst();
    if (supervisor_) supervisor_->JoinRebuild();
  }

  // A session joins, faults the device and goes: the rebuild starts.
  testing::AssertionResult Fault(uint64_t session_id) {
    auto lease = supervisor_->Join(session_id, {}, milliseconds(5000));
    if (!lease.ok()) return testing::AssertionFailure() << lease.status().ToString();
    const uint64_t generation = lease->generation;
    supervisor_->ReportFault(generation, session_id, Status(ErrorKind::kDeviceFault, "injected"));
    lease->stream.reset();
    supervisor_->ReleaseStream(generation);  // the last stream: the rebuild starts
    supervisor_->Leave(session_id);
    return testing::AssertionSuccess();
  }
  bool WaitUntil(const std::function<bool()>& done) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), done);
  }
  void ReleaseFirst() {
    std::lock_guard lock(mu_);
    release_first_ = true;
    cv_.notify_all();
  }
  std::vector<bool> serving_calls() {
    std::lock_guard lock(mu_);
    return serving_calls_;
  }

  std::unique_ptr<DeviceSupervisor> supervisor_;
  std::mutex mu_;
  std::condition_variable cv_;
  int hooks_started_ = 0;  // under mu_, as the rest
  int hooks_done_ = 0;
  bool release_first_ = false;
  std::vector<bool> serving_calls_;
};

// A fault that comes while the last rebuild's thread still runs its rebuilt hook (the
// device is already back, so a session may fault it again) starts a second rebuild. The
// serving hook (the health service) hears "lost" for each fault and "back" once, from the
// second rebuild: the first, overtaken by the second fault, does not say "back" after it.
TEST_F(DeviceSupervisorTest, AFaultDuringTheLastRebuildsHookIsFollowedByOneBack) {
  ASSERT_TRUE(Fault(1));
  ASSERT_TRUE(WaitUntil([&] { return hooks_started_ == 1; }));
  ASSERT_TRUE(Fault(2));  // the first rebuild's thread is in its hook
  ReleaseFirst();
  ASSERT_TRUE(WaitUntil([&] { return hooks_done_ == 2 && serving_calls_.size() == 3; }));
  supervisor_->JoinRebuild();
  EXPECT_EQ(serving_calls(), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(supervisor_->resets(), 2u);
  EXPECT_TRUE(supervisor_->serving());
}

// JoinRebuild returns only once every rebuild's thread is done, also one that a later rebuild
// overtook while it ran its hook, and no hook is called after it (what they reach may be
// gone): a fault after it still rebuilds the device, silently.
TEST_F(DeviceSupervisorTest, JoinRebuildWaitsForEveryRebuildAndEndsTheHooks) {
  ASSERT_TRUE(Fault(1));
  ASSERT_TRUE(WaitUntil([&] { return hooks_started_ == 1; }));
  ASSERT_TRUE(Fault(2));  // the first rebuild's thread is in its hook
  std::atomic<bool> joined{false};
  std::thread joiner([&] {
    supervisor_->JoinRebuild();
    joined = true;
  });
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(joined) << "JoinRebuild returned while the first rebuild's hook still ran";
  ReleaseFirst();
  joiner.join();
  int started_at_join = 0;
  std::vector<bool> serving_at_join = serving_calls();
  {
    std::lock_guard lock(mu_);
    started_at_join = hooks_started_;
    EXPECT_EQ(hooks_done_, hooks_started_) << "a rebuild's hook ran on after JoinRebuild";
  }
  ASSERT_TRUE(Fault(3));
  supervisor_->JoinRebuild();
  EXPECT_EQ(supervisor_->resets(), 3u);
  EXPECT_TRUE(supervisor_->serving());
  {
    std::lock_guard lock(mu_);
    EXPECT_EQ(hooks_started_, started_at_join) << "a hook was called after JoinRebuild";
  }
  EXPECT_EQ(serving_calls(), serving_at_join) << "the serving hook was called after JoinRebuild";
}

}  // namespace
}  // namespace ferry::session
