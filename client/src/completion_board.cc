#include "completion_board.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace ferry::internal {

CompletionBoard::~CompletionBoard() { ::munmap(map_, bytes_); }

void CompletionBoard::Sleep(uint64_t through, std::chrono::nanoseconds timeout) const {
  timespec t = {0, timeout.count()};
  (void)::syscall(SYS_futex, board_, FUTEX_WAIT, static_cast<uint32_t>(through), &t, nullptr, 0);
}

}  // namespace ferry::internal
