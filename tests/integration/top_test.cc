// ferryctl top against a real ferryd: --once --json for scripts, the live view driven in a
// real terminal (tmux), keys included, and what it says where no daemon is configured.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferryctl_output.h"
#include "ferryd_process.h"

namespace ferry {
namespace {

using testing::FerryctlPath;
using testing::Field;
using testing::ParseObject;
using testing::ReadAll;

// Run a shell command; return its stdout (stderr to the test's log).
std::string Shell(const std::string& cmd, int* rc = nullptr) {
  const std::string out = ::testing::TempDir() + "/top_test_shell.out";
  int status = std::system((cmd + " > " + out).c_str());
  if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ReadAll(out);
}

// Two sessions of this process: "busy" moves 8 MiB up and down, "idle" holds 4 KiB.
class TopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<testing::FerrydProcess>(std::vector<std::string>{});
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
    ClientOptions busy_options, idle_options;
    busy_options.client_name = "busy";
    idle_options.client_name = "idle";
    auto busy = Client::connect(daemon_->unix_target(), busy_options);
    auto idle = Client::connect(daemon_->unix_target(), idle_options);
    ASSERT_TRUE(busy.ok() && idle.ok());
    busy_client_ = std::make_unique<Client>(std::move(*busy));
    idle_client_ = std::make_unique<Client>(std::move(*idle));
    auto b = busy_client_->open_session();
    auto i = idle_client_->open_session();
    ASSERT_TRUE(b.ok() && i.ok());
    busy_ = std::make_unique<Session>(std::move(*b));
    idle_ = std::make_unique<Session>(std::move(*i));
    Tensor big = busy_->create_tensor<float>({2u << 20});
    std::vector<float> data(2u << 20, 1.0f);
    ASSERT_TRUE(busy_->upload(big, data).ok());
    ASSERT_TRUE(busy_->download<float>(big).ok());
    Tensor small = idle_->create_tensor<float>({1024});
    (void)small;
    ASSERT_TRUE(idle_->synchronize().ok());
  }
  void TearDown() override {
    if (busy_) (void)busy_->close();
    if (idle_) (void)idle_->close();
  }

  std::unique_ptr<testing::FerrydProcess> daemon_;
  std::unique_ptr<Client> busy_client_, idle_client_;
  std::unique_ptr<Session> busy_, idle_;
};

TEST_F(TopTest, OnceJsonListsUidsAndSessionsByDeviceTime) {
  int rc = -1;
  const std::string out = Shell(
      FerryctlPath() + " top --once --json --interval 0.1 --target=" + daemon_->unix_target(), &rc);
  ASSERT_EQ(rc, 0) << out;
  auto top = ParseObject(out);
  const auto& sessions = Field(top, "sessions").list_value();
  ASSERT_EQ(sessions.values_size(), 2) << out;
  // Sorted by device time: the session that moved 16 MiB comes first.
  const auto& first = sessions.values(0).struct_value();
  const auto& second = sessions.values(1).struct_value();
  EXPECT_EQ(Field(first, "client").string_value(), "busy") << out;
  EXPECT_EQ(Field(second, "client").string_value(), "idle") << out;
  EXPECT_GE(Field(first, "device_busy_ns").number_value(),
            Field(second, "device_busy_ns").number_value());
  EXPECT_EQ(Field(first, "h2d_bytes").number_value(), 8 << 20) << out;
  EXPECT_EQ(Field(first, "d2h_bytes").number_value(), 8 << 20) << out;
  EXPECT_EQ(Field(second, "device_bytes").number_value(), 4096) << out;
  EXPECT_EQ(Field(first, "pid").number_value(), getpid());
  // One uid: this process's, with both sessions' device time.
  const auto& uids = Field(top, "uids").list_value();
  ASSERT_EQ(uids.values_size(), 1) << out;
  const auto& me = uids.values(0).struct_value();
  EXPECT_EQ(Field(me, "uid").string_value(), std::to_string(getuid()));
  EXPECT_EQ(Field(me, "sessions_open").number_value(), 2);
  EXPECT_EQ(Field(me, "device_busy_ns").number_value(),
            Field(first, "device_busy_ns").number_value() +
                Field(second, "device_busy_ns").number_value());
  EXPECT_EQ(Field(me, "device_bytes").number_value(), (8 << 20) + 4096);

  // The table form names the same rows.
  const std::string table =
      Shell(FerryctlPath() + " top --once --interval 0.1 --target=" + daemon_->unix_target(), &rc);
  ASSERT_EQ(rc, 0) << table;
  EXPECT_NE(table.find("DEVICE-TIME"), std::string::npos) << table;
  EXPECT_LT(table.find(" busy "), table.find(" idle ")) << table;
}

// ferryctl top where no daemon is configured at its target: it says it cannot reach one and
// exits 2, and prints nothing on stdout: no JSON or table for a script to misread, and the live
// view does not take the terminal (no alternate screen) when it has nothing to show.
TEST_F(TopTest, NotConfigured) {
  const std::string dir = ::testing::TempDir() + "/top_not_configured";
  std::filesystem::create_directories(dir);
  const std::string target = "unix:" + dir + "/no-ferryd.sock";
  const std::string err = dir + "/err";
  for (const char* args : {"top --once --json", "top --once", "top"}) {
    int rc = -1;
    // timeout: a live view that went on without a daemon would never return.
    const std::string out = Shell("timeout 30 " + FerryctlPath() + " " + args +
                                      " --interval 0.1 --target=" + target + " 2> " + err,
                                  &rc);
    EXPECT_EQ(rc, 2) << args;
    EXPECT_TRUE(out.empty()) << args << ": " << out.substr(0, 400);
    const std::string said = ReadAll(err);
    EXPECT_EQ(said.rfind("ferryctl: cannot reach ferryd at " + target + ": ", 0), 0u)
        << args << ": " << said;
  }
  std::filesystem::remove_all(dir);
}

TEST_F(TopTest, LiveViewRefreshesInATerminalAndQuitsOnQ) {
  int rc = -1;
  Shell("command -v tmux", &rc);
  if (rc != 0) {
    GTEST_SKIP() << "tmux is not installed (deploy/install-deps.sh installs it): the live view "
                    "needs a real terminal";
  }
  // A private tmux server, so nothing of the user's is touched.
  const std::string tmux = "tmux -L ferry-top-test-" + std::to_string(getpid());
  // Written whole, then renamed: the test must never read the file between its creation and
  // the exit code's arrival.
  const std::string done = ::testing::TempDir() + "/top_test_done";
  std::filesystem::remove(done);
  const std::string cmd = FerryctlPath() +
                          " top --interval 0.2 --target=" + daemon_->unix_target() +
                          "; echo $? > " + done + ".tmp && mv " + done + ".tmp " + done;
  Shell(tmux + " new-session -d -s top -x 160 -y 40 '" + cmd + "'", &rc);
  ASSERT_EQ(rc, 0) << "tmux new-session failed";
  auto capture = [&] { return Shell(tmux + " capture-pane -p -t top"); };
  // Bounded waits for what the screen must come to show (no timing assertion: only how long
  // the test waits before it gives up).
  auto wait_for = [&](const std::string& text) {
    std::string screen;
    for (int i = 0; i < 100; ++i) {
      screen = capture();
      if (screen.find(text) != std::string::npos) return screen;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "the screen never showed '" << text << "':\n" << screen;
    return screen;
  };
  std::string screen = wait_for("sorted by device time");
  EXPECT_NE(screen.find("ferry top"), std::string::npos) << screen;
  screen = wait_for(" busy ");
  EXPECT_NE(screen.find(" idle "), std::string::npos) << screen;
  EXPECT_LT(screen.find(" busy "), screen.find(" idle ")) << screen;
  EXPECT_NE(screen.find(std::to_string(getuid())), std::string::npos) << screen;

  // It refreshes: a third session appears without a key pressed.
  ClientOptions late_options;
  late_options.client_name = "latecomer";
  auto late_client = Client::connect(daemon_->unix_target(), late_options);
  ASSERT_TRUE(late_client.ok());
  auto late = late_client->open_session();
  ASSERT_TRUE(late.ok());
  wait_for("latecomer");

  // m sorts by memory: the idle session's 4 KiB and the latecomer's nothing stay below busy;
  Shell(tmux + " send-keys -t top m");
  wait_for("sorted by memory");
  Shell(tmux + " send-keys -t top q");
  for (int i = 0; i < 100 && !std::filesystem::exists(done); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(ReadAll(done), "0\n") << "ferryctl top did not quit with 0 on q";
  Shell(tmux + " kill-server 2>/dev/null");
  ASSERT_TRUE(late->close().ok());
}

}  // namespace
}  // namespace ferry
