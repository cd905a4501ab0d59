// The randomness behind slab tokens (transport::FillRandom): a source that fails hard, or keeps
// asking to be retried, ends in a typed error instead of a loop that never returns.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "transport/slab_broker.h"

namespace ferry::transport {
namespace {

int calls = 0;

ssize_t FailsWithEio(void*, size_t, unsigned int) {
  ++calls;
  errno = EIO;
  return -1;
}
ssize_t AlwaysInterrupted(void*, size_t, unsigned int) {
  ++calls;
  errno = EINTR;
  return -1;
}
ssize_t AlwaysAgain(void*, size_t, unsigned int) {
  ++calls;
  errno = EAGAIN;
  return -1;
}
// Interrupted twice, then gives one byte per call.
ssize_t SlowButWorks(void* buf, size_t, unsigned int) {
  if (++calls <= 2) {
    errno = EINTR;
    return -1;
  }
  static_cast<unsigned char*>(buf)[0] = 0xab;
  return 1;
}

TEST(FillRandomTest, HardErrorFailsAtOnce) {
  calls = 0;
  unsigned char out[16];
  Status s = FillRandom(out, sizeof(out), &FailsWithEio);
  EXPECT_EQ(s.kind(), ErrorKind::kUnavailable);
  EXPECT_NE(s.message().find(std::strerror(EIO)), std::string::npos) << s.message();
  EXPECT_EQ(calls, 1);
}

TEST(FillRandomTest, RetriesAreBounded) {
  unsigned char out[16];
  for (RandomSource source : {&AlwaysInterrupted, &AlwaysAgain}) {
    calls = 0;
    Status s = FillRandom(out, sizeof(out), source);
    EXPECT_EQ(s.kind(), ErrorKind::kUnavailable);
    EXPECT_EQ(calls, kRandomRetries + 1);
  }
}

TEST(FillRandomTest, InterruptedAndShortReadsStillFillEverything) {
  calls = 0;
  unsigned char out[16] = {};
  ASSERT_TRUE(FillRandom(out, sizeof(out), &SlowButWorks).ok());
  for (unsigned char c : out) EXPECT_EQ(c, 0xab);
  EXPECT_EQ(calls, 2 + 16);
}

TEST(FillRandomTest, TheSystemSourceWorks) {
  unsigned char a[16] = {}, b[16] = {};
  ASSERT_TRUE(FillRandom(a, sizeof(a)).ok());
  ASSERT_TRUE(FillRandom(b, sizeof(b)).ok());
  EXPECT_NE(std::memcmp(a, b, sizeof(a)), 0);  // 2^-128 to fail by chance
}

}  // namespace
}  // namespace ferry::transport
