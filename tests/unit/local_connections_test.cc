// LocalConnections: the Unix endpoints' connections, counted per uid and in all until their
// fd is closed; root and the daemon's uid are never refused.
#include "rpc/local_connections.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace ferry::rpc {
namespace {

constexpr uint32_t kDaemonUid = 999;

// One end of a fresh socket pair (the daemon's end of a connection); the other is closed.
int Connection() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return -1;
  ::close(pair[1]);
  return pair[0];
}

systemd::PeerCredentials Peer(uid_t uid) {
  systemd::PeerCredentials p;
  p.uid = uid;
  p.gid = uid;
  p.pid = 1234;
  return p;
}

class LocalConnectionsTest : public ::testing::Test {
 protected:
  ~LocalConnectionsTest() override {
    for (int fd : fds_) ::close(fd);
  }
  // Admit a new connection of `uid`; the fd stays open (closed at the end) when admitted.
  bool Admit(LocalConnections& c, uid_t uid) {
    int fd = Connection();
    EXPECT_GE(fd, 0);
    if (!c.Admit(fd, "unix:/x", Peer(uid))) {
      ::close(fd);
      return false;
    }
    fds_.push_back(fd);
    return true;
  }
  std::vector<int> fds_;
};

TEST_F(LocalConnectionsTest, EachUidHoldsAtMostItsLimitAndAllAtMostTheTotal) {
  LocalConnections c({/*total=*/5, /*per_uid=*/3}, kDaemonUid);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Admit(c, 1000));
  EXPECT_FALSE(Admit(c, 1000)) << "uid 1000 holds its 3";
  EXPECT_EQ(c.refused_per_uid(), 1u);
  EXPECT_TRUE(Admit(c, 1001));
  EXPECT_TRUE(Admit(c, 1001));
  EXPECT_FALSE(Admit(c, 1002)) << "5 in all";
  EXPECT_EQ(c.refused_total_limit(), 1u);
  // Root and the daemon's uid are neither refused nor counted against the others.
  EXPECT_TRUE(Admit(c, 0));
  EXPECT_TRUE(Admit(c, kDaemonUid));
  EXPECT_EQ(c.count(), 7u);
  using Counts = std::vector<std::pair<uint32_t, uint64_t>>;
  EXPECT_EQ(c.CountByUid(), (Counts{{0, 1}, {kDaemonUid, 1}, {1000, 3}, {1001, 2}}));
}

TEST_F(LocalConnectionsTest, AClosedConnectionsPlaceComesBack) {
  LocalConnections c({/*total=*/4, /*per_uid=*/2}, kDaemonUid);
  ASSERT_TRUE(Admit(c, 1000));
  ASSERT_TRUE(Admit(c, 1000));
  ASSERT_FALSE(Admit(c, 1000));
  ::close(fds_[0]);  // as gRPC does when its client goes
  fds_.erase(fds_.begin());
  EXPECT_TRUE(Admit(c, 1000)) << "the closed one no longer counts";
  EXPECT_EQ(c.count(), 2u);
  // The total too: 1001 fills it, then one of its connections closes.
  ASSERT_TRUE(Admit(c, 1001));
  ASSERT_TRUE(Admit(c, 1001));
  ASSERT_FALSE(Admit(c, 1002));
  ::close(fds_.back());
  fds_.pop_back();
  EXPECT_TRUE(Admit(c, 1002));
}

TEST_F(LocalConnectionsTest, AReusedFdNumberIsANewConnection) {
  LocalConnections c({/*total=*/4, /*per_uid=*/1}, kDaemonUid);
  ASSERT_TRUE(Admit(c, 1000));
  const int fd = fds_[0];
  ::close(fd);
  fds_.clear();
  // The next socket takes the lowest free number: the same fd, now uid 1001's.
  int again = Connection();
  ASSERT_EQ(again, fd);
  ASSERT_TRUE(c.Admit(again, "unix:/y", Peer(1001)));
  fds_.push_back(again);
  auto who = c.Identify("fd:" + std::to_string(fd));
  EXPECT_EQ(who.uid, 1001u);
  EXPECT_EQ(who.address, "unix:/y");
  EXPECT_TRUE(Admit(c, 1000)) << "uid 1000's record went with its fd";
  // A descriptor the number now names is not the socket recorded: not counted.
  int other = fds_.back();
  ::close(other);
  fds_.pop_back();
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  EXPECT_EQ(c.count(), 1u);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST_F(LocalConnectionsTest, ZeroIsNoLimit) {
  LocalConnections c({/*total=*/0, /*per_uid=*/0}, kDaemonUid);
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(Admit(c, 1000));
  EXPECT_EQ(c.count(), 50u);
}

TEST_F(LocalConnectionsTest, StreamsOfOtherPeersAreNotLocal) {
  LocalConnections c;
  EXPECT_FALSE(c.Identify("ipv4:127.0.0.1:5000").local());
  EXPECT_FALSE(c.Identify("fd:12345").local());
}

}  // namespace
}  // namespace ferry::rpc
