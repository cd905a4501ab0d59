// ferryd under a stand-in for systemd: the notify protocol (READY once the socket accepts,
// STATUS lines, WATCHDOG pings, STOPPING on drain) over a NOTIFY_SOCKET the test binds, socket
// activation through LISTEN_FDS with a listening socket the test creates, and the
// operator-facing gRPC services (grpc.health.v1, server reflection).
//
// The test plays the service manager itself (it binds NOTIFY_SOCKET, passes LISTEN_FDS), so
// these tests need no systemd on the machine and always run.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cstring>
#include <future>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "generic_calls.h"

namespace ferry {
namespace {

using testing::FerrydProcess;

using testing::TempDir;

sockaddr_un UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

// The service manager's end of NOTIFY_SOCKET.
class NotifyListener {
 public:
  explicit NotifyListener(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = UnixAddress(path);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const int on = 1;
    EXPECT_EQ(setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)), 0);
  }
  ~NotifyListener() { close(fd_); }
  const std::string& path() const { return path_; }

  /// Wait up to `timeout` for the next datagram; "" when none came.
  std::string Next(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return "";
    char buf[4096];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
    iovec iov = {buf, sizeof(buf)};
    msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd_, &msg, 0);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
        timespec ts;
        std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
        last_arrival_ = std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
      }
    }
    return n > 0 ? std::string(buf, n) : "";
  }
  /// When the kernel received the datagram Next returned last (CLOCK_REALTIME): unlike the
  /// time it was read, not moved by how late this process got to read it.
  std::chrono::nanoseconds last_arrival() const { return last_arrival_; }
  /// Wait for a datagram containing `needle`; return it ("" on timeout).
  std::string WaitFor(const std::string& needle,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      std::string m = Next(std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now()));
      if (m.find(needle) != std::string::npos) return m;
    }
    return "";
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::chrono::nanoseconds last_arrival_{0};
};

// Set environment variables for the ferryd started in this scope (posix_spawn copies environ).
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::string> > vars) {
    for (const auto& [k, v] : vars) {
      setenv(k, v.c_str(), 1);
      names_.push_back(k);
    }
  }
  ~ScopedEnv() {
    for (const char* k : names_) unsetenv(k);
  }

 private:
  std::vector<const char*> names_;
};

grpc::Status AdminDrain(const std::string& target) {
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::DrainReply reply;
  return stub->Drain(&ctx, v1::DrainRequest(), &reply);
}

// grpc.health.v1.Health/Check for `service`: the ServingStatus number (1 SERVING,
// 2 NOT_SERVING), or -1 with the call's error in `error`.
int HealthCheck(const std::string& target, const std::string& service, std::string* error) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  std::string request;
  if (!service.empty()) {
    request = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  }
  std::string bytes;
  grpc::Status s =
      testing::UnaryBytesCall(channel, "/grpc.health.v1.Health/Check", request, &bytes);
  if (!s.ok()) {
    *error = s.error_message();
    return -1;
  }
  return bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
}

// grpc.reflection.v1alpha ServerReflectionInfo with list_services; return the raw reply.
std::string ReflectionListServices(const std::string& target, std::string* error) {
  // ServerReflectionRequest { string list_services = 7; } with an empty value.
  std::optional<std::string> reply =
      testing::ReflectionExchange(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()),
                                  std::string("\x3a\x00", 2), error);
  return reply ? *reply : "";
}

TEST(SystemdNotifyTest, ReadyStatusWatchdogStopping) {
  TempDir dir;
  NotifyListener manager(dir.path() + "/notify");
  std::unique_ptr<FerrydProcess> daemon;
  {
    ScopedEnv env({{"NOTIFY_SOCKET", manager.path()}, {"WATCHDOG_USEC", "400000"}});
    daemon = std::make_unique<FerrydProcess>();
  }
  ASSERT_TRUE(daemon->ok()) << daemon->log();

  std::string ready = manager.Next();
  EXPECT_EQ(ready.rfind("READY=1\n", 0), 0u) << ready;
  EXPECT_NE(ready.find("STATUS=serving device 0"), std::string::npos) << ready;
  EXPECT_NE(ready.find(daemon->unix_target()), std::string::npos) << ready;
  // READY means the socket accepts.
  EXPECT_EQ(daemon->AdminStatus().version().rfind("ERROR", 0), std::string::npos);

  // Pings at half of WatchdogSec (200 ms here), with the load in a STATUS line: 4 pings span
  // 3 intervals, timed by their arrival (a test delayed in reading them sees them at once).
  std::chrono::nanoseconds first{0};
  for (int i = 0; i < 4; ++i) {
    std::string ping = manager.Next(std::chrono::seconds(2));
    EXPECT_EQ(ping.rfind("WATCHDOG=1\n", 0), 0u) << ping;
    EXPECT_NE(ping.find("STATUS=serving: 0 sessions"), std::string::npos) << ping;
    if (i == 0) first = manager.last_arrival();
  }
  auto took = manager.last_arrival() - first;
  EXPECT_GT(took, std::chrono::milliseconds(400));
  EXPECT_LT(took, std::chrono::milliseconds(1500));

  EXPECT_EQ(daemon->Stop(), 0) << daemon->log();
  std::string stopping = manager.WaitFor("STOPPING=1");
  EXPECT_NE(stopping.find("STATUS=draining"), std::string::npos) << stopping;
  EXPECT_EQ(manager.WaitFor("STATUS=stopped"), "STATUS=stopped");
}

TEST(SystemdNotifyTest, WatchdogForAnotherPidIsIgnored) {
  TempDir dir;
  NotifyListener manager(dir.path() + "/notify");
  std::unique_ptr<FerrydProcess> daemon;
  {
    ScopedEnv env(
        {{"NOTIFY_SOCKET", manager.path()}, {"WATCHDOG_USEC", "200000"}, {"WATCHDOG_PID", "1"}});
    daemon = std::make_unique<FerrydProcess>();
  }
  ASSERT_TRUE(daemon->ok()) << daemon->log();
  EXPECT_EQ(manager.Next().rfind("READY=1", 0), 0u);
  EXPECT_EQ(manager.Next(std::chrono::milliseconds(600)), "") << "no watchdog armed";
  EXPECT_EQ(daemon->Stop(), 0);
}

TEST(SystemdNotifyTest, AdminDrainSendsStopping) {
  TempDir dir;
  NotifyListener manager(dir.path() + "/notify");
  std::unique_ptr<FerrydProcess> daemon;
  {
    ScopedEnv env({{"NOTIFY_SOCKET", manager.path()}});
    daemon = std::make_unique<FerrydProcess>();
  }
  ASSERT_TRUE(daemon->ok()) << daemon->log();
  EXPECT_EQ(manager.Next().rfind("READY=1", 0), 0u);
  ASSERT_TRUE(AdminDrain(daemon->unix_target()).ok());
  EXPECT_NE(manager.WaitFor("STOPPING=1"), "");
  // It exits by itself; wait for that (the process turns zombie), then reap it through Stop().
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream stat("/proc/" + std::to_string(daemon->pid()) + "/stat");
    std::string line;
    std::getline(stat, line);
    size_t paren = line.rfind(')');
    if (paren != std::string::npos && line.compare(paren, 3, ") Z") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int status = daemon->Stop();
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << daemon->log();
}

TEST(SystemdServicesTest, HealthAndReflection) {
  FerrydProcess daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  std::string error;
  EXPECT_EQ(HealthCheck(daemon.unix_target(), "", &error), 1) << error;
  EXPECT_EQ(HealthCheck(daemon.unix_target(), "ferry.v1.SessionService", &error), 1) << error;
  EXPECT_EQ(HealthCheck(daemon.unix_target(), "ferry.v1.Admin", &error), 1) << error;
  EXPECT_EQ(HealthCheck(daemon.unix_target(), "no.such.Service", &error), -1);
  std::string services = ReflectionListServices(daemon.unix_target(), &error);
  EXPECT_NE(services.find("ferry.v1.Admin"), std::string::npos) << error;
  EXPECT_NE(services.find("ferry.v1.SessionService"), std::string::npos) << error;
  EXPECT_NE(services.find("grpc.health.v1.Health"), std::string::npos) << error;
  EXPECT_EQ(daemon.Stop(), 0);
}

// Socket activation: the test plays systemd, binding the socket and passing it as fd 3.
// Start ferryd with `listen_fd` passed the way systemd passes sockets (fd 3, LISTEN_FDS=1,
// LISTEN_PID=its pid) and its output in `log_path`; return its pid. Everything the child
// needs is prepared before fork(): it only dup2s, formats its pid and execs
// (async-signal-safe).
pid_t SpawnActivated(int listen_fd, const std::vector<std::string>& args,
                     const std::string& log_path) {
  std::vector<std::string> argv_strings = {testing::FerrydPath()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.push_back(*e);
  env_strings.push_back("LISTEN_FDS=1");
  env_strings.push_back("LISTEN_PID=0000000000");  // filled in by the child
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* pid_var = envp[envp.size() - 2];
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return -1;

  pid_t pid = fork();
  if (pid == 0) {
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    // dup2 clears CLOEXEC on the copy; when the socket already is fd 3, clear it directly.
    if (listen_fd == 3 ? fcntl(3, F_SETFD, 0) != 0 : dup2(listen_fd, 3) != 3) _exit(120);
    char digits[16];
    int n = 0;
    for (pid_t p = getpid(); p > 0; p /= 10) digits[n++] = static_cast<char>('0' + p % 10);
    char* out = pid_var + std::strlen("LISTEN_PID=");
    while (n > 0) *out++ = digits[--n];
    *out = '\0';
    execve(argv[0], argv.data(), envp.data());
    _exit(121);
  }
  close(log_fd);
  return pid;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(SystemdActivationTest, ServesTheInheritedSocket) {
  TempDir dir;
  std::string path = dir.path() + "/ferryd.sock";
  int listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr = UnixAddress(path);
  ASSERT_EQ(bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listen_fd, 64), 0);
  struct stat before {};
  ASSERT_EQ(stat(path.c_str(), &before), 0);

  std::string log_path = dir.path() + "/ferryd.log";
  pid_t pid = SpawnActivated(listen_fd,
                             {"--backend", testing::TestBackend(), "--listen", "unix:" + path,
                              "--ready-file", dir.path() + "/ready", "--log-level", "debug"},
                             log_path);
  ASSERT_GT(pid, 0);
  close(listen_fd);  // the daemon owns it now
  auto log = [&] { return ReadFile(log_path); };

  // Ready when the ready file names the inherited socket.
  std::string ready;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       ready.empty() && std::chrono::steady_clock::now() < until;) {
    std::ifstream in(dir.path() + "/ready");
    std::getline(in, ready);
    int early = 0;
    if (ready.empty() && waitpid(pid, &early, WNOHANG) == pid) {
      FAIL() << "ferryd exited (status " << early << ") before serving:\n" << log();
    }
    if (ready.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(ready, "unix:" + path) << log();
  // The daemon accepted on the inherited socket: it did not bind a new one over it.
  struct stat after {};
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);

  // Sessions work through connections the daemon accepted itself.
  for (int round = 0; round < 3; ++round) {
    auto client = Client::connect("unix:" + path);
    ASSERT_TRUE(client.ok()) << client.status().ToString() << log();
    auto session = client->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    Tensor x = session->create_tensor<double>({1000});
    std::vector<double> data(1000);
    for (int i = 0; i < 1000; ++i) data[i] = i * 0.5;
    ASSERT_TRUE(session->upload(x, data).ok());
    session->scale(x, 4.0, x);
    auto back = session->download<double>(x);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    for (int i = 0; i < 1000; ++i) ASSERT_EQ((*back)[i], i * 2.0);
    ASSERT_TRUE(session->close().ok());
  }

  // Local clients of an activated daemon get the shared-memory route too: the slab pool
  // sits beside the inherited socket.
  {
    auto client = Client::connect("unix:" + path);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto session = client->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    auto buffer = session->pinned_buffer(4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    EXPECT_TRUE(buffer->is_shared()) << "no shared memory under socket activation\n" << log();
    std::memset(buffer->data(), 7, 4096);
    Tensor t = session->create_tensor<uint8_t>({4096});
    auto up = session->upload_pending(std::move(*buffer), std::move(t)).wait();
    ASSERT_TRUE(up.status.ok()) << up.status.ToString();
    auto down = session->download_pending(std::move(up.tensor), std::move(up.buffer)).wait();
    ASSERT_TRUE(down.status.ok()) << down.status.ToString();
    EXPECT_EQ(static_cast<const uint8_t*>(down.buffer.data())[4095], 7);
    ASSERT_TRUE(session->close().ok());
  }

  kill(pid, SIGTERM);
  int status = testing::WaitExit(pid, std::chrono::seconds(30));
  if (status == -1) {
    kill(pid, SIGKILL);
    testing::WaitExit(pid, std::chrono::seconds(5));
  }
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n"
                                                                             << log();
}

// An inherited TCP socket would bypass the TLS and token checks of ferryd's own TCP
// listener: ferryd refuses to start on one.
TEST(SystemdActivationTest, RefusesAnInheritedTcpSocket) {
  TempDir dir;
  int listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listen_fd, 8), 0);
  std::string log_path = dir.path() + "/ferryd.log";
  pid_t pid = SpawnActivated(
      listen_fd, {"--backend", testing::TestBackend(), "--ready-file", dir.path() + "/ready"},
      log_path);
  ASSERT_GT(pid, 0);
  close(listen_fd);
  int status = testing::WaitExit(pid, std::chrono::seconds(20));
  if (status == -1) kill(pid, SIGKILL);
  ASSERT_NE(status, -1) << "ferryd kept running on an inherited TCP socket";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(ReadFile(log_path).find("Unix stream sockets only"), std::string::npos)
      << ReadFile(log_path);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/ready"));
}

}  // namespace
}  // namespace ferry
