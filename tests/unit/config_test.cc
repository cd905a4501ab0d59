// ferryd's flag and config-file parsing.
#include "config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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


// A config file in a temp dir, removed at the end of the test.
class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ferry-config-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigFileTest, FileSettingsApply) {
  std::string path = Write("ferryd.conf", R"(# a comment
device = 2
backend = host   # trailing comment
listen = unix:/tmp/x.sock
listen = tcp:127.0.0.1:0

session-quota = 64M
allow-insecure-remote = yes
ready-file = "/tmp/ready file"
log-level = debug
drain-timeout = 500
)");
  auto c = ParseFlags({"--config", path});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->config_path, path);
  EXPECT_EQ(c->device, 2);
  EXPECT_EQ(c->backend, "host");
  EXPECT_EQ(c->daemon.listen,
            (std::vector<std::string>{"unix:/tmp/x.sock", "tcp:127.0.0.1:0"}));
  EXPECT_EQ(c->daemon.session_defaults.device_bytes_quota, 64ull << 20);
  EXPECT_TRUE(c->daemon.allow_insecure_remote);
  EXPECT_EQ(c->ready_file, "/tmp/ready file");
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(c->drain_timeout, std::chrono::milliseconds(500));
}

TEST_F(ConfigFileTest, FlagsWinOverTheFile) {
  std::string path = Write("ferryd.conf",
                           "device = 2\nbackend = host\nlisten = unix:/tmp/a.sock\n"
                           "listen = unix:/tmp/b.sock\nmax-sessions = 7\n");
  // Flags before or after --config win all the same.
  auto c = ParseFlags({"--device=5", "--config", path, "--listen", "unix:/tmp/c.sock"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->device, 5);
  EXPECT_EQ(c->backend, "host");
  EXPECT_EQ(c->daemon.max_sessions, 7u);
  // One --listen replaces every listen line of the file.
  EXPECT_EQ(c->daemon.listen, std::vector<std::string>{"unix:/tmp/c.sock"});
}

TEST_F(ConfigFileTest, DefaultListenFollowsTheFilesDevice) {
  auto c = ParseFlags({"--config", Write("ferryd.conf", "device = 4\n")});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.listen, std::vector<std::string>{"unix:/run/ferry/ferryd-4.sock"});
}

TEST_F(ConfigFileTest, ExplicitFileMustExistDefaultNeedNot) {
  auto missing = ParseFlags({"--config", dir_ + "/nope.conf"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.conf"), std::string::npos);
  EXPECT_FALSE(ParseFlags({"--config", dir_}).ok());  // a directory

  // A default path that does not exist is skipped ...
  auto c = ParseFlags({"--device", "1"}, dir_ + "/nope.conf");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->config_path, "");
  // ... one that exists is read ...
  std::string path = Write("default.conf", "max-in-flight = 3\n");
  c = ParseFlags({}, path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->config_path, path);
  EXPECT_EQ(c->daemon.session_defaults.max_in_flight_submits, 3u);
  // ... and --config= turns it off.
  c = ParseFlags({"--config="}, path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.session_defaults.max_in_flight_submits, 64u);
}

TEST_F(ConfigFileTest, FileErrorsNameTheLine) {
  struct Case {
    std::string text;
    std::string expect;  // in the message
  };
  std::vector<Case> cases = {
      {"device = 1\nbogus = 3\n", "f.conf:2: unknown setting 'bogus'"},
      {"device\n", "f.conf:1: expected 'name = value'"},
      {"device = x\n", "f.conf:1: device: not a number"},
      {"device = 1\n\ndevice = 2\n", "f.conf:3: 'device' is already set on line 1"},
      {"config = /etc/other.conf\n", "can only be given on the command line"},
      {"help = true\n", "can only be given on the command line"},
      {"allow-insecure-remote = maybe\n", "expected true or false"},
      {"listen = http://x\n", "unix:PATH or tcp:HOST:PORT"},
      {"listen = tcp:127.0.0.1:99999\n", "bad port"},
      {"log-level = chatty\n", "f.conf:1: log-level"},
      {"session-quota =\n", "empty size"},
  };
  for (const Case& k : cases) {
    auto c = ParseConfigText(k.text, "f.conf");
    ASSERT_FALSE(c.ok()) << k.text;
    EXPECT_EQ(c.status().kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(c.status().message().find(k.expect), std::string::npos)
        << "text: " << k.text << "message: " << c.status().message();
  }
}

TEST(ConfigTest, CheckConfigSwitch) {
  auto c = ParseFlags({"--check-config", "--backend", "host"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->check_config);
  EXPECT_FALSE(ParseFlags({"--check-config=yes"}).ok());
  EXPECT_FALSE(ParseFlags({"--config", "a", "--config", "b"}).ok());
}

TEST(ConfigTest, FormatConfigReadsBackTheSame) {
  auto c = ParseFlags({"--device", "1", "--backend", "host", "--listen", "unix:/tmp/q.sock",
                       "--listen", "tcp:127.0.0.1:0", "--session-quota", "3M",
                       "--device-memory-cap", "5000", "--allow-insecure-remote",
                       "--ready-file", "/tmp/r dy", "--drain-timeout", "250",
                       "--log-level", "warn", "--executor-threads", "3"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::string text = FormatConfig(*c);
  auto back = ParseConfigText(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(FormatConfig(*back), text);
  EXPECT_EQ(back->daemon.listen, c->daemon.listen);
  EXPECT_EQ(back->daemon.device_bytes_cap, 5000u);
  EXPECT_EQ(back->ready_file, "/tmp/r dy");
  EXPECT_NE(text.find("session-quota = 3M\n"), std::string::npos) << text;

  // The defaults read back too (empty ready-file, cap 0 with its comment).
  auto d = ParseFlags({});
  ASSERT_TRUE(d.ok());
  auto d_back = ParseConfigText(FormatConfig(*d));
  ASSERT_TRUE(d_back.ok()) << d_back.status().ToString() << "\n" << FormatConfig(*d);
  EXPECT_EQ(FormatConfig(*d_back), FormatConfig(*d));
}

TEST(ConfigTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0");
  EXPECT_EQ(FormatBytes(1ull << 30), "1G");
  EXPECT_EQ(FormatBytes(3ull << 20), "3M");
  EXPECT_EQ(FormatBytes(1536), "1536");
  EXPECT_EQ(FormatBytes(2048), "2K");
  EXPECT_EQ(FormatBytes(1000), "1000");
  for (uint64_t v : {0ull, 1ull, 4096ull, 5ull << 30, (1ull << 20) + 1}) {
    EXPECT_EQ(*ParseBytes(FormatBytes(v)), v);
  }
}

}  // namespace
}  // namespace ferry
