// SubmitRing and RingPoller (server/pool): records come out in order and whole, across the
// ring's end; whatever a client writes that breaks the layout breaks the ring, typed, and
// never makes the daemon read outside it; the poller hands one record per Arm, sleeps, and
// wakes for a doorbell.
#include "transport/submit_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "../integration/raw_protocol.h"
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

// What a registration hands over, one entry per call of its handler (each call's records,
// in ring order), for a test to wait on.
class HandOverRecorder {
 public:
  RingPoller::Handler Handler() {
    return [this](RingPoller::Taken t) {
      EXPECT_TRUE(t.broken.empty()) << t.broken;
      std::lock_guard lock(mu_);
      calls_.push_back(std::move(t.records));
      cv_.notify_all();
    };
  }
  // Waits (up to 5 s) until the handler has been called n times.
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return calls_.size() >= n; });
  }
  size_t calls() {
    std::lock_guard lock(mu_);
    return calls_.size();
  }
  // The records of call i (from 0); empty when there was none.
  std::vector<std::string> call(size_t i) {
    std::lock_guard lock(mu_);
    return i < calls_.size() ? calls_[i] : std::vector<std::string>{};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<std::string>> calls_;
};

// A poller (spinning for 100 us) with one ring registered, whose hand-overs `handed` records,
// and the client's side of that ring: where the Arm tests start. Check ok() first.
struct RecordedRing {
  RecordedRing() {
    if (!poller.ok()) return;
    ring = MakeRing();
    client = std::make_unique<ClientSide>(*ring);
    reg = (*poller)->Add(ring, handed.Handler());
  }
  bool ok() const { return poller.ok(); }

  HandOverRecorder handed;  // before the poller, which may call it until it stops
  Result<std::unique_ptr<RingPoller>> poller = RingPoller::Start(std::chrono::microseconds(100));
  std::shared_ptr<SubmitRing> ring;
  std::unique_ptr<ClientSide> client;
  std::shared_ptr<RingPoller::Registration> reg;
};

// Arm(n) lets the poller take up to n records, handed over in one call in ring order: those
// already in the ring, never more than n; the rest wait for the next Arm.
TEST(RingPollerTest, ArmedForManyHandsWhatIsThereUpToTheCountInOneCall) {
  RecordedRing r;
  ASSERT_TRUE(r.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(r.client->Write("m" + std::to_string(i)));
  r.reg->Arm(3);
  ASSERT_TRUE(r.handed.WaitFor(1));
  EXPECT_EQ(r.handed.call(0), (std::vector<std::string>{"m0", "m1", "m2"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(r.handed.calls(), 1u) << "taken past the count before the next Arm";
  r.reg->Arm(10);  // two are there: both, in one call
  ASSERT_TRUE(r.handed.WaitFor(2));
  EXPECT_EQ(r.handed.call(1), (std::vector<std::string>{"m3", "m4"}));
  EXPECT_EQ((*r.poller)->records_total(), 5u);
  r.reg->Remove();
}

// Arm(n, bytes) bounds what one hand-over holds by bytes too (a session arms for the in-flight
// bytes it may still hold): the poller takes records while those taken come to less than
// `bytes`, and always the first, so that a ring never stalls on a record larger than that.
TEST(RingPollerTest, ArmedForBytesTakesRecordsUntilTheyComeToThem) {
  RecordedRing r;
  ASSERT_TRUE(r.ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(r.client->Write("record" + std::to_string(i)));  // 7 B
  r.reg->Arm(32, 10);  // 7 bytes are less than 10: one more, then 14 are not
  ASSERT_TRUE(r.handed.WaitFor(1));
  EXPECT_EQ(r.handed.call(0), (std::vector<std::string>{"record0", "record1"}));
  r.reg->Arm(32, 1);  // less than one record: that one record all the same
  ASSERT_TRUE(r.handed.WaitFor(2));
  EXPECT_EQ(r.handed.call(1), (std::vector<std::string>{"record2"}));
  r.reg->Arm(2);  // no byte bound: the count's
  ASSERT_TRUE(r.handed.WaitFor(3));
  EXPECT_EQ(r.handed.call(2), (std::vector<std::string>{"record3", "record4"}));
  r.reg->Arm(32, 21);
  ASSERT_TRUE(r.handed.WaitFor(4));
  EXPECT_EQ(r.handed.call(3), (std::vector<std::string>{"record5"}));
  EXPECT_EQ(r.handed.calls(), 4u);
  r.reg->Remove();
}

// After its spin the poller sleeps, marking the rings asleep; a client's doorbell then wakes
// it, every time (the daemon never reads the doorbell: each ring is an edge), and nothing
// else would within the minute it may sleep here. A removed registration's handler is not
// called again.
TEST(RingPollerTest, SleepsAndWakesForTheDoorbellAndStopsAfterRemove) {
  auto poller = RingPoller::Start(std::chrono::microseconds(50), std::chrono::minutes(1));
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
    for (int k = 0; k < 5000 && calls.load() < i + 1; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(calls.load(), i + 1) << "the doorbell did not wake the poller";
    for (int k = 0; k < 2000 && !client.Asleep(); ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(client.Asleep()) << "the poller never went back to sleep";
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

// The doorbell is the client's too (one eventfd, handed over by SCM_RIGHTS), but the daemon
// only watches it: whatever a client does with it holds no thread of the daemon. It cannot
// carry a descriptor (a socket did, and the poller's read made the kernel close it on the
// poller's thread: a TCP socket with unsent bytes and SO_LINGER held every ring there), and a
// client that makes it blocking or writes its count full changes nothing for the poller,
// which goes on serving another session's ring, woken by that ring's doorbell alone.
TEST(RingPollerTest, WhatAClientDoesWithItsDoorbellHoldsNoThreadOfTheDaemon) {
  auto poller = RingPoller::Start(std::chrono::microseconds(50), std::chrono::minutes(1));
  ASSERT_TRUE(poller.ok());
  std::shared_ptr<SubmitRing> hostile = MakeRing(), other = MakeRing();
  ClientSide hostile_client(*hostile), other_client(*other);
  std::atomic<int> hostile_calls{0}, other_calls{0};
  std::shared_ptr<RingPoller::Registration> hostile_reg, other_reg;
  hostile_reg = (*poller)->Add(hostile, [&](RingPoller::Taken) {
    hostile_calls.fetch_add(1);
    hostile_reg->Arm();
  });
  other_reg = (*poller)->Add(other, [&](RingPoller::Taken) {
    other_calls.fetch_add(1);
    other_reg->Arm();
  });
  hostile_reg->Arm();
  other_reg->Arm();

  const int doorbell = ::dup(hostile->doorbell_for_client());  // as SCM_RIGHTS hands it
  ASSERT_GE(doorbell, 0);
  int pipe_ends[2];
  ASSERT_EQ(::pipe(pipe_ends), 0);
  EXPECT_EQ(testing::SendWithDescriptor(doorbell, pipe_ends[0], MSG_DONTWAIT | MSG_NOSIGNAL), -1)
      << "the doorbell carried a descriptor to the daemon";
  EXPECT_EQ(errno, ENOTSOCK);
  ::close(pipe_ends[0]);
  ::close(pipe_ends[1]);
  ASSERT_EQ(::fcntl(doorbell, F_SETFL, ::fcntl(doorbell, F_GETFL) & ~O_NONBLOCK), 0);
  const uint64_t most = UINT64_MAX - 1;  // the count is full: the client's next write blocks
  ASSERT_EQ(::write(doorbell, &most, sizeof(most)), 8);

  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 2000 && !other_client.Asleep(); ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(other_client.Asleep()) << "the poller never went to sleep";
    ASSERT_TRUE(other_client.Write("other's work"));
    for (int k = 0; k < 5000 && other_calls.load() <= round; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(other_calls.load(), round + 1) << "the other session's ring was not served";
  }
  // The hostile client's own records are still taken (at the poller's next pass).
  hostile_client.Put32(0, 5);  // a record of 5 bytes at 0, no doorbell (its count is full)
  hostile_client.SetHead(16);
  ASSERT_TRUE(other_client.Write("a pass"));
  for (int k = 0; k < 5000 && hostile_calls.load() == 0; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(hostile_calls.load(), 1);
  hostile_reg->Remove();
  other_reg->Remove();
  ::close(doorbell);
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
