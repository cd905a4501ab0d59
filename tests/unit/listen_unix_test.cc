// ListenUnix: the socket file is made with its final mode (0660), never changed afterwards,
// so there is no moment when anyone but the owner and the group could connect.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "rpc/local_connections.h"
#include "temp_files.h"

namespace ferry {
namespace {

using testing::TempDir;

// The inotify events the directory saw for `name` (IN_CREATE, IN_ATTRIB), drained.
uint32_t EventsFor(int inotify_fd, const std::string& name) {
  uint32_t seen = 0;
  alignas(inotify_event) char buf[8192];
  for (int i = 0; i < 64; ++i) {
    pollfd p{inotify_fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    ssize_t n = ::read(inotify_fd, buf, sizeof(buf));
    if (n <= 0) break;
    for (char* at = buf; at < buf + n;) {
      auto* e = reinterpret_cast<inotify_event*>(at);
      if (e->len > 0 && name == e->name) seen |= e->mask;
      at += sizeof(inotify_event) + e->len;
    }
  }
  return seen;
}

TEST(ListenUnixTest, TheSocketIsCreatedWithItsFinalModeEvenUnderUmaskZero) {
  TempDir dir;
  int in = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(in, 0);
  ASSERT_GE(::inotify_add_watch(in, dir.path().c_str(), IN_CREATE | IN_ATTRIB), 0);
  const mode_t old = ::umask(0);
  auto fd = rpc::ListenUnix(dir.path() + "/d.sock");
  const mode_t during = ::umask(old);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(during, 0u) << "ListenUnix must give the process its umask back";
  struct stat st {};
  ASSERT_EQ(::lstat((dir.path() + "/d.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  uint32_t events = EventsFor(in, "d.sock");
  EXPECT_TRUE(events & IN_CREATE);
  // A chmod after bind (the old way) shows as IN_ATTRIB: the file had another mode first,
  // under umask 0 a world-connectable one.
  EXPECT_FALSE(events & IN_ATTRIB) << "the socket's mode was changed after it was created";
  ::close(*fd);
  ::close(in);
}

TEST(ListenUnixTest, AStrictUmaskStillLeavesTheGroupIn) {
  TempDir dir;
  const mode_t old = ::umask(0077);
  auto fd = rpc::ListenUnix(dir.path() + "/d.sock");
  const mode_t during = ::umask(old);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(during, 0077u);
  struct stat st {};
  ASSERT_EQ(::lstat((dir.path() + "/d.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  ::close(*fd);
}

}  // namespace
}  // namespace ferry
