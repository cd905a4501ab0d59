// The reply ferry-nvrtc writes on its stdout, read by ferryd (cuda/nvrtc_compile.cc). Both
// are built together, so integers are in the machine's own order.
//
//   char magic[4] = "FNV1"; u32 code; u32 image_kind; u32 reserved;
//   u64 image_bytes; u64 text_bytes; image bytes; text bytes
//
// code: kOk (image is the module, text the compile log), kCompileError (text: the log),
// kUnsupported / kInternal (text: what failed). image_kind: kCubin or kPtx.
#pragma once

#include <cstdint>

namespace ferry::backend::nvrtc_reply {

inline constexpr char kMagic[4] = {'F', 'N', 'V', '1'};
inline constexpr uint32_t kOk = 0;
inline constexpr uint32_t kCompileError = 1;
inline constexpr uint32_t kUnsupported = 2;
inline constexpr uint32_t kInternal = 3;
inline constexpr uint32_t kCubin = 0;
inline constexpr uint32_t kPtx = 1;

struct Header {
  char magic[4];
  uint32_t code;
  uint32_t image_kind;
  uint32_t reserved;
  uint64_t image_bytes;
  uint64_t text_bytes;
};
static_assert(sizeof(Header) == 32);

/// The most log text a reply carries; the rest is cut (and said so).
inline constexpr uint64_t kMaxLogBytes = 64u << 10;
/// The most source bytes the helper reads.
inline constexpr uint64_t kMaxSourceBytes = 64u << 20;

}  // namespace ferry::backend::nvrtc_reply
