// SubmitRing and RingPoller (server/pool): records come out in order and whole, across the
// ring's end; whatever a client writes that breaks the layout breaks the ring, typed, and
// never makes the daemon read outside it; the poller hands one record per Arm, sleeps, and
// wakes for a doorbell.
#include "transport/submit_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "transport/ring_poller.h"

namespace ferry::transport {
namespace {

using Took = SubmitRing::Took;

// The client's side of a ring, written from the layout in submit_ring.h (as libferry does).
class ClientSide {
 public:
  explicit ClientSide(const SubmitRing& ring) : capacity_(ring.capacity()) {
    void* p =
        ::mmap(nullptr, ring.map_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ring.memfd(), 0);
    EXPECT_NE(p, MAP_FAILED);
    map_ = static_cast<char*>(p);
    doorbell_ = ring.doorbell_for_client();
  }
  ~ClientSide() { ::munmap(map_, SubmitRing::kHeaderBytes + capacity_); }

  // Write one record (false: no room); ring the doorbell when the poller is asleep.
  bool Write(const std::string& bytes) {
    const uint64_t need = 8 + ((bytes.size() + 7) & ~uint64_t{7});
    uint64_t at = head_ % capacity_;
    const uint64_t skip = at + need > capacity_ ? capacity_ - at : 0;
    if (head_ + skip + need - Tail() > capacity_) return false;
    if (skip) {
      Put32(at, SubmitRing::kSkipToStart);
      head_ += skip;
      at = 0;
    }
    Put32(at, static_cast<uint32_t>(bytes.size()));
    Put32(at + 4, 0);
    std::memcpy(Data() + at + 8, bytes.data(), bytes.size());
    head_ += need;
    SetHead(head_);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (Asleep()) {
      const uint64_t one = 1;
      EXPECT_EQ(::write(doorbell_, &one, sizeof(one)), 8);
    }
    return true;
  }
  void SetHead(uint64_t head) { Word64(SubmitRing::kHeadOffset)->store(head); }
  void Put32(uint64_t at, uint32_t v) { std::memcpy(Data() + at, &v, 4); }
  uint64_t Tail() { return Word64(SubmitRing::kTailOffset)->load(); }
  bool Asleep() {
    return reinterpret_cast<std::atomic<uint32_t>*>(map_ + SubmitRing::kAsleepOffset)->load();
  }
  uint64_t head() const { return head_; }

 private:
  char* Data() { return map_ + SubmitRing::kHeaderBytes; }
  std::atomic<uint64_t>* Word64(uint64_t offset) {
    return reinterpret_cast<std::atomic<uint64_t>*>(map_ + offset);
  }
  char* map_ = nullptr;
  uint64_t capacity_;
  int doorbell_ = -1;
  uint64_t head_ = 0;
};

std::unique_ptr<SubmitRing> MakeRing(uint64_t capacity = 4096) {
  auto ring = SubmitRing::Create(capacity);
  EXPECT_TRUE(ring.ok()) << ring.status().ToString();
  return std::move(*ring);
}

TEST(SubmitRingTest, CapacityMustBeAPowerOfTwoInRange) {
  EXPECT_FALSE(SubmitRing::Create(0).ok());
  EXPECT_FALSE(SubmitRing::Create(2048).ok());
  EXPECT_FALSE(SubmitRing::Create(12288).ok());
  EXPECT_FALSE(SubmitRing::Create(32ull << 20).ok());
  EXPECT_TRUE(SubmitRing::Create(64 << 10).ok());
}

TEST(SubmitRingTest, RecordsComeOutInOrderAcrossTheEndAndTailIsPublished) {
  auto ring = MakeRing();
  ClientSide client(*ring);
  std::string record, why;
  EXPECT_EQ(ring->Take(&record, &why), Took::kEmpty);
  EXPECT_FALSE(ring->HasRecord());
  // Records of sizes that do not divide the ring: they wrap (skip markers) many times.
  uint64_t written = 0, taken = 0;
  for (int round = 0; round < 200; ++round) {
    for (int k = 0; k < 3; ++k) {
      std::string bytes(100 + 37 * ((round + k) % 11), static_cast<char>('a' + written % 26));
      if (!client.Write(bytes)) break;
      ++written;
    }
    while (ring->HasRecord()) {
      ASSERT_EQ(ring->Take(&record, &why), Took::kRecord) << why;
      ASSERT_FALSE(record.empty());
      EXPECT_EQ(record.front(), static_cast<char>('a' + taken % 26));
      EXPECT_EQ(record.find_first_not_of(record.front()), std::string::npos) << "torn record";
      ++taken;
    }
    EXPECT_EQ(client.Tail(), client.head()) << "the daemon publishes how far it took";
  }
  EXPECT_EQ(taken, written);
  EXPECT_GT(client.head(), 20 * ring->capacity()) << "the test wraps the ring many times";
}

TEST(SubmitRingTest, AFullRingRefusesTheWriterUntilTaken) {
  auto ring = MakeRing();
  ClientSide client(*ring);
  const std::string bytes(1000, 'x');
  int fitted = 0;
  while (client.Write(bytes)) ++fitted;
  EXPECT_EQ(fitted, 4);  // 4 × 1008 bytes in 4096
  std::string record, why;
  ASSERT_EQ(ring->Take(&record, &why), Took::kRecord);
  EXPECT_TRUE(client.Write(bytes));
}

// Each way a client can break the layout: the ring reports it (and keeps reporting it), and
// takes nothing more.
TEST(SubmitRingTest, WhatBreaksTheLayoutBreaksTheRingForGood) {
  struct Case {
    const char* what;
    std::function<void(ClientSide&)> write;
  };
  const Case cases[] = {
      {"head past a whole ring", [](ClientSide& c) { c.SetHead(4096 + 8); }},
      {"head not a multiple of 8", [](ClientSide& c) { c.SetHead(12); }},
      {"head behind tail (wrapped)", [](ClientSide& c) { c.SetHead(~uint64_t{0} - 7); }},
      {"length past head",
       [](ClientSide& c) {
         c.Put32(0, 100);
         c.SetHead(64);
       }},
      {"length past the end of the ring",
       [](ClientSide& c) {
         c.Put32(0, 5000);
         c.SetHead(4096);
       }},
      {"huge length",
       [](ClientSide& c) {
         c.Put32(0, 0xFFFFFFF0u);
         c.SetHead(16);
       }},
      {"skip marker past head",
       [](ClientSide& c) {
         c.Put32(0, SubmitRing::kSkipToStart);
         c.SetHead(8);
       }},
  };
  for (const Case& c : cases) {
    auto ring = MakeRing();
    ClientSide client(*ring);
    c.write(client);
    std::string record = "untouched", why;
    EXPECT_EQ(ring->Take(&record, &why), Took::kBroken) << c.what;
    EXPECT_NE(why.find("submit ring"), std::string::npos) << c.what << ": " << why;
    EXPECT_EQ(record, "untouched") << c.what;
    EXPECT_FALSE(ring->HasRecord()) << c.what;
    std::string again;
    EXPECT_EQ(ring->Take(&record, &again), Took::kBroken) << c.what;
    EXPECT_EQ(again, why) << c.what;
  }
}

TEST(SubmitRingTest, ARecordIsCopiedOutBeforeTheClientCanChangeIt) {
  auto ring = MakeRing();
  ClientSide client(*ring);
  ASSERT_TRUE(client.Write("first"));
  std::string record, why;
  ASSERT_EQ(ring->Take(&record, &why), Took::kRecord);
  client.Put32(8, 0x58585858);  // overwrite the taken record's bytes
  EXPECT_EQ(record, "first");
}

// A registration gets one record per Arm, in order; nothing before the first Arm.
// The client's doorbell is a descriptor the daemon never reads: whatever the client does with
// it (makes it blocking, fills it) the poller's ClearDoorbell returns at once, and the doorbell
// still wakes the poller's epoll (through the read end, which is never handed out).
TEST(SubmitRingTest, AClientsDoorbellCannotMakeTheDaemonsReadBlock) {
  auto made = SubmitRing::Create(4096);
  ASSERT_TRUE(made.ok());
  SubmitRing& ring = **made;
  const int client_end = ::dup(ring.doorbell_for_client());  // as SCM_RIGHTS hands it
  ASSERT_GE(client_end, 0);
  EXPECT_NE(ring.doorbell_to_watch(), ring.doorbell_for_client());
  const int flags = ::fcntl(client_end, F_GETFL);
  ASSERT_EQ(::fcntl(client_end, F_SETFL, flags & ~O_NONBLOCK), 0);
  auto clear = [&ring, client_end] {
    auto cleared = std::async(std::launch::async, [&ring] { ring.ClearDoorbell(); });
    if (cleared.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return true;
    const uint64_t unblock = 1;  // so that the stuck read returns and the test ends
    (void)!::write(client_end, &unblock, sizeof(unblock));
    return false;
  };
  ASSERT_TRUE(clear()) << "ClearDoorbell blocked on a doorbell that was never rung";
  const uint64_t one = 1;
  ASSERT_EQ(::write(client_end, &one, sizeof(one)), 8);
  pollfd p = {ring.doorbell_to_watch(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 1) << "a ring is readable on the end the poller watches";
  ASSERT_TRUE(clear());
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "cleared";
  // A client that rings without pause fills its end; only its own sends block then.
  ASSERT_EQ(::fcntl(client_end, F_SETFL, flags | O_NONBLOCK), 0);
  int rings = 0;
  while (::write(client_end, &one, sizeof(one)) == 8 && rings < 1'000'000) ++rings;
  EXPECT_LT(rings, 1'000'000) << "the doorbell never filled";
  ASSERT_TRUE(clear());
  ASSERT_TRUE(clear()) << "a second clear, on what the first left";
  ::close(client_end);
}

TEST(RingPollerTest, HandsOneRecordPerArm) {
  auto poller = RingPoller::Start(std::chrono::microseconds(100));
  ASSERT_TRUE(poller.ok());
  std::shared_ptr<SubmitRing> ring = MakeRing();
  ClientSide client(*ring);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got;
  auto reg = (*poller)->Add(ring, [&](RingPoller::Taken t) {
    EXPECT_TRUE(t.broken.empty());
    EXPECT_EQ(t.records.size(), 1u);
    std::lock_guard lock(mu);
    for (std::string& r : t.records) got.push_back(std::move(r));
    cv.notify_all();
  });
  EXPECT_EQ((*poller)->rings(), 1u);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client.Write("m" + std::to_string(i)));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(got.empty()) << "taken before Arm";
  }
  for (size_t i = 0; i < 5; ++i) {
    reg->Arm();
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return got.size() == i + 1; }));
    EXPECT_EQ(got[i], "m" + std::to_string(i));
  }
  EXPECT_EQ((*poller)->records_total(), 5u);
  reg->Remove();
  EXPECT_EQ((*poller)->rings(), 0u);
}

// Arm(n) lets the poller take up to n records, handed over in one call in ring order: those
// already in the ring, never more than n; the rest wait for the next Arm.
TEST(RingPollerTest, ArmedForManyHandsWhatIsThereUpToTheCountInOneCall) {
  auto poller = RingPoller::Start(std::chrono::microseconds(100));
  ASSERT_TRUE(poller.ok());
  std::shared_ptr<SubmitRing> ring = MakeRing();
  ClientSide client(*ring);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::string>> calls;
  auto reg = (*poller)->Add(ring, [&](RingPoller::Taken t) {
    EXPECT_TRUE(t.broken.empty());
    std::lock_guard lock(mu);
    calls.push_back(std::move(t.records));
    cv.notify_all();
  });
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client.Write("m" + std::to_string(i)));
  reg->Arm(3);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return calls.size() == 1; }));
    EXPECT_EQ(calls[0], (std::vector<std::string>{"m0", "m1", "m2"}));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(calls.size(), 1u) << "taken past the count before the next Arm";
  }
  reg->Arm(10);  // two are there: both, in one call
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return calls.size() == 2; }));
    EXPECT_EQ(calls[1], (std::vector<std::string>{"m3", "m4"}));
  }
  EXPECT_EQ((*poller)->records_total(), 5u);
  reg->Remove();
}

// After its spin the poller sleeps, marking the rings asleep; a client's doorbell then wakes
// it. A removed registration's handler is not called again.
TEST(RingPollerTest, SleepsAndWakesForTheDoorbellAndStopsAfterRemove) {
  auto poller = RingPoller::Start(std::chrono::microseconds(50));
  ASSERT_TRUE(poller.ok());
  std::shared_ptr<SubmitRing> ring = MakeRing();
  ClientSide client(*ring);
  std::atomic<int> calls{0};
  std::shared_ptr<RingPoller::Registration> reg;
  reg = (*poller)->Add(ring, [&](RingPoller::Taken t) {
    EXPECT_TRUE(t.broken.empty()) << t.broken;
    calls.fetch_add(1);
    reg->Arm();
  });
  reg->Arm();
  for (int i = 0; i < 200 && !client.Asleep(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(client.Asleep()) << "the poller never went to sleep";
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client.Write("wake"));
    for (int k = 0; k < 500 && calls.load() < i + 1; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(calls.load(), i + 1) << "the doorbell did not wake the poller";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // asleep again
  }
  reg->Remove();
  ASSERT_TRUE(client.Write("after remove"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), 3);
}

// A client that writes without ringing the doorbell (a raw client may) is still served, once
// the poller's bounded sleep ends.
TEST(RingPollerTest, ARecordWrittenWithoutTheDoorbellIsTakenAfterTheSleep) {
  auto poller = RingPoller::Start(std::chrono::microseconds(50));
  ASSERT_TRUE(poller.ok());
  std::shared_ptr<SubmitRing> ring = MakeRing();
  ClientSide client(*ring);
  std::atomic<int> calls{0};
  auto reg = (*poller)->Add(ring, [&](RingPoller::Taken) { calls.fetch_add(1); });
  reg->Arm();
  for (int i = 0; i < 200 && !client.Asleep(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(client.Asleep());
  client.Put32(0, 5);  // a record of 5 bytes at 0, head stored, no doorbell
  client.SetHead(16);
  for (int i = 0; i < 400 && calls.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(calls.load(), 1) << "not taken within 2 s (the poller sleeps at most "
                             << RingPoller::kSleepMax.count() << " ms)";
  reg->Remove();
}

TEST(RingPollerTest, ABrokenRingIsReportedOnce) {
  auto poller = RingPoller::Start(std::chrono::microseconds(100));
  ASSERT_TRUE(poller.ok());
  std::shared_ptr<SubmitRing> ring = MakeRing();
  ClientSide client(*ring);
  std::atomic<int> broken{0};
  std::shared_ptr<RingPoller::Registration> reg;
  reg = (*poller)->Add(ring, [&](RingPoller::Taken t) {
    EXPECT_FALSE(t.broken.empty());
    broken.fetch_add(1);
    reg->Arm();  // armed again: a broken ring has nothing more to hand over
  });
  reg->Arm();
  client.SetHead(3);
  for (int i = 0; i < 500 && broken.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(broken.load(), 1);
  reg->Remove();
}

}  // namespace
}  // namespace ferry::transport
