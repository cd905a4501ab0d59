// Host-backend behaviour beyond the conformance suite: fault injection (sticky errors),
// allocation failures and accounting, asynchrony, the host backend's range checks and its
// graph-capture rules. Uses the ForTest hooks of HostDevice.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/host/host_device.h"
#include "stream_sync.h"

namespace ferry::backend {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr auto kSyncTimeout = std::chrono::seconds(60);

Status Sync(Stream& stream) { return testing::SyncStream(stream, kSyncTimeout); }

class HostBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostDeviceOptions options;
    options.memory_bytes = kMemory;
    Result<std::unique_ptr<HostDevice>> device = HostDevice::Create(options);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(device).value();
    stream_ = NewStream();
  }

  void TearDown() override {
    stream_.reset();
    device_.reset();
  }

  std::unique_ptr<Stream> NewStream() {
    Result<std::unique_ptr<Stream>> stream = device_->CreateStream();
    EXPECT_TRUE(stream.ok()) << stream.status().ToString();
    return stream.ok() ? std::move(stream).value() : nullptr;
  }

  DevicePtr Allocate(uint64_t bytes) {
    Result<DevicePtr> ptr = stream_->Allocate(bytes);
    EXPECT_TRUE(ptr.ok()) << ptr.status().ToString();
    return ptr.ok() ? *ptr : 0;
  }

  static constexpr uint64_t kMemory = 1ull << 20;
  std::unique_ptr<HostDevice> device_;
  std::unique_ptr<Stream> stream_;
};

Status InjectedFault() { return Status(ErrorKind::kDeviceFault, "injected fault"); }

TEST_F(HostBackendTest, CreateRejectsZeroMemory) {
  HostDeviceOptions options;
  options.memory_bytes = 0;
  EXPECT_FALSE(HostDevice::Create(options).ok());
  EXPECT_FALSE(CreateHostDevice(options).ok());
}

TEST_F(HostBackendTest, InfoAndFreeMemory) {
  EXPECT_EQ(device_->info().backend, "host");
  EXPECT_EQ(device_->info().total_memory, kMemory);
  EXPECT_EQ(device_->free_memory(), kMemory);
  DevicePtr p = Allocate(1000);
  EXPECT_EQ(device_->bytes_in_use(), 1000u);
  EXPECT_EQ(device_->free_memory(), kMemory - 1000);
  EXPECT_EQ(p % 256, 0u) << "allocations are 256-byte aligned";
  stream_->Free(p);
  ASSERT_TRUE(Sync(*stream_).ok());
  EXPECT_EQ(device_->bytes_in_use(), 0u);
}

TEST_F(HostBackendTest, StickyErrorSkipsLaterWorkAndIsReportedByEveryCompletion) {
  DevicePtr a = Allocate(64 * 4);
  DevicePtr b = Allocate(64 * 4);
  DevicePtr c = Allocate(64 * 4);
  ASSERT_TRUE(stream_->Fill(DType::kF32, a, 64, 0.0).ok());
  ASSERT_TRUE(stream_->Fill(DType::kF32, b, 64, 0.0).ok());
  ASSERT_TRUE(stream_->Fill(DType::kF32, c, 64, 0.0).ok());
  ASSERT_TRUE(Sync(*stream_).ok());
  const uint64_t in_use = device_->bytes_in_use();

  device_->InjectFaultForTest(1, InjectedFault());
  ASSERT_TRUE(stream_->Fill(DType::kF32, a, 64, 1.0).ok());  // runs
  ASSERT_TRUE(stream_->Fill(DType::kF32, b, 64, 2.0).ok());  // faults
  ASSERT_TRUE(stream_->Fill(DType::kF32, c, 64, 3.0).ok());  // skipped
  EXPECT_EQ(Sync(*stream_), InjectedFault());

  // Later work is skipped; enqueue still succeeds (the error is reported by completions).
  std::vector<float> host(64, -7.0f);
  ASSERT_TRUE(stream_->CopyDeviceToHost(host.data(), a, 64 * 4).ok());
  EXPECT_EQ(Sync(*stream_), InjectedFault());
  for (float v : host) EXPECT_EQ(v, -7.0f) << "the download after the fault was skipped";
  // Enqueue-time errors are still reported at enqueue.
  EXPECT_EQ(stream_->Fill(DType::kF32, 0, 1, 1.0).code(), Code::kInvalidArgument);

  // Every later completion reports the first error, in order.
  std::mutex mu;
  std::vector<Status> seen;
  for (int i = 0; i < 10; ++i) {
    stream_->OnComplete([&mu, &seen](Status status) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(status);
    });
  }
  // Free still releases memory on a faulted stream.
  stream_->Free(a);
  stream_->Free(b);
  stream_->Free(c);
  EXPECT_EQ(Sync(*stream_), InjectedFault());
  EXPECT_EQ(device_->bytes_in_use(), in_use - 3 * 64 * 4);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 10u);
  for (const Status& status : seen) EXPECT_EQ(status, InjectedFault());

  // Other streams are not affected.
  std::unique_ptr<Stream> other = NewStream();
  Result<DevicePtr> d = other->Allocate(16);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(other->Fill(DType::kU8, *d, 16, 1).ok());
  other->Free(*d);
  EXPECT_TRUE(Sync(*other).ok());
}

TEST_F(HostBackendTest, FaultIsCountedAcrossStreams) {
  std::unique_ptr<Stream> other = NewStream();
  DevicePtr a = Allocate(16);
  ASSERT_TRUE(Sync(*stream_).ok());
  device_->InjectFaultForTest(2, InjectedFault());
  ASSERT_TRUE(stream_->Fill(DType::kU8, a, 16, 1).ok());
  ASSERT_TRUE(Sync(*stream_).ok());
  ASSERT_TRUE(other->Fill(DType::kU8, a, 16, 2).ok());
  ASSERT_TRUE(Sync(*other).ok());
  ASSERT_TRUE(stream_->Fill(DType::kU8, a, 16, 3).ok());  // the third op: faults
  EXPECT_EQ(Sync(*stream_), InjectedFault());
  ASSERT_TRUE(other->Fill(DType::kU8, a, 16, 4).ok());  // fired once only
  EXPECT_TRUE(Sync(*other).ok());
  stream_->Free(a);
  EXPECT_EQ(Sync(*stream_), InjectedFault());
  EXPECT_EQ(device_->bytes_in_use(), 0u);
}

TEST_F(HostBackendTest, FailNextAllocation) {
  device_->FailNextAllocationForTest();
  Result<DevicePtr> failed = stream_->Allocate(64);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().kind(), ErrorKind::kOutOfDeviceMemory);
  EXPECT_EQ(device_->bytes_in_use(), 0u);
  Result<DevicePtr> ok = stream_->Allocate(64);
  ASSERT_TRUE(ok.ok()) << "only the next allocation fails";
  stream_->Free(*ok);
  ASSERT_TRUE(Sync(*stream_).ok());
}

TEST_F(HostBackendTest, AllocationBeyondMemoryBytesFailsUntilFreed) {
  DevicePtr first = Allocate(600 * 1024);
  Result<DevicePtr> second = stream_->Allocate(600 * 1024);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().kind(), ErrorKind::kOutOfDeviceMemory);
  stream_->Free(first);
  ASSERT_TRUE(Sync(*stream_).ok());
  second = stream_->Allocate(600 * 1024);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  stream_->Free(*second);
  ASSERT_TRUE(Sync(*stream_).ok());
}

TEST_F(HostBackendTest, FreeIsStreamOrdered) {
  device_->SetOpDelayForTest(milliseconds(30));
  DevicePtr p = Allocate(4096);
  ASSERT_TRUE(stream_->Fill(DType::kU8, p, 4096, 1).ok());
  stream_->Free(p);
  // The fill is still sleeping: the memory is not released yet.
  EXPECT_EQ(device_->bytes_in_use(), 4096u);
  ASSERT_TRUE(Sync(*stream_).ok());
  EXPECT_EQ(device_->bytes_in_use(), 0u);
}

TEST_F(HostBackendTest, EnqueueReturnsBeforeTheWorkRuns) {
  device_->SetOpDelayForTest(milliseconds(20));
  DevicePtr p = Allocate(64);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(stream_->Fill(DType::kU8, p, 64, i).ok());
  std::atomic<bool> done{false};
  stream_->OnComplete([&done](Status) { done = true; });
  const auto enqueue_time = std::chrono::steady_clock::now() - start;
  EXPECT_LT(enqueue_time, milliseconds(50)) << "enqueue must not wait for the work";
  EXPECT_FALSE(done.load()) << "the callback cannot have run yet";
  ASSERT_TRUE(Sync(*stream_).ok());
  EXPECT_TRUE(done.load());
  EXPECT_GE(stream_->busy_ns(), 100'000'000u) << "five 20 ms ops";
  device_->SetOpDelayForTest(microseconds(0));
  stream_->Free(p);
}

TEST_F(HostBackendTest, BusyTimeCountsWork) {
  DevicePtr p = Allocate(512 * 1024);
  ASSERT_TRUE(stream_->Fill(DType::kF32, p, 128 * 1024, 1.0).ok());
  ASSERT_TRUE(Sync(*stream_).ok());
  EXPECT_GT(stream_->busy_ns(), 0u);
  stream_->Free(p);
}

TEST_F(HostBackendTest, RangesOutsideAnAllocationAreRejected) {
  DevicePtr p = Allocate(1024);
  EXPECT_TRUE(stream_->Fill(DType::kF32, p + 512, 128, 1.0).ok()) << "an interior range";
  EXPECT_EQ(stream_->Fill(DType::kF32, p + 512, 129, 1.0).kind(), ErrorKind::kOutOfRange);
  EXPECT_EQ(stream_->Fill(DType::kF32, 12345, 1, 1.0).kind(), ErrorKind::kOutOfRange);
  std::vector<uint8_t> host(2048);
  EXPECT_EQ(stream_->CopyHostToDevice(p, host.data(), 2048).kind(), ErrorKind::kOutOfRange);
  EXPECT_EQ(stream_->CopyDeviceToHost(host.data(), p + 1, 1024).kind(), ErrorKind::kOutOfRange);
  EXPECT_EQ(stream_->Fill(DType::kF64, p, UINT64_MAX / 4, 1.0).code(), Code::kInvalidArgument)
      << "element count overflow";
  GemmArgs args;
  args.dtype = DType::kF32;
  args.m = args.n = args.k = 17;  // 17 * 17 * 4 > 1024
  args.a = args.b = args.c = p;
  EXPECT_EQ(stream_->Gemm(args).kind(), ErrorKind::kOutOfRange);
  stream_->Free(p);
  EXPECT_EQ(stream_->Fill(DType::kF32, p, 1, 1.0).kind(), ErrorKind::kOutOfRange) << "freed memory";
  stream_->Free(p);  // a second Free is ignored
  EXPECT_TRUE(Sync(*stream_).ok());
  EXPECT_EQ(device_->bytes_in_use(), 0u);
}

TEST_F(HostBackendTest, GraphReplayAfterFreeIsRejected) {
  DevicePtr p = Allocate(64);
  ASSERT_TRUE(stream_->BeginCapture().ok());
  ASSERT_TRUE(stream_->Fill(DType::kU8, p, 64, 1).ok());
  Result<std::unique_ptr<Graph>> graph = stream_->EndCapture();
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(stream_->LaunchGraph(**graph).ok());
  stream_->Free(p);
  EXPECT_EQ(stream_->LaunchGraph(**graph).kind(), ErrorKind::kOutOfRange);
  EXPECT_TRUE(Sync(*stream_).ok());
}

TEST_F(HostBackendTest, GraphFromAnotherDeviceIsRejected) {
  HostDeviceOptions options;
  options.memory_bytes = 1 << 20;
  Result<std::unique_ptr<HostDevice>> other_device = HostDevice::Create(options);
  ASSERT_TRUE(other_device.ok());
  Result<std::unique_ptr<Stream>> other_stream = (*other_device)->CreateStream();
  ASSERT_TRUE(other_stream.ok());
  ASSERT_TRUE((*other_stream)->BeginCapture().ok());
  Result<std::unique_ptr<Graph>> graph = (*other_stream)->EndCapture();
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ(stream_->LaunchGraph(**graph).code(), Code::kInvalidArgument);
  other_stream->reset();
}

TEST_F(HostBackendTest, FreeDuringCaptureReleasesAndInvalidatesTheCapture) {
  DevicePtr p = Allocate(64);
  ASSERT_TRUE(stream_->BeginCapture().ok());
  stream_->Free(p);
  Result<std::unique_ptr<Graph>> graph = stream_->EndCapture();
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(Sync(*stream_).ok());
  EXPECT_EQ(device_->bytes_in_use(), 0u);
  EXPECT_TRUE(stream_->BeginCapture().ok()) << "a new capture can start";
  EXPECT_TRUE(stream_->EndCapture().ok());
}

TEST_F(HostBackendTest, OnCompleteDuringCaptureReportsAnError) {
  DevicePtr p = Allocate(64);
  ASSERT_TRUE(stream_->BeginCapture().ok());
  ASSERT_TRUE(stream_->Fill(DType::kU8, p, 64, 1).ok());
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  stream_->OnComplete([promise](Status status) { promise->set_value(status); });
  ASSERT_EQ(future.wait_for(kSyncTimeout), std::future_status::ready);
  EXPECT_EQ(future.get().code(), Code::kInvalidArgument);
  Result<std::unique_ptr<Graph>> graph = stream_->EndCapture();
  ASSERT_TRUE(graph.ok()) << "the capture is still valid";
  EXPECT_EQ((*graph)->node_count(), 1u);
  EXPECT_TRUE(Sync(*stream_).ok()) << "the error was not sticky";
  stream_->Free(p);
}

TEST_F(HostBackendTest, FillRejectsUnrepresentableIntegers) {
  DevicePtr p = Allocate(64);
  EXPECT_EQ(stream_->Fill(DType::kU8, p, 4, 256).code(), Code::kInvalidArgument);
  EXPECT_EQ(stream_->Fill(DType::kU8, p, 4, -1).code(), Code::kInvalidArgument);
  EXPECT_EQ(stream_->Fill(DType::kI32, p, 4, 1e20).code(), Code::kInvalidArgument);
  EXPECT_EQ(stream_->Fill(static_cast<DType>(42), p, 4, 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(stream_->Binary(static_cast<BinaryOp>(9), DType::kF32, p, p, p, 4).code(),
            Code::kInvalidArgument);
  stream_->Free(p);
}

TEST_F(HostBackendTest, RegisteredRangesAreTracked) {
  std::vector<uint8_t> a(64), b(64);
  ASSERT_TRUE(device_->RegisterHostMemory(a.data(), a.size()).ok());
  ASSERT_TRUE(device_->RegisterHostMemory(b.data(), b.size()).ok());
  EXPECT_FALSE(device_->RegisterHostMemory(a.data(), a.size()).ok()) << "already registered";
  EXPECT_EQ(device_->registered_host_ranges_for_test(), 2u);
  EXPECT_TRUE(device_->UnregisterHostMemory(a.data()).ok());
  EXPECT_FALSE(device_->UnregisterHostMemory(a.data() + 1).ok());
  EXPECT_TRUE(device_->UnregisterHostMemory(b.data()).ok());
  EXPECT_EQ(device_->registered_host_ranges_for_test(), 0u);
}

// A copy between the device and ordinary (unregistered) host memory returns only once the
// stream's earlier work and the copy have run, as CUDA's pageable copies may (backend.h): a
// download has its bytes when it returns, and an upload's source may be reused at once. A
// copy of registered memory is queued like any op.
TEST_F(HostBackendTest, CopiesOfOrdinaryHostMemoryWaitForTheStreamsEarlierWork) {
  device_->SetOpDelayForTest(milliseconds(10));
  DevicePtr p = Allocate(64);
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(stream_->Fill(DType::kU8, p, 64, i).ok());
  ASSERT_TRUE(stream_->BeginBatch().ok());  // a batch is one command of several ops
  for (int i = 4; i <= 5; ++i) ASSERT_TRUE(stream_->Fill(DType::kU8, p, 64, i).ok());
  ASSERT_TRUE(stream_->EndBatch().ok());
  std::vector<uint8_t> out(64, 0);
  ASSERT_TRUE(stream_->CopyDeviceToHost(out.data(), p, 64).ok());
  EXPECT_EQ(out, std::vector<uint8_t>(64, 5)) << "the download returned before it ran";
  std::vector<uint8_t> in(64, 7);
  ASSERT_TRUE(stream_->Fill(DType::kU8, p, 64, 6).ok());
  ASSERT_TRUE(stream_->CopyHostToDevice(p, in.data(), 64).ok());
  std::fill(in.begin(), in.end(), 9);  // reused at once: the copy has its bytes already
  device_->SetOpDelayForTest(microseconds(0));
  std::vector<uint8_t> registered(64, 0);
  ASSERT_TRUE(device_->RegisterHostMemory(registered.data(), registered.size()).ok());
  ASSERT_TRUE(stream_->CopyDeviceToHost(registered.data(), p, 64).ok());
  ASSERT_TRUE(Sync(*stream_).ok());
  EXPECT_EQ(registered, std::vector<uint8_t>(64, 7));
  EXPECT_TRUE(device_->UnregisterHostMemory(registered.data()).ok());
  stream_->Free(p);
}

TEST_F(HostBackendTest, DestroyingAStreamDeliversPendingCompletions) {
  device_->SetOpDelayForTest(milliseconds(5));
  std::unique_ptr<Stream> s = NewStream();
  Result<DevicePtr> p = s->Allocate(64);
  ASSERT_TRUE(p.ok());
  std::atomic<int> calls{0};
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(s->Fill(DType::kU8, *p, 64, i).ok());
    s->OnComplete([&calls](Status status) {
      EXPECT_TRUE(status.ok());
      ++calls;
    });
  }
  s->Free(*p);
  s.reset();
  EXPECT_EQ(calls.load(), 20);
  EXPECT_EQ(device_->bytes_in_use(), 0u);
}

// Memory a caller allocated and never freed is released when its device goes: the process's
// count of live host-backend allocations is back where it was once the device is destroyed
// (a missing release fails here in any build, not only under ASan's leak check).
TEST_F(HostBackendTest, LeakedAllocationsAreReleasedWithTheDevice) {
  const uint64_t before = HostDevice::live_allocations_for_test();
  Allocate(4096);  // never freed
  Allocate(512);
  ASSERT_TRUE(Sync(*stream_).ok());
  EXPECT_EQ(HostDevice::live_allocations_for_test(), before + 2);
  EXPECT_EQ(device_->bytes_in_use(), 4096u + 512u);
  stream_.reset();
  EXPECT_EQ(HostDevice::live_allocations_for_test(), before + 2) << "a stream frees nothing";
  device_.reset();
  EXPECT_EQ(HostDevice::live_allocations_for_test(), before);
}

}  // namespace
}  // namespace ferry::backend
