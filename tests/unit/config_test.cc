// ferryd's flag parsing.
#include "config.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(ConfigTest, DefaultsListenOnTheDeviceSocket) {
  auto c = ParseFlags({"--device", "3"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->device, 3);
  ASSERT_EQ(c->daemon.listen.size(), 1u);
  EXPECT_EQ(c->daemon.listen[0], "unix:/run/ferry/ferryd-3.sock");
  EXPECT_EQ(c->backend, "auto");
}

TEST(ConfigTest, RepeatedListenAndSizes) {
  auto c = ParseFlags({"--listen=unix:/tmp/a.sock", "--listen", "tcp:127.0.0.1:0",
                       "--session-quota=64M", "--backend", "host", "--max-in-flight", "8"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.listen.size(), 2u);
  EXPECT_EQ(c->daemon.session_defaults.device_bytes_quota, 64ull << 20);
  EXPECT_EQ(c->daemon.session_defaults.max_in_flight_submits, 8u);
}

TEST(ConfigTest, BadInputIsATypedError) {
  EXPECT_FALSE(ParseFlags({"--nope"}).ok());
  EXPECT_FALSE(ParseFlags({"--device"}).ok());
  EXPECT_FALSE(ParseFlags({"--device", "x"}).ok());
  EXPECT_FALSE(ParseFlags({"--backend", "opencl"}).ok());
  EXPECT_FALSE(ParseFlags({"--max-in-flight", "0"}).ok());
  EXPECT_FALSE(ParseFlags({"--session-quota", "99999999999999999999G"}).ok());
  EXPECT_FALSE(ParseFlags({"stray"}).ok());
  EXPECT_EQ(ParseFlags({"--help=1"}).status().kind(), ErrorKind::kInvalidArgument);
}

TEST(ConfigTest, ParseBytes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("2K"), 2048u);
  EXPECT_EQ(*ParseBytes("3G"), 3ull << 30);
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("G").ok());
  EXPECT_FALSE(ParseBytes("-1").ok());
}

}  // namespace
}  // namespace ferry
