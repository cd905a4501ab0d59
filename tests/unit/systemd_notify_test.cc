// The sd_notify datagram protocol, the watchdog variables, socket activation (LISTEN_FDS)
// and the acceptor that serves an inherited socket, against real sockets.
#include "rpc/systemd_notify.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

namespace ferry::rpc::systemd {
namespace {

constexpr const char* kVars[] = {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
                                 "LISTEN_PID",    "LISTEN_FDS",    "LISTEN_FDNAMES"};

// Clears the variables this module reads, and a temp dir, around each test.
class SystemdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) ::unsetenv(v);
    char tmpl[] = "/tmp/ferry-sd-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
    for (int fd : fds_) ::close(fd);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A datagram socket bound at `name` (a path, or '@' + an abstract name).
  int BindDatagram(const std::string& name) {
    int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    if (name[0] == '@') addr.sun_path[0] = '\0';
    socklen_t len = offsetof(sockaddr_un, sun_path) + name.size();
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
    fds_.push_back(fd);
    return fd;
  }

  int ListenStream(const std::string& path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);  // no CLOEXEC, like an inherited one
    EXPECT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    return fd;
  }

  // Receive one datagram, waiting up to 2 s; "" on timeout.
  static std::string Receive(int fd) {
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, 2000) != 1) return "";
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : "";
  }

  std::string dir_;
  std::vector<int> fds_;
};

TEST_F(SystemdTest, NotifyWithoutNotifySocketSendsNothing) {
  EXPECT_FALSE(NotifyEnabled());
  EXPECT_TRUE(Notify("READY=1").ok());
}

TEST_F(SystemdTest, NotifySendsOneDatagramToAPathSocket) {
  std::string path = dir_ + "/notify";
  int fd = BindDatagram(path);
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  EXPECT_TRUE(NotifyEnabled());
  ASSERT_TRUE(Notify("READY=1\nSTATUS=serving device 0").ok());
  EXPECT_EQ(Receive(fd), "READY=1\nSTATUS=serving device 0");
  ASSERT_TRUE(Notify("WATCHDOG=1").ok());
  EXPECT_EQ(Receive(fd), "WATCHDOG=1");
  ASSERT_TRUE(Notify("STOPPING=1").ok());
  EXPECT_EQ(Receive(fd), "STOPPING=1");
}

TEST_F(SystemdTest, NotifyReachesAnAbstractSocket) {
  std::string name = "@ferry-sd-test-" + std::to_string(::getpid()) + "-" +
                     std::filesystem::path(dir_).filename().string();
  int fd = BindDatagram(name);
  ::setenv("NOTIFY_SOCKET", name.c_str(), 1);
  ASSERT_TRUE(Notify("READY=1").ok());
  EXPECT_EQ(Receive(fd), "READY=1");
}

TEST_F(SystemdTest, NotifyReportsAnUnreachableOrMalformedSocket) {
  ::setenv("NOTIFY_SOCKET", (dir_ + "/nobody-listens").c_str(), 1);
  EXPECT_FALSE(Notify("READY=1").ok());
  ::setenv("NOTIFY_SOCKET", "relative/path", 1);
  EXPECT_EQ(Notify("READY=1").kind(), ErrorKind::kInvalidArgument);
  ::setenv("NOTIFY_SOCKET", ("/" + std::string(200, 'x')).c_str(), 1);
  EXPECT_EQ(Notify("READY=1").kind(), ErrorKind::kInvalidArgument);
}

TEST_F(SystemdTest, WatchdogInterval) {
  EXPECT_FALSE(WatchdogInterval().has_value());
  ::setenv("WATCHDOG_USEC", "30000000", 1);
  ASSERT_TRUE(WatchdogInterval().has_value());
  EXPECT_EQ(*WatchdogInterval(), std::chrono::seconds(30));
  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  EXPECT_EQ(*WatchdogInterval(), std::chrono::seconds(30));
  ::setenv("WATCHDOG_PID", std::to_string(::getpid() + 1).c_str(), 1);
  EXPECT_FALSE(WatchdogInterval().has_value()) << "meant for another process";
  ::unsetenv("WATCHDOG_PID");
  ::setenv("WATCHDOG_USEC", "0", 1);
  EXPECT_FALSE(WatchdogInterval().has_value());
  ::setenv("WATCHDOG_USEC", "soon", 1);
  EXPECT_FALSE(WatchdogInterval().has_value());
}

TEST_F(SystemdTest, ListenFdsNotActivated) {
  auto fds = ListenFds();
  ASSERT_TRUE(fds.ok());
  EXPECT_TRUE(fds->empty());
  // For another process: ignored, and not passed on.
  ::setenv("LISTEN_PID", std::to_string(::getpid() + 1).c_str(), 1);
  ::setenv("LISTEN_FDS", "1", 1);
  fds = ListenFds();
  ASSERT_TRUE(fds.ok());
  EXPECT_TRUE(fds->empty());
  EXPECT_EQ(std::getenv("LISTEN_FDS"), nullptr);
  EXPECT_EQ(std::getenv("LISTEN_PID"), nullptr);
  ::setenv("LISTEN_PID", "me", 1);
  ::setenv("LISTEN_FDS", "1", 1);
  EXPECT_FALSE(ListenFds().ok());
}

// Socket activation needs fds 3 and 4, which the test runner may use: run it in a child.
TEST_F(SystemdTest, ListenFdsAdoptsInheritedSockets) {
  std::string a = dir_ + "/a.sock", b = dir_ + "/b.sock";
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int la = ListenStream(a), lb = ListenStream(b);
    // Park them high, then move them into place as systemd would.
    int ha = ::fcntl(la, F_DUPFD, 100), hb = ::fcntl(lb, F_DUPFD, 100);
    ::close(la);
    ::close(lb);
    if (::dup2(ha, 3) != 3 || ::dup2(hb, 4) != 4) ::_exit(10);
    ::close(ha);
    ::close(hb);
    ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
    ::setenv("LISTEN_FDS", "2", 1);
    ::setenv("LISTEN_FDNAMES", "a:b", 1);
    auto fds = ListenFds();
    if (!fds.ok()) ::_exit(11);
    if (*fds != std::vector<int>{3, 4}) ::_exit(12);
    if (!(::fcntl(3, F_GETFD) & FD_CLOEXEC) || !(::fcntl(4, F_GETFD) & FD_CLOEXEC)) ::_exit(13);
    if (std::getenv("LISTEN_FDS") || std::getenv("LISTEN_PID") || std::getenv("LISTEN_FDNAMES")) {
      ::_exit(14);
    }
    if (SocketEndpoint(3) != "unix:" + a || SocketEndpoint(4) != "unix:" + b) ::_exit(15);
    // A count naming a descriptor that is not open is an error.
    ::close(4);
    ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
    ::setenv("LISTEN_FDS", "2", 1);
    if (ListenFds().ok()) ::_exit(16);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "failed check " << WEXITSTATUS(status) << " (see the test body)";
}

TEST_F(SystemdTest, SocketEndpointNamesTcpAndUnknown) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  fds_.push_back(fd);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&in), sizeof(in)), 0);
  socklen_t len = sizeof(in);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&in), &len), 0);
  EXPECT_EQ(SocketEndpoint(fd), "tcp:127.0.0.1:" + std::to_string(ntohs(in.sin_port)));
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  EXPECT_EQ(SocketEndpoint(pipe_fds[0]), "fd:" + std::to_string(pipe_fds[0]));
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST_F(SystemdTest, AcceptorHandsOverNonBlockingConnectionsWithCredentials) {
  std::string path = dir_ + "/accept.sock";
  int listen_fd = ListenStream(path);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, PeerCredentials>> got;
  auto acceptor = SocketAcceptor::Start(listen_fd, [&](int fd, const PeerCredentials& peer) {
    std::lock_guard lock(mu);
    got.emplace_back(fd, peer);
    cv.notify_all();
  });
  ASSERT_TRUE(acceptor.ok()) << acceptor.status().ToString();

  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) {
    int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    clients.push_back(c);
  }
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return got.size() == 3; }));
  }
  EXPECT_EQ((*acceptor)->accepted(), 3u);
  for (auto& [fd, peer] : got) {
    EXPECT_EQ(peer.pid, ::getpid());
    EXPECT_EQ(peer.uid, ::getuid());
    EXPECT_EQ(peer.gid, ::getgid());
    EXPECT_TRUE(::fcntl(fd, F_GETFL) & O_NONBLOCK);
    EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC);
  }
  // The accepted fd is the client's connection.
  ASSERT_EQ(::write(clients[0], "x", 1), 1);
  char c = 0;
  pollfd p = {got[0].first, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  EXPECT_EQ(::read(got[0].first, &c, 1), 1);
  EXPECT_EQ(c, 'x');

  acceptor->reset();  // stops, joins, closes the listening socket
  EXPECT_EQ(::fcntl(listen_fd, F_GETFD), -1);
  for (int fd : clients) ::close(fd);
  for (auto& [fd, peer] : got) ::close(fd);
}

TEST_F(SystemdTest, AcceptorRefusesANonListeningSocket) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  fds_.push_back(fd);
  EXPECT_FALSE(SocketAcceptor::Start(fd, [](int, const PeerCredentials&) {}).ok());
}

}  // namespace
}  // namespace ferry::rpc::systemd
