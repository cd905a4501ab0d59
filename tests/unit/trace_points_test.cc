// The timeline trace points' recorder (common/include/ferry/trace_points.h).
#include "ferry/trace_points.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace ferry::trace {
namespace {

std::vector<Event> ReadEvents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Event> events(bytes.size() / sizeof(Event));
  if (!events.empty()) std::memcpy(events.data(), bytes.data(), events.size() * sizeof(Event));
  return events;
}

// Points recorded from two threads come out of Dump in FERRY_TRACE_FILE.<pid>, with their
// ids, their threads and steady-clock times that follow the order each thread recorded them.
TEST(TracePointsTest, PointsAreWrittenToTheFileAtDump) {
  char dir[] = "/tmp/ferry-trace-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string base = std::string(dir) + "/trace";
  ASSERT_EQ(::setenv("FERRY_TRACE_FILE", base.c_str(), 1), 0);
  Mark(kIssue, 7, 8);
  std::thread other([] {
    Mark(kTake, 7);
    Mark(kPost, 7);
  });
  other.join();
  Mark(kWait1, 7);
  Dump();
  const std::string path = base + "." + std::to_string(::getpid());
  const std::vector<Event> events = ReadEvents(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].point, kIssue);
  EXPECT_EQ(events[0].a, 7u);
  EXPECT_EQ(events[0].b, 8u);
  EXPECT_EQ(events[1].point, kTake);
  EXPECT_EQ(events[2].point, kPost);
  EXPECT_EQ(events[3].point, kWait1);
  EXPECT_EQ(events[0].tid, events[3].tid);
  EXPECT_EQ(events[1].tid, events[2].tid);
  EXPECT_NE(events[0].tid, events[1].tid);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_LE(events[i - 1].ns, events[i].ns);
  std::remove(path.c_str());
  ::rmdir(dir);
  ::unsetenv("FERRY_TRACE_FILE");
}

// FERRY_TRACE evaluates nothing unless the build has FERRY_TRACE_POINTS (the default: off).
TEST(TracePointsTest, TheMacroIsFreeUnlessTracePointsAreBuiltIn) {
  int evaluated = 0;
  auto id = [&] { return static_cast<uint64_t>(++evaluated); };
  FERRY_TRACE(kSeen, id());
  (void)id;
#if defined(FERRY_TRACE_POINTS) && FERRY_TRACE_POINTS
  EXPECT_EQ(evaluated, 1);
#else
  EXPECT_EQ(evaluated, 0);
#endif
}

}  // namespace
}  // namespace ferry::trace
