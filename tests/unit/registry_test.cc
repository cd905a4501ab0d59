// SessionRegistry's per-identity limits: which rule applies to whom, percentages resolved
// against the daemon's totals, and charges that hold across sessions of one identity.
#include "session/registry.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

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

// Where config `admins` leaves root out, root gets the rules any uid gets.
TEST(RegistryTest, RootIsBoundLikeAnyUidWhereItIsNoAdmin) {
  SessionRegistry reg(8ull << 30, 1024);
  reg.SetUidLimits(Rules({"gid:0:sessions=1"}), 1ull << 30, /*daemon_uid=*/999,
                   /*root_exempt=*/false);
  EXPECT_EQ(reg.AccountFor(Local(0, 0))->limits().sessions, 1u);
  EXPECT_EQ(reg.AccountFor(Local(999, 999))->limits().device_bytes, 0u) << "the daemon's uid";
  SessionRegistry defaults(8ull << 30, 1024);
  defaults.SetUidLimits(Rules({}), 1ull << 30, 999, /*root_exempt=*/false);
  EXPECT_EQ(defaults.AccountFor(Local(0, 0))->limits().sessions, 512u);
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

// With the user database's groups (the daemon's lookup), a gid: rule applies to every
// member of the group whatever gid its process connected with: a member cannot dodge the
// rule by switching its effective gid (sg), and a non-member cannot take it by connecting
// with that gid. Without an entry for the uid, the effective gid is matched.
TEST(RegistryTest, GidRulesMatchTheUidsGroupsNotTheGidItConnectedWith) {
  SessionRegistry reg(8ull << 30, 100);
  reg.SetGroupLookup([](uid_t uid) {
    if (uid == 1001) return std::vector<gid_t>{1001, 2000};  // a member of 2000
    if (uid == 1002) return std::vector<gid_t>{1002};
    return std::vector<gid_t>{};  // no entry
  });
  reg.SetUidLimits(Rules({"default:sessions=10", "gid:2000:sessions=1"}), 1ull << 30, 999);
  EXPECT_EQ(reg.AccountFor(Local(1001, 1001))->limits().sessions, 1u)
      << "a member connecting with another of its gids";
  EXPECT_EQ(reg.AccountFor(Local(1002, 2000))->limits().sessions, 10u)
      << "a non-member connecting with the rule's gid";
  EXPECT_EQ(reg.AccountFor(Local(1003, 2000))->limits().sessions, 1u)
      << "no entry: the effective gid";
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
            "default:sessions=50%,device=50%,pinned=50%,inflight=4096,inflight-bytes=50%,"
            "objects=50%,queued=50%");
  for (const char* text :
       {"uid:1000:inflight-bytes=64M", "remote:inflight-bytes=25%", "gid:27:objects=100000",
        "uid:5:objects=10%", "uid:7:queued=64", "remote:queued=25%", "gid:3:queued=none"}) {
    auto r = ParseUidLimitRule(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    EXPECT_EQ(FormatUidLimitRule(*r), text);
  }
  EXPECT_FALSE(ParseUidLimitRule("uid:1:inflight-bytes=0").ok());
  for (const char* text : {"remote:alice:sessions=4", "remote:b-2.x_y:objects=none,queued=25%"}) {
    auto r = ParseUidLimitRule(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    EXPECT_EQ(FormatUidLimitRule(*r), text);
  }
  EXPECT_FALSE(ParseUidLimitRule("remote:al/ice:sessions=4").ok());
  EXPECT_FALSE(ParseUidLimitRule("remote::sessions=4").ok());
}

// Each named tenant is an identity of its own, under the remote rule unless a remote:NAME
// rule names it; peers without a name share "remote".
TEST(RegistryTest, EachRemoteTenantHasItsOwnBudget) {
  SessionRegistry reg(8ull << 30, 100);
  reg.SetUidLimits(Rules({"remote:sessions=10", "remote:bob:sessions=3"}), 1ull << 30, 999);
  auto tenant = [](const char* name) {
    PeerIdentity p = Remote();
    p.tenant = name;
    return p;
  };
  auto alice = reg.AccountFor(tenant("alice"));
  EXPECT_EQ(alice->identity(), "remote:alice");
  EXPECT_EQ(alice->limits().sessions, 10u);
  EXPECT_EQ(alice->limits().device_bytes, 4ull << 30) << "the rest from the default rule";
  EXPECT_EQ(reg.AccountFor(tenant("bob"))->limits().sessions, 3u);
  EXPECT_NE(reg.AccountFor(tenant("carol")), alice);
  EXPECT_EQ(reg.AccountFor(Remote())->identity(), "remote");
  EXPECT_EQ(reg.AccountFor(Remote())->limits().sessions, 10u);
  // Alice's sessions do not count against anyone else's.
  std::vector<uint64_t> ids;
  for (int i = 0; i < 10; ++i) {
    auto id = reg.Open("c", tenant("alice"), std::make_shared<SessionCounters>());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  auto refused = reg.Open("c", tenant("alice"), std::make_shared<SessionCounters>());
  EXPECT_EQ(refused.status().kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(refused.status().message().find("remote:alice"), std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(reg.Open("c", tenant("carol"), std::make_shared<SessionCounters>()).ok());
  EXPECT_TRUE(reg.Open("c", Remote(), std::make_shared<SessionCounters>()).ok());
}

// The bytes submits hold in the daemon: charged to the daemon (in-flight-bytes) and to the
// identity (inflight-bytes, by default half of the daemon's), all or nothing; root is
// charged to the daemon only.
TEST(RegistryTest, InFlightBytesAreChargedToTheDaemonAndTheIdentity) {
  SessionRegistry reg(1ull << 30, 16);
  reg.SetInFlightBytesLimit(100 << 20);
  reg.SetUidLimits(Rules({"uid:1001:inflight-bytes=80M"}), 1ull << 30, 999);
  auto a = reg.AccountFor(Local(1000, 1000));  // the default rule: 50% of 100M
  auto b = reg.AccountFor(Local(1001, 1001));
  auto root = reg.AccountFor(Local(0, 0));
  EXPECT_EQ(a->limits().in_flight_bytes, 50u << 20);
  EXPECT_EQ(b->limits().in_flight_bytes, 80u << 20);
  EXPECT_EQ(root->limits().in_flight_bytes, 0u);

  EXPECT_TRUE(reg.ChargeInFlightBytes(a.get(), 40 << 20).ok());
  Status over = reg.ChargeInFlightBytes(a.get(), 20 << 20);
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(over.message().find("uid:1000's in-flight bytes limit"), std::string::npos)
      << over.message();
  EXPECT_EQ(reg.in_flight_bytes(), 40u << 20) << "a refused charge takes nothing";
  EXPECT_TRUE(reg.InFlightBytesRoomBelow(a.get(), 16 << 20)) << "10M left for a";
  EXPECT_FALSE(reg.InFlightBytesRoomBelow(b.get(), 16 << 20)) << "60M left for b";
  // The daemon's limit binds every identity, root too.
  EXPECT_TRUE(reg.ChargeInFlightBytes(b.get(), 50 << 20).ok());
  over = reg.ChargeInFlightBytes(root.get(), 20 << 20);
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(over.message().find("--in-flight-bytes"), std::string::npos) << over.message();
  EXPECT_EQ(b->in_flight_bytes(), 50u << 20);
  EXPECT_TRUE(reg.InFlightBytesRoomBelow(nullptr, 16 << 20)) << "10M left in the daemon";
  EXPECT_TRUE(reg.ChargeInFlightBytes(nullptr, 10 << 20).ok()) << "exactly the limit fits";
  reg.RefundInFlightBytes(a.get(), 40 << 20);
  reg.RefundInFlightBytes(b.get(), 50 << 20);
  reg.RefundInFlightBytes(nullptr, 10 << 20);
  EXPECT_EQ(reg.in_flight_bytes(), 0u);
  EXPECT_EQ(a->in_flight_bytes(), 0u);
  // Without a daemon-wide limit, a share is no limit and an amount still is one.
  SessionRegistry unlimited(1ull << 30, 16);
  unlimited.SetUidLimits(Rules({"uid:1001:inflight-bytes=8M"}), 1ull << 30, 999);
  EXPECT_EQ(unlimited.AccountFor(Local(1000, 1000))->limits().in_flight_bytes, 0u);
  EXPECT_EQ(unlimited.AccountFor(Local(1001, 1001))->limits().in_flight_bytes, 8u << 20);
}

// Objects (tensors, modules, graphs, recorded ops) likewise: the daemon's max-objects and
// the identity's share of it, all or nothing.
TEST(RegistryTest, ObjectsAreChargedToTheDaemonAndTheIdentity) {
  SessionRegistry reg(1ull << 30, 16);
  reg.SetObjectsLimit(1000);
  reg.SetUidLimits(Rules({"uid:1001:objects=900"}), 1ull << 30, 999);
  auto a = reg.AccountFor(Local(1000, 1000));
  auto b = reg.AccountFor(Local(1001, 1001));
  EXPECT_EQ(a->limits().objects, 500u);
  EXPECT_EQ(b->limits().objects, 900u);
  EXPECT_TRUE(reg.ChargeObjects(a.get(), 400).ok());
  Status over = reg.ChargeObjects(a.get(), 101);
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(over.message().find("uid:1000's objects"), std::string::npos) << over.message();
  EXPECT_TRUE(reg.ChargeObjects(a.get(), 100).ok()) << "exactly the limit fits";
  EXPECT_TRUE(reg.ChargeObjects(b.get(), 500).ok());
  over = reg.ChargeObjects(b.get(), 1);
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_NE(over.message().find("--max-objects"), std::string::npos) << over.message();
  EXPECT_EQ(reg.objects(), 1000u);
  reg.RefundObjects(a.get(), 500);
  reg.RefundObjects(b.get(), 500);
  EXPECT_EQ(reg.objects(), 0u);
  EXPECT_EQ(a->objects(), 0u);
  EXPECT_EQ(b->objects(), 0u);
}

// Queued device commands: each identity's share of the daemon's LaunchRoom (uid-limits
// queued, built in half of queued-commands), counted in its usage; root is exempt.
TEST(RegistryTest, EachIdentityHasAShareOfTheQueuedCommands) {
  SessionRegistry reg(1ull << 30, 16);
  reg.launch_room().SetLimit(896);
  reg.SetUidLimits(Rules({"uid:1001:queued=100"}), 1ull << 30, 999);
  auto a = reg.AccountFor(Local(1000, 1000));
  auto b = reg.AccountFor(Local(1001, 1001));
  auto root = reg.AccountFor(Local(0, 0));
  EXPECT_EQ(a->limits().queued_commands, 448u);
  EXPECT_EQ(b->limits().queued_commands, 100u);
  EXPECT_EQ(root->limits().queued_commands, 0u);
  EXPECT_EQ(a->launch_share().limit, 448u);
  ASSERT_TRUE(reg.launch_room().TryTake(448, &a->launch_share()));
  EXPECT_FALSE(reg.launch_room().TryTake(1, &a->launch_share()));
  EXPECT_TRUE(reg.launch_room().TryTake(100, &b->launch_share()));
  EXPECT_TRUE(reg.launch_room().TryTake(348, &root->launch_share())) << "the rest of the room";
  EXPECT_EQ(a->Usage().queued_commands, 448u);
  bool listed = false;
  for (const UidUsage& u : reg.UsageByUid()) {
    if (u.identity == "uid:1000") listed = u.queued_commands == 448;
  }
  EXPECT_TRUE(listed) << "an identity with commands queued is listed with them";
  reg.launch_room().Give(448, &a->launch_share());
  EXPECT_EQ(a->Usage().queued_commands, 0u);
  // Without a daemon-wide limit, a share is no limit and an amount still is one.
  SessionRegistry unlimited(1ull << 30, 16);
  unlimited.SetUidLimits(Rules({"uid:1001:queued=64"}), 1ull << 30, 999);
  EXPECT_EQ(unlimited.AccountFor(Local(1000, 1000))->limits().queued_commands, 0u);
  EXPECT_EQ(unlimited.AccountFor(Local(1001, 1001))->limits().queued_commands, 64u);
}

// --- usage identities (IdentityUsage) --------------------------------------------------

const IdentityUsage* Find(const std::vector<IdentityUsage>& all, const std::string& uid,
                          const std::string& client) {
  for (const IdentityUsage& u : all) {
    if (u.uid == uid && u.client == client) return &u;
  }
  return nullptr;
}

TEST(RegistryUsageTest, DeviceTimeIsKeptPerUidAndClientAfterSessionsClose) {
  SessionRegistry reg(8ull << 30, 1024);
  auto a = std::make_shared<SessionCounters>();
  auto b = std::make_shared<SessionCounters>();
  auto c = std::make_shared<SessionCounters>();
  uint64_t ia = reg.Add("train", Local(1000, 1000), a);
  uint64_t ib = reg.Add("train", Local(1000, 1000), b);
  uint64_t ic = reg.Add("infer", Local(1001, 1001), c);
  ASSERT_NE(ia, 0u);
  ASSERT_NE(ib, 0u);
  ASSERT_NE(ic, 0u);
  a->device_busy_ns = 3000;
  a->h2d_bytes = 10;
  a->device_bytes = 4096;
  b->device_busy_ns = 2000;
  b->d2h_bytes = 7;
  c->device_busy_ns = 500;
  auto all = reg.UsageByIdentity();
  const IdentityUsage* train = Find(all, "1000", "train");
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->device_busy_ns, 5000u);
  EXPECT_EQ(train->h2d_bytes, 10u);
  EXPECT_EQ(train->d2h_bytes, 7u);
  EXPECT_EQ(train->device_bytes, 4096u);
  EXPECT_EQ(train->sessions_open, 2u);
  ASSERT_NE(Find(all, "1001", "infer"), nullptr);
  EXPECT_EQ(Find(all, "1001", "infer")->device_busy_ns, 500u);

  // Closing keeps the counters (and the totals never go down); memory held drops.
  a->device_bytes = 0;
  reg.Remove(ia);
  reg.Remove(ib);
  all = reg.UsageByIdentity();
  train = Find(all, "1000", "train");
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->device_busy_ns, 5000u);
  EXPECT_EQ(train->sessions_open, 0u);
  EXPECT_EQ(train->sessions_total, 2u);
  EXPECT_EQ(train->device_bytes, 0u);
  // A new session of the same identity adds to it.
  auto d = std::make_shared<SessionCounters>();
  ASSERT_NE(reg.Add("train", Local(1000, 1000), d), 0u);
  d->device_busy_ns = 1;
  EXPECT_EQ(Find(reg.UsageByIdentity(), "1000", "train")->device_busy_ns, 5001u);
  // TCP peers are uid "remote".
  ASSERT_NE(reg.Add("", Remote(), std::make_shared<SessionCounters>()), 0u);
  EXPECT_NE(Find(reg.UsageByIdentity(), "remote", ""), nullptr);
}

TEST(RegistryUsageTest, IdentitiesPastTheLimitFoldIntoOther) {
  SessionRegistry reg(8ull << 30, 1024);
  reg.SetUsageIdentityLimit(3);
  std::vector<std::shared_ptr<SessionCounters>> counters;
  for (uint32_t uid = 1000; uid < 1010; ++uid) {
    counters.push_back(std::make_shared<SessionCounters>());
    counters.back()->device_busy_ns = 1;
    ASSERT_NE(reg.Add("c", Local(uid, uid), counters.back()), 0u);
  }
  auto all = reg.UsageByIdentity();
  // Three identities of their own, then one "other" for the remaining seven sessions.
  EXPECT_EQ(all.size(), 4u);
  EXPECT_NE(Find(all, "1000", "c"), nullptr);
  EXPECT_NE(Find(all, "1002", "c"), nullptr);
  EXPECT_EQ(Find(all, "1003", "c"), nullptr);
  const IdentityUsage* other = Find(all, "other", "other");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->device_busy_ns, 7u);
  EXPECT_EQ(other->sessions_open, 7u);
  EXPECT_EQ(reg.usage_folds(), 7u);
  // A known identity keeps its own series past the limit.
  ASSERT_NE(reg.Add("c", Local(1001, 1001), std::make_shared<SessionCounters>()), 0u);
  EXPECT_EQ(Find(reg.UsageByIdentity(), "1001", "c")->sessions_open, 2u);
}

TEST(RegistryUsageTest, OneUidsClientNamesAreBoundedAndSanitized) {
  SessionRegistry reg(8ull << 30, 1024);
  for (size_t i = 0; i < SessionRegistry::kMaxClientsPerUid + 5; ++i) {
    ASSERT_NE(
        reg.Add("name" + std::to_string(i), Local(1000, 1000), std::make_shared<SessionCounters>()),
        0u);
  }
  ASSERT_NE(reg.Add(std::string("a\"b\n\xff") + std::string(100, 'x'), Local(1001, 1001),
                    std::make_shared<SessionCounters>()),
            0u);
  auto all = reg.UsageByIdentity();
  size_t of_1000 = 0;
  for (const IdentityUsage& u : all) of_1000 += u.uid == "1000";
  EXPECT_EQ(of_1000, SessionRegistry::kMaxClientsPerUid + 1) << "16 names and one other";
  const IdentityUsage* other = Find(all, "1000", "other");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->sessions_open, 5u);
  const IdentityUsage* odd = nullptr;
  for (const IdentityUsage& u : all) {
    if (u.uid == "1001") odd = &u;
  }
  ASSERT_NE(odd, nullptr);
  EXPECT_EQ(odd->client.size(), kMaxClientName);
  EXPECT_EQ(odd->client.substr(0, 5), "a\"b__") << "printable ASCII only";
}

// Usage identities were kept until the daemon stopped, so once 256 had been seen every later
// tenant was accounted as uid "other". Here 300 short-lived identities come one every 3 s of
// the test's clock, each closing its session at once: with a 10-minute idle timeout the
// first ones have expired by the 257th, and every one is named while it works.
TEST(RegistryUsageTest, IdleIdentitiesExpireSoNewOnesAreNamed) {
  SessionRegistry reg(8ull << 30, 1024);  // metrics-max-identities' default: 256
  SessionRegistry::Clock::time_point now = SessionRegistry::Clock::now();
  reg.SetClockForTest([&now] { return now; });
  reg.SetUsageIdleTimeout(std::chrono::minutes(10));
  uint64_t busy = 0;
  for (uint32_t i = 0; i < 300; ++i) {
    const std::string uid = std::to_string(10000 + i);
    auto counters = std::make_shared<SessionCounters>();
    const uint64_t id = reg.Add("job", Local(10000 + i, 10000 + i), counters);
    ASSERT_NE(id, 0u);
    counters->device_busy_ns = 1000 + i;
    busy += 1000 + i;
    const std::vector<IdentityUsage> all = reg.UsageByIdentity();
    const IdentityUsage* own = Find(all, uid, "job");
    ASSERT_NE(own, nullptr) << "identity " << i << " has no series of its own";
    EXPECT_EQ(own->sessions_open, 1u);
    EXPECT_EQ(own->device_busy_ns, 1000u + i);
    EXPECT_EQ(Find(all, "other", "other"), nullptr) << "identity " << i;
    EXPECT_LE(all.size(), 256u) << "identity " << i;
    reg.Remove(id);
    // The daemon's total counts every session, those of expired identities too.
    EXPECT_EQ(reg.Totals().device_busy_ns, busy) << "identity " << i;
    now += std::chrono::seconds(3);
  }
  EXPECT_EQ(reg.usage_folds(), 0u);
  // Identity i closed at 3i s; at 900 s those idle 600 s or more (i <= 100) have gone.
  const std::vector<IdentityUsage> all = reg.UsageByIdentity();
  EXPECT_EQ(all.size(), 199u);
  EXPECT_EQ(reg.usage_expiries(), 101u);
  EXPECT_EQ(Find(all, "10100", "job"), nullptr) << "idle exactly the timeout: expired";
  ASSERT_NE(Find(all, "10101", "job"), nullptr) << "idle 3 s less than the timeout: kept";
  EXPECT_EQ(Find(all, "10101", "job")->device_busy_ns, 1101u);
  EXPECT_EQ(Find(all, "10101", "job")->sessions_total, 1u);
  EXPECT_EQ(reg.Totals().device_busy_ns, busy);
}

TEST(RegistryUsageTest, OnlyAnIdentityIdleForTheWholeTimeoutExpires) {
  SessionRegistry reg(8ull << 30, 1024);
  SessionRegistry::Clock::time_point now = SessionRegistry::Clock::now();
  reg.SetClockForTest([&now] { return now; });
  reg.SetUsageIdleTimeout(std::chrono::minutes(1));
  auto train = std::make_shared<SessionCounters>();
  ASSERT_NE(reg.Add("train", Local(1000, 1000), train), 0u);
  train->device_busy_ns = 7;
  auto eval = std::make_shared<SessionCounters>();
  const uint64_t eval_id = reg.Add("eval", Local(1000, 1000), eval);
  ASSERT_NE(eval_id, 0u);
  eval->device_busy_ns = 5;
  eval->h2d_bytes = 64;
  reg.Remove(eval_id);
  now += std::chrono::seconds(59);
  EXPECT_NE(Find(reg.UsageByIdentity(), "1000", "eval"), nullptr) << "idle 59 s of 60";
  now += std::chrono::seconds(1);
  EXPECT_EQ(Find(reg.UsageByIdentity(), "1000", "eval"), nullptr) << "idle 60 s";
  // A session open keeps its identity however long it runs.
  now += std::chrono::hours(1);
  auto all = reg.UsageByIdentity();
  const IdentityUsage* kept = Find(all, "1000", "train");
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->device_busy_ns, 7u);
  // The totals keep the expired identity's counts.
  DaemonTotals totals = reg.Totals();
  EXPECT_EQ(totals.device_busy_ns, 12u);
  EXPECT_EQ(totals.h2d_bytes, 64u);
  // One that comes back starts again from 0.
  auto again = std::make_shared<SessionCounters>();
  ASSERT_NE(reg.Add("eval", Local(1000, 1000), again), 0u);
  all = reg.UsageByIdentity();
  ASSERT_NE(Find(all, "1000", "eval"), nullptr);
  EXPECT_EQ(Find(all, "1000", "eval")->device_busy_ns, 0u);
  EXPECT_EQ(Find(all, "1000", "eval")->sessions_total, 1u);
  EXPECT_EQ(reg.usage_expiries(), 1u);

  // 0: never.
  SessionRegistry forever(8ull << 30, 1024);
  forever.SetClockForTest([&now] { return now; });
  forever.SetUsageIdleTimeout(std::chrono::milliseconds(0));
  forever.Remove(forever.Add("job", Local(1000, 1000), std::make_shared<SessionCounters>()));
  now += std::chrono::hours(24 * 365);
  EXPECT_NE(Find(forever.UsageByIdentity(), "1000", "job"), nullptr);
  EXPECT_EQ(forever.usage_expiries(), 0u);
}

// An expired identity's place is free under both bounds: the daemon's (metrics-max-identities;
// the "other" identity expires too) and a uid's kMaxClientsPerUid client names.
TEST(RegistryUsageTest, ExpiredIdentitiesFreeTheirPlacesUnderTheBounds) {
  SessionRegistry reg(8ull << 30, 1024);
  SessionRegistry::Clock::time_point now = SessionRegistry::Clock::now();
  reg.SetClockForTest([&now] { return now; });
  reg.SetUsageIdleTimeout(std::chrono::seconds(10));
  reg.SetUsageIdentityLimit(1);
  auto open_and_close = [&](const std::string& name, uint32_t uid) {
    reg.Remove(reg.Add(name, Local(uid, uid), std::make_shared<SessionCounters>()));
  };
  open_and_close("a", 1000);
  open_and_close("b", 1001);  // past the bound
  EXPECT_NE(Find(reg.UsageByIdentity(), "other", "other"), nullptr);
  now += std::chrono::seconds(10);
  open_and_close("c", 1002);
  auto all = reg.UsageByIdentity();
  EXPECT_EQ(all.size(), 1u);
  EXPECT_NE(Find(all, "1002", "c"), nullptr) << "named: the two before it expired";
  EXPECT_EQ(reg.usage_folds(), 1u);

  SessionRegistry names(8ull << 30, 1024);
  names.SetClockForTest([&now] { return now; });
  names.SetUsageIdleTimeout(std::chrono::seconds(10));
  for (size_t i = 0; i <= SessionRegistry::kMaxClientsPerUid; ++i) {
    names.Remove(names.Add("name" + std::to_string(i), Local(1000, 1000),
                           std::make_shared<SessionCounters>()));
  }
  EXPECT_NE(Find(names.UsageByIdentity(), "1000", "other"), nullptr) << "the 17th name";
  now += std::chrono::seconds(10);
  names.Remove(names.Add("late", Local(1000, 1000), std::make_shared<SessionCounters>()));
  all = names.UsageByIdentity();
  EXPECT_EQ(all.size(), 1u);
  EXPECT_NE(Find(all, "1000", "late"), nullptr);
}

}  // namespace
}  // namespace ferry::session
