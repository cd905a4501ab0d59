// Soak: 256 sessions at once against one real ferryd (host backend) for a bounded time,
// mixing blocking and pending pinned transfers, ops, submit floods, session churn, and
// clients killed with SIGKILL mid-flight. What a long-running daemon must keep:
//   - no unexpected error in any surviving client (the killed ones' sessions just end);
//   - its memory and fds flat: heap RSS (VmRSS less the shared slabs) at the end no more
//     than 64 MiB above what it was after the warm-up, and its fds, less the slab pool's
//     memfds, back within 8 of where they were before any client came;
//   - everything released at the end: 0 sessions, tensors, device bytes, submits in flight,
//     slabs in use and slab connections.
// Runs FERRY_SOAK_SECONDS (default 120) of load, alone (its own binary, ferry_soak_tests, is
// RUN_SERIAL in ctest); tests/README.md says how to run it longer.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"

namespace ferry {
namespace {

using testing::FerrydProcess;
using namespace std::chrono_literals;

constexpr int kWorkerProcesses = 4;
constexpr int kSessionsPerWorker = 64;  // 256 sessions at once
constexpr uint64_t kRssSlackBytes = 64ull << 20;
constexpr int kFdSlack = 8;

int SoakSeconds() {
  const char* s = std::getenv("FERRY_SOAK_SECONDS");
  int v = s && *s ? std::atoi(s) : 120;
  return std::max(v, 10);
}

// The daemon's heap and file-backed resident bytes: VmRSS less RssShmem (the slabs are
// shared memory the pool keeps by design, bounded by --pinned-budget).
uint64_t HeapRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  uint64_t rss = 0, shmem = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string key;
    uint64_t kb = 0;
    f >> key >> kb;
    if (key == "VmRSS:") rss = kb * 1024;
    if (key == "RssShmem:") shmem = kb * 1024;
  }
  return rss - std::min(rss, shmem);
}

int OpenFds(pid_t pid) {
  int n = 0;
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

std::string MiB(uint64_t b) { return std::to_string(b >> 20) + " MiB"; }

TEST(SoakTest, ManySessionsMixedWorkKillsAndFloodsStayBounded) {
  const int seconds = SoakSeconds();
  // Generous limits: the soak is about leaks and stability, not about where limits bite.
  FerrydProcess daemon({"--max-sessions", "1024", "--slab-size", "1M", "--pinned-budget", "1G",
                        "--host-memory", "8G", "--log-level", "warn"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const pid_t pid = daemon.pid();
  const std::string client = testing::ProgramPath("FERRY_TEST_CLIENT", FERRY_TEST_CLIENT_PATH);

  auto status = daemon.AdminStatus();
  const int base_fds = OpenFds(pid) - static_cast<int>(status.slab_fds_open());
  ASSERT_GT(base_fds, 0);

  // The workers: 4 processes of 64 sessions each, every session busy until the time is up.
  std::vector<pid_t> workers;
  for (int i = 0; i < kWorkerProcesses; ++i) {
    pid_t w = testing::Spawn(client, {daemon.unix_target(), "soak",
                                      std::to_string(kSessionsPerWorker), std::to_string(seconds)});
    ASSERT_GT(w, 0);
    workers.push_back(w);
  }

  // Clients killed mid-flight: a pinned-transfer loop or a client with submits queued,
  // killed with SIGKILL after 0.2-1.4 s, one after another for the whole run.
  std::atomic<bool> stop{false};
  std::atomic<int> killed{0};
  std::thread killer([&] {
    for (int i = 0; !stop; ++i) {
      pid_t v = testing::Spawn(client, {daemon.unix_target(), i % 2 ? "hang" : "pending-loop"},
                               "/dev/null");
      if (v <= 0) continue;
      for (int ms = 0; ms < 200 + (i * 337) % 1200 && !stop; ms += 50) {
        std::this_thread::sleep_for(50ms);
      }
      kill(v, SIGKILL);
      testing::WaitExit(v, 10s);
      killed++;
    }
  });

  // Sample the daemon once a second; the warm-up ends at a quarter of the run (at least
  // 10 s in), when every session has been through each kind of work several times.
  const auto start = std::chrono::steady_clock::now();
  const auto warm_at = start + std::chrono::seconds(std::max(10, seconds / 4));
  uint64_t warm_rss = 0, peak_rss = 0;
  int peak_fds = 0;
  while (std::chrono::steady_clock::now() < start + std::chrono::seconds(seconds)) {
    std::this_thread::sleep_for(1s);
    uint64_t rss = HeapRss(pid);
    peak_rss = std::max(peak_rss, rss);
    peak_fds = std::max(peak_fds, OpenFds(pid));
    if (warm_rss == 0 && std::chrono::steady_clock::now() >= warm_at) warm_rss = rss;
  }
  stop = true;
  killer.join();

  // Every worker ends on its own once the time is up; a generous bound for a slow machine.
  for (pid_t w : workers) {
    int st = testing::WaitExit(w, std::chrono::seconds(180));
    if (st == -1) {
      kill(w, SIGKILL);
      testing::WaitExit(w, 10s);
    }
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << "soak worker " << w << " failed (status " << st << "): its errors are above";
  }

  // Everything released: the killed clients' sessions too.
  auto idle = daemon.WaitIdle(60s);
  for (int i = 0; i < 500 && (idle.slabs_in_use() != 0 || idle.slab_connections() != 0); ++i) {
    std::this_thread::sleep_for(20ms);
    idle = daemon.AdminStatus();
  }
  EXPECT_EQ(idle.sessions_open(), 0u);
  EXPECT_EQ(idle.live_tensors(), 0u);
  EXPECT_EQ(idle.device_bytes_in_use(), 0u);
  EXPECT_EQ(idle.submits_in_flight(), 0u);
  EXPECT_EQ(idle.slabs_in_use(), 0u);
  EXPECT_EQ(idle.slab_connections(), 0u);
  // Sessions were closed and opened again while the others ran (every worker session that
  // made two rounds, besides the killed clients' that got as far as an open).
  EXPECT_GT(idle.sessions_total(), static_cast<uint64_t>(kWorkerProcesses * kSessionsPerWorker))
      << "no session was churned";

  const uint64_t end_rss = HeapRss(pid);
  const int end_fds = OpenFds(pid) - static_cast<int>(idle.slab_fds_open());
  std::printf(
      "soak: %d s, %d clients killed, %llu sessions in all; heap RSS warm %s, peak %s, "
      "end %s; fds (less slab memfds) base %d, end %d (peak %d with them)\n",
      seconds, killed.load(), static_cast<unsigned long long>(idle.sessions_total()),
      MiB(warm_rss).c_str(), MiB(peak_rss).c_str(), MiB(end_rss).c_str(), base_fds, end_fds,
      peak_fds);
  EXPECT_GT(killed.load(), 0);
  ASSERT_GT(warm_rss, 0u);
  EXPECT_LE(end_rss, warm_rss + kRssSlackBytes)
      << "the daemon's heap grew by " << MiB(end_rss - warm_rss) << " after the warm-up";
  EXPECT_LE(end_fds, base_fds + kFdSlack) << "fds leaked";

  // Still serving, and it exits cleanly.
  auto c = Client::connect(daemon.unix_target());
  ASSERT_TRUE(c.ok());
  auto s = c->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->close().ok());
  int st = daemon.Stop();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "ferryd exit status " << st;
}

}  // namespace
}  // namespace ferry
