// The metrics endpoint's bearer token (server/rpc/metrics.h): LoadMetricsTokens' file rules and
// MetricsRequestAuthorized's contract. The HTTP side (401 without the token) is tested on a
// real ferryd in tests/integration/metrics_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/metrics.h"
#include "temp_files.h"

namespace ferry::rpc {
namespace {

using TokenFile = ::ferry::testing::TempFile;

bool Authorized(const std::vector<std::string>& tokens, std::string_view header) {
  return MetricsRequestAuthorized(tokens, &header);
}

TEST(MetricsTokenTest, EveryLineIsATokenCommentsAndBlanksSkipped) {
  TokenFile file("# Prometheus\n  token-one \t\n\n\r\ntoken-two\r\n   # old: token-zero\n");
  auto tokens = LoadMetricsTokens(file.path());
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*tokens, (std::vector<std::string>{"token-one", "token-two"}));
  // A file of one token without a line break, as Prometheus' credentials_file often is.
  TokenFile bare("s3cret");
  tokens = LoadMetricsTokens(bare.path());
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*tokens, std::vector<std::string>{"s3cret"});
}

TEST(MetricsTokenTest, UnreadableEmptyOrTwoWordFilesAreRefused) {
  auto missing = LoadMetricsTokens("/nonexistent/ferry-metrics-token");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(missing.status().message().find(
                "cannot read metrics token file /nonexistent/ferry-metrics-token"),
            std::string::npos)
      << missing.status().message();
  for (const char* contents : {"", "\n\n", "  \n# only a comment\n"}) {
    TokenFile file(contents);
    auto empty = LoadMetricsTokens(file.path());
    ASSERT_FALSE(empty.ok()) << "'" << contents << "'";
    EXPECT_NE(empty.status().message().find("holds no token"), std::string::npos)
        << empty.status().message();
  }
  // token-file's NAME TOKEN lines are no metrics tokens.
  TokenFile named("good-token\nalice tok-a\n");
  auto two = LoadMetricsTokens(named.path());
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("line 2: expected one token"), std::string::npos)
      << two.status().message();
}

TEST(MetricsTokenTest, OnlyABearerTokenOfTheListPasses) {
  const std::vector<std::string> tokens = {"token-one", "token-two"};
  EXPECT_TRUE(Authorized(tokens, "Bearer token-one"));
  EXPECT_TRUE(Authorized(tokens, "Bearer token-two"));
  EXPECT_TRUE(Authorized(tokens, "bearer token-one"));  // the scheme is case-insensitive
  EXPECT_TRUE(Authorized(tokens, "BEARER   token-two"));
  EXPECT_FALSE(MetricsRequestAuthorized(tokens, nullptr));  // no header
  for (std::string_view bad : {"", "Bearer", "Bearer ", "Bearer  ", "Bearer token",
                               "Bearer token-one-", "Bearer Token-one", "Bearer token-onetoken-two",
                               "Bearer token-one token-two", "Bearertoken-one", "Basic token-one",
                               "token-one", "Bearer\ttoken-one", "Bearer token-three"}) {
    EXPECT_FALSE(Authorized(tokens, bad)) << "'" << bad << "'";
  }
  // The one token of a shorter list does not let a longer match through.
  EXPECT_FALSE(Authorized({"abc"}, "Bearer abcd"));
  EXPECT_FALSE(Authorized({"abcd"}, "Bearer abc"));
}

}  // namespace
}  // namespace ferry::rpc
