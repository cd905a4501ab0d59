// Fuzz target: the bound on a loaded module's device memory (server/backend/module_footprint.cc),
// which reads PTX text, CUBINs (ELF64) and fatbins a client sent. The first byte picks the
// format (0: PTX, 1: CUBIN or fatbin, 2: CUDA C++'s compiled image); the rest is the image.
//
// What must hold whatever the bytes: no read outside them and no overflow (ASan/UBSan would
// see it); the same image gives the same answer twice, and the same answer as a CUBIN and as
// compiled CUDA C++ (one rule); a PTX bound, when there is one, is never below the text's size
// (the text bounds the code; the variables come on top).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "backend/module_footprint.h"
#include "fuzz_check.h"

namespace {

void Check(bool ok, const char* what) {
  ferry::fuzz::CheckOrAbort(ok, "module_footprint_fuzz", what);
}

bool Same(const ferry::Result<uint64_t>& a, const ferry::Result<uint64_t>& b) {
  if (a.ok() != b.ok()) return false;
  return a.ok() ? a.value() == b.value() : a.status().kind() == b.status().kind();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ferry::backend::ModuleFormat;
  if (size == 0) return 0;
  const std::string_view image(reinterpret_cast<const char*>(data) + 1, size - 1);
  const ModuleFormat format = data[0] % 3 == 0   ? ModuleFormat::kPtx
                              : data[0] % 3 == 1 ? ModuleFormat::kCubin
                                                 : ModuleFormat::kCudaSource;
  const ferry::Result<uint64_t> bound = ferry::backend::ModuleFootprint(format, image);
  Check(Same(bound, ferry::backend::ModuleFootprint(format, image)), "not deterministic");
  if (!bound.ok()) {
    Check(bound.status().kind() == ferry::ErrorKind::kInvalidArgument,
          "a refusal that is not INVALID_ARGUMENT");
  }
  if (format == ModuleFormat::kPtx) {
    Check(!bound.ok() || bound.value() >= image.size(), "a PTX bound below the text's size");
  } else {
    const ModuleFormat other =
        format == ModuleFormat::kCubin ? ModuleFormat::kCudaSource : ModuleFormat::kCubin;
    Check(Same(bound, ferry::backend::ModuleFootprint(other, image)),
          "a CUBIN and compiled CUDA C++ bounded differently");
  }
  return 0;
}
