// The op-traits table (server/session/ops.h) that rpc and session both ask: every op the
// wire can carry maps onto the OpKind its decoded form has, and each row is named for its
// ferry.v1.Op field, so a new op cannot be classified on one side and missed on the other.
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

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

// The summary rpc makes of the wire's ops (before they are decoded) answers every question
// as the one made of the decoded ops does: the two are interchangeable.
void ExpectSameSummary(const session::SubmitSummary& a, const session::SubmitSummary& b) {
  EXPECT_EQ(a.ops(), b.ops());
  for (size_t k = 0; k < std::size(session::kOpTraits); ++k) {
    EXPECT_EQ(a.Has(static_cast<session::OpKind>(k)), b.Has(static_cast<session::OpKind>(k)))
        << session::kOpTraits[k].name;
  }
  EXPECT_EQ(a.quick(), b.quick());
  EXPECT_EQ(a.moves_bytes(), b.moves_bytes());
  EXPECT_EQ(a.raw_kernels(), b.raw_kernels());
  EXPECT_EQ(a.kernel_ops_only(), b.kernel_ops_only());
  EXPECT_EQ(a.to_device_bytes(), b.to_device_bytes());
  EXPECT_EQ(a.to_host_bytes(), b.to_host_bytes());
  EXPECT_EQ(a.inline_bytes(), b.inline_bytes());
  EXPECT_EQ(a.objects_added_at_most(), b.objects_added_at_most());
}

session::SubmitRequest Decode(const v1::Submit& submit) {
  auto message = std::make_shared<v1::ClientMessage>();
  *message->mutable_submit() = submit;
  return rpc::ToSubmitRequest(message);
}

TEST(SubmitSummaryTest, AddsUpWhatEachLayerAsks) {
  v1::Submit submit;
  auto* create = submit.add_ops()->mutable_create_tensor();
  create->set_handle(1);
  create->set_dtype(v1::DTYPE_F32);
  create->add_shape(4);
  submit.add_ops()->mutable_upload()->set_data(std::string(16, 'x'));
  submit.add_ops()->mutable_upload_from_slab()->set_length(100);
  submit.add_ops()->mutable_relu();
  submit.add_ops()->mutable_download()->set_length(8);
  submit.add_ops()->mutable_download_to_slab()->set_length(1000);
  submit.add_ops()->mutable_begin_graph()->set_handle(2);
  submit.add_ops()->mutable_fill();
  submit.add_ops()->mutable_scale();
  submit.add_ops()->mutable_end_graph();
  session::SubmitRequest request = Decode(submit);
  const session::SubmitSummary& s = request.summary;
  ExpectSameSummary(s, session::Summarize(request.ops));
  EXPECT_EQ(s.ops(), 10u);
  EXPECT_TRUE(s.Has(session::OpKind::kRelu));
  EXPECT_FALSE(s.Has(session::OpKind::kGemm));
  EXPECT_FALSE(s.quick()) << "a create and a download are not quick";
  EXPECT_TRUE(s.moves_bytes());
  EXPECT_FALSE(s.raw_kernels());
  EXPECT_FALSE(s.kernel_ops_only());
  EXPECT_EQ(s.to_device_bytes(), 116u);
  EXPECT_EQ(s.to_host_bytes(), 1008u);
  EXPECT_EQ(s.inline_bytes(), 24u) << "the upload's data and the download, not the slab ops";
  EXPECT_EQ(s.objects_added_at_most(), 1u + 2u + 1u) << "the tensor, two recorded ops, a graph";

  v1::Submit kernels;
  kernels.add_ops()->mutable_fill();
  kernels.add_ops()->mutable_scale();
  request = Decode(kernels);
  EXPECT_TRUE(request.summary.quick());
  EXPECT_TRUE(request.summary.kernel_ops_only());
  EXPECT_FALSE(request.summary.moves_bytes());
  ExpectSameSummary(request.summary, session::Summarize(request.ops));

  // Quick ends past kQuickSubmitOps ops, or past kQuickSubmitUploadBytes inline.
  v1::Submit big = kernels;
  while (static_cast<size_t>(big.ops_size()) <= session::kQuickSubmitOps)
    big.add_ops()->mutable_fill();
  EXPECT_FALSE(Decode(big).summary.quick());
  v1::Submit upload;
  upload.add_ops()->mutable_upload()->set_data(std::string(session::kQuickSubmitUploadBytes, 'x'));
  EXPECT_TRUE(Decode(upload).summary.quick());
  upload.add_ops()->mutable_upload()->set_data("x");
  EXPECT_FALSE(Decode(upload).summary.quick());

  // A launch is a raw kernel; an op that does not decode (a binary of no kind) makes the
  // submit neither quick nor kernel-only, as its MalformedOp does.
  v1::Submit launch;
  launch.add_ops()->mutable_launch();
  EXPECT_TRUE(Decode(launch).summary.raw_kernels());
  v1::Submit malformed;
  malformed.add_ops()->mutable_binary();
  request = Decode(malformed);
  EXPECT_TRUE(request.summary.Has(session::OpKind::kMalformed));
  EXPECT_FALSE(request.summary.quick());
  EXPECT_FALSE(request.summary.kernel_ops_only());
}

}  // namespace
}  // namespace ferry
