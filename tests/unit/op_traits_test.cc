// The op-traits table (server/session/ops.h) that rpc and session both ask: every op the
// wire can carry maps onto the OpKind its decoded form has, and each row is named for its
// ferry.v1.Op field, so a new op cannot be classified on one side and missed on the other.
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>

#include "ferry/v1/session.pb.h"
#include "rpc/convert.h"
#include "session/ops.h"

namespace ferry {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::OneofDescriptor;

// One wire op of the kind `field` names, filled in enough to decode as itself.
v1::Op OpFor(const FieldDescriptor* field) {
  v1::Op op;
  op.GetReflection()->MutableMessage(&op, field);
  if (op.has_create_tensor()) op.mutable_create_tensor()->set_dtype(v1::DTYPE_F32);
  if (op.has_binary()) op.mutable_binary()->set_kind(v1::ADD);
  if (op.has_load_module()) {
    op.mutable_load_module()->set_format(v1::PTX);
    op.mutable_load_module()->set_image("x");
  }
  if (op.has_launch()) {
    op.mutable_launch()->add_grid(1);
    op.mutable_launch()->add_block(1);
  }
  return op;
}

TEST(OpTraitsTest, EveryWireOpHasTheKindItDecodesTo) {
  const OneofDescriptor* kinds = v1::Op::descriptor()->FindOneofByName("kind");
  ASSERT_NE(kinds, nullptr);
  std::set<session::OpKind> seen;
  for (int i = 0; i < kinds->field_count(); ++i) {
    const FieldDescriptor* field = kinds->field(i);
    auto message = std::make_shared<v1::ClientMessage>();
    *message->mutable_submit()->add_ops() = OpFor(field);
    const std::optional<session::OpKind> kind = rpc::KindOf(message->submit().ops(0));
    ASSERT_TRUE(kind.has_value()) << field->name() << " has no OpKind";
    session::SubmitRequest request = rpc::ToSubmitRequest(message);
    ASSERT_EQ(request.ops.size(), 1u);
    EXPECT_EQ(session::KindOf(request.ops[0]), *kind) << field->name();
    EXPECT_EQ(session::Traits(*kind).name, field->name()) << "the row is named for its field";
    seen.insert(*kind);
  }
  // Every row but MalformedOp's (the daemon's own, for what did not decode) is on the wire.
  EXPECT_EQ(seen.size() + 1, std::size(session::kOpTraits));
  EXPECT_EQ(seen.count(session::OpKind::kMalformed), 0u);
  EXPECT_FALSE(rpc::KindOf(v1::Op()).has_value()) << "an op with no kind set has none";
}

}  // namespace
}  // namespace ferry
