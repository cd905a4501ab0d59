// rpc/protobuf_log.h: protobuf's own log lines go to the daemon's log at most once a second,
// with a count of those left out: a client whose messages make protobuf log cannot flood it.
#include "rpc/protobuf_log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "ferry/v1/session.pb.h"

namespace ferry::rpc {
namespace {

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ProtobufLogTest, AFloodOfParseErrorsLogsALineASecondWithACount) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  RouteProtobufLogs();
  v1::ClientMessage open;
  open.mutable_open()->set_client_name("n");
  std::string bytes = open.SerializeAsString();
  bytes[bytes.find('n')] = '\xff';  // not UTF-8: protobuf refuses it and logs a line
  v1::ClientMessage parsed;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past any earlier line's second
  for (int i = 0; i < 1000; ++i) ASSERT_FALSE(parsed.ParseFromString(bytes));
  const std::string flood = log.str();
  EXPECT_GE(Count(flood, "protobuf: "), 1u) << flood;
  EXPECT_LE(Count(flood, "protobuf: "), 2u) << flood;  // the loop may straddle one second
  EXPECT_NE(flood.find("invalid UTF-8"), std::string::npos) << flood;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_FALSE(parsed.ParseFromString(bytes));
  spdlog::set_default_logger(previous);
  const std::string after = log.str().substr(flood.size());
  EXPECT_EQ(Count(after, "protobuf: "), 1u) << after;
  EXPECT_NE(after.find("protobuf lines not logged before it"), std::string::npos) << after;
}

}  // namespace
}  // namespace ferry::rpc
