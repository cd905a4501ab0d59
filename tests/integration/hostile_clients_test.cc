// A daemon stays bounded under hostile local clients, against a real
// ferryd on the host backend:
//  - the slab socket: idle connections that never say hello are capped per uid and closed at
//    the hello deadline; out of file descriptors, the broker thread backs off instead of
//    spinning, and serves again once descriptors come back;
//  - per-uid limits: one uid cannot take every session slot or the whole device;
//  - doorbell storms: a client ringing its submit ring's doorbell without writing records
//    does not keep the ring poller on a core, and other sessions keep working.
//
// Other uids: the test forks a child that takes the uid (setresuid, root only), connects to
// the daemon's socket and hands the connected fd back; the kernel recorded the child's
// credentials at connect (SO_PEERCRED), so the daemon sees that uid while this process
// speaks gRPC over the fd. No test user, program or home directory is needed.
#include <grp.h>
#include <grpcpp/create_channel_posix.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "library_checks.h"
#include "metrics_scrape.h"
#include "raw_protocol.h"

namespace ferry {
namespace {

using testing::Eventually;
using testing::FerrydProcess;
using testing::NotAnErrorSaying;
using testing::RawSlabConnection;
using testing::RawStream;

// Connect to the Unix socket at `path` as `uid` (and gid); return the connected fd, or -1.
// Root only: a child process takes the uid, connects and passes the fd back (SCM_RIGHTS).
int ConnectAs(uid_t uid, gid_t gid, const std::string& path) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return -1;
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), std::min(path.size() + 1, sizeof(addr.sun_path)));
  pid_t pid = ::fork();
  if (pid == 0) {  // async-signal-safe calls only
    ::close(pair[0]);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      _exit(1);
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(2);
    _exit(testing::SendWithDescriptor(pair[1], fd, 0) == 1 ? 0 : 3);
  }
  ::close(pair[1]);
  int fd = -1;
  if (pid > 0) {
    char byte;
    if (testing::ReceiveWithDescriptor(pair[0], &byte, 1, &fd) != 1 && fd >= 0) {
      ::close(fd);
      fd = -1;
    }
    testing::WaitExit(pid, std::chrono::seconds(10));
  }
  ::close(pair[0]);
  return fd;
}

// Let every uid reach the daemon's sockets (the test's temp dir is 0700).
void OpenSocketsToAll(const FerrydProcess& d) {
  std::string sock = d.unix_target().substr(5);
  std::string dir = sock.substr(0, sock.rfind('/'));
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(sock.c_str(), 0666), 0);
  ASSERT_EQ(::chmod((sock + ".slabs").c_str(), 0666), 0);
}

// A session stream over a connection made as `uid` (gRPC speaks over the connected fd); with
// a deadline when not 0.
std::unique_ptr<RawStream> StreamAs(uid_t uid, const FerrydProcess& d,
                                    std::chrono::seconds deadline = std::chrono::seconds(0)) {
  int fd = ConnectAs(uid, uid, d.unix_target().substr(5));
  if (fd < 0) return nullptr;
  return std::make_unique<RawStream>(grpc::CreateInsecureChannelFromFd("ferryd", fd), deadline);
}

// True when the peer closed `fd` (EOF, or reset) within `timeout`.
bool ClosedByPeer(int fd, std::chrono::milliseconds timeout) {
  pollfd p = {fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
  char c;
  ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// The id of `pid`'s thread named `name`, or -1.
pid_t ThreadNamed(pid_t pid, const std::string& name) {
  // Each of ferryd's threads names itself as it starts, which may be just after the daemon
  // said it is ready (seen under ASan): look for up to 5 s.
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (int attempt = 0; attempt < 500; ++attempt) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::ifstream comm(entry.path() / "comm");
      std::string got;
      std::getline(comm, got);
      if (got == name) return std::stoi(entry.path().filename().string());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Whether every thread of ferryd `pid` but the main one has named itself (each does as it
// starts running; until then it has the process's name): waits up to 5 s.
bool EveryThreadHasNamedItself(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (int attempt = 0; attempt < 500; ++attempt) {
    int unnamed = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::ifstream comm(entry.path() / "comm");
      std::string got;
      std::getline(comm, got);
      unnamed += got == "ferryd" ? 1 : 0;
    }
    if (unnamed == 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// User + system CPU time of thread `tid` of `pid`, in clock ticks (/proc/PID/task/TID/stat).
uint64_t ThreadCpuTicks(pid_t pid, pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  size_t close = stat.rfind(')');  // the name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state
    if (i == 14) utime = std::stoull(f);
    if (i == 15) {
      stime = std::stoull(f);
      break;
    }
  }
  return utime + stime;
}

// The CPU time that thread `tid` (named `thread`) of `pid` uses in the next second, in clock
// ticks; printed, with `when`.
uint64_t TicksInOneSecond(pid_t pid, pid_t tid, const char* thread, const char* when) {
  const uint64_t before = ThreadCpuTicks(pid, tid);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const uint64_t used = ThreadCpuTicks(pid, tid) - before;
  std::printf("%s: %llu ticks in 1 s (%ld a second) %s\n", thread,
              static_cast<unsigned long long>(used), ::sysconf(_SC_CLK_TCK), when);
  return used;
}

size_t OpenFds(pid_t pid) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++n;
  }
  return n;
}

// A session through the raw protocol that binds its slab connection and acquires one slab;
// the slab's answer kind (0: granted), or -1 when any step failed.
int SessionGetsASlab(const std::string& target) {
  RawStream s(target, std::chrono::seconds(20));
  auto opened = s.Open();
  if (!opened || opened->slab_socket().empty()) return -1;
  RawSlabConnection slabs(opened->slab_socket());
  if (!slabs.connected() || slabs.Hello(opened->slab_token()) != 0) return -1;
  auto slab = slabs.Acquire();
  if (!slab) return -1;
  if (slab->fd >= 0) ::close(slab->fd);
  s.Close();
  return static_cast<int>(slab->kind);
}

constexpr uid_t kUidA = 41001;
constexpr uid_t kUidB = 41002;

// Uids A and B each open a session on `d` and close it: both still find a place. Call it as
// ASSERT_NO_FATAL_FAILURE(ExpectUidsAAndBOpenSessions(d)).
void ExpectUidsAAndBOpenSessions(const FerrydProcess& d) {
  auto a = StreamAs(kUidA, d);
  ASSERT_TRUE(a && a->Open()) << d.log();
  auto b = StreamAs(kUidB, d);
  ASSERT_TRUE(b && b->Open()) << d.log();
  a->Close();
  b->Close();
}

// The tests that connect as other uids (ConnectAs): root only, skipped with the reason
// otherwise. Start() runs the daemon with every uid let in to its sockets.
class HostileClientsPerUidTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as other uids";
  }

  // Start ferryd (daemon_) with `args` and let every uid reach its sockets. Call it as
  // ASSERT_NO_FATAL_FAILURE(Start(...)).
  void Start(std::vector<std::string> args, std::vector<std::string> launcher = {}) {
    daemon_ = std::make_unique<FerrydProcess>(std::move(args), false, std::move(launcher));
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
    OpenSocketsToAll(*daemon_);
  }

  // Start ferryd with at most 12 local connections in all and 8 per uid, and metrics, whose
  // endpoint is then metrics_. Call it as ASSERT_NO_FATAL_FAILURE(StartWithConnectionLimits()).
  void StartWithConnectionLimits() {
    ASSERT_NO_FATAL_FAILURE(
        Start({"--max-local-connections", "12", "--max-local-connections-per-uid", "8",
               "--metrics-listen", "127.0.0.1:0"}));
    metrics_ = testing::MetricsEndpoint(*daemon_);
    ASSERT_FALSE(metrics_.empty());
  }

  std::unique_ptr<FerrydProcess> daemon_;
  std::string metrics_;
};

// Idle connections of one uid beyond slab-max-pending-per-uid are closed at once; while they
// are held, another uid's session binds its slab connection and gets its slab.
TEST_F(HostileClientsPerUidTest, SlabSocketCapsIdleConnectionsPerUid) {
  ASSERT_NO_FATAL_FAILURE(
      Start({"--slab-size", "4M", "--pinned-budget", "16M", "--slab-max-pending-per-uid", "8",
             "--slab-hello-timeout", "60000"}));
  FerrydProcess& d = *daemon_;
  const std::string slab_path = d.unix_target().substr(5) + ".slabs";
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    int fd = ConnectAs(kUidA, kUidA, slab_path);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  // Wait (up to 5 s) for the refused ones to be closed; then the others stay open.
  std::vector<bool> closed(idle.size(), false);
  int n_closed = 0;
  for (int round = 0; round < 50 && n_closed < 12; ++round) {
    for (size_t i = 0; i < idle.size(); ++i) {
      if (!closed[i] && ClosedByPeer(idle[i], std::chrono::milliseconds(0))) {
        closed[i] = true;
        ++n_closed;
      }
    }
    if (n_closed < 12) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (size_t i = 0; i < idle.size(); ++i) {
    if (!closed[i] && ClosedByPeer(idle[i], std::chrono::milliseconds(0))) ++n_closed;
  }
  EXPECT_EQ(n_closed, 12) << "uid A may hold 8 connections without a hello, no more";
  EXPECT_EQ(d.AdminStatus().slab_connections(), 8u);
  // Another uid (root, this process) is not held back by A's idle connections.
  EXPECT_EQ(SessionGetsASlab(d.unix_target()), 0) << d.log();
  for (int fd : idle) ::close(fd);
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Regression (bench's 64 sessions at once): one uid's sessions that all connect to the slab
// socket before any sends its hello are never refused: each session's unspent token lets one
// more of its uid's connections wait, beyond slab-max-pending-per-uid (here 1).
TEST(HostileClientsTest, ManySessionsOfOneUidBindTheirSlabsAtOnce) {
  FerrydProcess d({"--slab-size", "4M", "--pinned-budget", "64M", "--slab-max-pending-per-uid", "1",
                   "--slab-hello-timeout", "60000"});
  ASSERT_TRUE(d.ok()) << d.log();
  constexpr int kSessions = 8;
  std::vector<std::unique_ptr<RawStream>> streams;
  std::vector<std::optional<v1::Opened>> opened;
  for (int i = 0; i < kSessions; ++i) {
    streams.push_back(std::make_unique<RawStream>(d.unix_target()));
    opened.push_back(streams.back()->Open());
    ASSERT_TRUE(opened.back() && !opened.back()->slab_socket().empty()) << d.log();
  }
  // Every connection is made (and accepted) before any hello is sent.
  std::vector<std::unique_ptr<RawSlabConnection>> conns;
  for (int i = 0; i < kSessions; ++i) {
    conns.push_back(std::make_unique<RawSlabConnection>(opened[i]->slab_socket()));
    ASSERT_TRUE(conns.back()->connected());
  }
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(conns[i]->Hello(opened[i]->slab_token()), 0) << "session " << i << "\n" << d.log();
    auto slab = conns[i]->Acquire();
    ASSERT_TRUE(slab) << "session " << i;
    EXPECT_EQ(slab->kind, 0u) << "session " << i;
    if (slab->fd >= 0) ::close(slab->fd);
  }
  // Without a session, the cap holds: a second idle connection of this uid is closed.
  RawSlabConnection idle1(opened[0]->slab_socket()), idle2(opened[0]->slab_socket());
  ASSERT_TRUE(idle1.connected() && idle2.connected());
  bool one_closed = false;
  for (int round = 0; round < 50 && !one_closed; ++round) {
    one_closed = ClosedByPeer(idle1.fd(), std::chrono::milliseconds(0)) ||
                 ClosedByPeer(idle2.fd(), std::chrono::milliseconds(0));
    if (!one_closed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(one_closed) << "a uid with no unspent token may hold 1 connection without a hello";
  for (auto& s : streams) s->Close();
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Connections that send no hello are closed at the deadline; a bound connection is not.
TEST(HostileClientsTest, SlabSocketClosesConnectionsWithoutHelloAtTheDeadline) {
  FerrydProcess d({"--slab-size", "4M", "--pinned-budget", "16M", "--slab-hello-timeout", "300"});
  ASSERT_TRUE(d.ok()) << d.log();
  const std::string slab_path = d.unix_target().substr(5) + ".slabs";
  RawStream s(d.unix_target());
  auto opened = s.Open();
  ASSERT_TRUE(opened);
  RawSlabConnection bound(opened->slab_socket());
  ASSERT_EQ(bound.Hello(opened->slab_token()), 0);
  std::vector<std::unique_ptr<RawSlabConnection>> idle;
  for (int i = 0; i < 5; ++i) {
    idle.push_back(std::make_unique<RawSlabConnection>(slab_path));
    ASSERT_TRUE(idle.back()->connected());
  }
  // A partial hello does not extend the deadline either.
  ASSERT_EQ(::send(idle[0]->fd(), "FSL1", 4, MSG_NOSIGNAL), 4);
  int closed = 0;
  for (auto& c : idle) closed += ClosedByPeer(c->fd(), std::chrono::seconds(10)) ? 1 : 0;
  EXPECT_EQ(closed, 5) << "connections without a hello outlived the deadline";
  // The bound connection outlived the deadline and still serves.
  auto slab = bound.Acquire();
  ASSERT_TRUE(slab);
  EXPECT_EQ(slab->kind, 0u);
  if (slab->fd >= 0) ::close(slab->fd);
  EXPECT_EQ(d.AdminStatus().slab_connections(), 1u);
  s.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// While alive, the sanitizers' options for processes started are those of a process that runs
// out of descriptors on purpose: reports go to their stderr instead of the files
// tests/run.sh names (log_path). Such a process cannot open a report file, and its report was
// once lost that way (ferryd's stderr is its log, open from the start).
class SanitizerOptionsOutOfDescriptors {
 public:
  SanitizerOptionsOutOfDescriptors() {
    for (const char* name : {"ASAN_OPTIONS", "UBSAN_OPTIONS"}) {
      const char* v = std::getenv(name);
      if (!v) continue;
      saved_.emplace_back(name, v);
      ::setenv(name, (std::string(v) + ":log_path=stderr").c_str(), 1);  // the last one wins
    }
  }
  ~SanitizerOptionsOutOfDescriptors() { Restore(); }
  // Give the processes started from now on this process's options again.
  void Restore() {
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
    saved_.clear();
  }

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

// Out of file descriptors (RLIMIT_NOFILE lowered on the running ferryd, then spent by idle
// slab connections), the slab thread does not spin; with descriptors back, sessions get
// their slabs again.
TEST(HostileClientsTest, SlabSocketBacksOffWhenOutOfDescriptors) {
  SanitizerOptionsOutOfDescriptors sanitizers;
  FerrydProcess d({"--slab-size", "4M", "--pinned-budget", "16M", "--slab-max-pending-per-uid",
                   "100000", "--slab-max-connections", "100000", "--slab-hello-timeout", "60000"});
  sanitizers.Restore();  // set for ferryd only
  ASSERT_TRUE(d.ok()) << d.log();
  const std::string slab_path = d.unix_target().substr(5) + ".slabs";
  const pid_t tid = ThreadNamed(d.pid(), "ferry-slabs");
  ASSERT_GT(tid, 0);
  // Every thread ferryd starts with is running before its descriptors go: UBSan's vptr check
  // of a thread's first call tests the object's memory through a pipe, and without a
  // descriptor for one it reports a valid std::thread state as having an invalid vptr (a CI
  // run: the acceptor thread, scheduled after the limit was lowered). No suppression helps:
  // one applies only to a type UBSan could read.
  ASSERT_TRUE(EveryThreadHasNamedItself(d.pid())) << d.log();
  rlimit old_limit{};
  ASSERT_EQ(::prlimit(d.pid(), RLIMIT_NOFILE, nullptr, &old_limit), 0);
  rlimit low = old_limit;
  low.rlim_cur = OpenFds(d.pid()) + 8;
  ASSERT_EQ(::prlimit(d.pid(), RLIMIT_NOFILE, &low, nullptr), 0);
  std::vector<std::unique_ptr<RawSlabConnection>> idle;
  for (int i = 0; i < 40; ++i) {  // the rest wait in the listen backlog
    idle.push_back(std::make_unique<RawSlabConnection>(slab_path));
  }
  for (int i = 0; i < 500 && OpenFds(d.pid()) < low.rlim_cur; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(OpenFds(d.pid()), low.rlim_cur) << "the descriptors were not spent";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accept has failed by now
  const long hz = ::sysconf(_SC_CLK_TCK);
  const uint64_t used = TicksInOneSecond(d.pid(), tid, "ferry-slabs", "out of fds");
  EXPECT_LT(used, static_cast<uint64_t>(hz / 10))
      << "ferry-slabs used " << used << " of " << hz << " ticks in one second out of fds";
  // Descriptors come back: the idle connections go and the limit is restored.
  idle.clear();
  ASSERT_EQ(::prlimit(d.pid(), RLIMIT_NOFILE, &old_limit, nullptr), 0);
  int kind = -1;
  for (int i = 0; i < 100 && kind != 0; ++i) {  // the backlog drains first
    kind = SessionGetsASlab(d.unix_target());
    if (kind != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(kind, 0) << d.log();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Slab acquires that must make their slabs wait for the grant threads, which take the
// queued ones one uid after another: with one grant thread and six of uid A's acquires
// queued (256 MiB slabs, none made ahead), uid B's acquire is answered after at most the
// one make in progress, not after A's six (an order, read from the daemon's gauge of
// acquires waiting; nothing is timed).
TEST_F(HostileClientsPerUidTest, OneUidsBurstOfSlabAcquiresDoesNotQueueAheadOfAnotherUid) {
  ASSERT_NO_FATAL_FAILURE(
      Start({"--slab-size", "256M", "--pinned-budget", "4G", "--initial-slabs", "0",
             "--slab-grant-threads", "1", "--metrics-listen", "127.0.0.1:0"}));
  FerrydProcess& d = *daemon_;
  const std::string ep = testing::MetricsEndpoint(d);
  ASSERT_FALSE(ep.empty());
  auto waiting = [&] { return testing::Value(testing::Scrape(ep), "ferry_slab_acquires_waiting"); };
  const std::string slab_path = d.unix_target().substr(5) + ".slabs";
  // A session of `uid` with its slab connection bound (made as that uid).
  struct Tenant {
    std::unique_ptr<RawStream> stream;
    std::unique_ptr<RawSlabConnection> slabs;
  };
  auto tenant = [&](uid_t uid) -> std::optional<Tenant> {
    Tenant t;
    t.stream = StreamAs(uid, d);
    if (!t.stream) return std::nullopt;
    std::optional<v1::Opened> opened = t.stream->Open();
    if (!opened || opened->slab_token().empty()) return std::nullopt;
    t.slabs = std::make_unique<RawSlabConnection>(ConnectAs(uid, uid, slab_path));
    if (!t.slabs->connected() || t.slabs->Hello(opened->slab_token()) != 0) return std::nullopt;
    return t;
  };
  std::vector<Tenant> a;
  for (int i = 0; i < 6; ++i) {
    auto t = tenant(kUidA);
    ASSERT_TRUE(t) << "uid A's session " << i << "\n" << d.log();
    a.push_back(std::move(*t));
  }
  // Every session set up first (a set-up under load may take as long as a make), then the
  // acquires back to back: A's six, and B's once A's are all queued.
  auto b = tenant(kUidB);
  ASSERT_TRUE(b) << d.log();
  for (Tenant& t : a) ASSERT_TRUE(t.slabs->Send(RawSlabConnection::RequestBytes(1)));
  double queued = 0;
  for (int i = 0; i < 5000 && queued < 6; ++i) {
    queued = waiting();
    if (queued < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(queued, 6) << "uid A's acquires were not all waiting; the makes are too fast for "
                          "this test's premise\n"
                       << d.log();
  auto granted = b->slabs->Acquire();
  const double a_still_waiting = waiting();
  ASSERT_TRUE(granted.has_value());
  EXPECT_EQ(granted->kind, 0u);
  if (granted->fd >= 0) ::close(granted->fd);
  // A's first make was in progress when B's came; the grant thread took B's next. A's second
  // may have started by now; four of A's at least are still waiting.
  EXPECT_GE(a_still_waiting, 4) << "uid B's acquire waited behind uid A's";
  for (Tenant& t : a) {
    auto slab = t.slabs->Answer();
    ASSERT_TRUE(slab.has_value());
    EXPECT_EQ(slab->kind, 0u);
    if (slab->fd >= 0) ::close(slab->fd);
  }
  EXPECT_EQ(waiting(), 0);
  for (Tenant& t : a) t.stream->Close();
  b->stream->Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// One uid cannot take every session slot: by default it holds half of max-sessions, and
// another uid and root still open sessions.
TEST_F(HostileClientsPerUidTest, OneUidCannotTakeEverySessionSlot) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max-sessions", "4"}));
  FerrydProcess& d = *daemon_;
  std::vector<std::unique_ptr<RawStream>> a;
  for (int i = 0; i < 2; ++i) {
    a.push_back(StreamAs(kUidA, d));
    ASSERT_TRUE(a.back() && a.back()->Open()) << "uid A's session " << i << "\n" << d.log();
  }
  auto refused = StreamAs(kUidA, d);
  ASSERT_TRUE(refused);
  ASSERT_TRUE(refused->SendOpen());
  ASSERT_EQ(NotAnErrorSaying(refused->Read(), v1::QUOTA_EXCEEDED, "uid:41001's sessions limit (2"),
            "");
  EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // uid B, and root, still open sessions.
  auto b = StreamAs(kUidB, d);
  ASSERT_TRUE(b && b->Open()) << d.log();
  RawStream root(d.unix_target());
  ASSERT_TRUE(root.Open()) << d.log();
  // Usage per uid, as ferryctl sessions shows it.
  auto channel = grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials());
  auto admin = v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  v1::ListSessionsReply list;
  ASSERT_TRUE(admin->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
  std::map<std::string, v1::UidUsage> usage;
  for (const auto& u : list.usage()) usage[u.identity()] = u;
  EXPECT_EQ(usage["uid:41001"].sessions(), 2u);
  EXPECT_EQ(usage["uid:41001"].max_sessions(), 2u);
  EXPECT_EQ(usage["uid:41002"].sessions(), 1u);
  EXPECT_EQ(usage["uid:0"].sessions(), 1u);
  EXPECT_EQ(usage["uid:0"].max_sessions(), 0u) << "root is exempt";
  for (auto& s : a) s->Close();
  b->Close();
  root.Close();
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Before its Open a session stream is no session (the sessions limits count it from Open), yet
// it costs the daemon gRPC's call state and a connection object (~20 KiB: 20,000 such streams
// grew ferryd by 408 MiB before the bound). So the streams one uid holds without sending Open
// are bounded (further ones are reset at once, CANCELLED, which libferry retries) and each
// ends at the open timeout (DEADLINE_EXCEEDED, with a PROTOCOL_VIOLATION error first);
// meanwhile another uid opens sessions, and the first uid opens one once its streams are gone.
TEST_F(HostileClientsPerUidTest, StreamsThatNeverSendOpenAreBoundedPerUidAndEndAtTheirDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max-sessionless-streams-per-uid", "8", "--open-timeout", "3000",
                                 "--metrics-listen", "127.0.0.1:0"}));
  FerrydProcess& d = *daemon_;
  const std::string ep = testing::MetricsEndpoint(d);
  ASSERT_FALSE(ep.empty());
  auto metric = [&](const std::string& name, const std::string& label = "") {
    return testing::Value(testing::Scrape(ep), name, label);
  };
  // uid A opens its streams on one connection, as HTTP/2 lets a client do.
  const int fd = ConnectAs(kUidA, kUidA, d.unix_target().substr(5));
  ASSERT_GE(fd, 0);
  auto channel = grpc::CreateInsecureChannelFromFd("ferryd", fd);
  std::vector<std::unique_ptr<RawStream>> held;
  for (int i = 0; i < 8; ++i) held.push_back(std::make_unique<RawStream>(channel));
  for (int i = 0; i < 500 && metric("ferry_streams_sessionless") < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(metric("ferry_streams_sessionless"), 8) << d.log();
  RawStream refused(channel);
  EXPECT_FALSE(refused.Read());
  EXPECT_EQ(refused.Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(metric("ferry_streams_refused_total", "max_sessionless_per_uid"), 1);
  // Another uid is not held back.
  auto b = StreamAs(kUidB, d);
  ASSERT_TRUE(b && b->Open()) << d.log();
  // A's streams end at their deadline, each told why.
  for (auto& s : held) {
    ASSERT_EQ(NotAnErrorSaying(s->Read(), v1::PROTOCOL_VIOLATION,
                               "no Open within the open timeout (3000 ms)"),
              "");
    EXPECT_EQ(s->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_EQ(metric("ferry_streams_open_timeouts_total"), 8);
  // A stream's place comes back once gRPC is done with its call, just after its client closed
  // it; B's stream opened a session, so it counts no more.
  auto sessionless_once_settled = [&] {
    Eventually([&] { return metric("ferry_streams_sessionless") == 0; }, 30);
    return metric("ferry_streams_sessionless");
  };
  EXPECT_EQ(sessionless_once_settled(), 0);
  auto a = StreamAs(kUidA, d);
  ASSERT_TRUE(a && a->Open()) << d.log();
  a->Close();
  b->Close();
  EXPECT_EQ(sessionless_once_settled(), 0);
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Connections to the Unix endpoints are bounded per uid and in all: each costs the daemon a
// descriptor and gRPC's per-connection state, session or not, so a uid that opened
// connections and sent nothing could take every descriptor the daemon may open. Past a limit
// a connection is closed at once; root is never refused; a closed connection's place comes
// back, found when the uid next reaches its limit.
TEST_F(HostileClientsPerUidTest, ConnectionsAreBoundedPerUidAndInAll) {
  ASSERT_NO_FATAL_FAILURE(StartWithConnectionLimits());
  FerrydProcess& d = *daemon_;
  const std::string& ep = metrics_;
  auto metric = [&](const std::string& name, const std::string& label = "") {
    return testing::Value(testing::Scrape(ep), name, label);
  };
  const std::string path = d.unix_target().substr(5);
  // Connections that send nothing; which of them the daemon closed within a second.
  auto connect = [&](uid_t uid, int n) {
    std::vector<int> fds;
    for (int i = 0; i < n; ++i) fds.push_back(ConnectAs(uid, uid, path));
    return fds;
  };
  auto closed = [](const std::vector<int>& fds) {
    std::vector<bool> out;
    for (int fd : fds) out.push_back(ClosedByPeer(fd, std::chrono::milliseconds(1000)));
    return out;
  };
  std::vector<int> a = connect(kUidA, 10);
  ASSERT_EQ(std::count(a.begin(), a.end(), -1), 0);
  // Accepted in the order made: A's first 8 are held, its 9th and 10th closed at once.
  EXPECT_EQ(closed(a), std::vector<bool>(
                           {false, false, false, false, false, false, false, false, true, true}));
  EXPECT_EQ(metric("ferry_uid_local_connections", "uid:41001"), 8);
  EXPECT_EQ(metric("ferry_local_connections_refused_total", "max_local_connections_per_uid"), 2);
  // B's 4 fit below its own limit; its 5th would pass the total (12), and is closed.
  std::vector<int> b = connect(kUidB, 5);
  ASSERT_EQ(std::count(b.begin(), b.end(), -1), 0);
  EXPECT_EQ(closed(b), std::vector<bool>({false, false, false, false, true}));
  EXPECT_EQ(metric("ferry_local_connections_refused_total", "\"max_local_connections\""), 1);
  // Root is never refused: it opens a session with the daemon full.
  RawStream root(d.unix_target());
  ASSERT_TRUE(root.Open()) << d.log();
  root.Close();
  // A closes half of its connections: their places come back, to A and to B.
  for (int i = 0; i < 4; ++i) ::close(a[i]);
  ASSERT_NO_FATAL_FAILURE(ExpectUidsAAndBOpenSessions(d));
  for (size_t i = 4; i < a.size(); ++i) ::close(a[i]);
  for (int fd : b) ::close(fd);
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A daemon started with few descriptors (RLIMIT_NOFILE 1024, soft and hard, as in many
// containers) keeps room for others when one uid takes all it may. Every connection and every
// local session costs the daemon descriptors, so the limits it derives from them
// (max-local-connections-per-uid: 128; max-sessions: 128, of which the uid's half) leave
// another uid, and root, able to open sessions and get a slab. (With 1024 connections per uid
// allowed, one uid took every descriptor: another uid's and root's connections failed, and
// the acceptor logged a warning every 100 ms; it now logs one per 10 s.)
TEST_F(HostileClientsPerUidTest, OneUidAtItsShareOfDescriptorsLeavesRoomForOthers) {
  const char* prlimit = "/usr/bin/prlimit";  // util-linux
  if (::access(prlimit, X_OK) != 0) GTEST_SKIP() << "needs " << prlimit << " to limit ferryd";
  ASSERT_NO_FATAL_FAILURE(Start({}, {prlimit, "--nofile=1024:1024", "--"}));
  FerrydProcess& d = *daemon_;
  EXPECT_NE(d.log().find("at most 128 sessions, 512 local connections in all and 128 per uid"),
            std::string::npos)
      << d.log();
  const std::string path = d.unix_target().substr(5);

  // A: connections past its share, then sessions on them (several streams per connection)
  // until it is refused, each taking its channels (board and ring) and a slab connection.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectAs(kUidA, kUidA, path);
    ASSERT_GE(fd, 0);
    channels.push_back(grpc::CreateInsecureChannelFromFd("ferryd", fd));
  }
  std::vector<std::unique_ptr<RawStream>> a_sessions;
  std::vector<std::unique_ptr<RawSlabConnection>> a_slab_connections;
  bool refused = false;
  for (int round = 0; round < 4 && !refused; ++round) {
    for (size_t i = 0; i < channels.size() && !refused; ++i) {
      auto s = std::make_unique<RawStream>(channels[i], std::chrono::seconds(10));
      auto opened = s->Open();
      refused = !opened;
      if (refused) break;
      auto slabs =
          std::make_unique<RawSlabConnection>(ConnectAs(kUidA, kUidA, opened->slab_socket()));
      if (slabs->connected() && slabs->Hello(opened->slab_token()) == 0) {
        a_slab_connections.push_back(std::move(slabs));
      }
      a_sessions.push_back(std::move(s));
    }
  }
  std::printf("MEASURED uid A holds %zu sessions, %zu slab connections; ferryd %zu descriptors\n",
              a_sessions.size(), a_slab_connections.size(), OpenFds(d.pid()));
  EXPECT_GT(a_sessions.size(), 0u);
  EXPECT_LE(OpenFds(d.pid()), 1024u - 64) << "A took the daemon's last descriptors";

  // B and root each open a session and get a slab.
  auto b = StreamAs(kUidB, d, std::chrono::seconds(10));
  ASSERT_TRUE(b);
  auto b_opened = b->Open();
  ASSERT_TRUE(b_opened) << d.log().substr(d.log().size() > 4000 ? d.log().size() - 4000 : 0);
  RawSlabConnection b_slabs(ConnectAs(kUidB, kUidB, b_opened->slab_socket()));
  ASSERT_EQ(b_slabs.Hello(b_opened->slab_token()), 0);
  auto b_slab = b_slabs.Acquire();
  ASSERT_TRUE(b_slab);
  EXPECT_EQ(b_slab->kind, 0u);
  if (b_slab->fd >= 0) ::close(b_slab->fd);
  EXPECT_EQ(SessionGetsASlab(d.unix_target()), 0);  // root

  size_t warnings = 0;
  for (size_t at = d.log().find("acceptor on"); at != std::string::npos;
       at = d.log().find("acceptor on", at + 1)) {
    ++warnings;
  }
  EXPECT_LE(warnings, 3u) << "the acceptor's warnings are at most one per 10 s";
  b->Close();
  a_slab_connections.clear();
  for (auto& s : a_sessions) s->Close();
  a_sessions.clear();
  channels.clear();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A connection stops counting once its client has hung up, before gRPC closes the daemon's
// end. A uid that shuts down its writes on each connection but keeps it open (so the socket
// never closes from its side) must not get past its limit that way: gRPC reads the end of
// the stream and closes the daemon's end, so ferryd's descriptors stay within the limit.
TEST_F(HostileClientsPerUidTest, HalfClosedConnectionsHoldNoDescriptorsPastTheLimit) {
  ASSERT_NO_FATAL_FAILURE(StartWithConnectionLimits());
  FerrydProcess& d = *daemon_;
  const std::string& ep = metrics_;
  const size_t fds_before = OpenFds(d.pid());
  std::vector<int> held;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectAs(kUidA, kUidA, d.unix_target().substr(5));
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
    held.push_back(fd);  // kept open: only its writes are shut
  }
  const bool within = Eventually([&] { return OpenFds(d.pid()) <= fds_before + 8; }, 30);
  EXPECT_TRUE(within) << "ferryd holds " << OpenFds(d.pid()) << " descriptors, " << fds_before
                      << " before 200 half-closed connections";
  // A uid holding no connection has no series (-1: none).
  EXPECT_EQ(testing::Value(testing::Scrape(ep), "ferry_uid_local_connections", "uid:41001"), -1);
  // uid A, and another uid, still connect and open sessions.
  ASSERT_NO_FATAL_FAILURE(ExpectUidsAAndBOpenSessions(d));
  for (int fd : held) ::close(fd);
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A uid's device bytes are summed across its sessions: each session is within its own
// quota, but together they are refused past the uid's limit; another uid is not affected,
// and the bytes come back when a session closes.
TEST_F(HostileClientsPerUidTest, DeviceBytesAreLimitedPerUidAcrossSessions) {
  ASSERT_NO_FATAL_FAILURE(Start({"--uid-limits", "uid:41001:device=12K,inflight=none"}));
  FerrydProcess& d = *daemon_;
  auto a1 = StreamAs(kUidA, d);
  auto a2 = StreamAs(kUidA, d);
  auto b = StreamAs(kUidB, d);
  ASSERT_TRUE(a1 && a1->Open() && a2 && a2->Open() && b && b->Open()) << d.log();
  using testing::Create;
  ASSERT_TRUE(a1->Submit(1, {Create(1, v1::DTYPE_U8, {8192})}));
  EXPECT_EQ(a1->Completion(1).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(a2->Submit(1, {Create(1, v1::DTYPE_U8, {8192})}));
  v1::Error e = a2->Completion(1);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED);
  EXPECT_NE(e.message().find("uid:41001's device memory (bytes) limit (12288"), std::string::npos)
      << e.message();
  ASSERT_TRUE(a2->Submit(2, {Create(2, v1::DTYPE_U8, {4096})}));  // what is left fits
  EXPECT_EQ(a2->Completion(2).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(b->Submit(1, {Create(1, v1::DTYPE_U8, {1 << 20})}));  // B: the default share
  EXPECT_EQ(b->Completion(1).kind(), v1::ERROR_KIND_NONE);
  a1->Close();  // A's first 8K come back
  ASSERT_TRUE(a2->Submit(3, {Create(3, v1::DTYPE_U8, {8192})}));
  EXPECT_EQ(a2->Completion(3).kind(), v1::ERROR_KIND_NONE);
  a2->Close();
  b->Close();
  v1::StatusReply idle = d.WaitIdle();
  EXPECT_EQ(idle.device_bytes_in_use(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A uid's pinned (slab) bytes are summed across its sessions.
TEST_F(HostileClientsPerUidTest, PinnedBytesAreLimitedPerUidAcrossSessions) {
  ASSERT_NO_FATAL_FAILURE(Start(
      {"--slab-size", "4M", "--pinned-budget", "32M", "--uid-limits", "uid:41001:pinned=8M"}));
  FerrydProcess& d = *daemon_;
  auto a1 = StreamAs(kUidA, d);
  auto a2 = StreamAs(kUidA, d);
  ASSERT_TRUE(a1 && a2);
  auto o1 = a1->Open();
  auto o2 = a2->Open();
  ASSERT_TRUE(o1 && o2) << d.log();
  // Connected as uid A: a session's token binds a connection of its own uid only.
  RawSlabConnection c1(ConnectAs(kUidA, kUidA, o1->slab_socket()));
  RawSlabConnection c2(ConnectAs(kUidA, kUidA, o2->slab_socket()));
  ASSERT_EQ(c1.Hello(o1->slab_token()), 0);
  ASSERT_EQ(c2.Hello(o2->slab_token()), 0);
  std::vector<int> kinds;
  for (auto* c : {&c1, &c1, &c2}) {
    auto slab = c->Acquire();
    ASSERT_TRUE(slab);
    kinds.push_back(static_cast<int>(slab->kind));
    if (slab->fd >= 0) ::close(slab->fd);
  }
  EXPECT_EQ(kinds, (std::vector<int>{0, 0, static_cast<int>(v1::QUOTA_EXCEEDED)}))
      << "the third 4M slab takes uid A past its 8M";
  a1->Close();
  c1.Close();
  bool granted = false;  // a1's slabs went back: a2 may take one
  for (int i = 0; i < 100 && !granted; ++i) {
    auto slab = c2.Acquire();
    ASSERT_TRUE(slab);
    if (slab->fd >= 0) ::close(slab->fd);
    granted = slab->kind == 0;
    if (!granted) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(granted);
  a2->Close();
  EXPECT_EQ(d.WaitIdle().slabs_in_use(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A session's slab token binds a slab connection of the session's own uid, of no other: a
// token another uid learned (a client that leaked it) is spent by the attempt and binds
// nothing, so no other uid ever maps the session's slabs.
TEST_F(HostileClientsPerUidTest, ASlabTokenBindsOnlyAConnectionOfTheSessionsUid) {
  ASSERT_NO_FATAL_FAILURE(Start({"--slab-size", "4M", "--pinned-budget", "16M"}));
  FerrydProcess& d = *daemon_;
  auto a = StreamAs(kUidA, d);
  ASSERT_TRUE(a);
  auto opened = a->Open();
  ASSERT_TRUE(opened) << d.log();
  RawSlabConnection thief(ConnectAs(kUidB, kUidB, opened->slab_socket()));
  ASSERT_TRUE(thief.connected());
  EXPECT_EQ(thief.Hello(opened->slab_token()), static_cast<int>(ErrorKind::kInvalidArgument));
  RawSlabConnection own(ConnectAs(kUidA, kUidA, opened->slab_socket()));
  ASSERT_TRUE(own.connected());
  EXPECT_EQ(own.Hello(opened->slab_token()), static_cast<int>(ErrorKind::kInvalidArgument))
      << "the token was spent by the other uid's attempt";
  EXPECT_EQ(d.AdminStatus().slabs_in_use(), 0u);
  a->Close();
  // A session's own uid binds its token as before.
  auto b = StreamAs(kUidA, d);
  ASSERT_TRUE(b);
  auto opened_b = b->Open();
  ASSERT_TRUE(opened_b);
  RawSlabConnection conn(ConnectAs(kUidA, kUidA, opened_b->slab_socket()));
  EXPECT_EQ(conn.Hello(opened_b->slab_token()), 0);
  b->Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A uid's submits in flight are summed across its sessions: with a long submit running in
// each of its two sessions, a third submit passes the uid's limit of 2 and is refused; the
// limit counts only what is in flight, so later submits run again.
TEST_F(HostileClientsPerUidTest, SubmitsInFlightAreLimitedPerUidAcrossSessions) {
  const bool cuda = testing::TestBackend() == "cuda";
  ASSERT_NO_FATAL_FAILURE(
      Start({"--uid-limits", "uid:41001:inflight=2", "--raw-kernels", "uid:41001"}));
  FerrydProcess& d = *daemon_;
  auto a1 = StreamAs(kUidA, d);
  auto a2 = StreamAs(kUidA, d);
  ASSERT_TRUE(a1 && a1->Open() && a2 && a2->Open()) << d.log();
  using testing::Create;
  using testing::Fill;
  for (auto* a : {a1.get(), a2.get()}) {
    std::vector<v1::Op> setup{Create(1, v1::DTYPE_U8, {64 << 20})};
    if (cuda) setup.push_back(testing::LoadSpin(2));
    ASSERT_TRUE(a->Submit(1, setup));
    v1::Error e = a->Completion(1);
    ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  }
  // Long, so that what follows arrives while both run: on a GPU one kernel that spins for
  // about 2 s, one launch to enqueue (with 20000 and then 60000 fills of 64 MiB instead,
  // a1's had ended when a2's third submit came, once each on the H200); on the host
  // backend 32 fills of 64 MiB, a second or so. A session's submits complete in order, so
  // a2's third submit stays in flight behind its long one.
  const std::vector<v1::Op> long_ops =
      cuda ? std::vector<v1::Op>{testing::Spin(2, 1, 1.0f, 4'000'000'000ull)}
           : std::vector<v1::Op>(32, Fill(1, 1.0));
  ASSERT_TRUE(a1->Submit(2, long_ops));
  // a1's is charged first: wait (bounded) until the daemon counts it in flight for uid A.
  auto admin =
      v1::Admin::NewStub(grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials()));
  uint64_t charged = 0;
  for (int i = 0; i < 2000 && charged == 0; ++i) {
    grpc::ClientContext ctx;
    v1::ListSessionsReply list;
    ASSERT_TRUE(admin->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
    for (const auto& u : list.usage()) {
      if (u.identity() == "uid:41001") charged = u.submits_in_flight();
    }
  }
  ASSERT_EQ(charged, 1u) << "a1's long submit was never seen in flight";
  ASSERT_TRUE(a2->Submit(2, long_ops));
  ASSERT_TRUE(a2->Submit(3, {Fill(1, 3.0)}));
  v1::Error third = a2->Completion(3);
  EXPECT_EQ(third.kind(), v1::QUOTA_EXCEEDED);
  EXPECT_NE(third.message().find("uid:41001's submits in flight limit (2"), std::string::npos)
      << third.message();
  EXPECT_EQ(a1->Completion(2).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(a2->Submit(4, {Fill(1, 4.0)}));  // behind a2's long one only: within the limit
  EXPECT_EQ(a2->Completion(4).kind(), v1::ERROR_KIND_NONE);
  a1->Close();
  a2->Close();
  EXPECT_EQ(d.WaitIdle().submits_in_flight(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The in-flight bytes uid A's submits hold (Admin ListSessions usage), 0 when none.
uint64_t InFlightBytesOfUidA(v1::Admin::Stub& admin) {
  grpc::ClientContext ctx;
  v1::ListSessionsReply list;
  if (!admin.ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok()) return 0;
  for (const auto& u : list.usage()) {
    if (u.identity() == "uid:41001") return u.in_flight_bytes();
  }
  return 0;
}

// One round of InFlightBytesAreLimitedPerUidAcrossSessions with `fills` fills of 64 MiB
// keeping each of uid A's two sessions busy: whether A's writers were held back with uploads
// left, the most A was seen to hold, and how many of its uploads were refused at its limit.
struct UidAFlood {
  bool held = false;
  uint64_t most_held = 0;
  int refused = 0;
};
void FloodUploadsAsUidA(int fills, UidAFlood& round) {
  FerrydProcess d({"--uid-limits", "uid:41001:inflight-bytes=40M", "--max-message", "16M"});
  ASSERT_TRUE(d.ok()) << d.log();
  OpenSocketsToAll(d);
  auto admin =
      v1::Admin::NewStub(grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials()));
  using testing::Create;
  using testing::Fill;
  constexpr uint64_t kUpload = 8 << 20;
  constexpr int kUploads = 8;
  std::vector<std::unique_ptr<RawStream>> a;
  for (int k = 0; k < 2; ++k) {
    a.push_back(StreamAs(kUidA, d));
    ASSERT_TRUE(a.back() && a.back()->Open()) << d.log();
    ASSERT_TRUE(a.back()->Submit(
        1, {Create(1, v1::DTYPE_F32, {16 << 20}), Create(2, v1::DTYPE_U8, {kUpload})}));
    ASSERT_EQ(a.back()->Completion(1).kind(), v1::ERROR_KIND_NONE);
    ASSERT_TRUE(a.back()->Submit(2, std::vector<v1::Op>(fills, Fill(1, 1.0))));
  }
  std::atomic<int> sent{0};
  std::vector<std::thread> writers;
  for (auto& s : a) {
    writers.emplace_back([r = s.get(), &sent] {
      const std::string bytes(kUpload, 'a');
      for (int i = 0; i < kUploads; ++i) {
        v1::ClientMessage m;
        m.mutable_submit()->set_submit_id(3 + static_cast<uint64_t>(i));
        auto* up = m.mutable_submit()->add_ops()->mutable_upload();
        up->set_tensor(2);
        up->set_data(bytes);
        if (!r->Send(m)) break;
        ++sent;
      }
    });
  }
  // Until A holds more than its limit less one message (16M) and its writers have stalled.
  int last = -1;
  for (int i = 0; i < 500; ++i) {
    const uint64_t held = InFlightBytesOfUidA(*admin);
    round.most_held = std::max(round.most_held, held);
    const int now = sent;
    if (held > (24u << 20) && now == last) {
      round.held = now < 2 * kUploads;
      break;
    }
    last = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Meanwhile another uid (root: exempt, within the daemon's 4G) uploads 8 MiB and reads it
  // back.
  {
    auto client = Client::connect(d.unix_target());
    ASSERT_TRUE(client.ok());
    auto s = client->open_session();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::vector<uint8_t> bytes(kUpload, 0x5c);
    Tensor t = s->create_tensor<uint8_t>({static_cast<int64_t>(bytes.size())});
    ASSERT_TRUE(s->upload(t, bytes).ok());
    auto back = s->download<uint8_t>(t);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == bytes);
    t = Tensor();
    ASSERT_TRUE(s->close().ok());
  }
  round.most_held = std::max(round.most_held, InFlightBytesOfUidA(*admin));
  // Every one of A's uploads is answered: run, or refused at A's limit.
  for (auto& s : a) {
    ASSERT_EQ(s->Completion(2).kind(), v1::ERROR_KIND_NONE);
    for (uint64_t id = 3; id < 3 + kUploads; ++id) {
      v1::Error e = s->Completion(id);
      if (e.kind() == v1::ERROR_KIND_NONE) continue;
      ASSERT_EQ(e.kind(), v1::QUOTA_EXCEEDED) << e.message();
      ASSERT_NE(e.message().find("uid:41001's in-flight bytes limit (41943040"), std::string::npos)
          << e.message();
      ++round.refused;
    }
  }
  for (auto& w : writers) w.join();
  for (auto& s : a) s->Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// One uid's sessions together hold at most its in-flight bytes (uid-limits inflight-bytes):
// two sessions of uid A each send 64 MiB of inline uploads behind long device work. A holds
// at most its 40M: its sessions stop reading with less than a message (max-message) left,
// and a submit that would pass the limit is refused with QUOTA_EXCEEDED naming it. Every
// upload is answered, and another uid transfers meanwhile. Where A's work was done before
// its writers were held back, the round runs again with three times the work.
TEST_F(HostileClientsPerUidTest, InFlightBytesAreLimitedPerUidAcrossSessions) {
  UidAFlood round;
  for (int fills = testing::TestBackend() == "cuda" ? 20000 : 100, rounds = 0; rounds < 3;
       fills *= 3, ++rounds) {
    round = UidAFlood{};
    FloodUploadsAsUidA(fills, round);
    if (HasFatalFailure()) return;
    std::printf("%d fills each: uid A held at most %llu bytes, %d uploads refused, %s\n", fills,
                static_cast<unsigned long long>(round.most_held), round.refused,
                round.held ? "held back" : "not held back before its work was done");
    if (round.held) break;
  }
  EXPECT_TRUE(round.held) << "uid A's sessions read every upload while their devices were busy";
  EXPECT_LE(round.most_held, 40u << 20);
}

// One uid's sessions together hold at most its objects (uid-limits objects): uid A's second
// session cannot create past A's 1000 tensors though each session is far below its own
// limit; another uid creates meanwhile; once A's first session closes, A creates again.
TEST_F(HostileClientsPerUidTest, ObjectsAreLimitedPerUidAcrossSessions) {
  ASSERT_NO_FATAL_FAILURE(Start({"--uid-limits", "uid:41001:objects=1000"}));
  FerrydProcess& d = *daemon_;
  auto creates = [](int n) {
    std::vector<v1::Op> ops;
    for (int i = 1; i <= n; ++i) ops.push_back(testing::Create(i, v1::DTYPE_U8, {0}));
    return ops;
  };
  auto a1 = StreamAs(kUidA, d);
  auto a2 = StreamAs(kUidA, d);
  ASSERT_TRUE(a1 && a1->Open() && a2 && a2->Open()) << d.log();
  ASSERT_TRUE(a1->Submit(1, creates(600)));
  ASSERT_EQ(a1->Completion(1).kind(), v1::ERROR_KIND_NONE);
  ASSERT_TRUE(a2->Submit(1, creates(600)));
  v1::Error e = a2->Completion(1);
  EXPECT_EQ(e.kind(), v1::QUOTA_EXCEEDED);
  EXPECT_NE(e.message().find("uid:41001's objects"), std::string::npos) << e.message();
  RawStream root(d.unix_target());
  ASSERT_TRUE(root.Open());
  ASSERT_TRUE(root.Submit(1, creates(2000)));
  EXPECT_EQ(root.Completion(1).kind(), v1::ERROR_KIND_NONE) << "another uid is not held back";
  a1->Close();
  ASSERT_TRUE(a2->Submit(2, creates(600)));
  e = a2->Completion(2);
  EXPECT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  a2->Close();
  root.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// What `identity` ("uid:N") holds now (Admin ListSessions usage); all zero when nothing.
v1::UidUsage UsageOf(v1::Admin::Stub& admin, const std::string& identity) {
  grpc::ClientContext ctx;
  v1::ListSessionsReply list;
  if (admin.ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok()) {
    for (const auto& u : list.usage()) {
      if (u.identity() == identity) return u;
    }
  }
  return v1::UidUsage();
}

// The device time recorded for uid `uid`'s sessions so far (every client name together).
uint64_t DeviceBusyNsOf(v1::Admin::Stub& admin, const std::string& uid) {
  grpc::ClientContext ctx;
  v1::ListSessionsReply list;
  uint64_t ns = 0;
  if (admin.ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok()) {
    for (const auto& i : list.identities()) ns += i.uid() == uid ? i.device_busy_ns() : 0;
  }
  return ns;
}

// One uid's sessions together keep at most its share of queued-commands (uid-limits queued,
// built in half), so that its long work cannot fill the launch room and make another uid's
// submits wait for its commands to run before they are even enqueued. Against a room of 64
// (A's share 32), uid A's two sessions each submit 80 long fills (each session allowed 64
// of its own); B's small submit is then enqueued at once and completes before the device
// has reported any of A's queued fills done (no device time is recorded for A yet: a
// session records it at a completion, and A's first covers the 32 it queued). A never holds
// more than 32; every submit completes with its results.
//
// A's sessions submit one after the other: the first takes A's whole share, then the second
// finds none. Submitted at once, the two split the share as their threads happened to run,
// and the session with the smaller part reported its fills done after as few as one (seen
// on a loaded machine: a split of 1 and 31, A's first completion 96 ms after the submits,
// B's round trip 68 ms there and up to 570 ms in other runs, B never short of room): the
// check on A's device time failed though B had not waited. Now A's first completion comes
// after all 32 of its queued fills have run.
TEST_F(HostileClientsPerUidTest, OneUidKeepsAtMostItsShareOfTheQueuedCommands) {
  ASSERT_NO_FATAL_FAILURE(Start({"--queued-commands", "64", "--session-queued-commands", "64",
                                 "--kernel-batch", "0", "--session-quota", "8G"}));
  FerrydProcess& d = *daemon_;
  auto admin =
      v1::Admin::NewStub(grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials()));
  using testing::Create;
  using testing::Download;
  using testing::Fill;
  auto first_float = [](const std::string& bytes) {
    float f = -1;
    if (bytes.size() == sizeof f) std::memcpy(&f, bytes.data(), sizeof f);
    return f;
  };
  // Fills that keep a stream busy: 128 MiB on the host backend (~10-30 ms each), 4 GiB on
  // a GPU (~1.5 ms on the H200); 32 of them take far longer than one small submit's round
  // trip.
  const int64_t kElements = testing::TestBackend() == "cuda" ? int64_t{1} << 30 : 32 << 20;
  std::vector<std::unique_ptr<RawStream>> a;
  for (int k = 0; k < 2; ++k) {
    a.push_back(StreamAs(kUidA, d));
    ASSERT_TRUE(a.back() && a.back()->Open()) << d.log();
    ASSERT_TRUE(a.back()->Submit(1, {Create(1, v1::DTYPE_F32, {kElements})}));
    ASSERT_EQ(a.back()->Completion(1).kind(), v1::ERROR_KIND_NONE);
  }
  auto b = StreamAs(kUidB, d);
  ASSERT_TRUE(b && b->Open()) << d.log();
  ASSERT_TRUE(b->Submit(1, {Create(1, v1::DTYPE_F32, {1})}));
  ASSERT_EQ(b->Completion(1).kind(), v1::ERROR_KIND_NONE);
  EXPECT_EQ(UsageOf(*admin, "uid:41001").max_queued_commands(), 32u);

  for (int k = 0; k < 2; ++k) {
    std::vector<v1::Op> ops(80, Fill(1, 1.0));
    ops.push_back(Fill(1, 5.0f + k));
    ops.push_back(Download(1, 0, 4));
    ASSERT_TRUE(a[k]->Submit(2, std::move(ops)));
    if (k == 0) {
      ASSERT_TRUE(
          Eventually([&] { return UsageOf(*admin, "uid:41001").queued_commands() >= 32; }, 5))
          << "uid A's first session never filled A's share";
    }
  }
  ASSERT_TRUE(Eventually([&] { return UsageOf(*admin, "uid:41001").submits_in_flight() == 2; }, 5))
      << "uid A's second session's submit never reached the daemon";
  const uint64_t a_busy = DeviceBusyNsOf(*admin, "41001");
  ASSERT_TRUE(b->Submit(2, {Fill(1, 7.0), Download(1, 0, 4)}));
  std::string bytes;
  v1::Error e = b->Completion(2, &bytes);
  ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
  EXPECT_EQ(first_float(bytes), 7.0f);
  EXPECT_EQ(DeviceBusyNsOf(*admin, "41001"), a_busy)
      << "uid B's submit waited for uid A's queued commands to complete";

  uint64_t most = 0;
  while (d.AdminStatus().submits_in_flight() > 0) {
    most = std::max<uint64_t>(most, UsageOf(*admin, "uid:41001").queued_commands());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::printf("uid A held at most %llu queued commands while its fills ran\n",
              static_cast<unsigned long long>(most));
  EXPECT_LE(most, 32u);
  for (int k = 0; k < 2; ++k) {
    bytes.clear();
    e = a[k]->Completion(2, &bytes);
    ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
    EXPECT_EQ(first_float(bytes), 5.0f + k);
    a[k]->Close();
  }
  b->Close();
  EXPECT_EQ(UsageOf(*admin, "uid:41001").queued_commands(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Every TCP peer is charged to the one identity "remote".
// A client's name is free text from the wire: the daemon keeps, logs and lists at most its
// first 64 bytes, printable ASCII only, so a name cannot cost the daemon memory (one of 1 MiB
// here), forge a log line (a newline) or reach an operator's terminal as control sequences.
TEST(HostileClientsTest, AClientsNameIsCutAndCleanedWhereverTheDaemonKeepsIt) {
  FerrydProcess d(std::vector<std::string>{});
  ASSERT_TRUE(d.ok()) << d.log();
  RawStream raw(d.unix_target());
  v1::ClientMessage open;
  open.mutable_open()->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  open.mutable_open()->set_client_name("evil\nsession 1 opened by 'root'\x1b[2J" +
                                       std::string(1 << 20, 'x'));
  ASSERT_TRUE(raw.Send(open));
  auto opened = raw.Read();
  ASSERT_TRUE(opened && opened->has_opened());
  auto admin =
      v1::Admin::NewStub(grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ListSessionsReply list;
  ASSERT_TRUE(admin->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
  ASSERT_EQ(list.sessions_size(), 1);
  const std::string& name = list.sessions(0).client_name();
  EXPECT_EQ(name.size(), 64u);
  EXPECT_EQ(name.substr(0, 5), "evil_");
  EXPECT_TRUE(std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c < 0x7f; }))
      << name;
  raw.Close();
  EXPECT_EQ(d.log().find("evil\nsession"), std::string::npos) << "the newline reached the log";
  EXPECT_NE(d.log().find("opened by 'evil_session 1 opened by"), std::string::npos) << d.log();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// ferryd writes its ready file through a temporary name next to it; in a directory others
// may write (as /tmp/ferry could be for deploy/quickstart.sh), a link planted at that name
// must not make it write elsewhere: the file it links to stays as it was.
TEST(HostileClientsTest, TheReadyFileIsNeverWrittenThroughALinkPlantedAtItsTemporaryName) {
  char tmpl[] = "/tmp/ferry-test-ready-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string victim = dir + "/victim";
  { std::ofstream(victim) << "precious\n"; }
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/ready.tmp").c_str()), 0);
  const pid_t pid = testing::Spawn(testing::FerrydPath(),
                                   {"--backend", testing::TestBackend(), "--listen",
                                    "unix:" + dir + "/ferryd.sock", "--ready-file", dir + "/ready"},
                                   dir + "/ferryd.log");
  ASSERT_GT(pid, 0);
  std::string ready;
  EXPECT_TRUE(Eventually([&] {
    std::ifstream in(dir + "/ready");
    std::getline(in, ready);
    return !ready.empty();
  }));
  EXPECT_EQ(ready, "unix:" + dir + "/ferryd.sock");
  std::string kept;
  std::getline(std::ifstream(victim), kept);
  EXPECT_EQ(kept, "precious") << "the ready file was written through the link";
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::filesystem::remove_all(dir);
}

TEST(HostileClientsTest, RemotePeersShareOneIdentity) {
  FerrydProcess d({"--uid-limits", "remote:sessions=1"}, /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  const std::string tcp = d.tcp_target().substr(4);  // HOST:PORT
  RawStream first(tcp);
  ASSERT_TRUE(first.Open()) << d.log();
  RawStream second(tcp);
  ASSERT_TRUE(second.SendOpen());
  ASSERT_EQ(NotAnErrorSaying(second.Read(), v1::QUOTA_EXCEEDED, "remote's sessions limit (1"), "");
  RawStream local(d.unix_target());  // a local client is another identity
  EXPECT_TRUE(local.Open());
  first.Close();
  local.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A TCP peer that sends a named tenant's token (token-file `NAME TOKEN`) is that tenant: an
// identity with a budget of its own, so one tenant's sessions leave the others theirs; peers
// with the shared token share "remote". A remote:NAME rule sets one tenant's limits.
TEST(HostileClientsTest, EachRemoteTenantHasABudgetOfItsOwn) {
  const testing::TempFile token_file("# name token\nalice tok-a\nbob tok-b\nshared-tok\n");
  ASSERT_FALSE(token_file.path().empty());
  FerrydProcess d({"--token-file", token_file.path(), "--uid-limits", "remote:sessions=2",
                   "--uid-limits", "remote:bob:sessions=1"},
                  /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = [&](const std::string& token) {
    ClientOptions options;
    options.bearer_token = token;
    auto c = Client::connect(d.tcp_target(), options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(*c);
  };
  Client alice = client("tok-a"), bob = client("tok-b"), shared = client("shared-tok");
  std::vector<Session> open;
  // Each opens up to its limit; the next is refused naming the tenant.
  auto fill = [&](Client& c, int limit, const std::string& identity) {
    for (int i = 0; i < limit; ++i) {
      auto s = c.open_session();
      ASSERT_TRUE(s.ok()) << identity << " " << i << ": " << s.status().ToString();
      open.push_back(std::move(*s));
    }
    auto refused = c.open_session();
    ASSERT_FALSE(refused.ok()) << identity;
    EXPECT_EQ(refused.status().kind(), ErrorKind::kQuotaExceeded);
    EXPECT_NE(
        refused.status().message().find(identity + "'s sessions limit (" + std::to_string(limit)),
        std::string::npos)
        << refused.status().message();
  };
  fill(alice, 2, "remote:alice");
  fill(bob, 1, "remote:bob");
  fill(shared, 2, "remote");
  auto channel = grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials());
  auto admin = v1::Admin::NewStub(channel);
  EXPECT_EQ(UsageOf(*admin, "remote:alice").sessions(), 2u);
  EXPECT_EQ(UsageOf(*admin, "remote:bob").max_sessions(), 1u);
  EXPECT_EQ(UsageOf(*admin, "remote").sessions(), 2u);
  // Each session says whose it is (ferryctl sessions shows it).
  grpc::ClientContext ctx;
  v1::ListSessionsReply list;
  ASSERT_TRUE(admin->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
  std::map<std::string, int> by_identity;
  for (const auto& s : list.sessions()) ++by_identity[s.identity()];
  EXPECT_EQ(by_identity,
            (std::map<std::string, int>{{"remote", 2}, {"remote:alice", 2}, {"remote:bob", 1}}));
  for (Session& s : open) EXPECT_TRUE(s.close().ok());
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The long work of VictimBesideLongWork: one long op, or thousands of shorter ones, more
// than the launch queue holds (about 1024: backend.h).
enum class LongWork { kOneLongOp, kThousandsOfOps };

// One round of the tests below, with the long work `scale` times as long: how many of the
// 3 tenants' submits were still in flight when the victim was done (through `still`).
void VictimBesideLongWork(LongWork work, int scale, uint64_t& still,
                          const std::vector<std::string>& daemon_args = {}) {
  const bool cuda = testing::TestBackend() == "cuda";
  const bool many = work == LongWork::kThousandsOfOps;
  std::vector<std::string> args{"--executor-threads", "2", "--raw-kernels",
                                "uid:" + std::to_string(getuid())};
  // Fills go op by op, not as one batch (one command however many ops it holds).
  if (many) args.insert(args.end(), {"--kernel-batch", "0"});
  args.insert(args.end(), daemon_args.begin(), daemon_args.end());  // later ones win
  FerrydProcess d(args);
  ASSERT_TRUE(d.ok()) << d.log();
  constexpr int kHostile = 3;
  std::vector<std::unique_ptr<RawStream>> hostile;
  for (int k = 0; k < kHostile; ++k) {
    auto raw = std::make_unique<RawStream>(d.unix_target());
    ASSERT_TRUE(raw->Open());
    const int64_t elements = cuda ? 4 : (many ? 1 << 20 : 16 << 20);
    std::vector<v1::Op> setup{testing::Create(1, v1::DTYPE_F32, {elements})};
    if (cuda) setup.push_back(testing::LoadSpin(2));
    ASSERT_TRUE(raw->Submit(1, setup));
    v1::Error e = raw->Completion(1);
    ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
    hostile.push_back(std::move(raw));
  }
  for (int k = 0; k < kHostile; ++k) {
    std::vector<v1::Op> ops;
    const float v = 2.0f + k;
    if (cuda && many) {
      // 20000 x about 0.1 ms at an H200's 1.98 GHz: a thread held in the launch calls is
      // let go when the last ~1000 are queued, 0.1 s before the work is done.
      for (int i = 0; i < 20000 * scale; ++i) ops.push_back(testing::Spin(2, 1, v, 200'000));
    } else if (cuda) {  // about 2 s
      ops.push_back(testing::Spin(2, 1, v, 4'000'000'000ull * scale));
    } else if (many) {  // 2000 fills of 4 MiB
      for (int i = 0; i < 2000 * scale; ++i) ops.push_back(testing::Fill(1, v));
    } else {  // 100 fills of 64 MiB
      for (int i = 0; i < 100 * scale; ++i) ops.push_back(testing::Fill(1, v));
    }
    ops.push_back(testing::Download(1, 0, 16));
    ASSERT_TRUE(hostile[k]->Submit(2, std::move(ops)));
  }
  // The victim comes once the daemon has taken all three, or after 200 ms (a daemon whose
  // executor threads are held does not take the third until one is free).
  const auto sent = std::chrono::steady_clock::now();
  while (d.AdminStatus().submits_in_flight() < kHostile &&
         std::chrono::steady_clock::now() < sent + std::chrono::milliseconds(200)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // The victim: a new session and a synchronize(), which need executor threads and no
  // device work.
  const auto t0 = std::chrono::steady_clock::now();
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok());
  auto s = client->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(s->synchronize().ok());
  const auto t2 = std::chrono::steady_clock::now();
  still = d.AdminStatus().submits_in_flight();
  auto ms = [](auto a, auto b) {
    return static_cast<long long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count());
  };
  std::printf(
      "victim: started %lld ms after the tenants' work was sent, connect and open %lld "
      "ms, synchronize %lld ms\n",
      ms(sent, t0), ms(t0, t1), ms(t1, t2));
  for (int k = 0; k < kHostile; ++k) {
    std::string bytes;
    v1::Error e = hostile[k]->Completion(2, &bytes);
    ASSERT_EQ(e.kind(), v1::ERROR_KIND_NONE) << e.message();
    ASSERT_EQ(bytes.size(), 16u);
    float first = 0;
    std::memcpy(&first, bytes.data(), sizeof first);
    EXPECT_EQ(first, 2.0f + k);
    hostile[k]->Close();
  }
  // The victim's session works on once the device is free.
  ASSERT_NO_FATAL_FAILURE(testing::ExpectRoundTripAndClose(*s, 1, 7.0f));
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Rounds of VictimBesideLongWork, with three times the work where the tenants' work was
// done before the victim was: the number of their submits still in flight in the last.
uint64_t VictimRounds(LongWork work, const std::vector<std::string>& daemon_args = {}) {
  uint64_t still = 0;
  for (int scale = 1, rounds = 0; rounds < 3; scale *= 3, ++rounds) {
    VictimBesideLongWork(work, scale, still, daemon_args);
    if (::testing::Test::HasFatalFailure()) return still;
    std::printf("long work x%d: victim done with %llu submits of others in flight\n", scale,
                static_cast<unsigned long long>(still));
    if (still >= 3) break;
  }
  return still;
}

// Tenants that queue long device work with an inline download behind it hold no executor
// thread while it runs: with 2 executor threads and 3 such sessions, another session opens
// and synchronizes while their work is still in flight. (On CUDA a download into ordinary
// memory made on the executor thread would hold it until the stream's earlier work is
// done; the daemon stages inline bytes in pinned memory instead.) The long work is one op:
// on CUDA a kernel spinning for about two seconds, on the host backend fills.
TEST(HostileClientsTest, InlineTransfersBehindLongWorkHoldNoExecutorThread) {
  const uint64_t still = VictimRounds(LongWork::kOneLongOp);
  if (HasFatalFailure()) return;
  EXPECT_GE(still, 3u) << "the victim waited for the others' device work: an executor thread "
                          "was held";
}

// Tenants whose submits hold thousands of ops, more than CUDA's launch queue (about 1024
// per hardware work queue; its launch calls then wait for room, holding the thread that
// makes them), hold no executor thread either: each session keeps at most
// session-queued-commands on its stream, all together at most queued-commands, and the
// rest is enqueued as earlier parts complete. On CUDA the ops are raw kernels of about 0.1
// ms (kernel batches do not take them); on the host backend, whose streams model the launch
// queue, fills with kernel batches off.
TEST(HostileClientsTest, SubmitsOfThousandsOfOpsHoldNoExecutorThread) {
  const uint64_t still = VictimRounds(LongWork::kThousandsOfOps);
  if (HasFatalFailure()) return;
  EXPECT_GE(still, 3u) << "the victim waited for the others' device work: an executor thread "
                          "was held in a launch";
}

// A client ringing its submit ring's doorbell without writing records: the ring poller
// thread stays well below a core over the storm, and another session's round trips through
// its own ring keep working meanwhile.
TEST(HostileClientsTest, DoorbellStormDoesNotHoldThePollerOnACore) {
  FerrydProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  const pid_t tid = ThreadNamed(d.pid(), "ferry-rings");
  ASSERT_GT(tid, 0);
  RawStream storm(d.unix_target());
  auto opened = storm.Open();
  ASSERT_TRUE(opened && opened->submit_ring());
  RawSlabConnection conn(opened->slab_socket());
  ASSERT_EQ(conn.Hello(opened->slab_token()), 0);
  auto bell = conn.Doorbell();
  ASSERT_TRUE(bell && bell->kind == 0 && bell->fd >= 0);
  const int doorbell = bell->fd;

  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok());
  auto s = client->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Tensor t = s->create_tensor<float>({256});
  s->fill(t, 0.0f);
  ASSERT_TRUE(s->synchronize().ok());

  std::atomic<bool> stop{false};
  std::thread ringer([&] {
    const uint64_t one = 1;
    // A ring every few microseconds: each would wake a poller that sleeps, and the ringer
    // itself stays off the CPU the poller needs (2 cores may be all the machine has).
    for (uint64_t i = 0; i < 10'000'000 && !stop.load(std::memory_order_relaxed); ++i) {
      (void)!::write(doorbell, &one, sizeof(one));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the storm is on
  // The storm alone: what the poller spends on it.
  const long hz = ::sysconf(_SC_CLK_TCK);
  const uint64_t used = TicksInOneSecond(d.pid(), tid, "ferry-rings", "of storm");
  EXPECT_LT(used, static_cast<uint64_t>(0.3 * hz))
      << "ferry-rings used " << used << " of " << hz << " ticks in one second of storm";
  // Meanwhile another session's round trips through its own ring keep working.
  for (int i = 1; i <= 200; ++i) {
    s->fill(t, static_cast<float>(i));
    auto v = s->download<float>(t);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_EQ((*v)[255], static_cast<float>(i));
  }
  stop = true;
  ringer.join();
  EXPECT_GT(d.AdminStatus().submit_ring_messages_total(), 200u) << "the session used its ring";
  ::close(doorbell);
  t = Tensor();
  ASSERT_TRUE(s->close().ok());
  storm.Close();
  EXPECT_EQ(d.WaitIdle().sessions_open(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

}  // namespace
}  // namespace ferry
