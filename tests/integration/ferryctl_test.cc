// ferryctl against a real ferryd: status, sessions and health (with the canary) in table and
// JSON form, their exit codes, drain, exit code 2 once the daemon is gone, and metrics where
// no endpoint is configured.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cstring>
#include <sstream>

#include "ferry/client.h"
#include "ferryctl_output.h"
#include "ferryd_process.h"

namespace ferry {
namespace {

using testing::FerryctlPath;
using testing::FerrydProcess;
using testing::Field;
using testing::ParseArray;
using testing::ParseObject;
using testing::ReadAll;

struct CtlRun {
  int exit_code = -1;  // -1: did not exit normally
  std::string out;
  std::string err;
};

/// Run ferryctl with `args` and `input` on its stdin; capture stdout and stderr apart.
CtlRun Ferryctl(const std::vector<std::string>& args, const std::string& input = "") {
  char tmpl[] = "/tmp/ferryctl-run-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string program = FerryctlPath();
  std::vector<char*> argv = {const_cast<char*>(program.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::ofstream(dir + "/in") << input;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, (dir + "/in").c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, (dir + "/out").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, (dir + "/err").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  CtlRun r;
  if (posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ) == 0) {
    int status = testing::WaitExit(pid, std::chrono::seconds(60));
    if (status == -1) {
      kill(pid, SIGKILL);
      testing::WaitExit(pid, std::chrono::seconds(5));
    } else if (WIFEXITED(status)) {
      r.exit_code = WEXITSTATUS(status);
    }
  }
  posix_spawn_file_actions_destroy(&actions);
  r.out = ReadAll(dir + "/out");
  r.err = ReadAll(dir + "/err");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return r;
}

class FerryctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<FerrydProcess>(extra_args_);
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
  }
  void TearDown() override {
    if (daemon_ && daemon_->ok()) {
      EXPECT_EQ(daemon_->Stop(), 0) << daemon_->log();
    }
  }
  CtlRun Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), "--target=" + daemon_->unix_target());
    return Ferryctl(args);
  }

  std::vector<std::string> extra_args_;
  std::unique_ptr<FerrydProcess> daemon_;
};

TEST_F(FerryctlTest, StatusTable) {
  CtlRun r = Ctl({"status"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  for (const char* key :
       {"device", "uuid", "backend", "driver", "memory total", "memory free", "memory in use",
        "uptime", "version", "sessions", "submits", "copy turns", "submit rings", "draining"}) {
    EXPECT_NE(r.out.find(std::string("\n") + key + " "), std::string::npos) << key << "\n" << r.out;
  }
  EXPECT_NE(r.out.find(testing::TestBackend() == "host" ? "host" : ""), std::string::npos);
  // Aligned: every value starts in the same column.
  std::istringstream lines(r.out);
  std::string line;
  size_t column = std::string::npos;
  while (std::getline(lines, line)) {
    size_t gap = line.find("  ");
    size_t value = line.find_first_not_of(' ', gap);
    if (column == std::string::npos) column = value;
    EXPECT_EQ(value, column) << line;
  }
}

TEST_F(FerryctlTest, StatusJson) {
  CtlRun r = Ctl({"--json", "status"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto s = ParseObject(r.out);
  EXPECT_EQ(Field(s, "draining").bool_value(), false);
  EXPECT_EQ(Field(s, "sessions_open").number_value(), 0);
  EXPECT_GT(Field(s, "device_total_bytes").number_value(), 0);
  EXPECT_FALSE(Field(s, "version").string_value().empty());
  EXPECT_FALSE(Field(s, "device_name").string_value().empty());
  EXPECT_FALSE(Field(s, "driver_version").string_value().empty());
  EXPECT_EQ(Field(s, "target").string_value(), daemon_->unix_target());
  // The pinned pool is reported: a local daemon starts with its initial slab.
  EXPECT_GE(Field(s, "slabs_total").number_value(), 1);
  EXPECT_EQ(Field(s, "slabs_in_use").number_value(), 0);
  EXPECT_GT(Field(s, "slab_size").number_value(), 0);
  // Copy turns, at the daemon's default.
  EXPECT_EQ(Field(s, "copy_turns").number_value(), 4);
  EXPECT_EQ(Field(s, "copy_turns_waiting").number_value(), 0);
}

TEST_F(FerryctlTest, SessionsListsOpenSessions) {
  CtlRun empty = Ctl({"sessions"});
  ASSERT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_NE(empty.out.find("no open sessions"), std::string::npos) << empty.out;
  CtlRun empty_json = Ctl({"sessions", "--json"});
  ASSERT_EQ(empty_json.exit_code, 0) << empty_json.err;
  EXPECT_EQ(ParseArray(empty_json.out).values_size(), 0);

  ClientOptions options;
  options.client_name = "ferryctl-test-client";
  auto client = Client::connect(daemon_->unix_target(), options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  Tensor t = session->create_tensor<float>({4096});
  ASSERT_TRUE(session->upload(t, std::vector<float>(4096, 1.0f)).ok());

  CtlRun table = Ctl({"sessions"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("ID"), std::string::npos);
  EXPECT_NE(table.out.find("CLIENT"), std::string::npos);
  EXPECT_NE(table.out.find("ferryctl-test-client"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("16.0 KiB"), std::string::npos) << table.out;  // device bytes, up
  EXPECT_NE(table.out.find("UID"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(" " + std::to_string(getuid()) + " "), std::string::npos) << table.out;

  CtlRun json = Ctl({"sessions", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  auto list = ParseArray(json.out);
  ASSERT_EQ(list.values_size(), 1) << json.out;
  const auto& s = list.values(0).struct_value();
  EXPECT_EQ(Field(s, "session_id").number_value(), static_cast<double>(session->id()));
  EXPECT_EQ(Field(s, "client_name").string_value(), "ferryctl-test-client");
  // The client is this process, on the Unix socket: the daemon knows who it is.
  EXPECT_EQ(Field(s, "uid").number_value(), static_cast<double>(getuid()));
  EXPECT_EQ(Field(s, "pid").number_value(), static_cast<double>(getpid()));
  EXPECT_EQ(Field(s, "peer").string_value(), daemon_->unix_target());
  EXPECT_EQ(Field(s, "device_bytes").number_value(), 4096 * 4);
  EXPECT_EQ(Field(s, "live_tensors").number_value(), 1);
  EXPECT_EQ(Field(Field(s, "stats").struct_value(), "bytes_uploaded").number_value(), 4096 * 4);

  // Usage per identity (this process's uid), under the sessions and alone with --by-uid.
  const std::string me = "uid:" + std::to_string(getuid());
  EXPECT_NE(table.out.find("IDENTITY"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(me), std::string::npos) << table.out;
  CtlRun by_uid = Ctl({"sessions", "--by-uid", "--json"});
  ASSERT_EQ(by_uid.exit_code, 0) << by_uid.err;
  auto usage = ParseArray(by_uid.out);
  ASSERT_EQ(usage.values_size(), 1) << by_uid.out;
  const auto& u = usage.values(0).struct_value();
  EXPECT_EQ(Field(u, "identity").string_value(), me);
  EXPECT_EQ(Field(u, "sessions").number_value(), 1);
  EXPECT_EQ(Field(u, "device_bytes").number_value(), 4096 * 4);
  EXPECT_GE(Field(u, "pinned_bytes").number_value(), 0);
  EXPECT_EQ(Field(u, "submits_in_flight").number_value(), 0);
  EXPECT_EQ(Field(u, "in_flight_bytes").number_value(), 0) << "every submit answered";
  EXPECT_EQ(Field(u, "max_in_flight_bytes").number_value(), 0) << "the daemon's own uid is exempt";
  EXPECT_NE(table.out.find("HELD"), std::string::npos) << table.out;
  EXPECT_EQ(Field(u, "objects").number_value(), 1) << "one live tensor";
  EXPECT_EQ(Field(u, "queued_commands").number_value(), 0) << "the session is idle";
  EXPECT_EQ(Field(u, "max_queued_commands").number_value(), 0) << "its own uid is exempt";
  EXPECT_NE(table.out.find("QUEUED"), std::string::npos) << table.out;
  ASSERT_TRUE(session->close().ok());
}

TEST_F(FerryctlTest, HealthWithCanaryIsOk) {
  CtlRun r = Ctl({"health", "--canary", "--canary-elements", "100003"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* check : {"reachable", "draining", "memory-headroom", "canary"}) {
    EXPECT_NE(r.out.find(check), std::string::npos) << check << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("100003 f32 elements"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("every element matches"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("health: OK"), std::string::npos) << r.out;

  CtlRun j = Ctl({"health", "--canary", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.out << j.err;
  auto s = ParseObject(j.out);
  EXPECT_EQ(Field(s, "status").string_value(), "ok");
  EXPECT_EQ(Field(s, "exit_code").number_value(), 0);
  bool saw_canary = false;
  for (const auto& v : Field(s, "checks").list_value().values()) {
    const auto& c = v.struct_value();
    EXPECT_EQ(Field(c, "status").string_value(), "ok") << j.out;
    if (Field(c, "name").string_value() == "canary") {
      saw_canary = true;
      EXPECT_EQ(Field(c, "elements").number_value(), 1 << 20);
      EXPECT_EQ(Field(c, "mismatches").number_value(), 0);
      EXPECT_GT(Field(c, "total_ms").number_value(), 0);
    }
  }
  EXPECT_TRUE(saw_canary) << j.out;
  // The canary cleaned up after itself.
  auto idle = daemon_->WaitIdle();
  EXPECT_EQ(idle.sessions_open(), 0u);
  EXPECT_EQ(idle.device_bytes_in_use(), 0u);
}

TEST_F(FerryctlTest, DaemonGoneIsCritical) {
  ASSERT_EQ(daemon_->Stop(), 0) << daemon_->log();
  CtlRun health = Ctl({"health"});
  EXPECT_EQ(health.exit_code, 2) << health.out << health.err;
  EXPECT_NE(health.out.find("CRITICAL"), std::string::npos) << health.out;
  EXPECT_NE(health.out.find("cannot reach ferryd"), std::string::npos) << health.out;
  CtlRun health_json = Ctl({"health", "--canary", "--json"});
  EXPECT_EQ(health_json.exit_code, 2);
  EXPECT_EQ(Field(ParseObject(health_json.out), "status").string_value(), "critical");
  for (const char* command : {"status", "sessions", "drain"}) {
    auto start = std::chrono::steady_clock::now();
    CtlRun r = Ctl({command});
    EXPECT_EQ(r.exit_code, 2) << command;
    EXPECT_NE(r.err.find("cannot reach ferryd at " + daemon_->unix_target()), std::string::npos)
        << command << ": " << r.err;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
}

TEST_F(FerryctlTest, UnansweringTargetTimesOut) {
  // A socket that accepts connections but never speaks HTTP/2.
  std::string path = "/tmp/ferryctl-mute-" + std::to_string(getpid()) + ".sock";
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  unlink(path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 8), 0);
  auto start = std::chrono::steady_clock::now();
  CtlRun r = Ferryctl({"--target", "unix:" + path, "--timeout", "0.5", "health"});
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_LT(took, std::chrono::seconds(5));
  close(fd);
  unlink(path.c_str());
}

TEST_F(FerryctlTest, DrainStopsTheDaemon) {
  CtlRun r = Ctl({"drain", "--wait", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto s = ParseObject(r.out);
  EXPECT_TRUE(Field(s, "draining").bool_value());
  EXPECT_TRUE(Field(s, "stopped").bool_value());
  int status = daemon_->Stop();  // already gone: reaps it
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << daemon_->log();
  EXPECT_EQ(Ctl({"status"}).exit_code, 2);
}

// A daemon with no metrics endpoint (the fixture's ferryd has no --metrics-listen), and a
// ferryctl told none: metrics says what to configure, on both sides, and exits 3 (usage);
// pointed at an address where no endpoint listens, it says it cannot reach one and exits 2.
// Neither prints anything on stdout, where a scraper would read metrics.
TEST_F(FerryctlTest, NotConfigured) {
  CtlRun r = Ctl({"metrics"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "ferryctl: metrics needs --metrics HOST:PORT (ferryd's --metrics-listen)\n");

  // A port that is bound and not listening: connections to it are refused, and nothing else
  // can take it while the test holds it.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  r = Ctl({"metrics", "--metrics", endpoint});
  close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "ferryctl: cannot reach metrics at " + endpoint + "\n");

  // The daemon itself is fine: status answers.
  EXPECT_EQ(Ctl({"status"}).exit_code, 0);
}

TEST_F(FerryctlTest, UsageErrorsExitThree) {
  EXPECT_EQ(Ctl({}).exit_code, 3);
  EXPECT_EQ(Ctl({"frobnicate"}).exit_code, 3);
  EXPECT_EQ(Ctl({"status", "--bogus"}).exit_code, 3);
  EXPECT_EQ(Ctl({"status", "--canary"}).exit_code, 3);
  EXPECT_EQ(Ctl({"--timeout", "-1", "status"}).exit_code, 3);
  CtlRun help = Ferryctl({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: ferryctl"), std::string::npos);
}

// ferryctl takes its bearer token from a file (--token-file) or from stdin (--token -), never
// from the command line, where every local user can read it in the process list.
TEST(FerryctlTokenTest, TheTokenComesFromAFileOrStdinNeverTheCommandLine) {
  const testing::TempFile token("  s3cret-token\n");
  FerrydProcess daemon({"--token-file", token.path()}, /*tcp=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string target = "--target=" + daemon.tcp_target();
  CtlRun r = Ferryctl({target, "status"});
  EXPECT_EQ(r.exit_code, 2) << "no token: the TCP endpoint refuses\n" << r.out << r.err;

  r = Ferryctl({target, "--token-file", token.path(), "status", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(Field(ParseObject(r.out), "version").string_value().empty()) << r.out;
  r = Ferryctl({target, "--token", "-", "health"}, "s3cret-token\n");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // What is read is what is sent: another token is refused by the daemon.
  r = Ferryctl({target, "--token", "-", "status"}, "s3cret-tokem\n");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;

  // The token, or a path to it, on the command line: a usage error before anything is sent,
  // saying what to use, and not repeating what was given (it may be the token).
  for (const std::vector<std::string>& given : std::vector<std::vector<std::string> >{
           {"--token", "s3cret-token"}, {"--token=s3cret-token"}, {"--token", token.path()}}) {
    std::vector<std::string> args = {target};
    args.insert(args.end(), given.begin(), given.end());
    args.push_back("status");
    r = Ferryctl(args);
    EXPECT_EQ(r.exit_code, 3) << given.back() << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("use --token-file PATH, or --token - to read it from stdin"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("s3cret-token"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  r = Ferryctl({target, "--token", "@" + token.path(), "status"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("use --token-file " + token.path()), std::string::npos) << r.err;

  // What is not one token is refused, naming the file and what is wrong with it.
  const testing::TempFile tenants("alice s3cret-token\n");  // a line of ferryd's token file
  const testing::TempFile empty(" \n");
  struct Bad {
    std::vector<std::string> args;
    std::string input, says;
  };
  for (const Bad& bad : std::vector<Bad>{
           {{"--token-file", tenants.path()}, "", tenants.path() + ": holds more than a token"},
           {{"--token-file", empty.path()}, "", empty.path() + ": holds no token"},
           {{"--token-file", "/nonexistent/token"}, "", "/nonexistent/token: No such file"},
           {{"--token", "-"}, "", "stdin holds no token"},
           {{"--token", "-"}, "a\nb\n", "stdin holds more than a token"},
           {{"--token", "-"}, std::string(5000, 'x'), "stdin holds more than 4096 bytes"},
           {{"--token", "-", "--token-file", token.path()}, "s3cret-token", "one way"},
       }) {
    std::vector<std::string> args = {target};
    args.insert(args.end(), bad.args.begin(), bad.args.end());
    args.push_back("status");
    r = Ferryctl(args, bad.input);
    EXPECT_EQ(r.exit_code, 3) << bad.says << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(bad.says), std::string::npos) << r.err;
  }
}

// A nearly full device warns (exit 1) and says why.
class FerryctlLowMemoryTest : public FerryctlTest {
 protected:
  void SetUp() override {
    if (testing::TestBackend() != "host") GTEST_SKIP() << "needs the host backend's --host-memory";
    extra_args_ = {"--host-memory", "16M"};
    FerryctlTest::SetUp();
  }
};

TEST_F(FerryctlLowMemoryTest, LowHeadroomWarns) {
  auto client = Client::connect(daemon_->unix_target());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  Tensor t = session->create_tensor<uint8_t>({(16 << 20) - (256 << 10)});
  ASSERT_TRUE(session->synchronize().ok());
  CtlRun r = Ctl({"health"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("WARNING"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("health: WARNING"), std::string::npos) << r.out;
  ASSERT_TRUE(session->close().ok());
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
}

}  // namespace
}  // namespace ferry
