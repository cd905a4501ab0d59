// The slab socket's grant queue serves uids in turn: a uid with many acquires queued does not
// hold back another uid's.
#include "transport/uid_round_robin.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ferry::transport {
namespace {

std::vector<std::string> Drain(UidRoundRobin<std::string>& q) {
  std::vector<std::string> out;
  while (!q.empty()) out.push_back(q.Pop());
  return out;
}

TEST(UidRoundRobinTest, UidsTakeTurnsAndEachKeepsItsOrder) {
  UidRoundRobin<std::string> q;
  for (const char* item : {"a1", "a2", "a3", "a4"}) q.Push(1000, item);
  q.Push(2000, "b1");
  q.Push(0, "root1");
  q.Push(2000, "b2");
  EXPECT_EQ(Drain(q), (std::vector<std::string>{"a1", "b1", "root1", "a2", "b2", "a3", "a4"}));
}

TEST(UidRoundRobinTest, AUidThatArrivesLateWaitsForAtMostOneTurnOfTheOthers) {
  UidRoundRobin<std::string> q;
  for (const char* item : {"a1", "a2", "a3"}) q.Push(1000, item);
  EXPECT_EQ(q.Pop(), "a1");
  q.Push(500, "late");  // a lower uid than the one served last: after the wrap
  q.Push(1500, "later");
  EXPECT_EQ(q.Pop(), "later");
  EXPECT_EQ(q.Pop(), "late");
  EXPECT_EQ(q.Pop(), "a2");
  EXPECT_EQ(q.Pop(), "a3");
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace ferry::transport
