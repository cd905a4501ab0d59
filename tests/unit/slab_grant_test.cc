// Slabs made side by side: the pool makes several at once within its budget, a session's
// ranges stay usable while one more slab of it is made, and the slab socket answers other
// connections (and other acquires) while one acquire's slab is being made.
//
// A registration hook that holds makes (GatedRegistration) stands in for a slow make, so
// what overlaps is seen directly, never inferred from timing.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "../integration/raw_protocol.h"
#include "pool/session_slabs.h"
#include "pool/slab_pool.h"
#include "rpc/local_connections.h"
#include "transport/session_channels.h"
#include "transport/slab_broker.h"

namespace ferry::pool {
namespace {

using testing::RawSlabConnection;
using transport::SessionChannels;
using transport::SlabBroker;
using transport::SlabBrokerOptions;

constexpr uint64_t kSlab = 1ull << 20;
constexpr auto kPatience = std::chrono::seconds(10);  // for what must happen, never a measure

// Registration that holds every make inside it while closed, and counts who is inside.
class GatedRegistration {
 public:
  HostRegistration Hooks() {
    HostRegistration reg;
    reg.register_memory = [this](void*, uint64_t) {
      std::unique_lock lock(mu_);
      ++inside_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_ || permits_ > 0; });
      if (!open_) --permits_;
      --inside_;
      return Status::Ok();
    };
    reg.unregister_memory = [](void*) {};
    return reg;
  }
  // True once `n` makes are inside at the same time.
  bool WaitInside(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kPatience, [&] { return inside_ >= n; });
  }
  int inside() {
    std::lock_guard lock(mu_);
    return inside_;
  }
  // Let `n` more makes through while closed.
  void Allow(int n) {
    std::lock_guard lock(mu_);
    permits_ += n;
    cv_.notify_all();
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  ~GatedRegistration() { Open(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0;
  int permits_ = 0;
  bool open_ = false;
};

// Opens the gate when it goes: declared after what waits on held makes (futures, the pool,
// the broker), it goes first, so a test that stops early ends instead of hanging.
struct OpenAtExit {
  GatedRegistration& gate;
  ~OpenAtExit() { gate.Open(); }
};

std::unique_ptr<SlabPool> MakePool(GatedRegistration& gate, uint64_t budget_slabs) {
  auto pool = SlabPool::Create({kSlab, budget_slabs * kSlab, /*initial_slabs=*/0}, gate.Hooks());
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return std::move(*pool);
}

TEST(SlabGrantTest, GrantsMakeTheirSlabsSideBySide) {
  GatedRegistration gate;
  auto pool = MakePool(gate, 4);
  std::vector<std::future<Result<SlabRef>>> grants;
  OpenAtExit open_at_exit{gate};  // a failed check never leaves a make held
  for (int i = 0; i < 3; ++i) {
    grants.push_back(std::async(std::launch::async, [&] { return pool->Acquire(1000); }));
  }
  // All three makes are inside registration at once: none waits for another's make.
  EXPECT_TRUE(gate.WaitInside(3)) << gate.inside() << " of 3 makes at once";
  gate.Open();
  for (auto& g : grants) EXPECT_TRUE(g.get().ok());
  EXPECT_EQ(pool->stats().most_made_at_once, 3u);
  EXPECT_EQ(pool->stats().made_on_grant_total, 3u);
}

TEST(SlabGrantTest, MakesInFlightCountAgainstTheBudget) {
  GatedRegistration gate;
  auto pool = MakePool(gate, 2);
  std::vector<std::future<Result<SlabRef>>> grants;
  for (int i = 0; i < 2; ++i) {
    grants.push_back(std::async(std::launch::async, [&] { return pool->Acquire(1000); }));
  }
  ASSERT_TRUE(gate.WaitInside(2));
  // The budget is taken by the two makes: a third grant waits for them, and once they end
  // held by sessions, it is refused without making a third slab.
  auto third = std::async(std::launch::async, [&] { return pool->Acquire(1000); });
  OpenAtExit open_at_exit{gate};
  EXPECT_EQ(third.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  gate.Open();
  for (auto& g : grants) EXPECT_TRUE(g.get().ok());
  Result<SlabRef> refused = third.get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().kind(), ErrorKind::kQuotaExceeded);
  EXPECT_EQ(pool->stats().slabs_total, 2u);
  EXPECT_EQ(pool->stats().most_made_at_once, 2u);
}

// Whether `calls` returned while a make was held (waits up to kPatience: a call that waited
// for the held make would not have returned).
bool ReturnedWhileAMakeIsHeld(const std::future<void>& calls) {
  return calls.wait_for(kPatience) == std::future_status::ready;
}

TEST(SlabGrantTest, ASessionsRangesStayUsableWhileItsNextSlabIsMade) {
  GatedRegistration gate;
  auto pool = MakePool(gate, 4);
  SessionSlabs slabs(pool.get());
  ASSERT_TRUE(slabs.Bind(1000));
  gate.Allow(1);
  auto held = slabs.Acquire();
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto next = std::async(std::launch::async, [&] { return slabs.Acquire(); });
  OpenAtExit open_at_exit{gate};
  ASSERT_TRUE(gate.WaitInside(1));
  // The executor's calls on the slab it holds do not wait for the make.
  const SlabRange range{held->id, 0, 4096};
  auto calls = std::async(std::launch::async, [&] {
    EXPECT_TRUE(slabs.Check(range).ok());
    slabs.MarkBusy(range);
    EXPECT_EQ(slabs.Check(range).kind(), ErrorKind::kBusy);
    slabs.Finish(range, /*failed=*/false);
    EXPECT_TRUE(slabs.Check(range).ok());
  });
  OpenAtExit open_before_calls_end{gate};
  EXPECT_TRUE(ReturnedWhileAMakeIsHeld(calls));
  EXPECT_EQ(gate.inside(), 1) << "the make ended before the calls were checked";
  gate.Open();
  ASSERT_TRUE(next.get().ok());
  EXPECT_EQ(slabs.slab_count(), 2u);
}

TEST(SlabGrantTest, ASlabMadeForASessionThatClosedMeanwhileGoesBack) {
  GatedRegistration gate;
  auto pool = MakePool(gate, 4);
  SessionSlabs slabs(pool.get());
  ASSERT_TRUE(slabs.Bind(1000));
  auto next = std::async(std::launch::async, [&] { return slabs.Acquire(); });
  OpenAtExit open_at_exit{gate};
  ASSERT_TRUE(gate.WaitInside(1));
  auto close = std::async(std::launch::async, [&] { slabs.Close(); });
  OpenAtExit open_before_close_ends{gate};
  EXPECT_TRUE(ReturnedWhileAMakeIsHeld(close));
  gate.Open();
  Result<SlabRef> late = next.get();
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().kind(), ErrorKind::kSessionClosed);
  pool->WaitIdleForTest();
  EXPECT_EQ(pool->stats().slabs_in_use, 0u);
  EXPECT_EQ(pool->stats().slabs_total, 0u) << "the slab went back and was destroyed";
  EXPECT_EQ(slabs.slab_count(), 0u);
}

// A test's side of one slab-socket connection whose answers may not come: reads give up
// after kPatience instead of hanging the test.
std::unique_ptr<RawSlabConnection> Connect(const std::string& path) {
  auto c = std::make_unique<RawSlabConnection>(path);
  timeval patience{static_cast<time_t>(kPatience.count()), 0};
  ::setsockopt(c->fd(), SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  return c;
}

TEST(SlabGrantTest, TheSlabSocketAnswersOthersWhileAnAcquireIsMade) {
  GatedRegistration gate;
  auto pool = MakePool(gate, 8);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ferry-slab-grant-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "s.slabs").string();
  auto listen_fd = rpc::ListenUnix(path);
  ASSERT_TRUE(listen_fd.ok()) << listen_fd.status().ToString();
  SlabBrokerOptions options;
  options.grant_threads = 2;
  auto broker = SlabBroker::Start(path, *listen_fd, options);
  ASSERT_TRUE(broker.ok()) << broker.status().ToString();
  auto a = std::make_shared<SessionChannels>();
  a->slabs = std::make_shared<SessionSlabs>(pool.get());
  auto b = std::make_shared<SessionChannels>();
  b->slabs = std::make_shared<SessionSlabs>(pool.get());
  auto token_a = (*broker)->IssueToken(a, ::getuid());
  auto token_b = (*broker)->IssueToken(b, ::getuid());
  ASSERT_TRUE(token_a.ok() && token_b.ok());
  auto ca = Connect(path);
  auto cb = Connect(path);
  OpenAtExit open_at_exit{gate};
  ASSERT_EQ(ca->Hello(*token_a), 0);
  // A's acquire is held in its make...
  ASSERT_TRUE(ca->Send(RawSlabConnection::RequestBytes(1)));
  ASSERT_TRUE(gate.WaitInside(1));
  // ...while B binds and is answered (it has no ring: UNSUPPORTED), and B's acquire makes
  // its slab beside A's.
  EXPECT_EQ(cb->Hello(*token_b), 0);
  auto ring = cb->Ring();
  ASSERT_TRUE(ring.has_value()) << "no answer while another acquire was made";
  EXPECT_EQ(ring->kind, static_cast<uint32_t>(ErrorKind::kUnsupported));
  ASSERT_TRUE(cb->Send(RawSlabConnection::RequestBytes(1)));
  EXPECT_TRUE(gate.WaitInside(2)) << "B's make waited for A's";
  gate.Open();
  for (RawSlabConnection* c : {ca.get(), cb.get()}) {
    auto slab = c->Answer();
    ASSERT_TRUE(slab.has_value());
    EXPECT_EQ(slab->kind, 0u);
    EXPECT_EQ(slab->size, kSlab);
    EXPECT_GE(slab->fd, 0);
    if (slab->fd >= 0) ::close(slab->fd);
  }
  EXPECT_EQ(a->slabs->slab_count(), 1u);
  EXPECT_EQ(b->slabs->slab_count(), 1u);
  broker->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::pool
