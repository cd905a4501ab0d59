// DeviceSupervisor: the rebuild after a device fault, on a thread of its own.

#include "session/device_supervisor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
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

// A fault that comes while the last rebuild's thread still runs its hooks (the device is
// already back, so a session may fault it again) starts a second rebuild; JoinRebuild then
// returns only once both threads are done, the first one's hooks included: nothing of a
// rebuild runs after the owner has gone. The serving hook (the health service) hears
// "lost" for each fault and "back" once, from the rebuild after the last: the first rebuild,
// overtaken by the second fault, does not say "back" after it.
TEST(DeviceSupervisorTest, AFaultDuringTheLastRebuildsHooksLeavesNoRebuildRunningAfterJoin) {
  std::unique_ptr<DeviceSupervisor> supervisor = MakeSupervisor();
  ASSERT_NE(supervisor, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  int hooks_started = 0;
  bool release_first = false;
  std::atomic<int> hooks_done{0};
  std::vector<bool> serving_calls;  // under mu
  supervisor->SetServingHook([&](bool up) {
    std::lock_guard lock(mu);
    serving_calls.push_back(up);
  });
  supervisor->SetRebuiltHook([&] {
    std::unique_lock lock(mu);
    const int call = ++hooks_started;
    cv.notify_all();
    if (call == 1) cv.wait(lock, [&] { return release_first; });  // held until released
    hooks_done.fetch_add(1);
  });

  auto fault = [&](uint64_t session_id) {
    auto lease = supervisor->Join(session_id, {}, milliseconds(5000));
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    const uint64_t generation = lease->generation;
    supervisor->ReportFault(generation, session_id, Status(ErrorKind::kDeviceFault, "injected"));
    lease->stream.reset();
    supervisor->ReleaseStream(generation);  // the last stream: the rebuild starts
    supervisor->Leave(session_id);
  };
  fault(1);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return hooks_started == 1; }));
  }
  // The first rebuild's thread is in its hook; its device serves: fault it again. The
  // second rebuild starts (its thread waits for the first's).
  fault(2);
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(200));
    std::lock_guard lock(mu);
    release_first = true;
    cv.notify_all();
  });
  supervisor->JoinRebuild();
  EXPECT_EQ(hooks_done.load(), 2) << "JoinRebuild returned while a rebuild's hook still ran";
  EXPECT_EQ(supervisor->resets(), 2u);
  releaser.join();
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(serving_calls, (std::vector<bool>{false, false, true}));
  }
  EXPECT_TRUE(supervisor->serving());
  supervisor.reset();
}

}  // namespace
}  // namespace ferry::session
