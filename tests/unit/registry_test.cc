// SessionRegistry's per-identity limits: which rule applies to whom, percentages resolved
// against the daemon's totals, and charges that hold across sessions of one identity.
#include "session/registry.h"

#include <gtest/gtest.h>

#include <memory>

namespace ferry::session {
namespace {

PeerIdentity Local(uint32_t uid, uint32_t gid) {
  PeerIdentity p;
  p.address = "unix:/tmp/x.sock";
  p.uid = uid;
  p.gid = gid;
  p.pid = 1;
  return p;
}

PeerIdentity Remote() {
  PeerIdentity p;
  p.address = "ipv4:127.0.0.1:5000";
  return p;
}

std::vector<UidLimitRule> Rules(std::initializer_list<const char*> texts) {
  std::vector<UidLimitRule> out{DefaultUidLimitRule()};
  for (const char* t : texts) {
    auto r = ParseUidLimitRule(t);
    EXPECT_TRUE(r.ok()) << t;
    if (!r.ok()) continue;
    if (r->match == UidLimitRule::Match::kDefault) {
      out.front() = *r;
    } else {
      out.push_back(*r);
    }
  }
  return out;
}

TEST(RegistryTest, TheDefaultRuleGivesEachUidHalfOfTheDaemon) {
  SessionRegistry reg(8ull << 30, 1024);
  reg.SetUidLimits(Rules({}), 1ull << 30, /*daemon_uid=*/999);
  ResolvedUidLimits l = reg.AccountFor(Local(1000, 1000))->limits();
  EXPECT_EQ(l.sessions, 512u);
  EXPECT_EQ(l.device_bytes, 4ull << 30);
  EXPECT_EQ(l.pinned_bytes, 512ull << 20);
  EXPECT_EQ(l.inflight, 4096u);
  // All remote peers share one identity under the default rule.
  auto remote = reg.AccountFor(Remote());
  EXPECT_EQ(remote->identity(), "remote");
  EXPECT_EQ(remote->limits().sessions, 512u);
  EXPECT_EQ(reg.AccountFor(Remote()), remote);
}

TEST(RegistryTest, RootAndTheDaemonUidAreExemptUnlessNamed) {
  SessionRegistry reg(8ull << 30, 1024);
  reg.SetUidLimits(Rules({"gid:0:sessions=1"}), 1ull << 30, /*daemon_uid=*/999);
  EXPECT_EQ(reg.AccountFor(Local(0, 0))->limits().sessions, 0u) << "a gid rule does not bind root";
  EXPECT_EQ(reg.AccountFor(Local(999, 999))->limits().device_bytes, 0u);
  SessionRegistry named(8ull << 30, 1024);
  named.SetUidLimits(Rules({"uid:0:sessions=3"}), 1ull << 30, 999);
  ResolvedUidLimits root = named.AccountFor(Local(0, 0))->limits();
  EXPECT_EQ(root.sessions, 3u);
  EXPECT_EQ(root.device_bytes, 4ull << 30) << "the rest from the default rule";
}

TEST(RegistryTest, UidRulesWinOverGidRulesWhichWinOverTheDefault) {
  SessionRegistry reg(8ull << 30, 100);
  reg.SetUidLimits(
      Rules({"default:sessions=10,device=none", "gid:50:sessions=20", "uid:1001:sessions=30"}),
      1ull << 30, 999);
  EXPECT_EQ(reg.AccountFor(Local(1000, 1000))->limits().sessions, 10u);
  EXPECT_EQ(reg.AccountFor(Local(1002, 50))->limits().sessions, 20u);
  EXPECT_EQ(reg.AccountFor(Local(1001, 50))->limits().sessions, 30u);
  EXPECT_EQ(reg.AccountFor(Local(1001, 50))->limits().device_bytes, 0u) << "none: no limit";
}

TEST(RegistryTest, SessionsAndBytesAreChargedPerUidAcrossSessions) {
  SessionRegistry reg(1ull << 30, 16);
  reg.SetUidLimits(Rules({"uid:1000:sessions=2,device=1M,pinned=8M,inflight=2"}), 1ull << 30, 999);
  auto c = std::make_shared<SessionCounters>();
  auto s1 = reg.Open("a", Local(1000, 1000), c);
  auto s2 = reg.Open("a", Local(1000, 1000), c);
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto s3 = reg.Open("a", Local(1000, 1000), c);
  ASSERT_FALSE(s3.ok());
  EXPECT_EQ(s3.status().kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(s3.status().message().find("uid:1000's sessions limit (2"), std::string::npos)
      << s3.status().message();
  EXPECT_TRUE(reg.Open("b", Local(1001, 1001), c).ok()) << "another uid is not held back";

  auto account = reg.AccountOf(*s1);
  ASSERT_EQ(account, reg.AccountOf(*s2));
  EXPECT_TRUE(account->ChargeDeviceBytes(768 << 10).ok());
  Status over = account->ChargeDeviceBytes(512 << 10);
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(over.message().find("device"), std::string::npos) << over.message();
  EXPECT_TRUE(account->ChargeDeviceBytes(256 << 10).ok()) << "exactly the limit fits";
  account->RefundDeviceBytes(1 << 20);
  EXPECT_TRUE(account->TryCharge(8 << 20).ok());
  EXPECT_FALSE(account->TryCharge(1).ok());
  account->Refund(8 << 20);
  EXPECT_TRUE(account->ChargeInflight().ok());
  EXPECT_TRUE(account->ChargeInflight().ok());
  EXPECT_FALSE(account->ChargeInflight().ok());
  account->RefundInflight();
  account->RefundInflight();

  std::vector<UidUsage> usage = reg.UsageByUid();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].identity, "uid:1000");
  EXPECT_EQ(usage[0].sessions, 2u);
  reg.Remove(*s1);
  EXPECT_TRUE(reg.Open("a", Local(1000, 1000), c).ok()) << "a closed session's slot is free";
}

TEST(RegistryTest, RulesFormatAsTheyParse) {
  for (const char* text : {"default:sessions=50%,device=50%,pinned=50%,inflight=4096",
                           "uid:1000:sessions=4", "gid:27:device=8G,pinned=512M",
                           "remote:sessions=none,inflight=none", "uid:0:device=1536K"}) {
    auto r = ParseUidLimitRule(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    EXPECT_EQ(FormatUidLimitRule(*r), text);
  }
  EXPECT_EQ(FormatUidLimitRule(DefaultUidLimitRule()),
            "default:sessions=50%,device=50%,pinned=50%,inflight=4096");
}

}  // namespace
}  // namespace ferry::session
