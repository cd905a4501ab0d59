// The check every CUDA C++ module passes before NVRTC sees it: no preprocessor construct
// that makes the compiler read a file.
//
// NVRTC resolves `#include "x"` against the file system (absolute paths, and relative ones
// against the process's directory) and quotes what it read in its log, which goes back to
// the client. So the daemon refuses, before compiling, every source that could name a file:
//  * an include-like directive (include, include_next, import, embed) unless it is exactly
//    `#include <NAME>` with NAME one of NVRTC's built-in headers (kBuiltinHeaders);
//  * __has_include, __has_include_next, __has_embed, _Pragma and __pragma anywhere, and the
//    names that token pasting could make them from: a proper prefix of one (`_`, `__`,
//    `_Pr`, `__has_`, ...), and NVRTC's internal macros (`_NV_*`), one of which pastes `_`
//    before its argument (cuda_source_check.cc says why that is enough);
//  * a #pragma other than a few that touch no file (unroll, nounroll, once, push_macro,
//    pop_macro, nv_diag_*); any directive name not in C++'s list;
//  * a directive continued over a line splice (backslash-newline), a splice inside a raw
//    string literal (compilers undo it there), a backslash followed by blanks before a
//    newline (compilers disagree whether that splices), trigraphs, a lone carriage return,
//    a NUL byte, a non-ASCII byte or a backslash outside literals and comments (a byte
//    order mark, a Unicode blank, a universal character name), an unterminated comment or
//    raw string.
// The source is read as the compiler's first translation phases do: line splices, comments
// as blanks (a comment can hide nothing: `/**/ #include` is a directive), string, character
// and raw-string literals, pp-numbers with digit separators, the digraph `%:` for `#`, and
// `$` as no part of a name (NVRTC's reading).
// Where this reading could differ from the compiler's, the source is refused.
//
// This is the first of two fences: the compile itself runs in a helper process that cannot
// open any file (server/backend/cuda/nvrtc_helper).
//
// No CUDA here: unit-tested on every machine (tests/unit/cuda_source_check_test.cc).
#pragma once

#include <array>
#include <string_view>

#include "ferry/status.h"

namespace ferry::backend {

/// The only names `#include <...>` may use: headers some NVRTC versions have built in. The
/// compile helper opens no file, so they compile only where NVRTC serves them itself (NVRTC
/// 13.0 does not, without an include path: the include then fails as a compile error).
inline constexpr std::array<std::string_view, 10> kBuiltinHeaders = {
    "cuda_fp16.h",  "cuda_fp16.hpp", "cuda_bf16.h",  "cuda_bf16.hpp", "cuda_fp8.h",
    "cuda_fp8.hpp", "cuda_fp6.h",    "cuda_fp6.hpp", "cuda_fp4.h",    "cuda_fp4.hpp"};

/// Return OK when `source` names no file; COMPILE_ERROR saying what was refused (and on
/// which line) otherwise. The message quotes at most the directive's name, never a path.
Status CheckCudaSource(std::string_view source);

}  // namespace ferry::backend
