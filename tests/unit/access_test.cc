// The raw-kernels access list, the groups of a uid, and who is an admin.
#include "rpc/access.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "ferry/status.h"

namespace ferry {
namespace {

TEST(AccessListTest, ParsesUidsAndGidsByNumberOrName) {
  auto empty = rpc::AccessList::Parse("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(empty->Admits(0, {0}));

  auto l = rpc::AccessList::Parse("uid:1234, gid:4321,uid:root");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_TRUE(l->Admits(1234, {}));
  EXPECT_TRUE(l->Admits(0, {}));  // root by name
  EXPECT_TRUE(l->Admits(999, {5, 4321}));
  EXPECT_FALSE(l->Admits(999, {5, 6}));
  EXPECT_FALSE(l->Admits(4321, {}));  // a gid is not a uid

  for (const char* bad : {"1234", "uid", "uid:", "gid:", "uid:12x", "uid:1,,gid:2", "group:1",
                          "uid:4294967295", "uid:no-such-user-ferry", "gid:no-such-group-ferry"}) {
    auto r = rpc::AccessList::Parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().kind(), ErrorKind::kInvalidArgument) << bad;
  }
}

TEST(AccessListTest, AGroupMatchesThroughTheUidsGroups) {
  // root's primary group is 0 on every system this runs on.
  std::vector<gid_t> groups = rpc::GroupsOfUid(0);
  ASSERT_FALSE(groups.empty());
  EXPECT_NE(std::find(groups.begin(), groups.end(), 0u), groups.end());
  auto l = rpc::AccessList::Parse("gid:0");
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->Admits(0));
  // A uid with no user-database entry has no groups: only its uid could match.
  EXPECT_TRUE(rpc::GroupsOfUid(3999999).empty());
  EXPECT_FALSE(l->Admits(3999999));
}

TEST(AdminPolicyTest, RootAndTheDaemonsUidAreAdminsByDefault) {
  rpc::AdminPolicy defaults;
  EXPECT_TRUE(defaults.IsAdmin(0));
  EXPECT_TRUE(defaults.IsAdmin(geteuid()));
  EXPECT_FALSE(defaults.IsAdmin(3999999));
  auto by_group = rpc::AccessList::Parse("gid:0");
  ASSERT_TRUE(by_group.ok());
  EXPECT_FALSE(rpc::AdminPolicy(*by_group).IsAdmin(3999999)) << "no entry, no groups";
}

// A container running as root is uid 0 to SO_PEERCRED: a list that leaves root out makes it
// no admin, while the daemon's own uid (a container's preStop drain) stays one.
TEST(AdminPolicyTest, RootIsNoAdminWhereTheListLeavesItOut) {
  auto none = rpc::AccessList::Parse("");
  ASSERT_TRUE(none.ok());
  rpc::AdminPolicy daemon_only(*none, /*daemon_uid=*/2500);
  EXPECT_FALSE(daemon_only.IsAdmin(0));
  EXPECT_TRUE(daemon_only.IsAdmin(2500));
  EXPECT_FALSE(daemon_only.IsAdmin(1000));
  auto listed = rpc::AccessList::Parse("uid:1000");
  ASSERT_TRUE(listed.ok());
  rpc::AdminPolicy with_1000(*listed, /*daemon_uid=*/2500);
  EXPECT_TRUE(with_1000.IsAdmin(1000));
  EXPECT_TRUE(with_1000.IsAdmin(2500));
  EXPECT_FALSE(with_1000.IsAdmin(0));
  EXPECT_FALSE(with_1000.IsAdmin(1001));
}

}  // namespace
}  // namespace ferry
