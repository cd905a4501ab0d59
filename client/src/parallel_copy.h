// ParallelCopy: memcpy of a large block by several threads at once.
//
// Blocking transfers of a local session go through pinned shared memory: the client copies
// the caller's ordinary memory into a slab (or out of it) while the daemon DMAs the other
// half. One thread copies about 6 GB/s into or out of shared memory on an H200's host, 4
// threads 22-25 GB/s, 8 threads 28-35 GB/s, while the DMA runs at 54 GB/s (docs/performance.md),
// so the copy is what bounds such a transfer, and it is split across threads here.
#pragma once

#include <cstdint>

namespace ferry::internal {

/// How many threads a ParallelCopy uses by default (the caller's included): the environment's
/// FERRY_COPY_THREADS (1 to 16) where set, else half the machine's hardware threads, 1 to 4.
int ParallelCopyThreads();

/// Copy `n` bytes from `src` to `dst` (not overlapping), using up to `threads` threads when
/// `n` is at least kParallelCopyMinBytes and no other ParallelCopy of the process is running
/// (then the caller copies alone, so copies at once share the cores fairly): the caller's
/// own thread and helper threads shared by the whole process, started on first use and never
/// stopped. Returns when every byte is copied. Thread-safe, and usable in a forked child
/// (which starts threads of its own).
void ParallelCopy(void* dst, const void* src, uint64_t n, int threads = ParallelCopyThreads());

/// Below this a copy is done by the caller alone.
/// (512 KiB was tried: 1 MiB blocking transfers of one process were 10-20 % faster, but
/// 4 and 8 processes transferring 1 MiB at once through one ferryd 10-45 % slower, their
/// helper threads competing for the cores; docs/performance.md.)
inline constexpr uint64_t kParallelCopyMinBytes = 2ull << 20;

}  // namespace ferry::internal
