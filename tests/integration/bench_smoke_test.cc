// Smoke test of ferry-bench: run it in quick mode, with the in-process baseline, against a
// real host-backend ferryd, and check that it succeeds and writes a sane JSON report.
//
// Part of ferry_integration_tests; tests/CMakeLists.txt defines FERRY_BENCH_PATH when the
// build has ferry-bench (FERRY_BUILD_BENCH, on by default). Without it the test skips and
// says why.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>

#include "ferryd_process.h"

namespace ferry {
namespace {

#ifndef FERRY_BENCH_PATH

TEST(BenchSmokeTest, QuickRunWithBaselineWritesJson) {
  GTEST_SKIP() << "ferry-bench is not part of this build (FERRY_BUILD_BENCH=OFF), so "
                  "FERRY_BENCH_PATH is not defined: nothing to run";
}

#else

using testing::FerrydProcess;

/// A minimal JSON syntax check (objects, arrays, strings, numbers, literals): return true
/// when `text` is exactly one well-formed JSON value.
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& text) : s_(text) {}
  bool Check() {
    if (!Value()) return false;
    Space();
    return i_ == s_.size();
  }

 private:
  void Space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Eat(char c) {
    Space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool String() {
    if (!Eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') i_ += s_[i_] == '\\' ? 2 : 1;
    return i_++ < s_.size();
  }
  bool Value() {
    Space();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      if (Eat('}')) return true;
      do {
        if (!String() || !Eat(':') || !Value()) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      ++i_;
      if (Eat(']')) return true;
      do {
        if (!Value()) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') return String();
    for (const char* lit : {"true", "false", "null"}) {
      if (s_.compare(i_, std::strlen(lit), lit) == 0) {
        i_ += std::strlen(lit);
        return true;
      }
    }
    size_t start = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) ||
                              std::strchr("+-.eE", s_[i_]) != nullptr)) {
      ++i_;
    }
    return i_ > start;
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(BenchSmokeTest, QuickRunWithBaselineWritesJson) {
  // The concurrency scenario's pending route holds one 64 MiB slab per session: 64 sessions
  // need more than the default 1 GiB pinned budget (slabs are made on demand).
  FerrydProcess daemon({"--pinned-budget", "4352M"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  char tmpl[] = "/tmp/ferry-bench-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  std::string json = dir + "/bench.json", svg = dir + "/bench.svg", log = dir + "/bench.log";

  pid_t pid = testing::Spawn(
      testing::ProgramPath("FERRY_TEST_BENCH", FERRY_BENCH_PATH),
      {"--target", daemon.unix_target(), "--quick", "--baseline", "--json", json, "--svg", svg},
      log);
  ASSERT_GT(pid, 0);
  int status = testing::WaitExit(pid, std::chrono::seconds(240));
  if (status == -1) {
    kill(pid, SIGKILL);
    testing::WaitExit(pid, std::chrono::seconds(5));
  }
  std::string output = ReadFile(log);
  ASSERT_NE(status, -1) << "ferry-bench did not finish; its output:\n" << output;
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << output;
  ASSERT_EQ(WEXITSTATUS(status), 0) << output;

  std::string text = ReadFile(json);
  ASSERT_FALSE(text.empty()) << output;
  EXPECT_TRUE(JsonChecker(text).Check()) << text;
  EXPECT_NE(text.find("\"machine\": {"), std::string::npos);
  for (const char* scenario : {"transfers", "latency", "throughput", "overlap", "concurrency",
                               "open_close", "sharing", "memory", "transports"}) {
    EXPECT_NE(text.find("\"" + std::string(scenario) + "\": ["), std::string::npos)
        << scenario << " missing from the JSON";
  }
  // Each line below names a row or table the output must hold (the whole output is printed
  // when one is missing).
  for (const char* row :
       {// The tables were printed, with the baseline and its backend named.
        "== transfers", "host backend",
        // Both transfer routes, prepared graph replay, the overlap arms and the daemon's
        // memory (the test's ferryd is found by SO_PEERCRED on its unix socket).
        "upload pending 8 MiB", "download blocking 8 MiB", "graph of 100 axpy, replayed",
        "overlapped (enqueue, work, wait)", "x longer arm", "sized to the in-process copy",
        // Concurrency on both routes, every pending row measured.
        "64 sessions, 1 MiB, blocking", "64 sessions, 1 MiB, pending",
        "64 sessions, pools excluded",
        // Sharing: both routes, and the blocking route against processes copying from
        // pageable memory.
        "2 processes, pinned", "2 processes, blocking vs pageable"}) {
    EXPECT_NE(output.find(row), std::string::npos) << "no '" << row << "' in\n" << output;
  }
  EXPECT_EQ(output.find("not measured"), std::string::npos) << output;
  EXPECT_NE(ReadFile(svg).find("(pending)"), std::string::npos);
  EXPECT_NE(ReadFile(svg).find("<svg"), std::string::npos);

  // Everything the bench opened on the daemon was released.
  EXPECT_EQ(daemon.WaitIdle().sessions_open(), 0u);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

#endif  // FERRY_BENCH_PATH

}  // namespace
}  // namespace ferry
