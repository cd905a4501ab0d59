// libferry's SlabSocket (client/src) against a scripted daemon side: a connection made ahead
// of the token (SlabSocket::ConnectTo) carries the hello; one the daemon closed before it
// read the hello (its hello timeout) is replaced by a new connection, once; a refused token
// is not presented again.
#include "slab_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ferry::internal {
namespace {

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

// A listening Unix socket in a fresh directory, and a thread that plays the daemon.
class FakeDaemon {
 public:
  FakeDaemon() {
    char dir[] = "/tmp/ferry-slab-socket-XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/s.slabs";
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path_.c_str());
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 8), 0);
  }
  ~FakeDaemon() {
    if (thread_.joinable()) thread_.join();
    ::close(listen_fd_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

  // Play `script`: per connection accepted, true = read the hello and one request and answer
  // both with `hello_kind` (0: bound) and kind 0; false = close it unread.
  void Play(std::vector<bool> script, uint32_t hello_kind = 0) {
    thread_ = std::thread([this, script, hello_kind] {
      for (bool serve : script) {
        const int fd = ::accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) return;
        ++accepted_;
        if (serve) {
          char hello[36 + 8];
          size_t got = 0;
          while (got < sizeof(hello)) {
            const ssize_t n = ::recv(fd, hello + got, sizeof(hello) - got, 0);
            if (n <= 0) break;
            got += static_cast<size_t>(n);
          }
          hellos_.push_back(std::string(hello + 4, 32));
          char answer[8 + 24] = {};
          std::memcpy(answer, &hello_kind, 4);
          if (hello_kind == 0) {
            (void)::send(fd, answer, sizeof(answer), MSG_NOSIGNAL);
          } else {
            (void)::send(fd, answer, 8, MSG_NOSIGNAL);  // refused: the daemon closes
          }
        }
        ::close(fd);
      }
    });
  }
  void Join() { thread_.join(); }
  int accepted() const { return accepted_; }
  const std::vector<std::string>& hellos() const { return hellos_; }

 private:
  std::string dir_, path_;
  int listen_fd_ = -1;
  std::thread thread_;
  int accepted_ = 0;
  std::vector<std::string> hellos_;
};

// A SlabSocket on a connection made ahead to `daemon`, and the outcome of its first request
// (the completion board, op 2).
struct FirstRequest {
  std::unique_ptr<SlabSocket> socket;
  Status status;
};
FirstRequest RequestOnAConnectionMadeAhead(const FakeDaemon& daemon) {
  const int ahead = SlabSocket::ConnectTo(daemon.path());
  EXPECT_GE(ahead, 0);
  FirstRequest r{std::make_unique<SlabSocket>(daemon.path(), kToken, ahead), Status()};
  char reply[24];
  int fd = -1;
  r.status = r.socket->Request(2, reply, &fd);
  return r;
}

TEST(SlabSocketTest, AConnectionMadeAheadCarriesTheHello) {
  FakeDaemon daemon;
  daemon.Play({true});
  FirstRequest first = RequestOnAConnectionMadeAhead(daemon);
  const Status& s = first.status;
  EXPECT_TRUE(s.ok()) << s.ToString();
  daemon.Join();
  EXPECT_EQ(daemon.accepted(), 1);
  ASSERT_EQ(daemon.hellos().size(), 1u);
  EXPECT_EQ(daemon.hellos()[0], kToken);
}

TEST(SlabSocketTest, AConnectionClosedBeforeItsHelloIsMadeAgainOnce) {
  FakeDaemon daemon;
  daemon.Play({false, true});  // the first connection closed unread, as a hello timeout does
  FirstRequest first = RequestOnAConnectionMadeAhead(daemon);
  const Status& s = first.status;
  EXPECT_TRUE(s.ok()) << s.ToString();
  daemon.Join();
  EXPECT_EQ(daemon.accepted(), 2);
  ASSERT_EQ(daemon.hellos().size(), 1u) << "the token went out on the second connection only";
}

TEST(SlabSocketTest, ARefusedTokenIsNotPresentedAgain) {
  FakeDaemon daemon;
  daemon.Play({true}, /*hello_kind=*/3);
  FirstRequest first = RequestOnAConnectionMadeAhead(daemon);
  const Status& s = first.status;
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.kind(), ErrorKind::kUnavailable) << s.ToString();
  daemon.Join();
  EXPECT_EQ(daemon.accepted(), 1);
  // And a later request does not connect again: the token is spent.
  char reply[24];
  int fd = -1;
  EXPECT_FALSE(first.socket->Request(2, reply, &fd).ok());
}

TEST(SlabSocketTest, ConnectToANamelessOrMissingPathFails) {
  EXPECT_EQ(SlabSocket::ConnectTo(""), -1);
  EXPECT_EQ(SlabSocket::ConnectTo("/nonexistent/ferry.sock.slabs"), -1);
  EXPECT_EQ(SlabSocket::ConnectTo(std::string(200, 'x')), -1);
}

}  // namespace
}  // namespace ferry::internal
