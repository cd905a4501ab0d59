// libferry's ParallelCopy (client/src/parallel_copy.h): every byte lands where memcpy would
// put it, whatever the size and thread count, with several callers at once, and in a forked
// child (where the helper threads do not exist).
#include "parallel_copy.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>
#include <thread>
#include <vector>

#include "sanitizer_build.h"

namespace ferry::internal {
namespace {

std::vector<char> Pattern(uint64_t n, uint32_t seed) {
  std::vector<char> v(n);
  uint32_t x = seed;
  for (auto& c : v) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return v;
}

TEST(ParallelCopyTest, EveryByteArrivesForEverySizeAndThreadCount) {
  for (uint64_t n :
       std::initializer_list<uint64_t>{0, 1, 4095, kParallelCopyMinBytes - 1, kParallelCopyMinBytes,
                                       (1ull << 20) + 3, (2ull << 20) - 1, (8ull << 20) + 12345}) {
    for (int threads : {1, 2, 3, 4, 16}) {
      auto src = Pattern(n, static_cast<uint32_t>(n + threads));
      // A guard byte on each side catches a piece written out of place.
      std::vector<char> dst(n + 2, '\x5a');
      ParallelCopy(dst.data() + 1, src.data(), n, threads);
      ASSERT_EQ(dst.front(), '\x5a') << n << " bytes, " << threads << " threads";
      ASSERT_EQ(dst.back(), '\x5a') << n << " bytes, " << threads << " threads";
      // (memcmp's pointers must be valid even for 0 bytes; an empty vector's data() is null.)
      ASSERT_TRUE(n == 0 || std::memcmp(dst.data() + 1, src.data(), n) == 0)
          << n << " bytes, " << threads << " threads";
    }
  }
}

TEST(ParallelCopyTest, CallersAtOnceEachGetTheirOwnBytes) {
  constexpr uint64_t kBytes = (6ull << 20) + 777;
  constexpr int kCallers = 4;
  std::vector<std::vector<char>> src, dst;
  for (int i = 0; i < kCallers; ++i) {
    src.push_back(Pattern(kBytes, 100 + i));
    dst.emplace_back(kBytes, 0);
  }
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int round = 0; round < 8; ++round) ParallelCopy(dst[i].data(), src[i].data(), kBytes, 4);
    });
  }
  for (auto& t : callers) t.join();
  for (int i = 0; i < kCallers; ++i) EXPECT_EQ(dst[i], src[i]) << "caller " << i;
}

TEST(ParallelCopyTest, AForkedChildCopiesWithoutTheParentsThreads) {
#ifdef FERRY_UNDER_TSAN
  GTEST_SKIP() << "ThreadSanitizer does not support starting threads in a child forked from a "
                  "multithreaded process, which this test does on purpose";
#endif
  constexpr uint64_t kBytes = 4ull << 20;
  auto src = Pattern(kBytes, 7);
  std::vector<char> warm(kBytes);
  ParallelCopy(warm.data(), src.data(), kBytes, 4);  // the parent's helper threads exist now
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char> dst(kBytes, 0);
    ParallelCopy(dst.data(), src.data(), kBytes, 4);
    _exit(std::memcmp(dst.data(), src.data(), kBytes) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's copy was wrong";
}

}  // namespace
}  // namespace ferry::internal
