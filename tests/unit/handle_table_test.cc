// HandleTable: the tensors, modules and graphs of one session, and their byte accounting.
#include "session/handle_table.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "fake_module.h"

namespace ferry::session {
namespace {

TensorRecord Record(backend::DevicePtr ptr, DType dtype, Shape shape, uint64_t generation) {
  TensorRecord r;
  r.ptr = ptr;
  r.dtype = dtype;
  r.shape = std::move(shape);
  r.elements = *r.shape.ElementCount();
  r.bytes = r.elements * DTypeSize(dtype);
  r.generation = generation;
  return r;
}

TEST(HandleTableTest, EmptyTableHoldsNothing) {
  HandleTable table;
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
  EXPECT_EQ(table.Find(1), nullptr);
  EXPECT_EQ(table.Find(0), nullptr);
  EXPECT_TRUE(table.tensors().empty());
  EXPECT_TRUE(table.modules().empty());
  EXPECT_TRUE(table.graphs().empty());
}

TEST(HandleTableTest, InsertThenFindReturnsTheRecord) {
  HandleTable table;
  table.Insert(7, Record(0x1000, DType::kF32, {4, 2}, 1));
  table.Insert(9, Record(0x2000, DType::kF64, {3}, 2));

  const TensorRecord* seven = table.Find(7);
  ASSERT_NE(seven, nullptr);
  EXPECT_EQ(seven->ptr, 0x1000u);
  EXPECT_EQ(seven->dtype, DType::kF32);
  EXPECT_EQ(seven->shape, (Shape{4, 2}));
  EXPECT_EQ(seven->elements, 8u);
  EXPECT_EQ(seven->bytes, 32u);
  EXPECT_EQ(seven->generation, 1u);

  const TensorRecord* nine = table.Find(9);
  ASSERT_NE(nine, nullptr);
  EXPECT_EQ(nine->ptr, 0x2000u);
  EXPECT_EQ(nine->bytes, 24u);

  EXPECT_EQ(table.Find(8), nullptr);
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(table.bytes(), 56u);
}

TEST(HandleTableTest, RemoveReturnsTheRecordAndReleasesItsBytes) {
  HandleTable table;
  table.Insert(1, Record(0x1000, DType::kF32, {16}, 1));
  table.Insert(2, Record(0x2000, DType::kU8, {10}, 2));
  ASSERT_EQ(table.bytes(), 74u);

  TensorRecord removed = table.Remove(1);
  EXPECT_EQ(removed.ptr, 0x1000u);
  EXPECT_EQ(removed.bytes, 64u);
  EXPECT_EQ(removed.generation, 1u);
  EXPECT_EQ(table.Find(1), nullptr);
  ASSERT_NE(table.Find(2), nullptr);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.bytes(), 10u);

  table.Remove(2);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
}

TEST(HandleTableTest, HandleCanBeReusedAfterRemove) {
  HandleTable table;
  table.Insert(5, Record(0x1000, DType::kF32, {4}, 1));
  table.Remove(5);
  table.Insert(5, Record(0x3000, DType::kF64, {8}, 2));
  const TensorRecord* r = table.Find(5);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->ptr, 0x3000u);
  EXPECT_EQ(r->dtype, DType::kF64);
  EXPECT_EQ(r->generation, 2u);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.bytes(), 64u);
}

TEST(HandleTableTest, EmptyTensorIsLiveButHoldsNoBytes) {
  HandleTable table;
  table.Insert(3, Record(0, DType::kF32, {0, 4}, 1));
  const TensorRecord* r = table.Find(3);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->ptr, 0u);
  EXPECT_EQ(r->elements, 0u);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.bytes(), 0u);
  TensorRecord removed = table.Remove(3);
  EXPECT_EQ(removed.bytes, 0u);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
}

TEST(HandleTableTest, TensorsViewListsEveryLiveHandle) {
  HandleTable table;
  table.Insert(1, Record(0x1000, DType::kF32, {1}, 1));
  table.Insert(2, Record(0x2000, DType::kF32, {2}, 2));
  table.Insert(3, Record(0x3000, DType::kF32, {3}, 3));
  table.Remove(2);
  uint64_t bytes = 0;
  for (const auto& [handle, record] : table.tensors()) {
    EXPECT_NE(handle, 2u);
    bytes += record.bytes;
  }
  EXPECT_EQ(table.tensors().size(), 2u);
  EXPECT_EQ(bytes, table.bytes());
}

TEST(HandleTableTest, ModulesAndGraphsAreKeptBesideTensors) {
  HandleTable table;
  table.InsertModule(4, ferry::testing::MakeFakeModule());
  GraphRecord graph;
  graph.tensors = {{1, 1}, {2, 5}};
  graph.has_raw_kernels = true;
  table.InsertGraph(6, std::move(graph));

  const HandleTable& view = table;
  EXPECT_EQ(view.modules().count(4), 1u);
  ASSERT_EQ(view.graphs().count(6), 1u);
  EXPECT_EQ(view.graphs().at(6).tensors.size(), 2u);
  EXPECT_TRUE(view.graphs().at(6).has_raw_kernels);
  // Modules and graphs are not tensors: no size, no bytes, not found by Find.
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
  EXPECT_EQ(table.Find(4), nullptr);
  EXPECT_EQ(table.Find(6), nullptr);
}

TEST(HandleTableTest, ClearForgetsEverything) {
  HandleTable table;
  table.Insert(1, Record(0x1000, DType::kF32, {16}, 1));
  table.Insert(2, Record(0x2000, DType::kF64, {16}, 2));
  table.InsertModule(1, ferry::testing::MakeFakeModule());
  table.InsertGraph(1, GraphRecord{});
  table.Clear();
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
  EXPECT_EQ(table.Find(1), nullptr);
  EXPECT_TRUE(table.modules().empty());
  EXPECT_TRUE(table.graphs().empty());
  // The table is usable again, with fresh accounting.
  table.Insert(1, Record(0x4000, DType::kU8, {3}, 3));
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.bytes(), 3u);
}

// The table may hold a module's last reference (no cache and no graph keeps it): removing
// its handle counts the module's bytes before it goes (AddressSanitizer saw a read of the
// freed module here).
TEST(HandleTableTest, RemovingAModuleTheTableAloneHeldReleasesItsBytes) {
  HandleTable table;
  table.InsertModule(4, ferry::testing::MakeFakeModule(1000));
  std::weak_ptr<backend::Module> module = table.modules().at(4);
  EXPECT_EQ(table.RemoveModule(4), 1000u);
  EXPECT_TRUE(module.expired()) << "the handle was its only owner";
  EXPECT_EQ(table.module_bytes(), 0u);
}

// A module's device bytes are the session's while a handle or one of its graphs holds it.
TEST(HandleTableTest, ModuleBytesAreChargedPerHandleAndWhileAGraphHoldsThem) {
  HandleTable table;
  table.Insert(1, Record(0x1000, DType::kU8, {100}, 1));
  std::shared_ptr<backend::Module> module = ferry::testing::MakeFakeModule(1000);
  table.InsertModule(4, module);
  EXPECT_EQ(table.module_bytes(), 1000u);
  EXPECT_EQ(table.bytes(), 1100u) << "tensors' and modules' bytes together";
  table.InsertModule(5, module);  // the same (cached) module under a second handle pays again
  EXPECT_EQ(table.bytes(), 2100u);
  EXPECT_EQ(table.RemoveModule(5), 1000u);
  EXPECT_EQ(table.RemoveModule(5), 0u) << "a handle no longer live releases nothing";

  // A graph that launches it keeps it loaded, and so charged, past its last unload.
  GraphRecord graph;
  graph.modules = std::make_shared<const std::vector<std::shared_ptr<backend::Module>>>(
      std::vector<std::shared_ptr<backend::Module>>{module});
  table.InsertGraph(6, graph);
  table.InsertGraph(7, graph);
  EXPECT_EQ(table.RemoveModule(4), 0u);
  EXPECT_EQ(table.bytes(), 1100u);
  EXPECT_EQ(table.RemoveGraph(6), 0u) << "graph 7 still holds it";
  EXPECT_EQ(table.RemoveGraph(7), 1000u);
  EXPECT_EQ(table.bytes(), 100u);
  EXPECT_EQ(table.module_bytes(), 0u);

  // Loaded again while a graph holds it: charged for the handle too, and one copy stays
  // charged for the graph after the unload.
  table.InsertModule(4, module);
  table.InsertGraph(6, graph);
  table.InsertModule(5, module);
  EXPECT_EQ(table.module_bytes(), 2000u);
  EXPECT_EQ(table.RemoveModule(4), 1000u);
  EXPECT_EQ(table.RemoveModule(5), 0u);
  EXPECT_EQ(table.module_bytes(), 1000u);
  EXPECT_EQ(table.RemoveGraph(6), 1000u);
  EXPECT_EQ(table.module_bytes(), 0u);
  EXPECT_EQ(table.RemoveGraph(6), 0u);
}

TEST(HandleTableTest, ClearForgetsModuleBytes) {
  HandleTable table;
  table.InsertModule(1, ferry::testing::MakeFakeModule(4096));
  EXPECT_EQ(table.bytes(), 4096u);
  table.Clear();
  EXPECT_EQ(table.bytes(), 0u);
  EXPECT_EQ(table.module_bytes(), 0u);
}

}  // namespace
}  // namespace ferry::session
