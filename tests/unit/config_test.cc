// ferryd's flag and config-file parsing.
#include "config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "config_lines.h"
#include "settings.h"
#include "temp_files.h"

#ifndef FERRY_SOURCE_DIR
#error "FERRY_SOURCE_DIR must name the source tree (tests/CMakeLists.txt defines it)"
#endif

namespace ferry {
namespace {

// `parsed` is an error whose message contains `what`.
template <typename T>
::testing::AssertionResult RefusedSaying(const Result<T>& parsed, const std::string& what) {
  if (parsed.ok()) return ::testing::AssertionFailure() << "accepted";
  if (parsed.status().message().find(what) == std::string::npos) {
    return ::testing::AssertionFailure() << "refused, saying: " << parsed.status().message();
  }
  return ::testing::AssertionSuccess();
}

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
  EXPECT_FALSE(ParseFlags({"--nvrtc-timeout", "99"}).ok());
  EXPECT_FALSE(ParseFlags({"--nvrtc-memory", "255M"}).ok());
  EXPECT_EQ(ParseFlags({"--nvrtc-timeout", "2500"})->cuda.nvrtc_timeout.count(), 2500);
  EXPECT_EQ(ParseFlags({"--nvrtc-memory", "1G"})->cuda.nvrtc_memory, 1ull << 30);
  EXPECT_FALSE(ParseFlags({"--cuda-work-queues", "33"}).ok());
  EXPECT_EQ(ParseFlags({"--cuda-work-queues", "32"})->cuda_work_queues, 32);
  EXPECT_EQ(ParseFlags({})->cuda_module_loading, "environment");
  EXPECT_EQ(ParseFlags({"--cuda-module-loading", "lazy"})->cuda_module_loading, "lazy");
  EXPECT_EQ(ParseFlags({"--cuda-module-loading", "eager"})->cuda_module_loading, "eager");
  EXPECT_FALSE(ParseFlags({"--cuda-module-loading", "EAGER"}).ok());
  EXPECT_FALSE(ParseFlags({"--copy-turns", "1025"}).ok());
  EXPECT_FALSE(ParseFlags({"--copy-turn-size", "-1"}).ok());
  EXPECT_EQ(ParseFlags({"--copy-turns", "0"})->daemon.copy_turns, 0u);
  EXPECT_EQ(ParseFlags({"--copy-turn-size", "8M"})->daemon.copy_turn_bytes, 8ull << 20);
  EXPECT_EQ(ParseFlags({"--submit-ring", "16K"})->daemon.submit_ring_bytes, 16ull << 10);
  EXPECT_EQ(ParseFlags({"--submit-ring", "0"})->daemon.submit_ring_bytes, 0u);
  EXPECT_FALSE(ParseFlags({"--submit-ring", "12K"}).ok());  // not a power of two
  EXPECT_FALSE(ParseFlags({"--submit-ring", "2K"}).ok());
  EXPECT_FALSE(ParseFlags({"--submit-ring", "32M"}).ok());
  EXPECT_FALSE(ParseFlags({"--session-quota", "99999999999999999999G"}).ok());
  EXPECT_FALSE(ParseFlags({"stray"}).ok());
  EXPECT_EQ(ParseFlags({"--help=1"}).status().kind(), ErrorKind::kInvalidArgument);
}

// Found by tests/fuzz/config_fuzz: a flag's value with a line break was taken whole, and
// --check-config printed it as lines of their own ("listen = unix:/a\npinned-budget = 1M"),
// which do not read back as the settings ferryd runs with.
TEST(ConfigTest, AValueWithALineBreakIsRefused) {
  auto c = ParseFlags({"--listen", "unix:/tmp/a.sock\nsession-quota = 1M"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().kind(), ErrorKind::kInvalidArgument);
  EXPECT_FALSE(ParseFlags({"--tls-cert=/a\r", "--tls-key=/b"}).ok());
  EXPECT_FALSE(ParseFlags({"--log-level", "info\n"}).ok());
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
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_.path(name);
    std::ofstream(path) << text;
    return path;
  }
  testing::TempDir dir_{"ferry-config-test"};
};

// Config text ParseConfigText must refuse, and what its message must hold.
struct RefusedText {
  std::string text;
  std::string expect;  // in the message
};

// Each case's text, parsed as file "f.conf", is refused INVALID_ARGUMENT with a message that
// holds `prefix` and the case's `expect`.
void ExpectEachRefused(const std::vector<RefusedText>& cases, const std::string& prefix = "") {
  for (const RefusedText& k : cases) {
    auto c = ParseConfigText(k.text, "f.conf");
    ASSERT_FALSE(c.ok()) << k.text;
    EXPECT_EQ(c.status().kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(c.status().message().find(prefix + k.expect), std::string::npos)
        << "text: " << k.text << "message: " << c.status().message();
  }
}

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
  EXPECT_EQ(c->daemon.listen, (std::vector<std::string>{"unix:/tmp/x.sock", "tcp:127.0.0.1:0"}));
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
  auto missing = ParseFlags({"--config", dir_.path("nope.conf")});
  ASSERT_TRUE(RefusedSaying(missing, "nope.conf"));
  EXPECT_FALSE(ParseFlags({"--config", dir_.path()}).ok());  // a directory

  // A default path that does not exist is skipped ...
  auto c = ParseFlags({"--device", "1"}, dir_.path("nope.conf"));
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
  ExpectEachRefused({
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
  });
}

// metrics-token-file is a path like token-file: default none, set from the file or a flag
// (the flag wins), printed by --check-config; the file itself is read at start, not here.
TEST_F(ConfigFileTest, MetricsTokenFileIsAPathFlagsWin) {
  auto c = ParseFlags({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.metrics_token_file, "");
  EXPECT_NE(FormatConfig(*c).find("\nmetrics-token-file =\n"), std::string::npos)
      << FormatConfig(*c);

  std::string path = Write("ferryd.conf",
                           "metrics-listen = 0.0.0.0:9400\n"
                           "metrics-token-file = /etc/ferry/metrics-token  # Prometheus'\n");
  c = ParseFlags({"--config", path});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.metrics_listen, "0.0.0.0:9400");
  EXPECT_EQ(c->daemon.metrics_token_file, "/etc/ferry/metrics-token");
  EXPECT_NE(FormatConfig(*c).find("\nmetrics-token-file = \"/etc/ferry/metrics-token\"\n"),
            std::string::npos)
      << FormatConfig(*c);

  c = ParseFlags({"--config", path, "--metrics-token-file", "/run/secrets/metrics token"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.metrics_token_file, "/run/secrets/metrics token");
  c = ParseFlags({"--config", path, "--metrics-token-file="});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.metrics_token_file, "");
  // No file is opened while parsing: one that does not exist is found at start.
  c = ParseFlags({"--metrics-token-file", dir_.path("nope")});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(ParseFlags({"--metrics-token-file"}).ok());  // needs a value
  auto twice = ParseConfigText("metrics-token-file = /a\nmetrics-token-file = /b\n", "f");
  ASSERT_TRUE(RefusedSaying(twice, "f:2: 'metrics-token-file' is already set on line 1"));
}

// metrics-identity-idle-timeout: milliseconds, 0..86400000, 10 minutes unless set; 0 keeps
// every usage identity until the daemon stops, and --check-config says so.
TEST(ConfigTest, MetricsIdentityIdleTimeoutIsMillisecondsUpToADay) {
  auto d = ParseFlags({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->daemon.metrics_identity_idle_timeout, std::chrono::minutes(10));
  auto c = ParseFlags({"--metrics-identity-idle-timeout", "250"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.metrics_identity_idle_timeout, std::chrono::milliseconds(250));
  for (const char* bad : {"86400001", "-1", "10m", ""}) {
    auto r = ParseFlags({"--metrics-identity-idle-timeout", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--metrics-identity-idle-timeout"), std::string::npos)
        << r.status().message();
  }
  auto never = ParseConfigText("metrics-identity-idle-timeout = 0\n", "f");
  ASSERT_TRUE(never.ok()) << never.status().ToString();
  EXPECT_EQ(never->daemon.metrics_identity_idle_timeout.count(), 0);
  EXPECT_NE(FormatConfig(*never).find("\nmetrics-identity-idle-timeout = 0  # never\n"),
            std::string::npos)
      << FormatConfig(*never);
}

TEST(ConfigTest, CheckConfigSwitch) {
  auto c = ParseFlags({"--check-config", "--backend", "host"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->check_config);
  EXPECT_FALSE(ParseFlags({"--check-config=yes"}).ok());
  EXPECT_FALSE(ParseFlags({"--config", "a", "--config", "b"}).ok());
}

// A quoted value is taken whole; a bare one ends at a comment; what cannot be read is an error
// naming the line.
TEST(ConfigTest, QuotedValuesAndComments) {
  auto c = ParseConfigText(
      "token-file = \"/etc/ferry/t #1\"   # the token\n"
      "ready-file = \"/tmp/say \\\"hi\\\" \\\\ bye\"\n"
      "listen = unix:/tmp/f.sock # a comment\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.token_file, "/etc/ferry/t #1");
  EXPECT_EQ(c->ready_file, "/tmp/say \"hi\" \\ bye");
  EXPECT_EQ(c->daemon.listen, std::vector<std::string>{"unix:/tmp/f.sock"});
  auto open = ParseConfigText("token-file = \"/etc/ferry/t\n", "f");
  ASSERT_TRUE(RefusedSaying(open, "f:1: token-file: a quoted value without its closing"));
  auto after = ParseConfigText("\n\ntoken-file = \"/a\" b\n", "f");
  ASSERT_TRUE(RefusedSaying(after, "f:3: token-file: text after the closing quote"));
}

TEST(ConfigTest, FormatConfigReadsBackTheSame) {
  auto c = ParseFlags({"--device",
                       "1",
                       "--backend",
                       "host",
                       "--listen",
                       "unix:/tmp/q.sock",
                       "--listen",
                       "tcp:127.0.0.1:0",
                       "--session-quota",
                       "3M",
                       "--device-memory-cap",
                       "5000",
                       "--allow-insecure-remote",
                       "--ready-file",
                       "/tmp/r dy",
                       "--drain-timeout",
                       "250",
                       "--log-level",
                       "warn",
                       "--executor-threads",
                       "3"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::string text = FormatConfig(*c);
  auto back = ParseConfigText(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(FormatConfig(*back), text);
  EXPECT_EQ(back->daemon.listen, c->daemon.listen);
  EXPECT_EQ(back->daemon.device_bytes_cap, 5000u);
  EXPECT_EQ(back->ready_file, "/tmp/r dy");
  EXPECT_NE(text.find("session-quota = 3M\n"), std::string::npos) << text;

  // Values with blanks, a '#' after a blank, double quotes and backslashes read back as they
  // were: FormatConfig quotes them (with \" and \\) and the parser takes a quoted value whole.
  const std::string awkward = "/tmp/a dir #1/\"q\" \\x.sock";
  auto w = ParseFlags(
      {"--listen", "unix:" + awkward, "--token-file", awkward, "--ready-file", awkward + " "});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const std::string w_text = FormatConfig(*w);
  auto w_back = ParseConfigText(w_text);
  ASSERT_TRUE(w_back.ok()) << w_back.status().ToString() << "\n" << w_text;
  EXPECT_EQ(w_back->daemon.listen, std::vector<std::string>{"unix:" + awkward}) << w_text;
  EXPECT_EQ(w_back->daemon.token_file, awkward) << w_text;
  EXPECT_EQ(w_back->ready_file, awkward + " ") << w_text;
  EXPECT_EQ(FormatConfig(*w_back), w_text);

  // The defaults read back too (empty ready-file, cap 0 with its comment).
  auto d = ParseFlags({});
  ASSERT_TRUE(d.ok());
  auto d_back = ParseConfigText(FormatConfig(*d));
  ASSERT_TRUE(d_back.ok()) << d_back.status().ToString() << "\n" << FormatConfig(*d);
  EXPECT_EQ(FormatConfig(*d_back), FormatConfig(*d));
}

using testing::SettingLines;

TEST(ConfigTest, FormatConfigRoundTripsEverySetting) {
  // Every setting away from its default, the hidden test-only ones included.
  const char* text = R"(device = 2
backend = host
listen = unix:/tmp/every.sock
listen = tcp:0.0.0.0:7531
allow-insecure-remote = true
tls-cert = "/etc/ferry/tls/a b.crt"
tls-key = /etc/ferry/tls/a.key
tls-client-ca = /etc/ferry/tls/ca.crt
token-file = /etc/ferry/token
allow-remote-raw-kernels = true
raw-kernels = "uid:1000, gid:0,uid:root"
admins = "uid:0,gid:0"
admin-group = 0
metrics-listen = 127.0.0.1:9402
metrics-token-file = "/etc/ferry/metrics token"
metrics-max-identities = 3
metrics-identity-idle-timeout = 0
session-quota = 2G
max-session-quota = 3G
max-in-flight = 7
session-in-flight-bytes = 32M
in-flight-bytes = 1G
session-max-submit-ops = 4096
session-max-tensors = 11
session-max-modules = 0
session-max-graphs = 13
session-max-graph-ops = 17
max-objects = 1000
max-sessions = 9
max-sessionless-streams = 40
max-sessionless-streams-per-uid = 0
max-local-connections = 300
max-local-connections-per-uid = 0
open-timeout = 750
uid-limits = default:sessions=8,device=1G,pinned=none,inflight=100,inflight-bytes=40%,objects=30%,queued=25%
uid-limits = uid:1000:sessions=4
uid-limits = gid:50:device=10%,pinned=512K
uid-limits = remote:inflight=none,inflight-bytes=512M
uid-limits = remote:alice:sessions=2
device-memory-cap = 5000
host-memory = 2G
max-message = 1M
rpc-bandwidth-probe = false
tcp-idle-timeout = 1500
executor-threads = 3
cuda-work-queues = 2
cuda-module-loading = lazy
nvrtc-timeout = 1500
nvrtc-memory = 512M
nvrtc-concurrency = 2
fuse-elementwise = false
streams-ahead = 5
copy-turns = 0
kernel-batch = 3
submit-run = 5
staging-wait = 250
session-queued-commands = 100
queued-commands = 300
copy-turn-size = 1M
device-turns = 2
uid-weights = "remote=3,uid:1000=2"
slab-size = 8M
pinned-budget = 64M
initial-slabs = 2
session-pinned-quota = 16M
submit-ring = 4K
staging-slabs = 0
slab-hello-timeout = 250
slab-max-connections = 100
slab-max-pending-per-uid = 3
slab-grant-threads = 2
drain-timeout = 250
host-fault-after-ops-for-test = 99
host-rebuild-fails-for-test = true
ready-file = /tmp/ready
log-level = debug
)";
  auto c = ParseConfigText(text, "every");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::string formatted = FormatConfig(*c);
  auto back = ParseConfigText(formatted, "formatted");
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << formatted;
  EXPECT_EQ(FormatConfig(*back), formatted);
  EXPECT_TRUE(back->host_rebuild_fails_for_test);
  EXPECT_EQ(back->host_fault_after_ops_for_test, 99u);
  EXPECT_EQ(back->daemon.slab_broker.grant_threads, 2u);
  EXPECT_EQ(back->daemon.session_defaults.max_ops_per_submit, 4096u);
  EXPECT_EQ(back->cuda.nvrtc_timeout.count(), 1500);
  EXPECT_EQ(back->cuda.nvrtc_memory, 512ull << 20);
  EXPECT_EQ(back->cuda.nvrtc_concurrency, 2);

  // The text above sets every setting FormatConfig knows, each away from its default:
  // FormatConfig prints each of its lines, and no line of the defaults' output.
  auto defaults = ParseConfigText("");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  std::map<std::string, std::string> default_values;
  for (const auto& [name, value] : SettingLines(FormatConfig(*defaults))) {
    default_values[name] = value;
  }
  std::set<std::string> printed;
  for (const auto& [name, value] : SettingLines(formatted)) {
    printed.insert(name);
    auto it = default_values.find(name);
    if (it != default_values.end()) EXPECT_NE(value, it->second) << name << " is at its default";
  }
  for (const auto& [name, value] : SettingLines(text)) {
    EXPECT_TRUE(printed.count(name)) << name << " is missing from\n" << formatted;
  }
  for (const auto& [name, value] : default_values) {
    EXPECT_TRUE(printed.count(name)) << name << " is missing from\n" << formatted;
  }
}

TEST(ConfigTest, HiddenSettingsArePrintedOnlyWhenSet) {
  auto c = ParseFlags({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(FormatConfig(*c).find("-for-test"), std::string::npos) << FormatConfig(*c);
  c = ParseFlags({"--host-rebuild-fails-for-test=true"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(FormatConfig(*c).find("\nhost-rebuild-fails-for-test = true\n"), std::string::npos)
      << FormatConfig(*c);
  EXPECT_EQ(FormatConfig(*c).find("host-fault-after-ops-for-test"), std::string::npos);
}

TEST(ConfigTest, SettingsThatDependOnEachOtherAreChecked) {
  ExpectEachRefused(
      {
          {"pinned-budget = 32M\n", "pinned-budget (32M) is below slab-size (64M)"},
          {"slab-size = 2G\n", "pinned-budget (1G) is below slab-size (2G)"},
          {"tls-cert = /c.pem\n", "tls-cert needs tls-key"},
          {"tls-key = /k.pem\n", "tls-key needs tls-cert"},
          {"tls-client-ca = /ca.pem\n", "tls-client-ca needs tls-cert and tls-key"},
          {"tls-client-ca = /ca.pem\ntls-cert = /c.pem\n", "tls-cert needs tls-key"},
          {"tls-client-ca = /ca.pem\ntls-key = /k.pem\n", "tls-key needs tls-cert"},
      },
      "f.conf: ");
  if (HasFatalFailure()) return;
  // The same on the command line, --check-config included (main exits 2 on any error).
  auto flags = ParseFlags({"--check-config", "--pinned-budget", "4M", "--slab-size", "8M"});
  ASSERT_FALSE(flags.ok());
  EXPECT_EQ(flags.status().kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(flags.status().message().find("pinned-budget (4M) is below slab-size (8M)"),
            std::string::npos)
      << flags.status().message();
  flags = ParseFlags({"--tls-cert", "/c.pem"});
  ASSERT_TRUE(RefusedSaying(flags, "tls-cert needs tls-key"));
  flags = ParseFlags({"--check-config", "--tls-client-ca", "/ca.pem"});
  ASSERT_TRUE(RefusedSaying(flags, "tls-client-ca needs tls-cert and tls-key"));

  // Consistent combinations pass; the files are not opened (these do not exist).
  for (const char* ok : {"pinned-budget = 64M\n", "slab-size = 1G\npinned-budget = 1G\n",
                         "tls-cert = /nonexistent/c.pem\ntls-key = /nonexistent/k.pem\n"
                         "tls-client-ca = /nonexistent/ca.pem\n"}) {
    auto c = ParseConfigText(ok);
    EXPECT_TRUE(c.ok()) << ok << c.status().ToString();
  }
}

TEST_F(ConfigFileTest, TheCheckSpansFileAndFlags) {
  // The file's tls-cert with the flag's tls-key is whole; the file's slab-size with a flag's
  // smaller pinned-budget is not.
  std::string path = Write("ferryd.conf", "tls-cert = /c.pem\nslab-size = 128M\n");
  auto c = ParseFlags({"--config", path, "--tls-key", "/k.pem"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.tls.key, "/k.pem");
  c = ParseFlags({"--config", path, "--tls-key", "/k.pem", "--pinned-budget", "64M"});
  ASSERT_TRUE(RefusedSaying(c, "below slab-size (128M)"));
}

TEST(ConfigTest, SwitchesTakeTrueOrFalseOnTheCommandLine) {
  auto c = ParseFlags({"--allow-insecure-remote", "--allow-remote-raw-kernels"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->daemon.allow_insecure_remote);
  EXPECT_TRUE(c->daemon.allow_remote_raw_kernels);

  c = ParseFlags({"--allow-insecure-remote=false", "--allow-remote-raw-kernels=true"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->daemon.allow_insecure_remote);
  EXPECT_TRUE(c->daemon.allow_remote_raw_kernels);

  // The file's words, and a flag's false overrides the file's true.
  c = ParseFlags({"--allow-insecure-remote=yes", "--allow-remote-raw-kernels=off"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->daemon.allow_insecure_remote);
  EXPECT_FALSE(c->daemon.allow_remote_raw_kernels);

  auto bad = ParseFlags({"--allow-insecure-remote=maybe"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--allow-insecure-remote: expected true or false"),
            std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(ParseFlags({"--allow-insecure-remote="}).ok());
  // A bare switch does not take the next argument as its value.
  EXPECT_FALSE(ParseFlags({"--allow-insecure-remote", "false"}).ok());
  // The actions take no value at all.
  EXPECT_FALSE(ParseFlags({"--help=true"}).ok());
  EXPECT_FALSE(ParseFlags({"--version=false"}).ok());
  EXPECT_FALSE(ParseFlags({"--check-config=true"}).ok());
}

TEST_F(ConfigFileTest, FlagSwitchFalseOverridesTheFile) {
  std::string path = Write("ferryd.conf", "allow-insecure-remote = true\n");
  auto c = ParseFlags({"--config", path, "--allow-insecure-remote=false"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->daemon.allow_insecure_remote);
}

// deploy/ferryd.conf.example shows every setting as a "#name = value" line (prose comments
// are "# ..."): with those lines uncommented it must parse, set every setting --check-config
// prints (not the hidden ones), and show the default of each whose default is not empty.
TEST(ConfigTest, ExampleFileShowsEverySettingWithItsDefault) {
  const std::string example_path = FERRY_SOURCE_DIR "/deploy/ferryd.conf.example";
  std::ifstream in(example_path);
  ASSERT_TRUE(in.is_open()) << "cannot read " << example_path;
  std::string uncommented;
  for (std::string line; std::getline(in, line);) {
    if (line.size() > 1 && line[0] == '#' && std::islower(static_cast<unsigned char>(line[1]))) {
      line = line.substr(1);
    }
    uncommented += line + "\n";
  }
  auto c = ParseConfigText(uncommented, example_path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();

  std::map<std::string, std::string> example;  // the first value shown for each setting
  for (const auto& [name, value] : SettingLines(uncommented)) example.emplace(name, value);
  auto defaults = ParseConfigText("");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  for (const auto& [name, value] : SettingLines(FormatConfig(*defaults))) {
    auto it = example.find(name);
    if (it == example.end()) {
      ADD_FAILURE() << example_path << " does not show '" << name << "'";
      continue;
    }
    if (!value.empty()) {
      EXPECT_EQ(it->second, value) << example_path << ": '" << name << "' is not its default";
    }
  }
  for (const auto& [name, value] : example) {
    EXPECT_EQ(name.find("-for-test"), std::string::npos)
        << example_path << " shows the hidden setting '" << name << "'";
  }
}

TEST(ConfigTest, UidLimitRules) {
  auto c = ParseFlags({"--uid-limits", "uid:1000:sessions=4,device=8G",
                       "--uid-limits=gid:27:pinned=25%", "--uid-limits", "remote:inflight=none"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto& rules = c->daemon.uid_limits;
  ASSERT_EQ(rules.size(), 4u);  // the built-in default rule stays first
  EXPECT_EQ(rules[0], session::DefaultUidLimitRule());
  EXPECT_EQ(session::FormatUidLimitRule(rules[1]), "uid:1000:sessions=4,device=8G");
  EXPECT_EQ(session::FormatUidLimitRule(rules[2]), "gid:27:pinned=25%");
  EXPECT_EQ(session::FormatUidLimitRule(rules[3]), "remote:inflight=none");
  // A default rule replaces the built-in one.
  c = ParseFlags({"--uid-limits", "default:sessions=2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->daemon.uid_limits.size(), 1u);
  EXPECT_EQ(session::FormatUidLimitRule(c->daemon.uid_limits[0]), "default:sessions=2");
  // What is wrong is named.
  for (const char* bad :
       {"uid:1000", "uid:x:sessions=1", "user:1:sessions=1", "default:sessions=0",
        "default:colour=1", "default:inflight=50%", "default:device=101%", "default:sessions=1,",
        "default:sessions=1,sessions=2", "uid:99999999999:sessions=1", "default:device=1T"}) {
    auto r = ParseFlags({"--uid-limits", bad});
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().kind(), ErrorKind::kInvalidArgument) << bad;
      EXPECT_NE(r.status().message().find("--uid-limits"), std::string::npos) << bad;
    }
  }
  // The same selector twice from one source is refused; flags replace the file's rules.
  EXPECT_FALSE(
      ParseConfigText("uid-limits = uid:5:sessions=1\nuid-limits = uid:5:device=1G\n").ok());
  EXPECT_FALSE(
      ParseConfigText("uid-limits = default:sessions=1\nuid-limits = default:device=1G\n").ok());
}

// The settings table (server/settings.cc): every count takes the ends of its range and refuses
// what is past them, and its member holds them (one too narrow would print another number).
TEST(ConfigTest, EveryCountTakesTheEndsOfItsRange) {
  for (const Setting& s : SettingsTable()) {
    if (!s.bounds) continue;
    const auto [lo, hi] = *s.bounds;
    for (uint64_t v : {lo, hi}) {
      auto c = ParseFlags({"--" + s.name + "=" + std::to_string(v)});
      ASSERT_TRUE(c.ok()) << s.name << " = " << v << ": " << c.status().ToString();
      EXPECT_EQ(s.get(*c), std::vector<std::string>{std::to_string(v)}) << s.name;
    }
    if (lo > 0) {
      auto below = ParseFlags({"--" + s.name + "=" + std::to_string(lo - 1)});
      ASSERT_FALSE(below.ok()) << s.name;
      EXPECT_NE(below.status().message().find("out of range"), std::string::npos) << s.name;
    }
    if (hi < ~0ull) {
      auto above = ParseFlags({"--" + s.name + "=" + std::to_string(hi + 1)});
      ASSERT_FALSE(above.ok()) << s.name;
      EXPECT_NE(above.status().message().find("out of range"), std::string::npos) << s.name;
    }
  }
}

// A setting's default is its member's initial value: parsing nothing changes no setting but
// those whose default is derived from others (listen's from device).
TEST(ConfigTest, DefaultsAreTheMembersInitialValues) {
  auto c = ParseConfigText("");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (const Setting& s : SettingsTable()) {
    if (!s.derived_default.empty()) continue;
    EXPECT_EQ(s.get(*c), s.get(DefaultConfig())) << s.name;
  }
  EXPECT_EQ(c->daemon.listen, std::vector<std::string>{"unix:/run/ferry/ferryd-0.sock"});
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

TEST(ConfigTest, RawKernelsAndAdminGroupAreCheckedAtParse) {
  // Numbers and names (root exists everywhere) parse; the setting keeps the text as given.
  auto c = ParseFlags({"--raw-kernels", "uid:1000,gid:root,uid:root", "--admin-group", "root"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.raw_kernels, "uid:1000,gid:root,uid:root");
  EXPECT_EQ(c->daemon.admin_group, "root");
  // Off by default: nobody gets raw kernels, there is no admin group.
  auto d = ParseFlags({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->daemon.raw_kernels, "");
  EXPECT_EQ(d->daemon.admin_group, "");
  EXPECT_EQ(d->daemon.admins, "uid:0") << "root is an admin by default";
  auto e = ParseFlags({"--admins", ""});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->daemon.admins, "") << "an empty list leaves root out";
  EXPECT_FALSE(ParseFlags({"--admins", "uid:no-such-user-ferry-test"}).ok());
  // What --check-config must report: a malformed entry, an unknown user or group.
  for (const char* bad : {"1000", "uid:", "user:1000", "uid:1000,,gid:0",
                          "uid:no-such-user-ferry-test", "gid:no-such-group-ferry-test"}) {
    auto r = ParseFlags({"--raw-kernels", bad});
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_NE(r.status().message().find("--raw-kernels"), std::string::npos);
  }
  EXPECT_FALSE(ParseFlags({"--admin-group", "no-such-group-ferry-test"}).ok());
  auto f = ParseConfigText("raw-kernels = uid:nobody-ferry-test\n", "f");
  ASSERT_TRUE(RefusedSaying(f, "f:1: raw-kernels: no such user"));
}

}  // namespace
}  // namespace ferry
