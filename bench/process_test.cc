// Tests of ferry-bench's child processes (process.h): which environment each child gets (the
// daemon under test is never an MPS client; MPS workers are), the workers' start-together
// protocol, and the private MPS control daemon's life cycle, against a stand-in
// nvidia-cuda-mps-control script (no GPU or MPS needed). Also ferry-bench itself where MPS
// cannot run: the tables still print, the MPS column says "n/a" and why.
//
// Built by bench/CMakeLists.txt as ferry_bench_process_test (FERRY_BENCH_PATH: the program).
#include "process.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ferry::bench {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// True while `pid` runs (exists and is not a zombie).
bool Alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

void WriteScript(const std::string& path, const std::string& body) {
  std::ofstream(path) << "#!/bin/bash\n" << body;
  chmod(path.c_str(), 0755);
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ferry-bench-process-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    ::unsetenv("CUDA_MPS_LOG_DIRECTORY");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

// The daemon under test inherits ferry-bench's environment except the MPS variables: were
// they set where ferry-bench runs, ferryd would otherwise become an MPS client.
TEST_F(ProcessTest, SpawnedDaemonNeverGetsTheMpsVariables) {
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/some-mps-pipe", 1);
  ::setenv("CUDA_MPS_LOG_DIRECTORY", "/tmp/some-mps-log", 1);
  ::setenv("FERRY_PROCESS_TEST_KEPT", "yes", 1);
  // A stand-in ferryd: records its environment, then writes its ready file and waits.
  std::string fake = dir_ + "/fake-ferryd";
  WriteScript(fake, R"(ready=""
while [[ $# -gt 0 ]]; do [[ "$1" == --ready-file ]] && ready="$2"; shift; done
env > "$(dirname "$ready")/env.txt"
echo "unix:$(dirname "$ready")/ferryd.sock" > "$ready"
exec sleep 60
)");
  SpawnedDaemon daemon;
  ASSERT_TRUE(daemon.Start(fake, dir_, false));
  daemon.Stop();
  std::string env = ReadFile(dir_ + "/env.txt");
  EXPECT_NE(env.find("FERRY_PROCESS_TEST_KEPT=yes"), std::string::npos) << env;
  EXPECT_EQ(env.find("CUDA_MPS_"), std::string::npos) << env;
}

// RunWorkers: every worker gets the go only once all are ready, each one's stdout after
// "ready" comes back with its exit status, and the environment changes reach the workers.
TEST_F(ProcessTest, RunWorkersStartsThemTogetherWithTheirEnvironment) {
  ::setenv("CUDA_MPS_LOG_DIRECTORY", "/tmp/inherited", 1);
  std::string worker = dir_ + "/worker";
  // Each worker counts the workers that were ready when it got the go.
  WriteScript(worker, "touch \"" + dir_ + "/ready.$$\"; echo ready; read -n 1 go || exit 3\n" +
                          "echo \"$(ls \"" + dir_ +
                          "\" | grep -c '^ready\\.') $CUDA_MPS_PIPE_DIRECTORY "
                          "${CUDA_MPS_LOG_DIRECTORY:-unset}\"\n");
  EnvChanges env{{{"CUDA_MPS_PIPE_DIRECTORY", "/tmp/pipe-x"}}, {"CUDA_MPS_LOG_DIRECTORY"}};
  auto out = RunWorkers(worker, 3, {}, env, std::chrono::seconds(30));
  ASSERT_EQ(out.size(), 3u);
  for (const WorkerOutput& w : out) {
    EXPECT_TRUE(w.ok()) << w.status;
    EXPECT_EQ(w.out, "3 /tmp/pipe-x unset\n");
  }
}

TEST_F(ProcessTest, RunWorkersReportsAWorkerThatFailsToSetUp) {
  std::string worker = dir_ + "/worker";
  WriteScript(worker, "echo 'error no device'; exit 4\n");
  auto out = RunWorkers(worker, 2, {}, {}, std::chrono::seconds(30));
  ASSERT_EQ(out.size(), 2u);
  for (const WorkerOutput& w : out) {
    EXPECT_FALSE(w.ok());
    EXPECT_TRUE(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 4) << w.status;
  }
}

// A stand-in for nvidia-cuda-mps-control: -d forks a daemon that makes the control pipe in
// $CUDA_MPS_PIPE_DIRECTORY and exits on "quit"; without -d, stdin goes to the pipe.
constexpr char kFakeMpsControl[] = R"(d="$CUDA_MPS_PIPE_DIRECTORY"
if [[ "${1:-}" == -d ]]; then
  [[ -d "$d" && -d "$CUDA_MPS_LOG_DIRECTORY" ]] || exit 5
  (
    exec </dev/null >/dev/null 2>&1
    mkfifo "$d/control"
    echo $BASHPID > "$d/nvidia-cuda-mps-control.pid"
    while true; do
      if read -r cmd < "$d/control"; then
        echo "$cmd" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
        [[ "$cmd" == quit ]] && { sleep 0.2; exit 0; }
      fi
    done
  ) &
  exit 0
fi
cat > "$d/control"
)";

TEST_F(ProcessTest, MpsDaemonStartsWithPrivateDirectoriesAndQuits) {
  std::string control = dir_ + "/nvidia-cuda-mps-control";
  WriteScript(control, kFakeMpsControl);
  EXPECT_EQ(MpsDaemon::FindControl(control), control);
  EXPECT_EQ(MpsDaemon::FindControl(dir_ + "/missing"), "");

  MpsDaemon mps;
  std::string why;
  ASSERT_TRUE(mps.Start(control, &why)) << why;
  EnvChanges env = mps.env();
  ASSERT_EQ(env.set.size(), 2u);
  std::string pipe_dir = env.set[0].second, log_dir = env.set[1].second;
  EXPECT_EQ(env.set[0].first, "CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(env.set[1].first, "CUDA_MPS_LOG_DIRECTORY");
  EXPECT_TRUE(std::filesystem::exists(pipe_dir + "/control"));
  pid_t pid = mps.pid();
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(Alive(pid));
  // The MPS variables were set for the daemon only, never in this process.
  EXPECT_EQ(std::getenv("CUDA_MPS_PIPE_DIRECTORY"), nullptr);

  mps.Stop();
  EXPECT_FALSE(mps.running());
  EXPECT_FALSE(Alive(pid)) << "the control daemon is still running after Stop()";
  EXPECT_FALSE(std::filesystem::exists(pipe_dir));
  EXPECT_FALSE(std::filesystem::exists(log_dir));
}

TEST_F(ProcessTest, MpsDaemonThatFailsToStartLeavesNothing) {
  std::string control = dir_ + "/nvidia-cuda-mps-control";
  WriteScript(control, "echo 'cannot start: no GPU' >&2; exit 1\n");
  MpsDaemon mps;
  std::string why;
  EXPECT_FALSE(mps.Start(control, &why));
  EXPECT_NE(why.find("cannot start: no GPU"), std::string::npos) << why;
  EXPECT_FALSE(mps.running());
}

#ifdef FERRY_BENCH_PATH
// Without a GPU (or without MPS) --baseline-mps still runs every table; the MPS column
// reads n/a and the notes say why. The fault scenario says it needs a GPU.
TEST_F(ProcessTest, BenchWithoutMpsPrintsNotAvailableWithTheReason) {
  std::string log = dir_ + "/bench.log";
  Child c = SpawnChild(
      FERRY_BENCH_PATH,
      {"--baseline-mps", "--baseline-backend", "host", "--quick", "--scenario", "latency",
       "--scenario", "sharing", "--scenario", "fault", "--mps-control", dir_ + "/missing"},
      false, false, log);
  ASSERT_GT(c.pid, 0);
  int status = WaitChild(c.pid, std::chrono::seconds(120));
  if (status == -1) kill(c.pid, SIGKILL);
  std::string output = ReadFile(log);
  ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("MPS arm: n/a: no CUDA baseline (the baseline runs on the host"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find(dir_ + "/missing is not an executable file"), std::string::npos) << output;
  EXPECT_NE(output.find("== latency"), std::string::npos) << output;
  EXPECT_NE(output.find("== sharing"), std::string::npos) << output;
  EXPECT_NE(output.find("* MPS: n/a: "), std::string::npos) << output;
  EXPECT_NE(output.find("skipped: needs a GPU"), std::string::npos) << output;
  // The MPS column is there, and holds n/a.
  std::istringstream lines(output);
  std::string line;
  bool header = false, na = false;
  while (std::getline(lines, line)) {
    header |= line.rfind("case", 0) == 0 && line.find("MPS") != std::string::npos;
    na |= line.rfind("fill 1 elt, synchronize()", 0) == 0 && line.find("n/a") != std::string::npos;
  }
  EXPECT_TRUE(header) << output;
  EXPECT_TRUE(na) << output;
}
#endif

}  // namespace
}  // namespace ferry::bench
