// GraphRecorder: what a session keeps of the graph its stream records.
#include "session/graph_recorder.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

namespace ferry::session {
namespace {

class FakeModule : public backend::Module {
 public:
  Result<std::vector<size_t>> ParameterSizes(std::string_view) const override {
    return std::vector<size_t>{};
  }
  uint64_t device_bytes() const override { return 0; }
};

TEST(GraphRecorderTest, OutsideARecordingNothingIsKept) {
  GraphRecorder recorder;
  auto module = std::make_shared<FakeModule>();
  recorder.UseTensor(7, 1);
  recorder.CountOp();
  EXPECT_FALSE(recorder.UseRawLaunch(module));  // the submit keeps it, not a graph
  EXPECT_FALSE(recorder.recording());
  EXPECT_EQ(recorder.ops(), 0u);
  recorder.Begin(3);
  auto [handle, graph] = recorder.Finish(nullptr);
  EXPECT_EQ(handle, 3u);
  EXPECT_TRUE(graph.tensors.empty());
  EXPECT_EQ(graph.modules, nullptr);
  EXPECT_FALSE(graph.has_raw_kernels);
  EXPECT_EQ(graph.ops, 0u);
}

TEST(GraphRecorderTest, FinishGivesTheGraphWhatItsOpsUsed) {
  GraphRecorder recorder;
  auto a = std::make_shared<FakeModule>();
  auto b = std::make_shared<FakeModule>();
  recorder.Begin(42);
  EXPECT_TRUE(recorder.recording());
  recorder.CountOp();
  recorder.UseTensor(1, 10);
  recorder.CountOp();
  EXPECT_TRUE(recorder.UseRawLaunch(a));
  recorder.UseTensor(2, 11);
  recorder.CountOp();
  EXPECT_TRUE(recorder.UseRawLaunch(b));
  recorder.CountOp();
  EXPECT_TRUE(recorder.UseRawLaunch(a));  // a module launched twice is kept once
  EXPECT_EQ(recorder.ops(), 4u);

  auto [handle, graph] = recorder.Finish(nullptr);
  EXPECT_EQ(handle, 42u);
  EXPECT_EQ(graph.ops, 4u);
  EXPECT_TRUE(graph.has_raw_kernels);
  using Ref = std::pair<uint64_t, uint64_t>;
  EXPECT_EQ(graph.tensors, (std::vector<Ref>{{1, 10}, {2, 11}}));
  ASSERT_NE(graph.modules, nullptr);
  ASSERT_EQ(graph.modules->size(), 2u);
  EXPECT_EQ((*graph.modules)[0], a);
  EXPECT_EQ((*graph.modules)[1], b);
  // The recording is over: the next op is the submit's, and the modules are the graph's.
  EXPECT_FALSE(recorder.recording());
  EXPECT_EQ(recorder.ops(), 0u);
  EXPECT_FALSE(recorder.UseRawLaunch(a));
  EXPECT_EQ(a.use_count(), 2);  // `a` and the graph's list
}

TEST(GraphRecorderTest, AbandonDropsTheRecordingAndItsModules) {
  GraphRecorder recorder;
  auto module = std::make_shared<FakeModule>();
  recorder.Begin(5);
  recorder.CountOp();
  recorder.UseTensor(9, 1);
  recorder.UseRawLaunch(module);
  EXPECT_EQ(module.use_count(), 2);
  recorder.Abandon();
  EXPECT_FALSE(recorder.recording());
  EXPECT_EQ(recorder.ops(), 0u);
  EXPECT_EQ(module.use_count(), 1);  // no longer kept loaded for it
  // A new recording starts empty.
  recorder.Begin(6);
  auto [handle, graph] = recorder.Finish(nullptr);
  EXPECT_EQ(handle, 6u);
  EXPECT_TRUE(graph.tensors.empty());
  EXPECT_FALSE(graph.has_raw_kernels);
  EXPECT_EQ(graph.modules, nullptr);
}

}  // namespace
}  // namespace ferry::session
