// libferry's channel set-up (client/src/channel.h), shared by Client::connect and ferryctl:
// target syntax, and TLS material that cannot be read is a typed error before any
// connection (unix targets ignore the TLS settings).
#include "channel.h"

#include <gtest/gtest.h>

namespace ferry::internal {
namespace {

TEST(ChannelTest, TargetsInGrpcSyntax) {
  EXPECT_EQ(GrpcTarget("tcp:127.0.0.1:5000"), "127.0.0.1:5000");
  EXPECT_EQ(GrpcTarget("unix:/run/ferry/ferryd-0.sock"), "unix:/run/ferry/ferryd-0.sock");
  EXPECT_EQ(GrpcTarget("dns:///host:1"), "dns:///host:1");
}

TEST(ChannelTest, AnUnreadableTlsFileIsAnErrorOnTcp) {
  ClientOptions options;
  options.tls_ca_cert = "/nonexistent/ferry-ca.pem";
  auto channel = MakeChannel("tcp:127.0.0.1:1", options);
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(channel.status().message().find("/nonexistent/ferry-ca.pem"), std::string::npos)
      << channel.status().ToString();
  // A unix target does not speak TLS: the setting is not even read.
  EXPECT_TRUE(MakeChannel("unix:/nonexistent/ferryd.sock", options).ok());
}

}  // namespace
}  // namespace ferry::internal
