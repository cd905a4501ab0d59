// LocalConnections: the Unix endpoints' connections, counted per uid and in all until their
// fd is closed; the daemon's uid, and root while it is an admin, are never refused.
#include "rpc/local_connections.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace ferry::rpc {
namespace {

constexpr uint32_t kDaemonUid = 999;

// A fresh socket pair: the daemon's end of a connection and its client's.
struct Connection {
  Connection() {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
      daemon = pair[0];
      client = pair[1];
    }
  }
  int daemon = -1;
  int client = -1;
};

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
    for (int fd : clients_) ::close(fd);
  }
  // Admit a new connection of `uid`; both ends stay open (closed at the end) when admitted:
  // fds_ holds the daemon's ends, clients_ the clients'.
  bool Admit(LocalConnections& c, uid_t uid) {
    Connection conn;
    EXPECT_GE(conn.daemon, 0);
    if (!c.Admit(conn.daemon, "unix:/x", Peer(uid))) {
      ::close(conn.daemon);
      ::close(conn.client);
      return false;
    }
    fds_.push_back(conn.daemon);
    clients_.push_back(conn.client);
    return true;
  }
  std::vector<int> fds_;
  std::vector<int> clients_;
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

// Where config `admins` leaves root out (clients in containers run as root, and SO_PEERCRED
// gives them uid 0), root is counted and refused like any uid; the daemon's uid is not.
TEST_F(LocalConnectionsTest, RootIsCountedLikeAnyUidWhereItIsNoAdmin) {
  LocalConnections c({/*total=*/3, /*per_uid=*/2}, kDaemonUid, /*exempt_root=*/false);
  EXPECT_TRUE(Admit(c, 0));
  EXPECT_TRUE(Admit(c, 0));
  EXPECT_FALSE(Admit(c, 0)) << "root holds its 2";
  EXPECT_EQ(c.refused_per_uid(), 1u);
  EXPECT_TRUE(Admit(c, 1000));
  EXPECT_FALSE(Admit(c, 1001)) << "3 in all, root's 2 among them";
  EXPECT_TRUE(Admit(c, kDaemonUid));
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

// A client that closes a connection and at once opens another is not refused, though gRPC
// still holds the first one's fd (it closes it once it has read the end of the stream).
TEST_F(LocalConnectionsTest, AConnectionWhoseClientClosedItsEndNoLongerCounts) {
  LocalConnections c({/*total=*/3, /*per_uid=*/2}, kDaemonUid);
  ASSERT_TRUE(Admit(c, 1000));
  ASSERT_TRUE(Admit(c, 1000));
  ASSERT_FALSE(Admit(c, 1000));
  ::close(clients_[0]);  // the client goes; the daemon's end is still open
  clients_[0] = -1;
  EXPECT_EQ(c.count(), 1u);
  EXPECT_TRUE(Admit(c, 1000)) << "the hung-up one no longer counts";
  // A client that only shuts down its writes has ended its side too; for the total as well.
  ASSERT_TRUE(Admit(c, 1001));
  ASSERT_FALSE(Admit(c, 1002)) << "3 in all";
  ASSERT_EQ(::shutdown(clients_.back(), SHUT_WR), 0);
  EXPECT_TRUE(Admit(c, 1002));
  using Counts = std::vector<std::pair<uint32_t, uint64_t>>;
  EXPECT_EQ(c.CountByUid(), (Counts{{1000, 2}, {1002, 1}}));
}

TEST_F(LocalConnectionsTest, AReusedFdNumberIsANewConnection) {
  LocalConnections c({/*total=*/4, /*per_uid=*/1}, kDaemonUid);
  ASSERT_TRUE(Admit(c, 1000));
  const int fd = fds_[0];
  ::close(fd);
  fds_.clear();
  // The next socket takes the lowest free number: the same fd, now uid 1001's.
  Connection conn;
  const int again = conn.daemon;
  clients_.push_back(conn.client);
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

// A stream is identified by its connection's descriptor number ("fd:N"). Once that connection
// is closed, a descriptor that takes its number without being admitted (another socket of
// the daemon's, say) identifies nobody, though the record of the closed one is still there.
TEST_F(LocalConnectionsTest, ANumberReusedByAnotherSocketIdentifiesNobody) {
  LocalConnections c({/*total=*/4, /*per_uid=*/4}, kDaemonUid);
  ASSERT_TRUE(Admit(c, 1000));
  const int fd = fds_[0];
  ASSERT_EQ(c.Identify("fd:" + std::to_string(fd)).uid, 1000u);
  ::close(fd);
  fds_.clear();
  Connection conn;  // the lowest free number: the same fd, never admitted
  ASSERT_EQ(conn.daemon, fd);
  fds_.push_back(conn.daemon);
  clients_.push_back(conn.client);
  const session::PeerIdentity who = c.Identify("fd:" + std::to_string(fd));
  EXPECT_FALSE(who.local());
  EXPECT_FALSE(who.uid.has_value());
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
