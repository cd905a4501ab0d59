// How a fuzz target reports a property that does not hold: it names the target and the
// property on stderr and aborts, so that libFuzzer keeps the input as a crash (and the corpus
// replay of standalone_main.cc fails).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace ferry::fuzz {

/// Unless `ok`, print "TARGET: WHAT" on stderr and abort.
inline void CheckOrAbort(bool ok, const char* target, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: %s\n", target, what);
    std::abort();
  }
}

}  // namespace ferry::fuzz
