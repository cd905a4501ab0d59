// A Module that no backend loaded, of a chosen device size: for the session's tables and its
// charges of module memory (a session test's device hands it out where the host backend has
// no modules). It runs nothing and names no functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace ferry::testing {

class FakeModule final : public backend::Module {
 public:
  explicit FakeModule(uint64_t device_bytes = 0) : device_bytes_(device_bytes) {}

  Result<std::vector<size_t>> ParameterSizes(std::string_view) const override {
    return std::vector<size_t>{};
  }
  uint64_t device_bytes() const override { return device_bytes_; }

 private:
  const uint64_t device_bytes_;
};

inline std::shared_ptr<backend::Module> MakeFakeModule(uint64_t device_bytes = 0) {
  return std::make_shared<FakeModule>(device_bytes);
}

}  // namespace ferry::testing
