// Session: the daemon's per-session state machine, in process, on a supervised HostDevice.
//
// Every Session call runs on the session's executor (posted and waited for, as the rpc layer
// does); the events land in a thread-safe recorder that also checks they are raised on
// that executor. Tests wait for events on a condition variable with a generous timeout and
// never sleep; the order of events, not their timing, is what they check.
#include "session/session.h"

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/host/host_device.h"
#include "fake_module.h"
#include "session/device_supervisor.h"
#include "session/registry.h"

namespace ferry::session {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};  // generous: nothing here should take more than ms

// --- Recording fake --------------------------------------------------------------------------

struct Event {
  enum class Kind { kChunk, kCompleted, kSynchronized, kClosed };
  Kind kind = Kind::kCompleted;
  uint64_t id = 0;             // the submit id (chunks, completions) or the sync id
  uint32_t op_index = 0;       // chunks
  uint64_t offset = 0;         // chunks
  std::string data;            // chunks
  Status status;               // completions
  SessionStatsSnapshot stats;  // OnClosed
};

size_t CountOf(const std::vector<Event>& events, Event::Kind kind) {
  size_t n = 0;
  for (const Event& e : events) n += e.kind == kind;
  return n;
}

/// Record every event, in order, and let the test thread wait for them. Thread-safe.
class RecordingEvents final : public SessionEvents {
 public:
  explicit RecordingEvents(Executor strand) : strand_(std::move(strand)) {}

  void OnDownloadChunk(uint64_t submit_id, uint32_t op_index, uint64_t offset,
                       ChunkBytes data) override {
    Event e;
    e.kind = Event::Kind::kChunk;
    e.id = submit_id;
    e.op_index = op_index;
    e.offset = offset;
    e.data = data.Take();
    Record(std::move(e));
  }
  void PostCompletion(uint64_t submit_id, bool ok) override {
    std::lock_guard lock(mu_);
    posted_.emplace_back(submit_id, ok, events_.size());
  }
  void OnCompleted(uint64_t submit_id, const Status& status) override {
    Event e;
    e.kind = Event::Kind::kCompleted;
    e.id = submit_id;
    e.status = status;
    Record(std::move(e));
  }
  void OnSynchronized(uint64_t sync_id) override {
    Event e;
    e.kind = Event::Kind::kSynchronized;
    e.id = sync_id;
    Record(std::move(e));
  }
  void OnClosed(const SessionStatsSnapshot& stats) override {
    Event e;
    e.kind = Event::Kind::kClosed;
    e.stats = stats;
    Record(std::move(e));
  }

  /// Wait until `done(events)` holds; false after `timeout`.
  bool WaitUntil(const std::function<bool(const std::vector<Event>&)>& done,
                 milliseconds timeout = kTimeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done(events_); });
  }
  bool WaitForCompletions(size_t n) {
    return WaitUntil([n](const auto& ev) { return CountOf(ev, Event::Kind::kCompleted) >= n; });
  }
  bool WaitForClosed(milliseconds timeout = kTimeout) {
    return WaitUntil([](const auto& ev) { return CountOf(ev, Event::Kind::kClosed) > 0; }, timeout);
  }

  std::vector<Event> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  /// Each PostCompletion: the submit, whether it succeeded, and how many events came before.
  std::vector<std::tuple<uint64_t, bool, size_t>> posted() const {
    std::lock_guard lock(mu_);
    return posted_;
  }
  std::vector<Event> completions() const {
    std::vector<Event> out;
    for (Event& e : events()) {
      if (e.kind == Event::Kind::kCompleted) out.push_back(std::move(e));
    }
    return out;
  }
  /// Return the status the completion of `submit_id` carried (a failure when none came).
  Status CompletionOf(uint64_t submit_id) const {
    for (const Event& e : completions()) {
      if (e.id == submit_id) return e.status;
    }
    ADD_FAILURE() << "no completion for submit " << submit_id;
    return Status(ErrorKind::kInternal, "no completion");
  }
  /// Return the bytes the Download op `op_index` of `submit_id` delivered, checking that
  /// its chunks came in offset order without gaps.
  std::string Downloaded(uint64_t submit_id, uint32_t op_index) const {
    std::string out;
    for (const Event& e : events()) {
      if (e.kind != Event::Kind::kChunk || e.id != submit_id || e.op_index != op_index) continue;
      EXPECT_EQ(e.offset, out.size()) << "chunk of submit " << submit_id << " op " << op_index;
      out += e.data;
    }
    return out;
  }
  int calls_off_strand() const {
    std::lock_guard lock(mu_);
    return calls_off_strand_;
  }

 private:
  void Record(Event e) {
    {
      std::lock_guard lock(mu_);
      if (!strand_.running_in_this_thread()) ++calls_off_strand_;
      events_.push_back(std::move(e));
    }
    cv_.notify_all();
  }

  const Executor strand_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;  // guarded by mu_
  // PostCompletion's (submit id, ok, how many events came before it); guarded by mu_.
  std::vector<std::tuple<uint64_t, bool, size_t>> posted_;
  int calls_off_strand_ = 0;  // guarded by mu_
};

// --- Helpers ---------------------------------------------------------------------------------

template <typename T>
std::vector<T> Decode(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

template <typename T>
std::shared_ptr<const std::string> Encode(const std::vector<T>& values) {
  auto bytes = std::make_shared<std::string>(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes->data(), values.data(), bytes->size());
  return bytes;
}

SubmitRequest Request(uint64_t id, std::vector<Op> ops,
                      std::shared_ptr<const void> payload = nullptr) {
  SubmitRequest r;
  r.submit_id = id;
  r.ops = std::move(ops);
  r.summary = Summarize(r.ops);
  r.payload = std::move(payload);
  return r;
}

/// Wait until `done()` holds, polling: for state that raises no event (an aborted session
/// going away, the device being rebuilt). False after `timeout`.
bool WaitUntil(const std::function<bool()>& done, milliseconds timeout = kTimeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

struct Client {
  std::shared_ptr<Session> session;
  RecordingEvents* events = nullptr;
};

class SessionTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kDeviceBytes = 64ull << 20;

  /// The device the supervisor builds (and builds again after a fault).
  virtual Result<std::unique_ptr<backend::Device>> MakeDevice() {
    backend::HostDeviceOptions options;
    options.memory_bytes = kDeviceBytes;
    return backend::CreateHostDevice(options);
  }

  void SetUp() override {
    auto supervisor = DeviceSupervisor::Create([this] { return MakeDevice(); }, nullptr);
    ASSERT_TRUE(supervisor.ok()) << supervisor.status().ToString();
    supervisor_ = std::move(*supervisor);
    registry_ = std::make_unique<SessionRegistry>(1ull << 30, 16);
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { io_.run(); });
  }

  void TearDown() override {
    if (!registry_) return;  // SetUp failed
    // Let every session a test left open go away (Abort raises nothing, so poll).
    for (const auto& s : sessions_) {
      EXPECT_TRUE(OnStrand(s->executor(), [&s] { s->Abort(); }));
    }
    // A test's long lane runs here too: the teardown of a session that holds a large graph
    // goes there (ALargeGraphIsLaunchedAndReleasedOnTheLongLane).
    EXPECT_TRUE(RunLongLaneUntil([this] { return registry_->Totals().sessions_open == 0; },
                                 HasFailure() ? milliseconds(500) : kTimeout))
        << "a session never finished closing";
    for (const auto& e : events_) EXPECT_EQ(e->calls_off_strand(), 0);
    work_.reset();
    for (std::thread& t : threads_) t.join();
    sessions_.clear();
    events_.clear();
    for (const auto& bytes : registered_) {
      EXPECT_TRUE(host()->UnregisterHostMemory(const_cast<char*>(bytes->data())).ok());
    }
    // A rebuild the test started (a fault, then its last stream released) calls MakeDevice,
    // a virtual of this fixture, on the supervisor's thread: it ends before the fixture goes.
    supervisor_->JoinRebuild();
  }

  /// `bytes`, registered with the device as the daemon's staging and slabs are: a copy from
  /// them does not wait for the stream's earlier work (backend.h), so an upload of them holds
  /// its copy turn while the device runs it. Unregistered at TearDown.
  std::shared_ptr<const std::string> Registered(std::shared_ptr<const std::string> bytes) {
    EXPECT_TRUE(host()->RegisterHostMemory(const_cast<char*>(bytes->data()), bytes->size()).ok());
    registered_.push_back(bytes);
    return bytes;
  }

  /// Open a session on its own strand, with a recorder for its events; it takes copy turns
  /// from turns_ when a test made one. With `long_lane` (a test's long_lane_, whose
  /// io_context the test runs itself) the strand has a long lane.
  Client Open(SessionConfig config = {}, LongLane* long_lane = nullptr) {
    Executor strand(io_, long_lane, "uid:1000");
    auto events = std::make_unique<RecordingEvents>(strand);
    auto created =
        Session::Create(supervisor_.get(), registry_.get(), strand, config, "session_test",
                        PeerIdentity{"in-process"}, events.get(), turns_.get());
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    if (!created.ok()) return {};
    Client c{*created, events.get()};
    events_.push_back(std::move(events));
    sessions_.push_back(c.session);
    return c;
  }

  /// Run `fn` on `strand` and wait for it to return.
  [[nodiscard]] bool OnStrand(const Executor& strand, std::function<void()> fn) {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    strand.Post([fn = std::move(fn), done] {
      fn();
      done->set_value();
    });
    return finished.wait_for(kTimeout) == std::future_status::ready;
  }

  /// Submit on the session's strand (and return once Submit has returned).
  void Submit(const Client& c, uint64_t id, std::vector<Op> ops,
              std::shared_ptr<const void> payload = nullptr) {
    SubmitRequest request = Request(id, std::move(ops), std::move(payload));
    ASSERT_TRUE(OnStrand(c.session->executor(), [&] { c.session->Submit(std::move(request)); }));
  }

  /// Submit and wait for its completion; return its status.
  Status SubmitAndWait(const Client& c, uint64_t id, std::vector<Op> ops,
                       std::shared_ptr<const void> payload = nullptr) {
    const size_t before = c.events->completions().size();
    Submit(c, id, std::move(ops), std::move(payload));
    EXPECT_TRUE(c.events->WaitForCompletions(before + 1)) << "submit " << id;
    return c.events->CompletionOf(id);
  }

  /// For the graph recordings cut into slices: tensor 1 (0.0) and tensor 2 (1.0) of 4 f64,
  /// made by submit `id`; and the ops that record graph 7 adding tensor 2 to tensor 1 `adds`
  /// times, which takes several slices to enqueue.
  static constexpr size_t kLongRecordingAdds = (1 << 18) - 8;  // within session-max-graph-ops
  void MakeAddends(const Client& c, uint64_t id) {
    Status s = SubmitAndWait(c, id,
                             {CreateTensorOp{1, DType::kF64, {4}},
                              CreateTensorOp{2, DType::kF64, {4}}, FillOp{1, 0.0}, FillOp{2, 1.0}});
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static std::vector<Op> RecordAdds(size_t adds) {
    std::vector<Op> record{BeginGraphOp{7}};
    for (size_t i = 0; i < adds; ++i) record.push_back(AxpyOp{1.0, 2, 1});  // x1 += x2
    record.push_back(EndGraphOp{});
    return record;
  }

  /// After an Abort that followed submit 1's completion, once the session is gone: no device
  /// bytes, nothing reserved, no session listed, and no event but submit 1's completion.
  void ExpectAllReleasedAfterAbort(const Client& c) {
    EXPECT_EQ(supervisor_->bytes_in_use(), 0u);
    EXPECT_EQ(reserved(), 0u);
    EXPECT_TRUE(registry_->List().empty());
    std::vector<Event> events = c.events->events();
    ASSERT_EQ(events.size(), 1u) << "only the completion of submit 1, from before the Abort";
    EXPECT_EQ(events[0].id, 1u);
  }

  /// Close and wait for OnClosed; return the stats it reported.
  SessionStatsSnapshot CloseAndWait(const Client& c) {
    EXPECT_TRUE(OnStrand(c.session->executor(), [&c] { c.session->Close(); }));
    EXPECT_TRUE(c.events->WaitForClosed());
    std::vector<Event> events = c.events->events();
    if (events.empty() || events.back().kind != Event::Kind::kClosed) {
      ADD_FAILURE() << "OnClosed is not the last event";
      return {};
    }
    return events.back().stats;
  }

  // Run the test's long lane until `done()` holds or `timeout` passes; return done().
  template <typename Predicate>
  bool RunLongLaneUntil(Predicate done, milliseconds timeout = kTimeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      long_lane_io_.run_one_for(milliseconds(10));
    }
    return done();
  }

  backend::HostDevice* host() {
    auto* device = dynamic_cast<backend::HostDevice*>(supervisor_->device());
    EXPECT_NE(device, nullptr);
    return device;
  }
  uint64_t reserved() const { return registry_->Totals().device_bytes_reserved; }

  // Destroyed in reverse: the sessions, then their recorders (which a session calls), then
  // the io_context (every strand, held by both, must go before it), registry and device.
  std::unique_ptr<DeviceSupervisor> supervisor_;
  std::unique_ptr<SessionRegistry> registry_;
  std::unique_ptr<CopyTurns> turns_;  // set by a test before Open, or none
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ =
      boost::asio::make_work_guard(io_);
  // A long lane no thread runs: a test that opens a session with it runs its io_context
  // (run_one_for), so it sees what goes there. A session whose strand waits for it runs
  // nothing else meanwhile.
  boost::asio::io_context long_lane_io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> long_lane_work_ =
      boost::asio::make_work_guard(long_lane_io_);  // run_one_for waits for what comes
  LongLane long_lane_{long_lane_io_, 1};
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<RecordingEvents>> events_;
  std::vector<std::shared_ptr<Session>> sessions_;
  std::vector<std::shared_ptr<const std::string>> registered_;  // Registered
};

// --- The happy path --------------------------------------------------------------------------

TEST_F(SessionTest, CreateFillDownloadFreeDeliversChunksThenOneCompletion) {
  Client c = Open();
  Status s = SubmitAndWait(
      c, 1,
      {CreateTensorOp{1, DType::kF64, {4}}, FillOp{1, 2.5}, DownloadOp{1, 8, 24}, FreeTensorOp{1}});
  EXPECT_TRUE(s.ok()) << s.ToString();

  std::vector<Event> events = c.events->events();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(CountOf(events, Event::Kind::kCompleted), 1u);
  EXPECT_EQ(events.back().kind, Event::Kind::kCompleted);
  EXPECT_EQ(events.back().id, 1u);
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i].kind, Event::Kind::kChunk);
    EXPECT_EQ(events[i].id, 1u);
    EXPECT_EQ(events[i].op_index, 2u);
  }
  // Chunk offsets are relative to the Download's own offset.
  EXPECT_EQ(Decode<double>(c.events->Downloaded(1, 2)), (std::vector<double>{2.5, 2.5, 2.5}));
  EXPECT_EQ(reserved(), 0u);  // the submit freed what it created
}

TEST_F(SessionTest, LargeDownloadArrivesInChunksInOffsetOrder) {
  Client c = Open();
  const uint64_t bytes = kMaxChunkBytes + 100;
  ASSERT_TRUE(SubmitAndWait(c, 1,
                            {CreateTensorOp{1, DType::kU8, {static_cast<int64_t>(bytes)}},
                             FillOp{1, 7}, DownloadOp{1, 0, bytes}})
                  .ok());
  std::vector<Event> events = c.events->events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].offset, 0u);
  EXPECT_EQ(events[0].data.size(), kMaxChunkBytes);
  EXPECT_EQ(events[1].offset, kMaxChunkBytes);
  EXPECT_EQ(events[1].data.size(), 100u);
  EXPECT_EQ(events[2].kind, Event::Kind::kCompleted);
  std::string all = c.events->Downloaded(1, 2);
  ASSERT_EQ(all.size(), bytes);
  EXPECT_EQ(all, std::string(bytes, '\x07'));
}

// --- Ordering --------------------------------------------------------------------------------

// Each completion is posted (the completion board's post) before the submit's chunks and its
// OnCompleted, so a client polling its board never sees an answer before the post.
TEST_F(SessionTest, EachCompletionIsPostedBeforeItsChunksAndItsReport) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(
                  c, 1, {CreateTensorOp{1, DType::kF64, {4}}, FillOp{1, 1.0}, DownloadOp{1, 0, 32}})
                  .ok());
  EXPECT_EQ(SubmitAndWait(c, 2, {FillOp{99, 1.0}}).kind(), ErrorKind::kInvalidHandle);
  using Posted = std::tuple<uint64_t, bool, size_t>;
  // Submit 1: posted before its chunk (event 0) and its completion (event 1); submit 2 after
  // those two, before its own completion (event 2).
  EXPECT_EQ(c.events->posted(), (std::vector<Posted>{{1, true, 0}, {2, false, 2}}));
  EXPECT_EQ(c.events->events().size(), 3u);
}

TEST_F(SessionTest, RefusedSubmitCompletesBetweenTheInFlightOnesAroundIt) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF32, {64}}}).ok());
  host()->SetOpDelayForTest(milliseconds(2));
  size_t in_flight = 0;
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    c.session->Submit(Request(10, {FillOp{1, 1.0}, FillOp{1, 2.0}, FillOp{1, 3.0}}));
    c.session->Submit(Request(11, {FillOp{1, 4.0}, FillOp{99, 5.0}}));  // 99 does not exist
    c.session->Submit(Request(12, {FillOp{1, 6.0}, FillOp{1, 7.0}, FillOp{1, 8.0}}));
    in_flight = c.session->in_flight();
  }));
  // No completion can run inside that handler: the refusal waits behind submit 10.
  EXPECT_EQ(in_flight, 3u);
  ASSERT_TRUE(c.events->WaitForCompletions(4));

  std::vector<Event> done = c.events->completions();
  ASSERT_EQ(done.size(), 4u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[1].id, 10u);
  EXPECT_EQ(done[2].id, 11u);
  EXPECT_EQ(done[3].id, 12u);
  EXPECT_TRUE(done[1].status.ok()) << done[1].status.ToString();
  EXPECT_EQ(done[2].status.kind(), ErrorKind::kInvalidHandle) << done[2].status.ToString();
  EXPECT_EQ(done[2].status.op_index(), 1);
  EXPECT_TRUE(done[3].status.ok()) << done[3].status.ToString();
}

// A run (what the connection took from a submit ring at once) shares one completion watch,
// and its consecutive kernel-only submits one batch. A refused submit, a download and a
// Synchronize among them keep their places; every submit is reported once, in order.
TEST_F(SessionTest, ARunsSubmitsShareOneBatchAndAreEachReportedInOrder) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF64, {4}}}).ok());
  host()->SetOpDelayForTest(milliseconds(1));
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    c.session->BeginSubmitRun(40);  // the ops expected: batches open while 16 may follow
    c.session->Submit(Request(10, {FillOp{1, 1.0}}));
    c.session->Submit(Request(11, {ScaleOp{1, 3.0, 1}}));
    c.session->Submit(Request(12, {FillOp{99, 5.0}}));  // refused: 99 does not exist
    c.session->Submit(Request(13, {AxpyOp{1.0, 1, 1}}));
    c.session->Submit(Request(14, {DownloadOp{1, 0, 32}}));  // not a kernel: ends the batch
    c.session->Synchronize(7);
    c.session->Submit(Request(15, {ScaleOp{1, 0.5, 1}}));
    c.session->Submit(Request(16, {AxpyOp{2.0, 1, 1}}));
    c.session->EndSubmitRun();
    // Fewer ops than a run's batch (16): no batch, one watch.
    c.session->BeginSubmitRun(2);
    c.session->Submit(Request(17, {ScaleOp{1, 2.0, 1}}));
    c.session->Submit(Request(18, {DownloadOp{1, 0, 8}}));
    c.session->EndSubmitRun();
    // 20 one-op submits: one batch of 16, then 4 op by op.
    c.session->BeginSubmitRun(20);
    for (uint64_t id = 20; id < 40; ++id) c.session->Submit(Request(id, {AxpyOp{1.0, 1, 1}}));
    c.session->EndSubmitRun();
  }));
  ASSERT_TRUE(c.events->WaitForCompletions(30));

  std::vector<Event> events = c.events->events();
  std::vector<uint64_t> order;
  int sync7 = -1, done14 = -1, done15 = -1;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == Event::Kind::kSynchronized && events[i].id == 7) sync7 = i;
    if (events[i].kind != Event::Kind::kCompleted) continue;
    order.push_back(events[i].id);
    if (events[i].id == 14) done14 = i;
    if (events[i].id == 15) done15 = i;
  }
  std::vector<uint64_t> expected_order{1, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  for (uint64_t id = 20; id < 40; ++id) expected_order.push_back(id);
  EXPECT_EQ(order, expected_order);
  for (uint64_t id : {10, 11, 13, 14, 15, 16, 17, 18}) {
    EXPECT_TRUE(c.events->CompletionOf(id).ok())
        << id << ": " << c.events->CompletionOf(id).ToString();
  }
  EXPECT_EQ(c.events->CompletionOf(12).kind(), ErrorKind::kInvalidHandle);
  EXPECT_GT(sync7, done14);
  EXPECT_LT(sync7, done15);
  EXPECT_EQ(Decode<double>(c.events->Downloaded(14, 0)), std::vector<double>(4, 6.0));
  EXPECT_EQ(Decode<double>(c.events->Downloaded(18, 0)), std::vector<double>{18.0});
  auto last = SubmitAndWait(c, 40, {DownloadOp{1, 0, 8}});
  ASSERT_TRUE(last.ok()) << last.ToString();
  // y doubled 20 times by adding itself: 18 * 2^20.
  EXPECT_EQ(Decode<double>(c.events->Downloaded(40, 0)), std::vector<double>{18.0 * (1 << 20)});
  EXPECT_EQ(CloseAndWait(c).kernel_batches, 3u);  // 10, 11, 13; 15, 16; 20..35
}

// A long run of kernel ops in one submit goes as batches of at most kMaxBatchOps ops: one
// batch's capture and instantiation hold an executor thread every session shares. The ops'
// results are those of running them one by one.
TEST_F(SessionTest, ALongRunOfKernelOpsGoesAsSeveralBatches) {
  Client c = Open();
  const size_t ops = 2 * Session::kMaxBatchOps + 100;
  std::vector<Op> submit{CreateTensorOp{1, DType::kF64, {4}}};
  for (size_t i = 0; i < ops; ++i) submit.push_back(FillOp{1, static_cast<double>(i)});
  submit.push_back(DownloadOp{1, 0, 32});
  Status s = SubmitAndWait(c, 1, std::move(submit));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(1, ops + 1)),
            std::vector<double>(4, static_cast<double>(ops - 1)));
  EXPECT_EQ(CloseAndWait(c).kernel_batches, 3u);  // 4096, 4096, 100
}

// A submit whose enqueue takes longer than a slice (Session::kEnqueueSlice) gives up its
// thread between batches and goes on later; the submit behind it waits for it, and both
// complete in order with the right result.
TEST_F(SessionTest, ALongEnqueueYieldsItsThreadAndGoesOnInOrder) {
  Client c = Open();
  const size_t ops = 1 << 18;
  std::vector<Op> submit{CreateTensorOp{1, DType::kF64, {4}}};
  for (size_t i = 0; i < ops; ++i) submit.push_back(FillOp{1, static_cast<double>(i)});
  Submit(c, 1, std::move(submit));
  Submit(c, 2, {ScaleOp{1, -1.0, 1}, DownloadOp{1, 0, 32}});
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  const std::vector<Event> done = c.events->completions();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[1].id, 2u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
  EXPECT_TRUE(done[1].status.ok()) << done[1].status.ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(2, 1)),
            std::vector<double>(4, -static_cast<double>(ops - 1)));
  EXPECT_GT(registry_->enqueue_yields(), 0u) << "2^18 fills took less than one slice";
}

// A graph recording longer than a slice is cut too: the stream keeps capturing while the
// enqueue yields, and the graph it records is whole.
TEST_F(SessionTest, ALongGraphRecordingYieldsItsThreadAndRecordsEveryOp) {
  Client c = Open();
  MakeAddends(c, 1);
  std::vector<Op> record = RecordAdds(kLongRecordingAdds);
  const uint64_t before = registry_->enqueue_yields();
  Status s = SubmitAndWait(c, 2, std::move(record));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(registry_->enqueue_yields(), before) << "2^18 recorded ops took less than one slice";
  s = SubmitAndWait(c, 3, {LaunchGraphOp{7}, LaunchGraphOp{7}, DownloadOp{1, 0, 32}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(3, 2)),
            std::vector<double>(4, 2.0 * static_cast<double>(kLongRecordingAdds)));
}

// A run (submits taken from the ring at once, one completion watch at its end) that ends
// while its last submit's graph recording is paused: the watch would be recorded into the
// graph (refused), so it is asked for once the recording is done; the submits before it
// complete, unharmed.
TEST_F(SessionTest, ARunEndingWhileAGraphRecordingIsPausedCompletesItsEarlierSubmits) {
  Client c = Open();
  MakeAddends(c, 1);
  std::vector<Op> record = RecordAdds(kLongRecordingAdds);
  const uint64_t before = registry_->enqueue_yields();
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    c.session->BeginSubmitRun(3 + record.size());
    c.session->Submit(Request(2, {FillOp{1, 5.0}, DownloadOp{1, 0, 32}}));
    c.session->Submit(Request(3, std::move(record)));
    c.session->EndSubmitRun();
  }));
  ASSERT_TRUE(c.events->WaitForCompletions(3));
  EXPECT_GT(registry_->enqueue_yields(), before) << "the recording was never paused";
  EXPECT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_TRUE(c.events->CompletionOf(3).ok()) << c.events->CompletionOf(3).ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(2, 1)), std::vector<double>(4, 5.0));
  Status s = SubmitAndWait(c, 4, {LaunchGraphOp{7}, DownloadOp{1, 0, 32}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(4, 1)),
            std::vector<double>(4, 5.0 + static_cast<double>(kLongRecordingAdds)));
}

// A client that goes away while its graph recording is paused between slices: the rest of
// the recording is dropped and the capture abandoned (no graph is built), the ops already
// recorded never run, and the session releases everything.
TEST_F(SessionTest, AnAbortWhileAGraphRecordingIsPausedDropsItAndReleasesEverything) {
  Client c = Open();
  MakeAddends(c, 1);
  std::vector<Op> record = RecordAdds(kLongRecordingAdds);
  const uint64_t before = registry_->enqueue_yields();
  bool paused = false;
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    c.session->Submit(Request(2, std::move(record)));
    paused = registry_->enqueue_yields() > before;  // it yielded: the rest is still to come
    c.session->Abort();
  }));
  ASSERT_TRUE(paused) << "the recording fit in one slice";
  ASSERT_TRUE(WaitUntil([this] { return registry_->Totals().sessions_open == 0; }));
  ExpectAllReleasedAfterAbort(c);
}

// A graph of more than kLongGraphOps recorded ops is instantiated on the executor's long
// lane, which no other session's work waits for: until the long lane runs it the submit does
// not complete, while another session's work runs on the shared threads; the launch of the
// graph and the direct download after it run in the same turn, and the graph replays every
// op. A small graph's EndGraph stays on the shared lane.
TEST_F(SessionTest, ALargeGraphIsInstantiatedOnTheLongLane) {
  Client c = Open({}, &long_lane_);
  MakeAddends(c, 1);
  std::vector<Op> ops = RecordAdds(Session::kLongGraphOps + 1);
  ops.push_back(LaunchGraphOp{7});
  ops.push_back(DownloadOp{1, 0, 32});
  Submit(c, 2, std::move(ops));
  EXPECT_FALSE(c.events->WaitUntil(
      [](const auto& ev) { return CountOf(ev, Event::Kind::kCompleted) >= 2; }, milliseconds(200)))
      << "the large graph ended without the long lane";
  Client other = Open();
  EXPECT_TRUE(SubmitAndWait(other, 1, {CreateTensorOp{1, DType::kF64, {4}}, FillOp{1, 1.0}}).ok())
      << "another session waited for the long lane";
  // The launch and the download stay there: the graph is large
  // (ALargeGraphIsLaunchedAndReleasedOnTheLongLane), and this session has no staging, so the
  // download is a direct copy (InlineTransfersWithoutStagingGoToTheLongLane).
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "nothing went to the long lane";
  EXPECT_EQ(registry_->long_lane_turns(), 1u);
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  ASSERT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(2, Session::kLongGraphOps + 4)),
            std::vector<double>(4, static_cast<double>(Session::kLongGraphOps + 1)));

  // A small one: no long lane (this test runs it no more).
  std::vector<Op> small = RecordAdds(Session::kLongGraphOps);
  small.front() = BeginGraphOp{8};
  ASSERT_TRUE(SubmitAndWait(c, 3, std::move(small)).ok());
  EXPECT_EQ(long_lane_io_.poll(), 0u) << "a small graph went to the long lane";
}

// A large graph's launch (CUDA: the first uploads the graph) and its release (CUDA: the
// executable graph's destruction) take about as long as its instantiation: each goes to the
// long lane, a launch alone too (a submit of fewer than kLongSubmitOps ops otherwise starts on
// the shared lane), and so does the teardown of a session that holds a large graph. The ops
// around them run on the shared lane; a small graph's launch, release and teardown stay there.
TEST_F(SessionTest, ALargeGraphIsLaunchedAndReleasedOnTheLongLane) {
  Client c = Open({}, &long_lane_);
  MakeAddends(c, 1);
  Submit(c, 2, RecordAdds(Session::kLongGraphOps + 1));
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "the graph's EndGraph";
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  ASSERT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  auto completed = [](size_t n) {
    return [n](const std::vector<Event>& ev) { return CountOf(ev, Event::Kind::kCompleted) >= n; };
  };
  for (const uint64_t id : {3, 4}) {  // a launch, then a fill and the graph's release
    std::vector<Op> ops{LaunchGraphOp{7}};
    if (id == 4) ops = {FillOp{2, 1.0}, FreeGraphOp{7}};
    Submit(c, id, std::move(ops));
    EXPECT_FALSE(c.events->WaitUntil(completed(id), milliseconds(200)))
        << "submit " << id << " ran without the long lane";
    ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "submit " << id;
    ASSERT_TRUE(c.events->WaitForCompletions(id));
    EXPECT_TRUE(c.events->CompletionOf(id).ok()) << c.events->CompletionOf(id).ToString();
  }
  EXPECT_EQ(registry_->long_lane_turns(), 3u);

  // A small graph: nothing of it goes to the long lane, nor does the session's teardown.
  std::vector<Op> small = RecordAdds(Session::kLongGraphOps);
  small.front() = BeginGraphOp{8};
  ASSERT_TRUE(SubmitAndWait(c, 5, std::move(small)).ok());
  ASSERT_TRUE(SubmitAndWait(c, 6, {LaunchGraphOp{8}, FreeGraphOp{8}}).ok());
  std::vector<Op> kept = RecordAdds(Session::kLongGraphOps);
  kept.front() = BeginGraphOp{9};
  ASSERT_TRUE(SubmitAndWait(c, 7, std::move(kept)).ok());
  ASSERT_TRUE(OnStrand(c.session->executor(), [&c] { c.session->Close(); }));
  ASSERT_TRUE(WaitUntil([this] { return registry_->Totals().sessions_open == 0; }))
      << "the teardown of a session with a small graph waited for the long lane";
  EXPECT_EQ(long_lane_io_.poll(), 0u) << "a small graph's work went to the long lane";

  // A session closed while it holds a large graph is torn down there.
  Client d = Open({}, &long_lane_);
  MakeAddends(d, 1);
  Submit(d, 2, RecordAdds(Session::kLongGraphOps + 1));
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "the graph's EndGraph";
  ASSERT_TRUE(d.events->WaitForCompletions(2));
  ASSERT_TRUE(OnStrand(d.session->executor(), [&d] { d.session->Close(); }));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(registry_->Totals().sessions_open, 1u) << "torn down without the long lane";
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "the teardown";
  ASSERT_TRUE(WaitUntil([this] { return registry_->Totals().sessions_open == 0; }));
  EXPECT_EQ(registry_->long_lane_turns(), 5u);
  EXPECT_EQ(supervisor_->bytes_in_use(), 0u);

  // So is one that holds small graphs of more than kLongGraphOps ops together: releasing
  // them takes as long as one of that size.
  Client e = Open({}, &long_lane_);
  MakeAddends(e, 1);
  for (uint64_t id : {2, 3}) {
    std::vector<Op> half = RecordAdds(Session::kLongGraphOps / 2 + 1);
    half.front() = BeginGraphOp{id + 10};
    ASSERT_TRUE(SubmitAndWait(e, id, std::move(half)).ok());
  }
  EXPECT_EQ(long_lane_io_.poll(), 0u) << "a small graph was recorded on the long lane";
  ASSERT_TRUE(OnStrand(e.session->executor(), [&e] { e.session->Close(); }));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(registry_->Totals().sessions_open, 1u)
      << "graphs of more than kLongGraphOps ops together were released without the long lane";
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "the teardown";
  ASSERT_TRUE(WaitUntil([this] { return registry_->Totals().sessions_open == 0; }));
  EXPECT_EQ(registry_->long_lane_turns(), 6u);
}

// An inline transfer without staging ranges (the direct path: here no staging at all) copies
// between the device and the message's own memory, which on CUDA may wait for the stream's
// earlier work: it goes to the long lane, the upload and the download after it together in
// one turn, and the submit completes once the long lane has run them.
TEST_F(SessionTest, InlineTransfersWithoutStagingGoToTheLongLane) {
  Client c = Open({}, &long_lane_);
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF64, {4}}}).ok());
  std::shared_ptr<const std::string> bytes = Encode(std::vector<double>{1, 2, 3, 4});
  Submit(c, 2, {UploadOp{1, 0, *bytes}, DownloadOp{1, 0, 32}, FillOp{1, 0.0}}, bytes);
  EXPECT_FALSE(c.events->WaitUntil(
      [](const auto& ev) { return CountOf(ev, Event::Kind::kCompleted) >= 2; }, milliseconds(200)))
      << "the transfers were made without the long lane";
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "nothing went to the long lane";
  EXPECT_EQ(registry_->long_lane_turns(), 1u) << "the upload and the download took two turns";
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  ASSERT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(2, 1)), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(long_lane_io_.poll(), 0u) << "the fill went to the long lane too";
}

// A direct copy that waited for the daemon's launch room on the long lane: the room, once
// taken for it, is kept while its enqueue goes back to the long lane (a wake-up runs on the
// shared lane), not given back there to be asked for again behind every other waiter.
TEST_F(SessionTest, LaunchRoomTakenForALongLaneOpIsKeptAcrossTheHandOver) {
  LaunchRoom& room = registry_->launch_room();
  room.SetLimit(4);
  ASSERT_TRUE(room.TryTake(4, nullptr));  // others' commands fill the room
  Client c = Open({}, &long_lane_);
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF64, {4}}}).ok());
  std::shared_ptr<const std::string> bytes = Encode(std::vector<double>{1, 2, 3, 4});
  Submit(c, 2, {UploadOp{1, 0, *bytes}, DownloadOp{1, 0, 32}}, bytes);
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u);  // no room there: it waits for the room
  EXPECT_EQ(room.queued(), 4u);
  room.Give(4, nullptr);  // the room wakes it on the shared lane, which hands it over again
  ASSERT_TRUE(WaitUntil([this] { return registry_->long_lane_turns() == 2; }));
  EXPECT_EQ(room.queued(), 1u) << "the room taken for the upload was given back";
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u);
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  ASSERT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(2, 1)), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_TRUE(WaitUntil([&room] { return room.queued() == 0; }));
}

// A submit that loads a module (CUDA: a compile, up to seconds, before anything is enqueued)
// is started on the long lane; the session's later submits wait behind it and start on the
// shared lane again. (The host backend loads no module: the submit fails there, after the
// long lane ran it.)
TEST_F(SessionTest, ASubmitThatLoadsAModuleIsStartedOnTheLongLane) {
  Client c = Open({}, &long_lane_);
  Submit(c, 1, {LoadModuleOp{7, backend::ModuleFormat::kPtx, "x"}});
  // Posted, not waited for: the strand runs it after the long-lane function.
  auto second = std::make_shared<SubmitRequest>(
      Request(2, {CreateTensorOp{1, DType::kF64, {4}}, FillOp{1, 2.0}}));
  c.session->executor().Post([s = c.session, second] { s->Submit(std::move(*second)); });
  EXPECT_FALSE(c.events->WaitUntil(
      [](const auto& ev) { return CountOf(ev, Event::Kind::kCompleted) >= 1; }, milliseconds(200)))
      << "the load was started without the long lane, or the submit behind it passed it";
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "nothing went to the long lane";
  EXPECT_EQ(registry_->long_lane_turns(), 1u);
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  std::vector<Event> done = c.events->completions();
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[0].status.kind(), ErrorKind::kUnsupported) << done[0].status.ToString();
  EXPECT_TRUE(done[1].status.ok()) << done[1].status.ToString();
  EXPECT_EQ(long_lane_io_.poll(), 0u) << "the submit behind it went to the long lane";
}

// A submit of more than kLongSubmitOps ops (a LaunchGraph counted as the ops its graph
// recorded) is started on the long lane, where it is admitted (admission is not cut into
// slices); until the long lane runs it, it does not complete. One of kLongSubmitOps ops stays
// on the shared lane.
TEST_F(SessionTest, ASubmitOfManyOpsIsAdmittedOnTheLongLane) {
  Client c = Open({}, &long_lane_);
  MakeAddends(c, 1);
  std::vector<Op> adds(Session::kLongSubmitOps, AxpyOp{1.0, 2, 1});
  ASSERT_TRUE(SubmitAndWait(c, 2, adds).ok());
  EXPECT_EQ(long_lane_io_.poll(), 0u) << "a submit of kLongSubmitOps ops went to the long lane";
  auto completed = [](size_t n) {
    return [n](const std::vector<Event>& ev) { return CountOf(ev, Event::Kind::kCompleted) >= n; };
  };
  adds.push_back(AxpyOp{1.0, 2, 1});
  Submit(c, 3, std::move(adds));
  EXPECT_FALSE(c.events->WaitUntil(completed(3), milliseconds(200)))
      << "a submit of kLongSubmitOps + 1 ops was admitted without the long lane";
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "nothing went to the long lane";
  ASSERT_TRUE(c.events->WaitForCompletions(3));
  EXPECT_TRUE(c.events->CompletionOf(3).ok()) << c.events->CompletionOf(3).ToString();

  // 64 launches of a graph of kLongGraphOps + 1 ops count as 65600 ops: admitted there, and
  // launched there (ALargeGraphIsLaunchedAndReleasedOnTheLongLane), in as many turns as their
  // slices take.
  Submit(c, 4, RecordAdds(Session::kLongGraphOps + 1));
  ASSERT_EQ(long_lane_io_.run_one_for(kTimeout), 1u) << "the graph's EndGraph";
  ASSERT_TRUE(c.events->WaitForCompletions(4));
  ASSERT_TRUE(c.events->CompletionOf(4).ok()) << c.events->CompletionOf(4).ToString();
  Submit(c, 5, std::vector<Op>(64, LaunchGraphOp{7}));
  EXPECT_FALSE(c.events->WaitUntil(completed(5), milliseconds(200)))
      << "64 launches of a 1025-op graph were admitted without the long lane";
  ASSERT_TRUE(RunLongLaneUntil([&] { return c.events->WaitUntil(completed(5), milliseconds(1)); }))
      << "64 launches of a 1025-op graph never completed";
  EXPECT_TRUE(c.events->CompletionOf(5).ok()) << c.events->CompletionOf(5).ToString();
  EXPECT_GE(registry_->long_lane_turns(), 3u);
  EXPECT_EQ(long_lane_io_.poll(), 0u);
}

// A submit that records a graph and launches it: each launch weighs the ops the graph
// recorded in that same submit, as admission counts them, so 64 launches of a 1024-op graph
// recorded alongside (65,536 ops and more) start on the long lane, though no graph the
// session held before is launched.
TEST_F(SessionTest, LaunchesOfAGraphRecordedInTheSameSubmitCountItsOps) {
  Client c = Open({}, &long_lane_);
  MakeAddends(c, 1);
  std::vector<Op> ops = RecordAdds(Session::kLongGraphOps);  // graph 7, on the shared lane
  for (int i = 0; i < 64; ++i) ops.push_back(LaunchGraphOp{7});
  Submit(c, 2, std::move(ops));
  EXPECT_FALSE(c.events->WaitUntil(
      [](const auto& ev) { return CountOf(ev, Event::Kind::kCompleted) >= 2; }, milliseconds(200)))
      << "64 launches of a graph recorded in the same submit were admitted without the long lane";
  ASSERT_TRUE(RunLongLaneUntil([&] {
    return c.events->WaitUntil(
        [](const auto& ev) { return CountOf(ev, Event::Kind::kCompleted) >= 2; }, milliseconds(1));
  })) << "the submit never completed";
  EXPECT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_GE(registry_->long_lane_turns(), 1u);
}

// A client that goes away while its large graph waits for the long lane: the abort reaches
// the strand behind the instantiation (one function at a time, in order), and once the long
// lane has run it, the graph and everything else are released.
TEST_F(SessionTest, AnAbortWhileALargeGraphWaitsForTheLongLaneReleasesEverything) {
  Client c = Open({}, &long_lane_);
  MakeAddends(c, 1);
  Submit(c, 2, RecordAdds(Session::kLongGraphOps + 1));
  c.session->executor().Post([s = c.session] { s->Abort(); });
  // Run the long lane until the session is gone (ALargeGraphIsInstantiatedOnTheLongLane
  // checks that the EndGraph goes there).
  ASSERT_TRUE(RunLongLaneUntil([this] { return registry_->Totals().sessions_open == 0; }))
      << "the session never finished closing";
  ExpectAllReleasedAfterAbort(c);
}

// The slice is the executor turn's, not each submit's: a submit enqueued late in a turn that
// has run its slice already (here: 3 ms of other work first) yields after its first ops,
// though it alone would fit a slice many times over. So submits started together (parked
// behind a long one, or a ring's run) hold the thread one slice at a time.
TEST_F(SessionTest, ASubmitEnqueuedLateInATurnYieldsAfterItsFirstOps) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF64, {4}}}).ok());
  std::vector<Op> fills;
  for (int i = 0; i < 200; ++i) fills.push_back(FillOp{1, static_cast<double>(i)});
  fills.push_back(DownloadOp{1, 0, 32});
  SubmitRequest request = Request(2, std::move(fills));
  const uint64_t before = registry_->enqueue_yields();
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    c.session->Submit(std::move(request));
  }));
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  EXPECT_GT(registry_->enqueue_yields(), before) << "200 fills in a spent turn did not yield";
  EXPECT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(2, 200)), std::vector<double>(4, 199.0));
}

// A submit that may block or run long (here a create: an allocation) that reaches the
// session on a caller's thread (a RunOrPost or TryRun run there: a gRPC thread, the ring
// poller, the completion watcher) is not started there: it parks, and an io thread starts it
// once that thread is done; a quick submit behind it waits for it.
TEST_F(SessionTest, ASubmitThatMayBlockIsNotStartedOnACallersThread) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF32, {64}}}).ok());
  const uint64_t before = reserved();
  uint64_t reserved_there = 0;
  size_t in_flight_there = 0;
  std::function<void()> on_callers_thread = [&] {
    EXPECT_TRUE(SerialExecutor::RunningOnCallersThread());
    c.session->Submit(Request(2, {CreateTensorOp{2, DType::kF32, {1 << 20}}}));
    c.session->Submit(Request(3, {FillOp{1, 2.0}}));
    // Nothing of the session's can run elsewhere meanwhile: what is seen here is this
    // thread's doing alone.
    reserved_there = reserved();
    in_flight_there = c.session->in_flight();
  };
  while (!c.session->executor().TryRun(on_callers_thread)) std::this_thread::yield();
  EXPECT_EQ(reserved_there, before) << "the create was started on the caller's thread";
  EXPECT_EQ(in_flight_there, 2u);
  ASSERT_TRUE(c.events->WaitForCompletions(3));
  EXPECT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_TRUE(c.events->CompletionOf(3).ok()) << c.events->CompletionOf(3).ToString();
  EXPECT_EQ(reserved(), before + (4ull << 20)) << "the create ran, on an io thread";
  const std::vector<Event> done = c.events->completions();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[1].id, 2u);
  EXPECT_EQ(done[2].id, 3u) << "the quick submit waited behind the parked one";
}

TEST_F(SessionTest, SynchronizeWithNothingInFlightAnswersAtOnce) {
  Client c = Open();
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] { c.session->Synchronize(5); }));
  std::vector<Event> events = c.events->events();  // raised inside Synchronize itself
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Event::Kind::kSynchronized);
  EXPECT_EQ(events[0].id, 5u);
}

TEST_F(SessionTest, SynchronizeComesAfterEveryEarlierCompletion) {
  Client c = Open();
  host()->SetOpDelayForTest(milliseconds(2));
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    c.session->Submit(
        Request(1, {CreateTensorOp{1, DType::kF32, {8}}, FillOp{1, 1.0}, FillOp{1, 2.0}}));
    c.session->Submit(Request(2, {FillOp{77, 1.0}}));  // refused, queued behind submit 1
    c.session->Synchronize(7);
    c.session->Submit(Request(3, {FillOp{1, 3.0}, FillOp{1, 4.0}}));
    c.session->Synchronize(8);
  }));
  ASSERT_TRUE(c.events->WaitUntil(
      [](const auto& ev) { return CountOf(ev, Event::Kind::kSynchronized) == 2; }));

  std::vector<Event> events = c.events->events();
  auto position = [&events](Event::Kind kind, uint64_t id) {
    for (size_t i = 0; i < events.size(); ++i) {
      if (events[i].kind == kind && events[i].id == id) return static_cast<int>(i);
    }
    return -1;
  };
  const int sync7 = position(Event::Kind::kSynchronized, 7);
  const int sync8 = position(Event::Kind::kSynchronized, 8);
  const int done1 = position(Event::Kind::kCompleted, 1);
  const int done2 = position(Event::Kind::kCompleted, 2);
  const int done3 = position(Event::Kind::kCompleted, 3);
  ASSERT_GE(done1, 0);
  ASSERT_GE(done2, 0);
  ASSERT_GE(done3, 0);
  EXPECT_GT(sync7, done1);
  EXPECT_GT(sync7, done2);
  EXPECT_GT(sync8, done3);
  EXPECT_GT(sync8, sync7);
}

TEST_F(SessionTest, BackpressureFollowsTheInFlightLimit) {
  SessionConfig config;
  config.max_in_flight_submits = 2;
  Client c = Open(config);
  host()->SetOpDelayForTest(milliseconds(2));
  bool before = false, after_one = false, after_two = false;
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    before = c.session->CanAcceptSubmit();
    c.session->Submit(Request(1, {CreateTensorOp{1, DType::kF32, {8}}, FillOp{1, 1.0}}));
    after_one = c.session->CanAcceptSubmit();
    c.session->Submit(Request(2, {FillOp{1, 2.0}, FillOp{1, 3.0}}));
    after_two = c.session->CanAcceptSubmit();
  }));
  EXPECT_TRUE(before);
  EXPECT_TRUE(after_one);
  EXPECT_FALSE(after_two);

  ASSERT_TRUE(c.events->WaitForCompletions(1));
  bool after_completion = false;
  ASSERT_TRUE(
      OnStrand(c.session->executor(), [&] { after_completion = c.session->CanAcceptSubmit(); }));
  EXPECT_TRUE(after_completion);
  ASSERT_TRUE(c.events->WaitForCompletions(2));
}

// --- Device errors ---------------------------------------------------------------------------

// A device fault loses the context for every session (DeviceSupervisor): the session whose
// work faulted gets DEVICE_FAULT for that submit and every later one; every other session
// gets DEVICE_RESET from then on; sessions opened after the rebuild work.
TEST_F(SessionTest, DeviceFaultFailsTheFaultingSessionForGood) {
  Client a = Open();
  Client b = Open();
  ASSERT_TRUE(SubmitAndWait(a, 1, {CreateTensorOp{1, DType::kF32, {16}}}).ok());
  ASSERT_TRUE(SubmitAndWait(b, 1, {CreateTensorOp{1, DType::kF32, {16}}, FillOp{1, 2.0}}).ok());

  host()->InjectFaultForTest(0, Status(ErrorKind::kDeviceFault, "injected fault"));
  Status faulted = SubmitAndWait(a, 2, {FillOp{1, 1.0}, FillOp{1, 2.0}});
  EXPECT_EQ(faulted.kind(), ErrorKind::kDeviceFault) << faulted.ToString();
  EXPECT_EQ(faulted.op_index(), -1);

  Status later = SubmitAndWait(a, 3, {FillOp{1, 1.0}});
  EXPECT_EQ(later.kind(), ErrorKind::kDeviceFault) << later.ToString();
  later = SubmitAndWait(a, 4, {CreateTensorOp{2, DType::kF32, {4}}});
  EXPECT_EQ(later.kind(), ErrorKind::kDeviceFault) << later.ToString();

  // Once both sessions dropped their streams the device is rebuilt; their tensors are gone.
  ASSERT_TRUE(WaitUntil([this] { return supervisor_->resets() == 1; }));
  EXPECT_EQ(reserved(), 0u);
  Status other = SubmitAndWait(b, 2, {FillOp{1, 3.0}});
  EXPECT_EQ(other.kind(), ErrorKind::kDeviceReset) << other.ToString();

  Client fresh = Open();
  ASSERT_TRUE(SubmitAndWait(fresh, 1,
                            {CreateTensorOp{1, DType::kF32, {4}}, FillOp{1, 1.5},
                             DownloadOp{1, 0, 16}, FreeTensorOp{1}})
                  .ok());
  EXPECT_EQ(Decode<float>(fresh.events->Downloaded(1, 2)), std::vector<float>(4, 1.5f));

  for (const Client* c : {&a, &b, &fresh}) {
    SessionStatsSnapshot stats = CloseAndWait(*c);
    (void)stats;
  }
  EXPECT_EQ(supervisor_->bytes_in_use(), 0u);
  EXPECT_EQ(reserved(), 0u);
}

// A run-time error that is not a device fault stays on the stream that hit it (per-stream
// sticky): that session's later submits fail with it, other sessions are untouched.
TEST_F(SessionTest, StickyStreamErrorFailsOnlyItsOwnSession) {
  Client a = Open();
  Client b = Open();
  ASSERT_TRUE(SubmitAndWait(a, 1, {CreateTensorOp{1, DType::kF32, {16}}}).ok());
  ASSERT_TRUE(SubmitAndWait(b, 1, {CreateTensorOp{1, DType::kF32, {16}}}).ok());

  host()->InjectFaultForTest(0, Status(ErrorKind::kInternal, "injected stream error"));
  Status failed = SubmitAndWait(a, 2, {FillOp{1, 1.0}});
  EXPECT_EQ(failed.kind(), ErrorKind::kInternal) << failed.ToString();
  EXPECT_EQ(failed.op_index(), -1);
  Status later = SubmitAndWait(a, 3, {FillOp{1, 2.0}});
  EXPECT_EQ(later.kind(), ErrorKind::kInternal) << later.ToString();

  ASSERT_TRUE(SubmitAndWait(b, 2, {FillOp{1, 4.0}, DownloadOp{1, 0, 64}}).ok());
  EXPECT_EQ(Decode<float>(b.events->Downloaded(2, 1)), std::vector<float>(16, 4.0f));
  EXPECT_EQ(supervisor_->resets(), 0u);
}

TEST_F(SessionTest, FailedAllocationRefusesTheSubmitWhole) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF32, {16}}, FillOp{1, 3.0}}).ok());
  ASSERT_EQ(reserved(), 64u);
  ASSERT_EQ(supervisor_->bytes_in_use(), 64u);

  host()->FailNextAllocationForTest();
  Status refused =
      SubmitAndWait(c, 2, {CreateTensorOp{2, DType::kF32, {32}}, FillOp{2, 1.0}, FillOp{1, 5.0}});
  EXPECT_EQ(refused.kind(), ErrorKind::kOutOfDeviceMemory) << refused.ToString();
  EXPECT_EQ(refused.op_index(), 0);
  EXPECT_EQ(reserved(), 64u);
  EXPECT_EQ(supervisor_->bytes_in_use(), 64u);

  // Tensor 2 never entered the table, and nothing of the submit ran.
  EXPECT_EQ(SubmitAndWait(c, 3, {DownloadOp{2, 0, 4}}).kind(), ErrorKind::kInvalidHandle);
  ASSERT_TRUE(SubmitAndWait(c, 4, {DownloadOp{1, 0, 64}}).ok());
  EXPECT_EQ(Decode<float>(c.events->Downloaded(4, 0)), std::vector<float>(16, 3.0f));

  // A later submit works, and may use the handle.
  ASSERT_TRUE(
      SubmitAndWait(c, 5,
                    {CreateTensorOp{2, DType::kF32, {32}}, FillOp{2, 1.5}, DownloadOp{2, 0, 128}})
          .ok());
  EXPECT_EQ(Decode<float>(c.events->Downloaded(5, 2)), std::vector<float>(32, 1.5f));
  EXPECT_EQ(reserved(), 64u + 128u);

  SessionStatsSnapshot stats = CloseAndWait(c);
  EXPECT_EQ(stats.submits, 5u);
  EXPECT_EQ(stats.failed_submits, 2u);
  EXPECT_EQ(reserved(), 0u);
  EXPECT_EQ(supervisor_->bytes_in_use(), 0u);
}

// Regression: Session::Enqueue reserves the bytes of every create of a submit up front, but
// on a failed allocation (or module load) it used to give back only the creates it had
// reached, so the daemon-wide reservation of the later creates leaked for good.
TEST_F(SessionTest, RefusedEnqueueReleasesTheReservationOfEveryCreate) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF32, {16}}}).ok());
  ASSERT_EQ(reserved(), 64u);

  host()->FailNextAllocationForTest();
  Status refused = SubmitAndWait(
      c, 2, {CreateTensorOp{2, DType::kF32, {32}}, CreateTensorOp{3, DType::kF32, {8}}});
  EXPECT_EQ(refused.kind(), ErrorKind::kOutOfDeviceMemory) << refused.ToString();
  EXPECT_EQ(refused.op_index(), 0);
  EXPECT_EQ(reserved(), 64u) << "the 32 bytes of tensor 3 stay reserved";

  // The host backend loads no modules: the same refusal path, before any allocation.
  static constexpr char kImage[] = "not a module";
  Status unsupported = SubmitAndWait(
      c, 3,
      {LoadModuleOp{1, backend::ModuleFormat::kPtx, kImage}, CreateTensorOp{4, DType::kF32, {8}}});
  EXPECT_EQ(unsupported.kind(), ErrorKind::kUnsupported) << unsupported.ToString();
  EXPECT_EQ(unsupported.op_index(), 0);
  EXPECT_EQ(reserved(), 64u) << "the 32 bytes of tensor 4 stay reserved";

  CloseAndWait(c);
  EXPECT_EQ(supervisor_->bytes_in_use(), 0u);
  EXPECT_EQ(reserved(), 0u) << "reservations leaked past the session";
}

TEST_F(SessionTest, DaemonWideCapRefusesWithQuotaExceeded) {
  registry_ = std::make_unique<SessionRegistry>(1024, 16);
  SessionConfig config;
  config.device_bytes_quota = 1 << 20;  // the session's own quota would allow it
  Client a = Open(config);
  Client b = Open(config);

  Status over = SubmitAndWait(a, 1, {CreateTensorOp{1, DType::kU8, {2048}}});
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded) << over.ToString();
  EXPECT_EQ(reserved(), 0u);
  EXPECT_EQ(supervisor_->bytes_in_use(), 0u);

  ASSERT_TRUE(SubmitAndWait(a, 2, {CreateTensorOp{1, DType::kU8, {1024}}}).ok());
  EXPECT_EQ(reserved(), 1024u);
  // The cap is shared by every session.
  over = SubmitAndWait(b, 1, {CreateTensorOp{1, DType::kU8, {1}}});
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded) << over.ToString();

  ASSERT_TRUE(SubmitAndWait(a, 3, {FreeTensorOp{1}}).ok());
  EXPECT_EQ(reserved(), 0u);
  EXPECT_TRUE(SubmitAndWait(b, 2, {CreateTensorOp{1, DType::kU8, {1}}}).ok());
}

// --- Close and Abort -------------------------------------------------------------------------

TEST_F(SessionTest, CloseWithWorkInFlightReportsStatsAndReleasesEverything) {
  Client c = Open();
  std::vector<float> ramp(256);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<float>(i);
  std::shared_ptr<const std::string> upload = Encode(ramp);
  host()->SetOpDelayForTest(milliseconds(1));
  size_t in_flight = 0;
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    // 4 ops, 1 launch, 1024 bytes up and down; 1 tensor of 1024 bytes.
    c.session->Submit(Request(1,
                              {CreateTensorOp{1, DType::kF32, {256}}, UploadOp{1, 0, *upload},
                               ScaleOp{1, 2.0, 1}, DownloadOp{1, 0, 1024}},
                              upload));
    // 7 ops, 3 launches, 4 bytes down; 2 tensors, peak 1024 + 1024 + 4 bytes.
    c.session->Submit(Request(
        2, {CreateTensorOp{2, DType::kF32, {256}}, CopyOp{1, 2},
            BinaryOpArgs{backend::BinaryOp::kAdd, 1, 2, 2}, CreateTensorOp{3, DType::kF32, {}},
            ReduceSumOp{2, 3}, DownloadOp{3, 0, 4}, FreeTensorOp{2}}));
    c.session->Submit(Request(3, {FillOp{99, 1.0}}));  // refused: no tensor 99
    c.session->Close();
    c.session->Submit(Request(4, {FillOp{1, 1.0}}));  // refused: the session is closing
    in_flight = c.session->in_flight();
  }));
  EXPECT_EQ(in_flight, 4u);
  ASSERT_TRUE(c.events->WaitForClosed());

  std::vector<Event> events = c.events->events();
  ASSERT_EQ(events.back().kind, Event::Kind::kClosed);
  EXPECT_EQ(CountOf(events, Event::Kind::kClosed), 1u);
  std::vector<Event> done = c.events->completions();
  ASSERT_EQ(done.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(done[i].id, i + 1);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
  EXPECT_TRUE(done[1].status.ok()) << done[1].status.ToString();
  EXPECT_EQ(done[2].status.kind(), ErrorKind::kInvalidHandle);
  EXPECT_EQ(done[3].status.kind(), ErrorKind::kSessionClosed);

  std::vector<float> doubled(256);
  for (size_t i = 0; i < doubled.size(); ++i) doubled[i] = 2.0f * static_cast<float>(i);
  EXPECT_EQ(Decode<float>(c.events->Downloaded(1, 3)), doubled);
  EXPECT_EQ(Decode<float>(c.events->Downloaded(2, 5)), std::vector<float>{4.0f * 32640.0f});

  const SessionStatsSnapshot& stats = events.back().stats;
  EXPECT_EQ(stats.submits, 4u);
  EXPECT_EQ(stats.failed_submits, 2u);
  EXPECT_EQ(stats.ops, 11u);
  EXPECT_EQ(stats.kernel_launches, 4u);
  EXPECT_EQ(stats.bytes_uploaded, 1024u);
  EXPECT_EQ(stats.bytes_downloaded, 1028u);
  EXPECT_EQ(stats.tensors_created, 3u);
  EXPECT_EQ(stats.peak_device_bytes, 2052u);

  EXPECT_EQ(supervisor_->bytes_in_use(), 0u);
  DaemonTotals totals = registry_->Totals();
  EXPECT_EQ(totals.sessions_open, 0u);
  EXPECT_EQ(totals.device_bytes_reserved, 0u);
  EXPECT_EQ(totals.submits, 4u);  // folded into the daemon totals
  EXPECT_TRUE(registry_->List().empty());
}

TEST_F(SessionTest, AbortWithWorkInFlightRaisesNothingButReleasesEverything) {
  Client c = Open();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kF32, {16}}}).ok());
  host()->SetOpDelayForTest(milliseconds(2));
  uint64_t in_use = 0;
  size_t in_flight = 0;
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    c.session->Submit(Request(2, {CreateTensorOp{2, DType::kF32, {1024}}, FillOp{2, 1.0},
                                  FillOp{2, 2.0}, DownloadOp{2, 0, 4096}}));
    c.session->Submit(Request(3, {FillOp{1, 3.0}, DownloadOp{1, 0, 64}}));
    c.session->Abort();
    in_flight = c.session->in_flight();
    in_use = supervisor_->bytes_in_use();
  }));
  EXPECT_EQ(in_flight, 2u);
  EXPECT_EQ(in_use, 64u + 4096u);

  ASSERT_TRUE(WaitUntil([this] { return registry_->Totals().sessions_open == 0; }));
  EXPECT_EQ(supervisor_->bytes_in_use(), 0u);
  EXPECT_EQ(reserved(), 0u);
  EXPECT_TRUE(registry_->List().empty());
  bool closing = false;
  ASSERT_TRUE(OnStrand(c.session->executor(), [&] {
    in_flight = c.session->in_flight();
    closing = c.session->closing();
  }));
  EXPECT_EQ(in_flight, 0u);
  EXPECT_TRUE(closing);
  // Only the completion of submit 1, from before the Abort.
  std::vector<Event> events = c.events->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Event::Kind::kCompleted);
  EXPECT_EQ(events[0].id, 1u);
}

// Regression: a session in teardown (Close with nothing in flight: frees enqueued, the final
// completion awaited) that was told the device is lost before that completion reached it
// dropped the completion as stale (the epoch moved on) and never called Finalize, so
// OnClosed never came and the registry kept the session.
TEST_F(SessionTest, DeviceLossDuringTeardownStillRaisesOnClosed) {
  Client a = Open();
  ASSERT_TRUE(SubmitAndWait(a, 1, {CreateTensorOp{1, DType::kF32, {16}}}).ok());

  // A stream of the same device, outside any session: it holds the device's completion
  // thread (so the teardown's completion waits) and keeps the device from being rebuilt.
  constexpr uint64_t kOtherSession = 1000;
  auto lease = supervisor_->Join(kOtherSession, std::weak_ptr<DeviceLostListener>());
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, release = false;
  lease->stream->OnComplete([&](Status) {
    std::unique_lock lock(mu);
    holding = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  {
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, kTimeout, [&] { return holding; }));
  }

  // The teardown's completion is now queued behind the held one.
  EXPECT_TRUE(OnStrand(a.session->executor(), [&] { a.session->Close(); }));
  // Another session reports a fault: the device-lost notice is posted to a's strand before
  // its final completion can be.
  supervisor_->ReportFault(lease->generation, kOtherSession,
                           Status(ErrorKind::kDeviceFault, "injected fault elsewhere"));
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();

  // Everything is already done once the completion thread runs again: a short wait.
  EXPECT_TRUE(a.events->WaitForClosed(milliseconds(2000))) << "OnClosed never came";
  EXPECT_EQ(registry_->Totals().sessions_open, 0u);
  EXPECT_EQ(reserved(), 0u);

  lease->stream.reset();
  supervisor_->ReleaseStream(lease->generation);
  supervisor_->Leave(kOtherSession);
}

// --- Op semantics through the session --------------------------------------------------------

// --- Copy turns ------------------------------------------------------------------------------

// One turn per direction for copies of 4 KiB or more. Session a's upload holds the upload turn
// (the host device takes 20 ms per op), so session b's large upload waits for it, and b's
// later submits, small or not, wait behind that one: they still complete in order, with the
// right bytes, and every turn is given back.
TEST_F(SessionTest, LargeCopiesWaitForATurnAndTheSessionsLaterSubmitsWaitBehindThem) {
  turns_ = std::make_unique<CopyTurns>(1, 4096);
  Client a = Open();
  Client b = Open();
  const std::vector<float> ones(4096, 1.0f), twos(4096, 2.0f);
  auto up_a = Registered(Encode(ones)), up_b = Registered(Encode(twos));
  ASSERT_TRUE(SubmitAndWait(a, 1, {CreateTensorOp{1, DType::kF32, {4096}}}).ok());
  ASSERT_TRUE(
      SubmitAndWait(b, 1,
                    {CreateTensorOp{1, DType::kF32, {4096}}, CreateTensorOp{2, DType::kF32, {4}}})
          .ok());
  host()->SetOpDelayForTest(milliseconds(20));
  Submit(a, 2, {UploadOp{1, 0, *up_a}}, up_a);
  size_t b_in_flight = 0;
  ASSERT_TRUE(OnStrand(b.session->executor(), [&] {
    b.session->Submit(Request(2, {UploadOp{1, 0, *up_b}}, up_b));  // waits for the turn
    b.session->Submit(Request(3, {FillOp{2, 5.0}}));               // small: waits behind it
    b.session->Submit(Request(4, {FillOp{99, 5.0}}));              // refused, in order
    b.session->Submit(Request(5, {DownloadOp{1, 0, 4096 * 4}, DownloadOp{2, 0, 16}}));
    b.session->Synchronize(7);
    b_in_flight = b.session->in_flight();
  }));
  EXPECT_EQ(b_in_flight, 4u);              // parked submits count as in flight (backpressure)
  EXPECT_EQ(turns_->stats().waiting, 1u);  // b's first large upload; the rest wait behind it
  ASSERT_TRUE(b.events->WaitUntil(
      [](const auto& ev) { return CountOf(ev, Event::Kind::kSynchronized) == 1; }));
  std::vector<Event> done = b.events->completions();
  ASSERT_EQ(done.size(), 5u);
  for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(done[i].id, i + 1);
  EXPECT_TRUE(done[1].status.ok()) << done[1].status.ToString();
  EXPECT_TRUE(done[2].status.ok()) << done[2].status.ToString();
  EXPECT_EQ(done[3].status.kind(), ErrorKind::kInvalidHandle) << done[3].status.ToString();
  EXPECT_TRUE(done[4].status.ok()) << done[4].status.ToString();
  EXPECT_EQ(Decode<float>(b.events->Downloaded(5, 0)), twos);
  EXPECT_EQ(Decode<float>(b.events->Downloaded(5, 1)), std::vector<float>(4, 5.0f));
  EXPECT_EQ(b.events->events().back().kind, Event::Kind::kSynchronized);
  ASSERT_TRUE(a.events->WaitForCompletions(2));
  EXPECT_TRUE(a.events->CompletionOf(2).ok());
  CopyTurns::Stats s = turns_->stats();
  EXPECT_EQ(s.waits, 1u);  // b's upload; its download found the download turn free
  EXPECT_EQ(s.waiting, 0u);
  EXPECT_EQ(s.held_to_device, 0u);
  EXPECT_EQ(s.held_to_host, 0u);
}

// A waiting submit that admission then refuses gives its turn back at once, and the next
// waiter gets it.
TEST_F(SessionTest, AWaitingSubmitThatIsRefusedGivesItsTurnBack) {
  turns_ = std::make_unique<CopyTurns>(1, 4096);
  Client a = Open();
  Client b = Open();
  Client c = Open();
  auto bytes = Registered(std::make_shared<std::string>(8192, '\x11'));
  for (const Client* x : {&a, &b, &c}) {
    ASSERT_TRUE(SubmitAndWait(*x, 1, {CreateTensorOp{1, DType::kU8, {8192}}}).ok());
  }
  host()->SetOpDelayForTest(milliseconds(20));
  Submit(a, 2, {UploadOp{1, 0, *bytes}}, bytes);
  Submit(b, 2, {UploadOp{42, 0, *bytes}}, bytes);  // tensor 42 does not exist
  Submit(c, 2, {UploadOp{1, 0, *bytes}, DownloadOp{1, 0, 8192}}, bytes);
  EXPECT_EQ(turns_->stats().waiting, 2u);
  ASSERT_TRUE(c.events->WaitForCompletions(2));
  EXPECT_EQ(b.events->CompletionOf(2).kind(), ErrorKind::kInvalidHandle);
  EXPECT_TRUE(c.events->CompletionOf(2).ok()) << c.events->CompletionOf(2).ToString();
  EXPECT_EQ(c.events->Downloaded(2, 1), *bytes);
  EXPECT_EQ(turns_->stats().held_to_device, 0u);
  EXPECT_EQ(turns_->stats().held_to_host, 0u);
}

// A client that goes away while its submits wait for a turn: they are dropped unrun, the
// session goes away without waiting for the turn, and the turn, once granted, is given back.
TEST_F(SessionTest, AbortWhileWaitingForATurnDropsTheWaitingSubmitsAndWithdrawsTheRequest) {
  turns_ = std::make_unique<CopyTurns>(1, 4096);
  Client a = Open();
  Client b = Open();
  auto bytes = Registered(std::make_shared<std::string>(8192, '\x22'));
  ASSERT_TRUE(SubmitAndWait(a, 1, {CreateTensorOp{1, DType::kU8, {8192}}}).ok());
  ASSERT_TRUE(SubmitAndWait(b, 1, {CreateTensorOp{1, DType::kU8, {8192}}}).ok());
  host()->SetOpDelayForTest(milliseconds(50));
  Submit(a, 2, {UploadOp{1, 0, *bytes}}, bytes);
  ASSERT_TRUE(OnStrand(b.session->executor(), [&] {
    b.session->Submit(Request(2, {UploadOp{1, 0, *bytes}}, bytes));
    b.session->Submit(Request(3, {FillOp{1, 1.0}}));
    b.session->Abort();
  }));
  // b closes while a still holds the turn (50 ms per op): nothing of b ran, and b's request
  // no longer waits (left waiting, it would hold b until granted).
  ASSERT_TRUE(WaitUntil([this] { return registry_->Totals().sessions_open == 1; }));
  EXPECT_EQ(turns_->stats().held_to_device, 1u);
  EXPECT_EQ(turns_->stats().waiting, 0u);
  EXPECT_EQ(b.events->events().size(), 1u);  // only submit 1's completion, before the Abort
  ASSERT_TRUE(a.events->WaitForCompletions(2));
  ASSERT_TRUE(WaitUntil([this] { return turns_->stats().held_to_device == 0; }));
  EXPECT_EQ(turns_->stats().waiting, 0u);
  // The turn works on: a takes it again.
  host()->SetOpDelayForTest(milliseconds(0));
  EXPECT_TRUE(SubmitAndWait(a, 3, {UploadOp{1, 0, *bytes}}, bytes).ok());
}

TEST_F(SessionTest, GemmWithZeroInnerDimensionGivesBetaTimesC) {
  Client c = Open();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Status s = SubmitAndWait(
      c, 1,
      {CreateTensorOp{1, DType::kF32, {2, 0}},  // A: 2 x 0
       CreateTensorOp{2, DType::kF32, {0, 3}},  // B: 0 x 3
       CreateTensorOp{3, DType::kF32, {2, 3}},  // C
       FillOp{3, 4.0}, GemmOp{1, 2, 3, false, false, 1.0, 0.5}, DownloadOp{3, 0, 24},
       // beta == 0: C is overwritten, not read (NaN does not survive).
       CreateTensorOp{4, DType::kF32, {2, 3}}, FillOp{4, nan},
       GemmOp{1, 2, 4, false, false, 1.0, 0.0}, DownloadOp{4, 0, 24},
       // Transposed A stored k x m = 0 x 2.
       CreateTensorOp{5, DType::kF32, {0, 2}}, CreateTensorOp{6, DType::kF32, {2, 3}},
       FillOp{6, -2.0}, GemmOp{5, 2, 6, true, false, 3.0, 1.5}, DownloadOp{6, 0, 24}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Decode<float>(c.events->Downloaded(1, 5)), std::vector<float>(6, 2.0f));
  EXPECT_EQ(Decode<float>(c.events->Downloaded(1, 9)), std::vector<float>(6, 0.0f));
  EXPECT_EQ(Decode<float>(c.events->Downloaded(1, 14)), std::vector<float>(6, -3.0f));
}

TEST_F(SessionTest, ReduceSumOfEmptyTensorIsZero) {
  Client c = Open();
  Status s =
      SubmitAndWait(c, 1,
                    {CreateTensorOp{1, DType::kF64, {0}}, CreateTensorOp{2, DType::kF64, {}},
                     FillOp{2, 7.0}, ReduceSumOp{1, 2}, DownloadOp{2, 0, 8},
                     CreateTensorOp{3, DType::kF32, {4, 0}}, CreateTensorOp{4, DType::kF32, {1}},
                     FillOp{4, -1.0}, ReduceSumOp{3, 4}, DownloadOp{4, 0, 4}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Decode<double>(c.events->Downloaded(1, 4)), std::vector<double>{0.0});
  EXPECT_EQ(Decode<float>(c.events->Downloaded(1, 9)), std::vector<float>{0.0f});
}

// --- Module memory ---------------------------------------------------------------------------

/// The host backend with modules: LoadModule hands out a module that takes as many device
/// bytes as its image (decimal digits) says, as ModuleFootprint would have bounded them.
class ModuleDevice final : public backend::Device {
 public:
  explicit ModuleDevice(std::unique_ptr<backend::Device> host) : host_(std::move(host)) {}

  const backend::DeviceInfo& info() const override { return host_->info(); }
  Result<std::unique_ptr<backend::Stream>> CreateStream() override { return host_->CreateStream(); }
  Status RegisterHostMemory(void* ptr, uint64_t bytes) override {
    return host_->RegisterHostMemory(ptr, bytes);
  }
  Status UnregisterHostMemory(void* ptr) override { return host_->UnregisterHostMemory(ptr); }
  Result<std::shared_ptr<backend::Module>> LoadModule(backend::ModuleFormat,
                                                      std::string_view image) override {
    uint64_t bytes = 0;
    for (char c : image) {
      if (c < '0' || c > '9') return Status(ErrorKind::kCompileError, "not a size");
      bytes = bytes * 10 + static_cast<uint64_t>(c - '0');
    }
    return ferry::testing::MakeFakeModule(bytes);
  }
  uint64_t bytes_in_use() const override { return host_->bytes_in_use(); }
  uint64_t free_memory() const override { return host_->free_memory(); }
  backend::Usage usage() const override { return host_->usage(); }

 private:
  const std::unique_ptr<backend::Device> host_;
};

class SessionModuleTest : public SessionTest {
 protected:
  static constexpr uint64_t kQuota = 1 << 20;

  Result<std::unique_ptr<backend::Device>> MakeDevice() override {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<backend::Device> host, SessionTest::MakeDevice());
    return std::unique_ptr<backend::Device>(std::make_unique<ModuleDevice>(std::move(host)));
  }
  Client OpenWithQuota() {
    SessionConfig config;
    config.device_bytes_quota = kQuota;
    return Open(config);
  }
  static Op Load(uint64_t handle, std::string_view bytes) {
    return LoadModuleOp{handle, backend::ModuleFormat::kPtx, bytes};
  }
  /// The device bytes the session's stats show it holding now, and its peak.
  uint64_t live_bytes() const {
    std::vector<SessionEntry> list = registry_->List();
    EXPECT_EQ(list.size(), 1u);
    return list.empty() ? 0 : list[0].counters->device_bytes.load();
  }
  uint64_t peak_bytes() const {
    std::vector<SessionEntry> list = registry_->List();
    return list.empty() ? 0 : list[0].counters->peak_device_bytes.load();
  }
};

// A module's device memory counts against the session's quota as a tensor's does: a load past
// it is QUOTA_EXCEEDED for that op and the submit changes nothing.
TEST_F(SessionModuleTest, LoadModuleOverTheQuotaIsQuotaExceeded) {
  Client c = OpenWithQuota();
  ASSERT_TRUE(SubmitAndWait(c, 1, {CreateTensorOp{1, DType::kU8, {512 << 10}}}).ok());
  Status over = SubmitAndWait(c, 2, {Load(5, "600000")});
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded) << over.ToString();
  EXPECT_EQ(over.op_index(), 0);
  EXPECT_NE(over.message().find("device quota"), std::string::npos) << over.ToString();
  EXPECT_EQ(reserved(), 512u << 10) << "nothing of the refused load stays charged";
  EXPECT_EQ(live_bytes(), 512u << 10);
  // A tensor created before the load in the same submit counts too; the submit is refused
  // whole: its tensor is not made and its bytes go back.
  Status whole =
      SubmitAndWait(c, 3, {CreateTensorOp{2, DType::kU8, {256 << 10}}, Load(5, "300000")});
  EXPECT_EQ(whole.kind(), ErrorKind::kQuotaExceeded) << whole.ToString();
  EXPECT_EQ(whole.op_index(), 1);
  EXPECT_EQ(reserved(), 512u << 10);
  EXPECT_EQ(SubmitAndWait(c, 4, {FillOp{2, 0}}).kind(), ErrorKind::kInvalidHandle);
  // The module is refused, not the session: one that fits loads, and then counts against a
  // tensor that no longer fits beside it.
  ASSERT_TRUE(SubmitAndWait(c, 5, {Load(5, "400000")}).ok());
  EXPECT_EQ(reserved(), (512u << 10) + 400000);
  EXPECT_EQ(live_bytes(), (512u << 10) + 400000);
  EXPECT_EQ(peak_bytes(), (512u << 10) + 400000);
  Status tensor = SubmitAndWait(c, 6, {CreateTensorOp{3, DType::kU8, {200 << 10}}});
  EXPECT_EQ(tensor.kind(), ErrorKind::kQuotaExceeded) << tensor.ToString();
}

// The 8 GiB a 100-byte PTX may declare is refused under a 1 MiB quota.
TEST_F(SessionModuleTest, AModuleLargerThanTheQuotaIsRefused) {
  Client c = OpenWithQuota();
  Status s = SubmitAndWait(c, 1, {Load(1, "8589934592")});
  EXPECT_EQ(s.kind(), ErrorKind::kQuotaExceeded) << s.ToString();
  EXPECT_EQ(reserved(), 0u);
  // The daemon-wide cap (1 GiB here) refuses what a larger session quota would let through.
  SessionConfig config;
  config.device_bytes_quota = 16ull << 30;
  Client big = Open(config);
  Status capped = SubmitAndWait(big, 1, {Load(1, "2147483648")});
  EXPECT_EQ(capped.kind(), ErrorKind::kQuotaExceeded) << capped.ToString();
  EXPECT_EQ(reserved(), 0u);
}

// Each module handle pays, cached modules included; an unload and the session's close give the
// bytes back.
TEST_F(SessionModuleTest, ModuleBytesAreReleasedAtUnloadAndAtClose) {
  Client c = OpenWithQuota();
  ASSERT_TRUE(SubmitAndWait(c, 1, {Load(1, "1000"), Load(2, "2000"), Load(3, "2000")}).ok());
  EXPECT_EQ(reserved(), 5000u);
  EXPECT_EQ(live_bytes(), 5000u);
  ASSERT_TRUE(SubmitAndWait(c, 2, {UnloadModuleOp{2}}).ok());
  EXPECT_EQ(reserved(), 3000u);
  EXPECT_EQ(live_bytes(), 3000u);
  EXPECT_EQ(peak_bytes(), 5000u);
  // Unloaded and loaded again in one submit: charged once.
  ASSERT_TRUE(SubmitAndWait(c, 3, {UnloadModuleOp{1}, Load(1, "1500")}).ok());
  EXPECT_EQ(reserved(), 3500u);
  SessionStatsSnapshot stats = CloseAndWait(c);
  EXPECT_EQ(stats.peak_device_bytes, 5000u);
  EXPECT_TRUE(WaitUntil([this] { return registry_->Totals().sessions_open == 0; }));
  EXPECT_EQ(reserved(), 0u) << "the close gave every module's bytes back";
}

}  // namespace
}  // namespace ferry::session
