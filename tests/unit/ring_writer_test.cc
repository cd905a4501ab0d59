// RingWriter (libferry, client/src/ring_writer.h) against the daemon's SubmitRing
// (server/transport/submit_ring.h): what the client writes comes out whole, parseable and in
// order across the ring's end; a full ring refuses the write without writing anything; a
// message too large for the ring is left to the stream; the doorbell is rung only while the
// poller may sleep; a thread that announces its sleep on the completion board in the ring is
// woken by the board's next post (Open.board_sleeps_announced).
#include "ring_writer.h"

#include <gtest/gtest.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "transport/completion_board.h"
#include "transport/submit_ring.h"

namespace ferry::internal {
namespace {

using transport::SubmitRing;
using Wrote = RingWriter::Wrote;

struct Pair {
  std::unique_ptr<SubmitRing> ring;
  std::unique_ptr<RingWriter> writer;
};

// A daemon's ring and a client's writer over the same memory, as a session maps them.
Pair MakePair(uint64_t capacity = 4096) {
  Pair p;
  auto ring = SubmitRing::Create(capacity);
  EXPECT_TRUE(ring.ok()) << ring.status().ToString();
  p.ring = std::move(*ring);
  void* map =
      ::mmap(nullptr, p.ring->map_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, p.ring->memfd(), 0);
  EXPECT_NE(map, MAP_FAILED);
  static_assert(RingWriter::kHeaderBytes == SubmitRing::kHeaderBytes);
  p.writer = std::make_unique<RingWriter>(static_cast<char*>(map), capacity,
                                          ::dup(p.ring->doorbell_for_client()));
  return p;
}

v1::ClientMessage SubmitMessage(uint64_t sequence, uint64_t submit_id, size_t payload) {
  v1::ClientMessage m;
  m.set_sequence(sequence);
  auto* submit = m.mutable_submit();
  submit->set_submit_id(submit_id);
  auto* upload = submit->add_ops()->mutable_upload();
  upload->set_tensor(submit_id);
  upload->set_data(std::string(payload, static_cast<char>('a' + submit_id % 26)));
  return m;
}

v1::ClientMessage TakeMessage(SubmitRing& ring) {
  std::string record, why;
  EXPECT_EQ(ring.Take(&record, &why), SubmitRing::Took::kRecord) << why;
  v1::ClientMessage m;
  EXPECT_TRUE(m.ParseFromString(record)) << "a record is one whole ClientMessage";
  return m;
}

// Whether the doorbell (an eventfd the daemon never reads) was rung since the last look:
// the test reads and so resets its count, as the daemon does not.
bool DoorbellRung(int doorbell) {
  uint64_t rings = 0;
  return ::read(doorbell, &rings, sizeof(rings)) == sizeof(rings) && rings > 0;
}

TEST(RingWriterTest, MessagesComeOutWholeAndInOrderAcrossTheEnd) {
  Pair p = MakePair();
  uint64_t written = 0, taken = 0, record_bytes = 0;
  for (int round = 0; round < 200; ++round) {
    // Sizes that do not divide the ring: records wrap (skip markers) many times.
    for (int k = 0; k < 3; ++k) {
      v1::ClientMessage m = SubmitMessage(written + 1, written + 1, 50 + 37 * ((round + k) % 11));
      ASSERT_EQ(p.writer->Write(m), Wrote::kWritten);
      ++written;
      record_bytes += 8 + ((m.ByteSizeLong() + 7) & ~uint64_t{7});
    }
    while (p.ring->HasRecord()) {
      v1::ClientMessage m = TakeMessage(*p.ring);
      ++taken;
      EXPECT_EQ(m.sequence(), taken);
      ASSERT_TRUE(m.has_submit());
      EXPECT_EQ(m.submit().submit_id(), taken);
      ASSERT_EQ(m.submit().ops_size(), 1);
      const std::string& data = m.submit().ops(0).upload().data();
      EXPECT_EQ(data.find_first_not_of(static_cast<char>('a' + taken % 26)), std::string::npos)
          << "torn record " << taken;
    }
  }
  EXPECT_EQ(taken, written);
  EXPECT_GT(record_bytes, 20 * p.ring->capacity()) << "the test wraps the ring many times";
}

TEST(RingWriterTest, AFullRingRefusesWithoutWritingUntilTheDaemonTakes) {
  Pair p = MakePair();
  int fitted = 0;
  Wrote wrote;
  while ((wrote = p.writer->Write(SubmitMessage(fitted + 1, fitted + 1, 900))) == Wrote::kWritten) {
    ++fitted;
  }
  EXPECT_EQ(wrote, Wrote::kFull);
  EXPECT_GE(fitted, 3);
  // kFull wrote nothing: exactly the records that fitted come out.
  for (int k = 1; k <= fitted; ++k) EXPECT_EQ(TakeMessage(*p.ring).sequence(), uint64_t(k));
  EXPECT_FALSE(p.ring->HasRecord());
  // Taken records make room again.
  EXPECT_EQ(p.writer->Write(SubmitMessage(fitted + 1, fitted + 1, 900)), Wrote::kWritten);
  EXPECT_EQ(TakeMessage(*p.ring).sequence(), uint64_t(fitted + 1));
}

TEST(RingWriterTest, AMessageOverAQuarterOfTheRingIsLeftToTheStream) {
  Pair p = MakePair();
  EXPECT_EQ(p.writer->Write(SubmitMessage(1, 1, 2000)), Wrote::kTooLarge);
  EXPECT_FALSE(p.ring->HasRecord()) << "nothing was written";
  EXPECT_EQ(p.writer->Write(SubmitMessage(1, 1, 900)), Wrote::kWritten);
  EXPECT_EQ(TakeMessage(*p.ring).sequence(), 1u);
}

// A daemon that is gone (its doorbell closed, the ring still mapped by the client) makes a
// ring fail quietly: the client's process is never killed by SIGPIPE (SIGPIPE is at its
// default action here, so one would end this test binary). The doorbell is an eventfd, which
// raises none; a daemon of 2026-12-04 or 12-05 handed a socket, which libferry rings with
// MSG_NOSIGNAL.
TEST(RingWriterTest, RingingADaemonThatIsGoneRaisesNoSignal) {
  struct sigaction old_action {};
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ASSERT_EQ(::sigaction(SIGPIPE, &default_action, &old_action), 0);
  {
    Pair p = MakePair();
    p.ring->SetAsleep(true);
    ASSERT_EQ(p.writer->Write(SubmitMessage(1, 1, 10)), Wrote::kWritten);
    p.ring.reset();  // the daemon's side closed
    EXPECT_EQ(p.writer->Write(SubmitMessage(2, 2, 10)), Wrote::kWritten);
  }
  {
    auto ring = SubmitRing::Create(4096);
    ASSERT_TRUE(ring.ok());
    void* map = ::mmap(nullptr, (*ring)->map_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                       (*ring)->memfd(), 0);
    ASSERT_NE(map, MAP_FAILED);
    int ends[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, ends), 0);
    RingWriter writer(static_cast<char*>(map), 4096, ends[1]);  // a socket doorbell
    (*ring)->SetAsleep(true);
    ::close(ends[0]);  // that daemon's end closed
    EXPECT_EQ(writer.Write(SubmitMessage(1, 1, 10)), Wrote::kWritten)
        << "the record goes into the mapping; only the ring fails";
  }
  ::sigaction(SIGPIPE, &old_action, nullptr);
}

TEST(RingWriterTest, TheDoorbellRingsOnlyWhileThePollerMaySleep) {
  Pair p = MakePair();
  const int doorbell = p.ring->doorbell_to_watch();
  ASSERT_EQ(p.writer->Write(SubmitMessage(1, 1, 10)), Wrote::kWritten);
  EXPECT_FALSE(DoorbellRung(doorbell)) << "an awake poller needs no doorbell";
  p.ring->SetAsleep(true);
  ASSERT_EQ(p.writer->Write(SubmitMessage(2, 2, 10)), Wrote::kWritten);
  EXPECT_TRUE(DoorbellRung(doorbell));
  p.ring->SetAsleep(false);
  ASSERT_EQ(p.writer->Write(SubmitMessage(3, 3, 10)), Wrote::kWritten);
  EXPECT_FALSE(DoorbellRung(doorbell));
  for (uint64_t k = 1; k <= 3; ++k) EXPECT_EQ(TakeMessage(*p.ring).sequence(), k);
}

// A completion board that wakes its futex only while `ring`'s count of announced sleepers is
// not 0, and its page mapped read-only, as a client maps it. Check ok() first.
struct WatchedBoard {
  explicit WatchedBoard(const std::shared_ptr<SubmitRing>& ring) {
    auto made = transport::CompletionBoard::Create();
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return;
    board = std::move(*made);
    board->WakeOnlyAnnounced(
        std::shared_ptr<const std::atomic<uint32_t>>(ring, ring->board_sleepers()));
    page =
        ::mmap(nullptr, transport::CompletionBoard::kBytes, PROT_READ, MAP_SHARED, board->fd(), 0);
  }
  ~WatchedBoard() {
    if (ok()) ::munmap(page, transport::CompletionBoard::kBytes);
  }
  WatchedBoard(const WatchedBoard&) = delete;
  WatchedBoard& operator=(const WatchedBoard&) = delete;
  bool ok() const { return board && page != MAP_FAILED; }

  std::unique_ptr<transport::CompletionBoard> board;
  void* page = MAP_FAILED;
};

// A client thread that announces its sleep through `writer`, sleeps on `board`'s futex while
// the board reads `expected` (10 s at most), and takes its announcement back. Made once the
// sleep is announced.
class AnnouncedSleeper {
 public:
  AnnouncedSleeper(RingWriter& writer, const WatchedBoard& board, uint32_t expected)
      : thread_([this, &writer, page = board.page, expected] {
          writer.AnnounceBoardSleep(+1);
          announced_ = true;
          timespec timeout = {10, 0};
          const long r = ::syscall(SYS_futex, page, FUTEX_WAIT, expected, &timeout, nullptr, 0);
          result_ = r == 0 ? 0 : errno;
          writer.AnnounceBoardSleep(-1);
        }) {
    while (!announced_) std::this_thread::yield();
  }
  ~AnnouncedSleeper() {
    if (thread_.joinable()) thread_.join();
  }
  // Wait for the thread; 0 when its FUTEX_WAIT was woken, else its errno.
  int Join() {
    thread_.join();
    return result_;
  }

 private:
  std::atomic<bool> announced_{false};
  int result_ = -1;
  std::thread thread_;  // last: it uses the members above
};

// The daemon wakes the board's futex only while the client's count of sleepers in the ring is
// not 0. A sleeper that announced itself is never left asleep by a post: its FUTEX_WAIT is
// either woken (0) or sees the posted value and does not sleep (EAGAIN); a lost wake-up
// would show as ETIMEDOUT after 10 s. Half the rounds post while the sleeper is most likely
// in the kernel, half as it gets there.
TEST(RingWriterTest, ASleepAnnouncedInTheRingIsWokenByTheBoardsPost) {
  Pair p = MakePair();
  std::shared_ptr<SubmitRing> ring = std::move(p.ring);
  WatchedBoard watched(ring);
  ASSERT_TRUE(watched.ok());
  for (uint32_t round = 1; round <= 20; ++round) {
    AnnouncedSleeper sleeper(*p.writer, watched, /*expected=*/round - 1);
    EXPECT_EQ(ring->board_sleepers()->load(), 1u) << "the daemon sees what the client announced";
    if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    watched.board->Post(round, true);
    const int result = sleeper.Join();
    EXPECT_TRUE(result == 0 || result == EAGAIN)
        << "round " << round << ": " << std::strerror(result);
  }
  EXPECT_EQ(ring->board_sleepers()->load(), 0u);
}

// The count is the client's to write, anything at all: a client that writes garbage into its
// own ring's count (here, the largest value) still has its board posted and woken, and
// decides nothing about another session's board, whose sleeper, announced in its own ring, is
// woken as ever.
TEST(RingWriterTest, AClientsSleepersCountDecidesOnlyItsOwnBoardsWakes) {
  Pair hostile = MakePair(), other = MakePair();
  std::shared_ptr<SubmitRing> hostile_ring = std::move(hostile.ring);
  std::shared_ptr<SubmitRing> other_ring = std::move(other.ring);
  WatchedBoard hostile_board(hostile_ring), other_board(other_ring);
  ASSERT_TRUE(hostile_board.ok() && other_board.ok());
  hostile.writer->AnnounceBoardSleep(-1);  // 0 - 1: the largest count
  ASSERT_EQ(hostile_ring->board_sleepers()->load(), UINT32_MAX);
  AnnouncedSleeper sleeper(*other.writer, other_board, /*expected=*/0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  for (uint64_t id = 1; id <= 100; ++id) hostile_board.board->Post(id, true);
  other_board.board->Post(1, true);
  const int result = sleeper.Join();
  EXPECT_TRUE(result == 0 || result == EAGAIN) << std::strerror(result);
  EXPECT_EQ(other_ring->board_sleepers()->load(), 0u);
}

}  // namespace
}  // namespace ferry::internal
