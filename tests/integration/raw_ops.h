// Builders of ferry.v1 ops, for tests that speak the raw protocol.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/v1/session.pb.h"

namespace ferry::testing {

inline v1::Op Create(uint64_t h, v1::DType dtype, std::vector<int64_t> shape) {
  v1::Op op;
  auto* c = op.mutable_create_tensor();
  c->set_handle(h);
  c->set_dtype(dtype);
  for (auto d : shape) c->add_shape(d);
  return op;
}
inline v1::Op Fill(uint64_t h, double v) {
  v1::Op op;
  op.mutable_fill()->set_tensor(h);
  op.mutable_fill()->set_value(v);
  return op;
}
inline v1::Op Download(uint64_t h, uint64_t off, uint64_t len) {
  v1::Op op;
  op.mutable_download()->set_tensor(h);
  op.mutable_download()->set_offset(off);
  op.mutable_download()->set_length(len);
  return op;
}

}  // namespace ferry::testing
