// The README's example program runs against a real ferryd and prints the right sum.
#include <gtest/gtest.h>

#include "ferryd_process.h"

namespace ferry {
namespace {

TEST(ExampleTest, QuickstartRunsAgainstADaemon) {
  testing::FerrydProcess daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  pid_t pid = testing::Spawn(testing::ProgramPath("FERRY_QUICKSTART", FERRY_QUICKSTART_PATH),
                             {daemon.unix_target()});
  ASSERT_GT(pid, 0);
  int status = testing::WaitExit(pid, std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(daemon.WaitIdle().live_tensors(), 0u);
}

}  // namespace
}  // namespace ferry
