// Descriptors a client passes toward the daemon (SCM_RIGHTS) hold none of its threads. None
// of ferry's protocols passes one that way, and the last close of a descriptor runs on the
// thread that closes it: a TCP socket with unsent bytes and SO_LINGER makes that close wait
// for as long as its sender asked. Where the kernel can (Linux 6.16, SO_PASSRIGHTS) the
// daemon's Unix sockets refuse them; elsewhere the slab socket's reads take them with room
// for them and reset a socket before closing it, and a connection is drained the same way
// before it is closed (its queued messages would otherwise be closed by the kernel on the
// broker's thread).
//
// The slab broker tests turn the refusal off on their listener, as an older kernel has it,
// so that what the broker does itself is what is tested.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "../integration/raw_protocol.h"
#include "pool/session_slabs.h"
#include "pool/slab_pool.h"
#include "rpc/local_connections.h"
#include "transport/session_channels.h"
#include "transport/slab_broker.h"

namespace ferry::pool {
namespace {

using testing::RawSlabConnection;
using testing::SendWithDescriptor;
using transport::SessionChannels;
using transport::SlabBroker;
using transport::SlabBrokerOptions;

// A session's channels with a slab set of `pool` and no board or ring.
std::shared_ptr<SessionChannels> ChannelsOf(SlabPool* pool) {
  auto channels = std::make_shared<SessionChannels>();
  channels->slabs = std::make_shared<SessionSlabs>(pool);
  return channels;
}

constexpr auto kPatience = std::chrono::seconds(10);  // for what must happen, never a measure
constexpr int kSoPassRights = 83;                     // SO_PASSRIGHTS, Linux 6.16

// A TCP socket whose last close waits up to `linger_s` seconds: connected on loopback to a
// listener that never accepts, its send buffer filled, SO_LINGER set. Owns the listener.
struct LingeringSocket {
  int listener = -1;
  int fd = -1;
  explicit LingeringSocket(int linger_s) {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::listen(listener, 1), 0);
    EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    std::string bytes(64 << 10, 'x');
    while (::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
    }
    const linger slow{1, linger_s};
    EXPECT_EQ(::setsockopt(fd, SOL_SOCKET, SO_LINGER, &slow, sizeof(slow)), 0);
  }
  ~LingeringSocket() {
    if (fd >= 0) {
      const linger reset{1, 0};
      (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      ::close(fd);
    }
    ::close(listener);
  }
};

class PassedDescriptorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ferry-passed-fds-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "s.slabs").string();
    auto pool = SlabPool::Create(
        {1ull << 20, 4ull << 20, /*initial_slabs=*/0},
        HostRegistration{[](void*, uint64_t) { return Status::Ok(); }, [](void*) {}});
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
  }
  void TearDown() override {
    broker_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A broker on a listener that accepts passed descriptors, as on a kernel before 6.16.
  void StartBroker(const SlabBrokerOptions& options = {}) {
    auto listen_fd = rpc::ListenUnix(path_);
    ASSERT_TRUE(listen_fd.ok()) << listen_fd.status().ToString();
    const int pass = 1;
    (void)::setsockopt(*listen_fd, SOL_SOCKET, kSoPassRights, &pass, sizeof(pass));
    auto broker = SlabBroker::Start(path_, *listen_fd, options);
    ASSERT_TRUE(broker.ok()) << broker.status().ToString();
    broker_ = std::move(*broker);
  }
  std::unique_ptr<RawSlabConnection> Connect() {
    auto c = std::make_unique<RawSlabConnection>(path_);
    timeval patience{static_cast<time_t>(kPatience.count()), 0};
    ::setsockopt(c->fd(), SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    return c;
  }
  // A session's hello on a new connection is answered (bound) within kPatience: the broker's
  // thread is free.
  void ExpectAnotherSessionIsServed() {
    auto channels = ChannelsOf(pool_.get());
    auto token = broker_->IssueToken(channels, ::getuid());
    ASSERT_TRUE(token.ok()) << token.status().ToString();
    auto c = Connect();
    EXPECT_EQ(c->Hello(*token), 0) << "the slab socket's thread did not answer another session";
  }

  std::filesystem::path dir_;
  std::string path_;
  std::unique_ptr<SlabPool> pool_;
  std::unique_ptr<SlabBroker> broker_;
};

// A descriptor passed with a connection's bytes is taken and closed at once (a socket reset
// first), and the connection ends; the broker goes on serving others.
TEST_F(PassedDescriptorsTest, ADescriptorPassedToTheSlabSocketEndsItsConnectionAndHoldsNothing) {
  StartBroker();
  auto attacker = Connect();
  {
    LingeringSocket slow(60);
    ASSERT_EQ(SendWithDescriptor(attacker->fd(), slow.fd), 1) << std::strerror(errno);
    ::close(slow.fd);  // the daemon's copy is now the last
    slow.fd = -1;
    ExpectAnotherSessionIsServed();
  }
  char byte;
  EXPECT_EQ(::recv(attacker->fd(), &byte, 1, 0), 0)
      << "the connection that passed it was not ended";
}

// A connection the broker closes without reading on (here: its session ended while its peer
// had an answer unread, so it is kept until the peer reads it) may have messages with
// descriptors queued; its close drains them the same way.
TEST_F(PassedDescriptorsTest, AConnectionClosedWithDescriptorsQueuedHoldsNothing) {
  StartBroker();
  auto channels = ChannelsOf(pool_.get());
  auto token = broker_->IssueToken(channels, ::getuid());
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  auto c = Connect();
  ASSERT_EQ(c->Hello(*token), 0);
  ASSERT_TRUE(c->Send(RawSlabConnection::RequestBytes(2)));  // its answer left unread for now
  // The answer is in this end's queue before the session ends: else the broker may see the
  // end first and close a connection with nothing unread (it did under ASan).
  pollfd answered = {c->fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&answered, 1, static_cast<int>(kPatience.count() * 1000)), 1)
      << "the board request was never answered";
  channels->slabs->Close();
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (broker_->stats().unread_connections == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(broker_->stats().unread_connections, 1u)
      << "the connection was not kept for its reader";
  {
    LingeringSocket slow(60);
    ASSERT_EQ(SendWithDescriptor(c->fd(), slow.fd), 1) << std::strerror(errno);
    ::close(slow.fd);
    slow.fd = -1;
    ASSERT_TRUE(c->Answer().has_value()) << "the unread answer";
    char byte;
    EXPECT_EQ(::recv(c->fd(), &byte, 1, 0), 0) << "the broker never closed the connection";
    ExpectAnotherSessionIsServed();
  }
}

// Where the kernel can refuse passed descriptors, the daemon's Unix listeners do, and their
// connections inherit it: the sender's sendmsg fails (EPERM) and nothing reaches the daemon.
TEST_F(PassedDescriptorsTest, TheDaemonsUnixSocketsRefusePassedDescriptorsWhereTheKernelCan) {
  const int probe = ::socket(AF_UNIX, SOCK_STREAM, 0);
  const bool kernel_can = rpc::RefusePassedDescriptors(probe);
  ::close(probe);
  if (!kernel_can) {
    GTEST_SKIP() << "this kernel has no SO_PASSRIGHTS (Linux 6.16): the slab socket's own "
                    "handling is tested above";
  }
  auto listen_fd = rpc::ListenUnix(path_);
  ASSERT_TRUE(listen_fd.ok()) << listen_fd.status().ToString();
  RawSlabConnection client(path_);  // connected, not yet accepted
  ASSERT_TRUE(client.connected());
  int pipe_ends[2];
  ASSERT_EQ(::pipe(pipe_ends), 0);
  EXPECT_EQ(SendWithDescriptor(client.fd(), pipe_ends[0]), -1);
  EXPECT_EQ(errno, EPERM);
  ::close(pipe_ends[0]);
  ::close(pipe_ends[1]);
  ::close(*listen_fd);
}

}  // namespace
}  // namespace ferry::pool
