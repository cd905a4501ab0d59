// ModuleFootprint: a bound on the device memory a module of device code takes once loaded,
// read from the image itself, so that a session pays for its modules as it pays for its
// tensors (session/session.h). A module's `.global` variables are device memory like any
// tensor: a 100-byte PTX may declare gigabytes of them.
//
// The bound never falls short of what the image declares (over-counting a little is
// accepted; under-counting would be a hole in the quotas): what cannot be bounded is
// refused with INVALID_ARGUMENT, never estimated. No CUDA here: the estimate reads bytes and
// text only, so it is built and unit-tested (and fuzzed) on every machine.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <string_view>

#include "backend/backend.h"
#include "ferry/status.h"

namespace ferry::backend {

/// Return the device bytes `loadable_image` of `format` takes at most once loaded.
///
/// `loadable_image` is what the driver loads (cuda_module.h, LoadableImage): PTX text as the
/// client sent it, a CUBIN (ELF64) or an uncompressed fatbin for kCubin, and for kCudaSource
/// the CUBIN that NVRTC compiled from the source (never the source itself).
///  * PTX: the text's size (a bound on its code) plus every `.global` and `.const`
///    variable's bytes (element size x vector width x every array dimension, plus its
///    alignment's padding). `.extern` declarations take none. Text after a NUL is not read
///    (the driver stops there). Refused: a size that overflows or cannot be parsed, an
///    unterminated comment or string, preprocessor lines (`#...`, which could define what a
///    declaration means).
///  * CUBIN: the sizes of every section that is allocated (SHF_ALLOC), executable or holds
///    no file bytes (SHT_NOBITS: `.nv.global` and the like), or the loadable segments'
///    memory sizes if those are larger. Refused: a truncated ELF, or a header, section or
///    segment that points outside the image.
///  * Fatbin: the largest of its entries' bounds (the driver loads one of them), each ELF
///    entry by the CUBIN rule and each PTX entry by the PTX rule. Refused: a compressed
///    entry, an entry of another kind, or one that cannot be parsed (what cannot be read
///    cannot be bounded).
Result<uint64_t> ModuleFootprint(ModuleFormat format, std::string_view loadable_image);

}  // namespace ferry::backend
