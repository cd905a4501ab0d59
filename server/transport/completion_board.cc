#include "transport/completion_board.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

#include "ferry/sys_error.h"
#include "ferry/trace_points.h"

namespace ferry::transport {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the board's words are shared memory");
static_assert(std::endian::native == std::endian::little,
              "the futex word is completed_through's low half, at offset 0");

Result<std::unique_ptr<CompletionBoard>> CompletionBoard::Create() {
  std::unique_ptr<CompletionBoard> board(new CompletionBoard());
  const int fd = ::memfd_create("ferry-board", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SysError("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(kBytes)) != 0) {
    Status s = SysError("ftruncate of a completion board");
    ::close(fd);
    return s;
  }
  void* page = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) {
    Status s = SysError("mmap of a completion board");
    ::close(fd);
    return s;
  }
  board->page_ = page;
  board->completed_through_ = new (page) std::atomic<uint64_t>(0);
  board->last_failed_ = new (static_cast<char*>(page) + 8) std::atomic<uint64_t>(0);
  // The client's fd: opened read-only, so it cannot map the page writable; and sealed so that
  // no fd can shrink the page under the daemon's mapping (and, where the kernel has it, none
  // can make a new writable mapping; the daemon's own stays writable).
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    Status s = SysError("sealing a completion board");
    ::close(fd);
    return s;
  }
#ifdef F_SEAL_FUTURE_WRITE
  (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE);  // Linux 5.1 and later
#endif
  (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL);
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  board->read_only_fd_ = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
  const int open_errno = errno;
  ::close(fd);
  if (board->read_only_fd_ < 0) {
    errno = open_errno;
    return SysError("reopening a completion board read-only");
  }
  return board;
}

CompletionBoard::~CompletionBoard() {
  if (page_) ::munmap(page_, kBytes);
  if (read_only_fd_ >= 0) ::close(read_only_fd_);
}

void CompletionBoard::Reset() {
  last_failed_->store(0, std::memory_order_relaxed);
  completed_through_->store(0, std::memory_order_release);
}

void CompletionBoard::Post(uint64_t submit_id, bool ok) {
  FERRY_TRACE(trace::kPost, submit_id);
  if (!ok) last_failed_->store(submit_id, std::memory_order_relaxed);
  // Sequentially consistent, with the read of sleepers_ below (see WakeOnlyAnnounced).
  completed_through_->store(submit_id, std::memory_order_seq_cst);
  if (sleepers_ && sleepers_->load(std::memory_order_seq_cst) == 0) return;
  // Wake clients asleep on the board: a shared (not private) futex on the low 32 bits of
  // completed_through. Without waiters the kernel finds none and returns (< 1 µs).
  (void)::syscall(SYS_futex, page_, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace ferry::transport
