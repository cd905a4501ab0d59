// ChannelStock (server/transport): every Take hands out a board and a ring no one had
// before, fresh (nothing posted, nothing written); the stock refills itself through
// run_later up to its depth, and an empty stock still answers a Take.
#include "transport/channel_stock.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace ferry::transport {
namespace {

// The inode of an fd: two memfds are the same memory only if their inodes are equal.
ino_t Inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

TEST(ChannelStockTest, EveryTakeIsFreshAndTheStockRefillsToItsDepth) {
  std::vector<std::function<void()>> later;  // run by the test, as the io threads would
  auto stock = ChannelStock::Create(
      4096, 3, [&](std::function<void()> fn) { later.push_back(std::move(fn)); });
  EXPECT_EQ(stock->ready(), 3u) << "made ahead at creation";

  std::set<ino_t> seen;
  std::vector<ChannelStock::Channels> taken;
  for (int i = 0; i < 5; ++i) {  // more than the depth: the last ones are made by Take
    ChannelStock::Channels c = stock->Take();
    ASSERT_TRUE(c.board.ok()) << c.board.status().ToString();
    ASSERT_TRUE(c.ring.ok()) << c.ring.status().ToString();
    EXPECT_TRUE(seen.insert(Inode((*c.board)->fd())).second) << "a board handed out twice";
    EXPECT_TRUE(seen.insert(Inode((*c.ring)->memfd())).second) << "a ring handed out twice";
    EXPECT_EQ((*c.ring)->capacity(), 4096u);
    // Nothing in it: the ring has no record and a fresh board says nothing completed.
    std::string record, why;
    EXPECT_EQ((*c.ring)->Take(&record, &why), SubmitRing::Took::kEmpty);
    taken.push_back(std::move(c));
  }
  EXPECT_EQ(stock->ready(), 0u);
  ASSERT_EQ(later.size(), 1u) << "one refill posted at a time";
  later[0]();
  EXPECT_EQ(stock->ready(), 3u);
  for (int i = 0; i < 3; ++i) {
    ChannelStock::Channels c = stock->Take();
    ASSERT_TRUE(c.board.ok() && c.ring.ok());
    EXPECT_TRUE(seen.insert(Inode((*c.board)->fd())).second);
    EXPECT_TRUE(seen.insert(Inode((*c.ring)->memfd())).second);
  }
  EXPECT_EQ(later.size(), 2u) << "the next refill is posted once the last one has run";
}

TEST(ChannelStockTest, WithoutRingsTakesGiveBoardsAndSayWhyThereIsNoRing) {
  auto stock = ChannelStock::Create(0, 1, [](std::function<void()> fn) { fn(); });
  for (int i = 0; i < 3; ++i) {
    ChannelStock::Channels c = stock->Take();
    EXPECT_TRUE(c.board.ok());
    EXPECT_FALSE(c.ring.ok());
  }
  EXPECT_EQ(stock->ready(), 1u) << "run_later ran the refill at once";
}

// Descriptors this process has open: a board and a ring hold four between them.
size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

// The posted refill holds the stock weakly: it neither keeps the stock alive nor, once the
// stock is gone, makes anything (no new descriptors).
TEST(ChannelStockTest, ARefillAfterTheStockIsGoneDoesNothing) {
  std::function<void()> refill;
  std::weak_ptr<ChannelStock> gone;
  {
    auto stock =
        ChannelStock::Create(4096, 1, [&](std::function<void()> fn) { refill = std::move(fn); });
    gone = stock;
    (void)stock->Take();
  }
  ASSERT_TRUE(refill);
  EXPECT_TRUE(gone.expired()) << "the posted refill keeps the stock alive";
  const size_t before = OpenDescriptors();
  refill();
  EXPECT_EQ(OpenDescriptors(), before) << "the refill made a board or a ring";
}

}  // namespace
}  // namespace ferry::transport
