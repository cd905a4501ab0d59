// Admission: whole-submit validation against the session's tensors and quota.
#include "session/admission.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fake_module.h"
#include "session/session.h"

namespace ferry::session {
namespace {

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest() { limits_.device_bytes_quota = 1 << 20; }

  void AddTensor(uint64_t handle, DType dtype, Shape shape) {
    TensorRecord r;
    r.dtype = dtype;
    r.shape = shape;
    r.ptr = 0x1000 * handle;
    r.bytes = *TensorBytes(dtype, shape, &r.elements);
    table_.Insert(handle, r);
  }
  Status Admit(std::vector<Op> ops) {
    SubmitRequest req;
    req.submit_id = 1;
    req.ops = std::move(ops);
    return AdmitSubmit(req, table_, limits_).status();
  }

  HandleTable table_;
  AdmissionLimits limits_;
};

TEST_F(AdmissionTest, CreateUseFreeInOneSubmitIsAdmitted) {
  EXPECT_TRUE(Admit({CreateTensorOp{1, DType::kF32, {16}}, FillOp{1, 2.0}, ScaleOp{1, 3.0, 1},
                     DownloadOp{1, 0, 64}, FreeTensorOp{1}})
                  .ok());
}

TEST_F(AdmissionTest, HandleZeroIsInvalid) {
  Status s = Admit({FillOp{0, 1.0}});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidHandle);
  EXPECT_EQ(s.op_index(), 0);
  EXPECT_EQ(Admit({CreateTensorOp{0, DType::kF32, {1}}}).kind(), ErrorKind::kInvalidHandle);
}

TEST_F(AdmissionTest, UseAfterFreeInSameSubmitNamesTheOp) {
  Status s = Admit({CreateTensorOp{1, DType::kF32, {4}}, FreeTensorOp{1}, FillOp{1, 0}});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidHandle);
  EXPECT_EQ(s.op_index(), 2);
}

TEST_F(AdmissionTest, DuplicateCreateIsRefused) {
  AddTensor(7, DType::kF32, {4});
  EXPECT_EQ(Admit({CreateTensorOp{7, DType::kF32, {4}}}).kind(), ErrorKind::kInvalidHandle);
  // Freed then created again in one submit is fine.
  EXPECT_TRUE(Admit({FreeTensorOp{7}, CreateTensorOp{7, DType::kF64, {2}}}).ok());
}

TEST_F(AdmissionTest, DtypeAndShapeMismatches) {
  AddTensor(1, DType::kF32, {8});
  AddTensor(2, DType::kF64, {8});
  AddTensor(3, DType::kF32, {4, 2});
  AddTensor(4, DType::kI32, {8});
  EXPECT_EQ(Admit({BinaryOpArgs{backend::BinaryOp::kAdd, 1, 2, 1}}).kind(),
            ErrorKind::kDtypeMismatch);
  EXPECT_EQ(Admit({BinaryOpArgs{backend::BinaryOp::kAdd, 1, 3, 1}}).kind(),
            ErrorKind::kShapeMismatch);
  EXPECT_EQ(Admit({AxpyOp{1.0, 4, 4}}).kind(), ErrorKind::kDtypeMismatch);
  EXPECT_EQ(Admit({ReduceSumOp{1, 3}}).kind(), ErrorKind::kShapeMismatch);
  // Copy only needs equal element counts.
  EXPECT_TRUE(Admit({CopyOp{1, 3}}).ok());
  EXPECT_EQ(Admit({CopyOp{1, 2}}).kind(), ErrorKind::kDtypeMismatch);
}

TEST_F(AdmissionTest, ReluTakesOneFloatDtypeAndShape) {
  AddTensor(1, DType::kF32, {8});
  AddTensor(2, DType::kF64, {8});
  AddTensor(3, DType::kF32, {4, 2});
  AddTensor(4, DType::kI32, {8});
  AddTensor(5, DType::kF32, {8});
  EXPECT_TRUE(Admit({ReluOp{1, 1}}).ok()) << "in place";
  EXPECT_TRUE(Admit({ReluOp{1, 5}}).ok());
  EXPECT_EQ(Admit({ReluOp{4, 4}}).kind(), ErrorKind::kDtypeMismatch) << "integers";
  EXPECT_EQ(Admit({ReluOp{1, 2}}).kind(), ErrorKind::kDtypeMismatch);
  EXPECT_EQ(Admit({ReluOp{1, 3}}).kind(), ErrorKind::kShapeMismatch);
  Status s = Admit({FillOp{1, 0}, ReluOp{1, 9}});
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidHandle);
  EXPECT_EQ(s.op_index(), 1);
}

TEST_F(AdmissionTest, GemmShapesAreChecked) {
  AddTensor(1, DType::kF32, {2, 3});
  AddTensor(2, DType::kF32, {3, 4});
  AddTensor(3, DType::kF32, {2, 4});
  AddTensor(4, DType::kF32, {4, 3});
  AddTensor(5, DType::kF32, {24});
  EXPECT_TRUE(Admit({GemmOp{1, 2, 3}}).ok());
  EXPECT_TRUE(Admit({GemmOp{1, 4, 3, false, true}}).ok());
  EXPECT_EQ(Admit({GemmOp{1, 4, 3}}).kind(), ErrorKind::kShapeMismatch);
  EXPECT_EQ(Admit({GemmOp{1, 2, 5}}).kind(), ErrorKind::kShapeMismatch);
  EXPECT_EQ(Admit({GemmOp{1, 2, 1}}).kind(), ErrorKind::kInvalidArgument);
}

TEST_F(AdmissionTest, OffsetsAndLengthsThatOverflowAreOutOfRange) {
  AddTensor(1, DType::kU8, {100});
  EXPECT_TRUE(Admit({DownloadOp{1, 0, 100}}).ok());
  EXPECT_EQ(Admit({DownloadOp{1, 1, 100}}).kind(), ErrorKind::kOutOfRange);
  EXPECT_EQ(Admit({DownloadOp{1, UINT64_MAX, 2}}).kind(), ErrorKind::kOutOfRange);
  std::string data(10, 'x');
  EXPECT_EQ(Admit({UploadOp{1, UINT64_MAX - 5, data}}).kind(), ErrorKind::kOutOfRange);
  EXPECT_TRUE(Admit({UploadOp{1, 90, data}}).ok());
}

TEST_F(AdmissionTest, QuotaHoldsAtEveryPointOfTheSubmit) {
  limits_.device_bytes_quota = 1000;
  EXPECT_TRUE(Admit({CreateTensorOp{1, DType::kU8, {600}}, FreeTensorOp{1},
                     CreateTensorOp{2, DType::kU8, {600}}})
                  .ok());
  Status s = Admit({CreateTensorOp{1, DType::kU8, {600}}, CreateTensorOp{2, DType::kU8, {600}}});
  EXPECT_EQ(s.kind(), ErrorKind::kQuotaExceeded);
  EXPECT_EQ(s.op_index(), 1);
}

TEST_F(AdmissionTest, HugeAndNegativeShapesAreRefused) {
  EXPECT_EQ(Admit({CreateTensorOp{1, DType::kF64, {1ll << 40, 1ll << 40}}}).kind(),
            ErrorKind::kQuotaExceeded);
  EXPECT_EQ(Admit({CreateTensorOp{1, DType::kF64, {-1}}}).kind(), ErrorKind::kShapeMismatch);
  EXPECT_EQ(Admit({CreateTensorOp{1, DType::kInvalid, {1}}}).kind(), ErrorKind::kInvalidArgument);
}

TEST_F(AdmissionTest, MalformedOpIsRefusedWithItsReason) {
  Status s = Admit({FillOp{0, 0}});
  Status m = Admit({CreateTensorOp{1, DType::kF32, {1}},
                    MalformedOp{Status(ErrorKind::kInvalidArgument, "bad kind")}});
  EXPECT_EQ(m.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(m.message(), "bad kind");
  EXPECT_EQ(m.op_index(), 1);
}

TEST_F(AdmissionTest, OpsPerSubmitLimit) {
  limits_.max_ops_per_submit = 2;
  AddTensor(1, DType::kF32, {1});
  EXPECT_EQ(Admit({FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}}).kind(), ErrorKind::kQuotaExceeded);
}

// A session holds at most max_modules modules and max_graphs graphs, counting what it
// already holds, what the submit frees and what it creates.
// A handle freed, created again and freed again in one submit is gone: using it afterwards is
// refused at admission (it once reached the device and aborted the daemon).
TEST_F(AdmissionTest, HandleFreedTwiceAroundARecreateIsGone) {
  AddTensor(1, DType::kF32, {4});
  table_.InsertGraph(5, GraphRecord{});
  Status graph = Admit({FreeGraphOp{5}, BeginGraphOp{5}, FillOp{1, 0}, EndGraphOp{}, FreeGraphOp{5},
                        LaunchGraphOp{5}});
  EXPECT_EQ(graph.kind(), ErrorKind::kInvalidHandle) << graph.ToString();
  EXPECT_EQ(graph.op_index(), 5);
  table_.InsertModule(7, ferry::testing::MakeFakeModule());
  LaunchOp launch;
  launch.module = 7;
  launch.function = "f";
  Status module = Admit({UnloadModuleOp{7}, LoadModuleOp{7, backend::ModuleFormat::kPtx, "x"},
                         UnloadModuleOp{7}, launch});
  EXPECT_EQ(module.kind(), ErrorKind::kInvalidHandle) << module.ToString();
  EXPECT_EQ(module.op_index(), 3);
}

TEST_F(AdmissionTest, ModuleAndGraphCountLimits) {
  limits_.max_modules = 2;
  limits_.max_graphs = 1;
  table_.InsertModule(7, ferry::testing::MakeFakeModule());  // one module held already
  EXPECT_TRUE(Admit({LoadModuleOp{8, backend::ModuleFormat::kPtx, "x"}}).ok());
  Status over = Admit({LoadModuleOp{8, backend::ModuleFormat::kPtx, "x"},
                       LoadModuleOp{9, backend::ModuleFormat::kPtx, "x"}});
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded) << over.ToString();
  EXPECT_EQ(over.op_index(), 1);
  // Freeing one first makes room; freeing and loading the same handle again counts once.
  EXPECT_TRUE(Admit({UnloadModuleOp{7}, LoadModuleOp{8, backend::ModuleFormat::kPtx, "x"},
                     LoadModuleOp{9, backend::ModuleFormat::kPtx, "x"}})
                  .ok());
  EXPECT_TRUE(Admit({UnloadModuleOp{7}, LoadModuleOp{7, backend::ModuleFormat::kPtx, "x"},
                     LoadModuleOp{8, backend::ModuleFormat::kPtx, "x"}})
                  .ok());

  AddTensor(1, DType::kF32, {4});
  EXPECT_TRUE(Admit({BeginGraphOp{1}, FillOp{1, 0}, EndGraphOp{}}).ok());
  Status graphs = Admit(
      {BeginGraphOp{1}, FillOp{1, 0}, EndGraphOp{}, BeginGraphOp{2}, FillOp{1, 0}, EndGraphOp{}});
  EXPECT_EQ(graphs.kind(), ErrorKind::kQuotaExceeded) << graphs.ToString();
  EXPECT_EQ(graphs.op_index(), 5);
}

// A session holds at most max_tensors tensors, counting what it holds, what the submit frees
// and what it creates; freeing makes room again.
TEST_F(AdmissionTest, TensorCountLimit) {
  limits_.max_tensors = 3;
  AddTensor(1, DType::kF32, {0});
  AddTensor(2, DType::kF32, {0});
  EXPECT_TRUE(Admit({CreateTensorOp{3, DType::kF32, {0}}}).ok());
  Status over = Admit({CreateTensorOp{3, DType::kF32, {0}}, CreateTensorOp{4, DType::kF32, {0}}});
  EXPECT_EQ(over.kind(), ErrorKind::kQuotaExceeded) << over.ToString();
  EXPECT_EQ(over.op_index(), 1);
  // Zero-byte tensors count too: the count, not the device quota, bounds them.
  EXPECT_TRUE(Admit({FreeTensorOp{1}, CreateTensorOp{3, DType::kF32, {0}},
                     CreateTensorOp{4, DType::kF32, {0}}, FreeTensorOp{4},
                     CreateTensorOp{5, DType::kF32, {0}}})
                  .ok());
}

// Ops recorded into a session's live graphs are bounded, within one graph and together.
TEST_F(AdmissionTest, RecordedGraphOpsLimit) {
  limits_.max_graph_ops = 4;
  AddTensor(1, DType::kF32, {4});
  EXPECT_TRUE(
      Admit({BeginGraphOp{1}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{}})
          .ok());
  Status one = Admit({BeginGraphOp{1}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0},
                      FillOp{1, 0}, EndGraphOp{}});
  EXPECT_EQ(one.kind(), ErrorKind::kQuotaExceeded) << one.ToString();
  EXPECT_EQ(one.op_index(), 5);  // the op that passes the limit
  // A graph the session holds counts: 3 more ops fit beside its 1, not 4.
  GraphRecord held;
  held.ops = 1;
  table_.InsertGraph(9, held);
  EXPECT_TRUE(
      Admit({BeginGraphOp{1}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{}}).ok());
  Status together = Admit(
      {BeginGraphOp{1}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{}});
  EXPECT_EQ(together.kind(), ErrorKind::kQuotaExceeded) << together.ToString();
  EXPECT_EQ(together.op_index(), 5);
  // Freeing it first makes room again.
  EXPECT_TRUE(Admit({FreeGraphOp{9}, BeginGraphOp{1}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0},
                     FillOp{1, 0}, EndGraphOp{}})
                  .ok());
  // So does freeing one recorded earlier in the same submit, and a freed handle recorded
  // again counts its new ops only.
  EXPECT_TRUE(Admit({BeginGraphOp{1}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{}, FreeGraphOp{1},
                     BeginGraphOp{2}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{}})
                  .ok());
  EXPECT_TRUE(Admit({FreeGraphOp{9}, BeginGraphOp{9}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0},
                     FillOp{1, 0}, EndGraphOp{}})
                  .ok());
  Status past = Admit({FreeGraphOp{9}, BeginGraphOp{9}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{},
                       BeginGraphOp{2}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{}});
  EXPECT_EQ(past.kind(), ErrorKind::kQuotaExceeded) << past.ToString();
  EXPECT_EQ(past.op_index(), 9) << "2 + 3 recorded ops in the graphs left, past 4";
}

// A LaunchGraph counts toward the ops per submit as the ops its graph recorded (at least one):
// admitting it checks every tensor those ops use (and the CUDA backend checks every range
// again), so a submit of launches costs what a submit of their recorded ops would. With the
// session's defaults a submit may launch a graph of session-max-graph-ops ops 4 times.
class GraphLaunchWorkTest : public AdmissionTest {
 protected:
  GraphLaunchWorkTest() {
    const SessionConfig defaults;
    limits_.max_ops_per_submit = defaults.max_ops_per_submit;
    limits_.max_graph_ops = defaults.max_graph_ops;
    AddTensor(1, DType::kF32, {16});
    AddTensor(2, DType::kF32, {16});
    AddTensor(3, DType::kF32, {16});
  }
  // Put into the table graph `handle` of `ops` recorded binary ops over tensors 1, 2 and 3
  // (three uses each).
  void AddGraph(uint64_t handle, uint64_t ops) {
    GraphRecord g;
    g.ops = ops;
    g.tensors.reserve(3 * ops);
    for (uint64_t i = 0; i < ops; ++i) {
      for (uint64_t t = 1; t <= 3; ++t) g.tensors.emplace_back(t, table_.Find(t)->generation);
    }
    table_.InsertGraph(handle, std::move(g));
  }
  static std::vector<Op> Launches(uint64_t graph, size_t n) {
    return std::vector<Op>(n, Op{LaunchGraphOp{graph}});
  }
};

TEST_F(GraphLaunchWorkTest, ManyLaunchesOfALargeGraphAreRefusedAtTheLaunchPastTheLimit) {
  const uint64_t max_graph_ops = SessionConfig().max_graph_ops;
  AddGraph(7, max_graph_ops);
  // 4096 launches of a 262144-op graph: 2^30 recorded ops, 3 * 2^30 tensor checks (seconds
  // of one executor thread before the bound; a submit of 2^20 launches, about an hour).
  // Refused whole, at the fourth launch: the ops after it count one each already.
  Status s = Admit(Launches(7, 4096));
  EXPECT_EQ(s.kind(), ErrorKind::kQuotaExceeded) << s.ToString();
  EXPECT_EQ(s.op_index(), 3);
  EXPECT_NE(s.message().find("session-max-submit-ops"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("graph 7"), std::string::npos) << s.message();
  // Exactly at the limit is admitted; one op more is not (it counts wherever it is).
  EXPECT_TRUE(Admit(Launches(7, 4)).ok());
  std::vector<Op> over = Launches(7, 4);
  over.push_back(FillOp{1, 0});
  Status one_more = Admit(over);
  EXPECT_EQ(one_more.kind(), ErrorKind::kQuotaExceeded) << one_more.ToString();
  EXPECT_EQ(one_more.op_index(), 3);
}

TEST_F(GraphLaunchWorkTest, OneLaunchOfTheLargestGraphIsAdmitted) {
  AddGraph(7, SessionConfig().max_graph_ops);
  EXPECT_TRUE(Admit({LaunchGraphOp{7}}).ok());
  EXPECT_TRUE(Admit({FillOp{1, 1}, LaunchGraphOp{7}, AxpyOp{2.0, 1, 2}}).ok());
}

TEST_F(GraphLaunchWorkTest, NormalUseOfSmallGraphsIsAdmitted) {
  AddGraph(8, 100);
  EXPECT_TRUE(Admit({LaunchGraphOp{8}, LaunchGraphOp{8}, LaunchGraphOp{8}}).ok());
  // A training loop's submit: a launch and a few ops, a thousand times over.
  std::vector<Op> loop;
  for (int i = 0; i < 1000; ++i) {
    loop.push_back(FillOp{1, 0});
    loop.push_back(LaunchGraphOp{8});
    loop.push_back(AxpyOp{1.0, 1, 2});
  }
  EXPECT_TRUE(Admit(loop).ok());
  // 2^20 / 100 launches fit in one submit, one more does not.
  EXPECT_TRUE(Admit(Launches(8, (1u << 20) / 100)).ok());
  EXPECT_EQ(Admit(Launches(8, (1u << 20) / 100 + 1)).kind(), ErrorKind::kQuotaExceeded);
}

// What counts, with a small limit: the submit's ops, each launch as its graph's ops (a graph
// recorded in the same submit too), an empty graph's launch as one.
TEST_F(AdmissionTest, GraphLaunchesCountTheirRecordedOpsTowardOpsPerSubmit) {
  limits_.max_ops_per_submit = 10;
  AddTensor(1, DType::kF32, {4});
  GraphRecord g;
  g.ops = 4;
  g.tensors = {{1, 0}, {1, 0}, {1, 0}, {1, 0}};
  table_.InsertGraph(9, g);
  EXPECT_TRUE(Admit({LaunchGraphOp{9}, LaunchGraphOp{9}, FillOp{1, 0}, FillOp{1, 0}}).ok());  // 10
  Status s = Admit({LaunchGraphOp{9}, LaunchGraphOp{9}, LaunchGraphOp{9}});                   // 12
  EXPECT_EQ(s.kind(), ErrorKind::kQuotaExceeded) << s.ToString();
  EXPECT_EQ(s.op_index(), 2);
  // Recorded here: 5 ops plus 3 for each launch.
  EXPECT_TRUE(Admit({BeginGraphOp{10}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{},
                     LaunchGraphOp{10}})
                  .ok());  // 6 + 2
  Status here = Admit({BeginGraphOp{10}, FillOp{1, 0}, FillOp{1, 0}, FillOp{1, 0}, EndGraphOp{},
                       LaunchGraphOp{10}, LaunchGraphOp{10}});  // 7 + 4
  EXPECT_EQ(here.kind(), ErrorKind::kQuotaExceeded) << here.ToString();
  EXPECT_EQ(here.op_index(), 6);
  // An empty graph's launch counts as one op.
  table_.InsertGraph(11, GraphRecord{});
  EXPECT_TRUE(Admit(std::vector<Op>(10, Op{LaunchGraphOp{11}})).ok());
  EXPECT_EQ(Admit(std::vector<Op>(11, Op{LaunchGraphOp{11}})).kind(), ErrorKind::kQuotaExceeded);
}

// Admission checks a graph's tensors once per submit while no tensor is freed; a free (or the
// graph recorded again) makes the next launch check them again.
TEST_F(AdmissionTest, GraphLaunchAfterAFreeInTheSameSubmitChecksItsTensorsAgain) {
  AddTensor(1, DType::kF32, {4});
  AddTensor(2, DType::kF32, {4});
  GraphRecord g;
  g.ops = 1;
  g.tensors = {{1, 0}, {2, 0}};
  table_.InsertGraph(5, g);
  EXPECT_TRUE(Admit({LaunchGraphOp{5}, LaunchGraphOp{5}, FreeTensorOp{2}}).ok());
  Status freed = Admit({LaunchGraphOp{5}, LaunchGraphOp{5}, FreeTensorOp{2}, LaunchGraphOp{5}});
  EXPECT_EQ(freed.kind(), ErrorKind::kInvalidHandle) << freed.ToString();
  EXPECT_EQ(freed.op_index(), 3);
  Status reused = Admit(
      {LaunchGraphOp{5}, FreeTensorOp{2}, CreateTensorOp{2, DType::kF32, {4}}, LaunchGraphOp{5}});
  EXPECT_EQ(reused.kind(), ErrorKind::kInvalidHandle) << reused.ToString();
  EXPECT_EQ(reused.op_index(), 3);
  // Recorded again after the free, over live tensors only: admitted.
  EXPECT_TRUE(Admit({LaunchGraphOp{5}, FreeTensorOp{2}, FreeGraphOp{5}, BeginGraphOp{5},
                     FillOp{1, 0}, EndGraphOp{}, LaunchGraphOp{5}})
                  .ok());
}

}  // namespace
}  // namespace ferry::session
