// libferry's implementation: the session stream, its reader thread, and the recording of
// ops into ferry.v1 messages.
#include "ferry/client.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "ferry/little_endian.h"
#include "ferry/v1/session.grpc.pb.h"
#include "parallel_copy.h"

namespace ferry {
namespace internal {
namespace {

constexpr uint64_t kUploadChunkBytes = 1ull << 20;     // bytes per Upload op
constexpr uint64_t kUploadSubmitBytes = 8ull << 20;    // upload bytes per submit message
constexpr uint64_t kDownloadSubmitBytes = 8ull << 20;  // download bytes per submit
constexpr uint64_t kMaxMessageBytes = 80ull << 20;

std::string GrpcTarget(const std::string& target) {
  if (target.rfind("tcp:", 0) == 0) return target.substr(4);
  return target;  // "unix:PATH" and gRPC's own schemes pass through
}

Status FromProto(const v1::Error& e) {
  return Status::FromWire(e.code(), e.kind(), e.message(), e.op_index());
}

v1::DType ToProto(DType d) {
  switch (d) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kF64:
      return v1::DTYPE_F64;
    case DType::kI32:
      return v1::DTYPE_I32;
    case DType::kU8:
      return v1::DTYPE_U8;
    default:
      return v1::DTYPE_INVALID;
  }
}

SessionStats FromProto(const v1::SessionStats& s) {
  SessionStats out;
  out.submits = s.submits();
  out.failed_submits = s.failed_submits();
  out.ops = s.ops();
  out.kernel_launches = s.kernel_launches();
  out.bytes_uploaded = s.bytes_uploaded();
  out.bytes_downloaded = s.bytes_downloaded();
  out.tensors_created = s.tensors_created();
  out.peak_device_bytes = s.peak_device_bytes();
  out.device_busy_ns = s.device_busy_ns();
  out.graph_launches = s.graph_launches();
  out.kernel_batches = s.kernel_batches();
  out.h2d_bytes = s.h2d_bytes();
  out.h2d_ns = s.h2d_ns();
  out.d2h_bytes = s.d2h_bytes();
  out.d2h_ns = s.d2h_ns();
  return out;
}

constexpr uint64_t kBufferAlign = 256;
constexpr uint64_t kStagingBytes = 16ull << 20;  // blocking transfers: two halves

uint64_t AlignUp(uint64_t v) { return (v + kBufferAlign - 1) / kBufferAlign * kBufferAlign; }

}  // namespace

// The session's submit ring, mapped read-write (docs/protocol.md, "Submit ring"): the owner
// thread writes numbered messages into it, and the daemon's ring poller takes them, instead of
// the stream's gRPC write. Owner thread only.
class RingWriter {
 public:
  RingWriter(char* map, uint64_t capacity, int doorbell)
      : map_(map), capacity_(capacity), doorbell_(doorbell) {}
  ~RingWriter() {
    ::munmap(map_, kHeaderBytes + capacity_);
    ::close(doorbell_);
  }
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  static constexpr uint64_t kHeaderBytes = 4096;

  enum class Wrote { kWritten, kFull, kTooLarge };
  /// Write `m` (its sequence set) as the next record and ring the doorbell when the daemon's
  /// poller may be asleep. kFull, writing nothing, while the daemon has not taken enough
  /// records yet (try again); kTooLarge for a message over a quarter of the ring (the stream
  /// carries it).
  Wrote Write(const v1::ClientMessage& m) {
    const uint64_t n = m.ByteSizeLong();
    if (n > capacity_ / 4) return Wrote::kTooLarge;
    const uint64_t bytes = 8 + ((n + 7) & ~uint64_t{7});
    uint64_t at = head_ & (capacity_ - 1);
    const uint64_t skip = at + bytes > capacity_ ? capacity_ - at : 0;
    const uint64_t tail = Word64(kTailOffset)->load(std::memory_order_acquire);
    if (head_ + skip + bytes - tail > capacity_) return Wrote::kFull;
    char* data = map_ + kHeaderBytes;
    if (skip) {
      const uint32_t marker = 0xFFFFFFFFu;
      std::memcpy(data + at, &marker, sizeof(marker));
      head_ += skip;
      at = 0;
    }
    const uint32_t header[2] = {static_cast<uint32_t>(n), 0};
    std::memcpy(data + at, header, sizeof(header));
    m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(data + at + 8));
    head_ += bytes;
    Word64(kHeadOffset)->store(head_, std::memory_order_release);
    // Pairs with the poller, which marks the ring asleep and then looks at head again.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (reinterpret_cast<std::atomic<uint32_t>*>(map_ + kAsleepOffset)
            ->load(std::memory_order_relaxed)) {
      const uint64_t one = 1;
      (void)!::write(doorbell_, &one, sizeof(one));
    }
    return Wrote::kWritten;
  }

 private:
  static constexpr uint64_t kHeadOffset = 0, kTailOffset = 64, kAsleepOffset = 128;
  std::atomic<uint64_t>* Word64(uint64_t offset) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(map_ + offset);
  }
  char* map_;
  uint64_t capacity_;
  int doorbell_;
  uint64_t head_ = 0;  // bytes written so far
};

// One slab mapped into this process; unmapped when the last buffer carved from it and the
// session's arena are gone.
struct SlabMapping {
  uint64_t id = 0;
  char* base = nullptr;
  uint64_t size = 0;
  ~SlabMapping() {
    if (base) ::munmap(base, size);
  }
};

// First-fit sub-allocator over the session's mapped slabs. Thread-safe (a buffer may be
// dropped on any thread).
class SlabArena {
 public:
  void Add(std::shared_ptr<SlabMapping> m) {
    std::lock_guard lock(mu_);
    Entry e;
    e.free[0] = m->size;
    e.map = std::move(m);
    slabs_.push_back(std::move(e));
  }
  // Carve `bytes` (aligned) out of some slab; false when none has room.
  bool Allocate(uint64_t bytes, std::shared_ptr<SlabMapping>* map, uint64_t* offset) {
    std::lock_guard lock(mu_);
    for (Entry& e : slabs_) {
      for (auto it = e.free.begin(); it != e.free.end(); ++it) {
        if (it->second < bytes) continue;
        *offset = it->first;
        *map = e.map;
        uint64_t rest = it->second - bytes, at = it->first + bytes;
        e.free.erase(it);
        if (rest) e.free[at] = rest;
        return true;
      }
    }
    return false;
  }
  void Free(uint64_t slab, uint64_t offset, uint64_t bytes) {
    std::lock_guard lock(mu_);
    for (Entry& e : slabs_) {
      if (e.map->id != slab) continue;
      auto next = e.free.lower_bound(offset);
      if (next != e.free.end() && next->first == offset + bytes) {  // merge with the next
        bytes += next->second;
        next = e.free.erase(next);
      }
      if (next != e.free.begin()) {  // merge with the previous
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          prev->second += bytes;
          return;
        }
      }
      e.free[offset] = bytes;
      return;
    }
  }

 private:
  struct Entry {
    std::shared_ptr<SlabMapping> map;
    std::map<uint64_t, uint64_t> free;  // offset -> bytes
  };
  std::mutex mu_;
  std::vector<Entry> slabs_;
};

// The memory of one PinnedBuffer: a range of a slab, or heap memory.
struct BufferBlock {
  char* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<SlabMapping> slab;  // null: heap
  uint64_t slab_offset = 0;
  uint64_t reserved = 0;  // bytes taken from the slab
  std::weak_ptr<SlabArena> arena;
  std::unique_ptr<char[]> heap;
  ~BufferBlock() {
    if (!slab) return;
    if (auto a = arena.lock()) a->Free(slab->id, slab_offset, reserved);
  }
};

// A pending transfer: its submits [first_id, last_id] (0: refused before sending), and the
// values it holds until the outcome is known.
struct PendingState {
  uint64_t first_id = 0, last_id = 0;
  Status refused;
  Tensor tensor;
  PinnedBuffer buffer;
  std::weak_ptr<SessionState> session;
  bool waited = false;
};

class ClientState {
 public:
  std::string target;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::SessionService::Stub> stub;
};

// The state of one session, shared by the Session object and its Tensors (weakly).
// Recording and writes happen on the owner's thread; the reader thread delivers events.
class SessionState {
 public:
  using Stream = grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>;

  ~SessionState() {
    Shutdown();
    detached_.clear();
    staging_ = PinnedBuffer();
    if (board_map_) ::munmap(board_map_, board_map_bytes_);  // no waiter is left to read it
  }

  Status Open(std::shared_ptr<ClientState> client, const SessionOptions& options) {
    client_ = std::move(client);
    stream_ = client_->stub->Session(&context_);
    v1::ClientMessage m;
    auto* open = m.mutable_open();
    open->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
    open->set_client_name(client_->options.client_name);
    open->set_device_bytes_quota(options.device_bytes_quota);
    open->set_max_in_flight_submits(options.max_in_flight_submits);
    if (!stream_->Write(m)) return StreamFailure("sending Open");
    v1::ServerMessage reply;
    if (!stream_->Read(&reply)) return StreamFailure("waiting for Opened");
    if (reply.has_error()) {
      Status s = FromProto(reply.error());
      Shutdown();
      return s;
    }
    if (!reply.has_opened()) {
      Shutdown();
      return Status(ErrorKind::kProtocolViolation, "the daemon did not answer Open with Opened");
    }
    opened_ = reply.opened();
    if (local() && opened_.completion_board()) MapCompletionBoard();
    if (local() && opened_.submit_ring()) MapSubmitRing();
    reader_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "ferry-reader");
      ReadLoop();
    });
    return Status::Ok();
  }

  const v1::Opened& opened() const { return opened_; }
  bool draining() const { return draining_; }

  // --- recording (owner thread) -----------------------------------------------------
  uint64_t NextHandle() { return next_handle_++; }
  v1::Op* Record() { return pending_.add_ops(); }
  size_t recorded() const { return pending_.ops_size(); }
  bool closed() const { return closed_; }

  /// Send the recorded ops as one Submit; `downloads` are where Download op bytes go;
  /// `track`: keep its outcome for a pending transfer.
  Result<uint64_t> Submit(
      std::vector<std::pair<uint32_t, std::pair<void*, uint64_t>>> downloads = {},
      bool track = false) {
    ReapDetached();
    if (closed_) return Status(ErrorKind::kSessionClosed, "the session is closed");
    if (pending_.ops_size() == 0) return uint64_t{0};
    uint64_t id = next_submit_id_++;
    v1::ClientMessage m;
    pending_.set_submit_id(id);
    m.mutable_submit()->Swap(&pending_);
    pending_.Clear();
    {
      std::lock_guard lock(mu_);
      if (!dead_.ok()) {
        pending_.Clear();
        return dead_;
      }
      if (track) tracked_[id];
      if (!downloads.empty()) {
        auto& targets = download_targets_[id];
        for (auto& [op, dest] : downloads) targets[op] = dest;
      }
    }
    if (!Send(m)) {
      std::lock_guard lock(mu_);
      download_targets_.erase(id);
      tracked_.erase(id);
      return dead_.ok() ? Status(ErrorKind::kSessionClosed, "the session stream is gone") : dead_;
    }
    last_submitted_ = id;
    return id;
  }

  /// Wait for submit `id`'s completion and return its outcome (consuming it).
  Status WaitSubmit(uint64_t id) {
    std::unique_lock lock(mu_);
    if (Wait(
            lock, [&] { return last_completed_ >= id || !dead_.ok(); }, BoardFor(id, id))) {
      return Status::Ok();  // the board says it succeeded: no failure to consume
    }
    if (last_completed_ < id) return dead_;
    auto it = failures_.find(id);
    if (it == failures_.end()) return Status::Ok();
    Status s = it->second;
    failures_.erase(it);
    return s;
  }

  Status Synchronize() {
    auto submitted = Submit();
    if (!submitted.ok()) return submitted.status();
    // Every submit gets exactly one Completed, in order: once the last one submitted has
    // completed, all have, and no Synchronize message (a round trip) is needed.
    uint64_t last = last_submitted_;
    std::unique_lock lock(mu_);
    // Failures before synchronized_through_ were reported by an earlier Synchronize (or
    // consumed by a WaitSubmit); the board's word covers the submits since.
    const bool by_board = Wait(
        lock, [&] { return last_completed_ >= last || !dead_.ok(); },
        BoardFor(synchronized_through_ + 1, last));
    if (!by_board && last_completed_ < last) return dead_;
    synchronized_through_ = last;
    Status first;
    if (!failures_.empty()) first = failures_.begin()->second;
    failures_.clear();
    return first;
  }

  Result<SessionStats> Close() {
    if (closed_) return Status(ErrorKind::kSessionClosed, "the session is already closed");
    auto submitted = Submit();
    closed_ = true;
    if (!submitted.ok()) {
      Shutdown();
      return submitted.status();
    }
    v1::ClientMessage m;
    m.mutable_close();
    bool sent = Send(m);
    std::optional<SessionStats> stats;
    {
      std::unique_lock lock(mu_);
      if (sent) cv_.wait(lock, [&] { return closed_stats_.has_value() || !dead_.ok(); });
      stats = closed_stats_;
    }
    Shutdown();
    detached_.clear();  // every completion has arrived (or the stream is gone)
    if (!stats) return DeadOr("the session stream ended before Closed");
    return *stats;
  }

  /// End the stream without waiting for the device; idempotent.
  void Shutdown() {
    if (shut_down_) return;
    shut_down_ = true;
    closed_ = true;
    if (stream_) {
      bool clean;
      {
        std::lock_guard lock(mu_);
        clean = closed_stats_.has_value();
      }
      if (clean) {
        stream_->WritesDone();
      } else {
        context_.TryCancel();
      }
    }
    if (reader_.joinable()) reader_.join();
    if (stream_) stream_->Finish();
    if (slab_fd_ >= 0) ::close(slab_fd_);
    slab_fd_ = -1;
  }

  // --- pending transfers ------------------------------------------------------------
  /// Return whether submits [first, last] have all completed, and the first failure.
  bool Outcome(uint64_t first, uint64_t last, Status* status) {
    std::lock_guard lock(mu_);
    if (auto board = BoardFor(first, last); board && BoardSaysSucceeded(*board)) {
      *status = Status::Ok();
      return true;
    }
    return OutcomeLocked(first, last, status);
  }
  Status WaitOutcome(uint64_t first, uint64_t last) {
    std::unique_lock lock(mu_);
    Status s;
    if (Wait(
            lock, [&] { return OutcomeLocked(first, last, &s); }, BoardFor(first, last))) {
      s = Status::Ok();
    }
    for (uint64_t id = first; id <= last; ++id) tracked_.erase(id);
    return s;
  }
  void Detach(std::shared_ptr<PendingState> p) {
    if (shut_down_) return;  // every completion is in (or never will be): release now
    detached_.push_back(std::move(p));
  }
  /// Release detached transfers whose completion arrived (owner thread).
  void ReapDetached() {
    for (size_t i = 0; i < detached_.size();) {
      Status s;
      auto& p = detached_[i];
      if (p->first_id == 0 || Outcome(p->first_id, p->last_id, &s)) {
        {
          std::lock_guard lock(mu_);
          for (uint64_t id = p->first_id; id && id <= p->last_id; ++id) tracked_.erase(id);
        }
        auto done = std::move(p);
        detached_.erase(detached_.begin() + static_cast<long>(i));
        done.reset();  // records the tensor's release into the current record
      } else {
        ++i;
      }
    }
  }

  // --- shared memory ---------------------------------------------------------------
  bool local() const { return !opened_.slab_socket().empty(); }
  uint64_t slab_size() const { return opened_.slab_size(); }

  Result<PinnedBuffer> Allocate(uint64_t bytes) {
    ReapDetached();
    if (closed_) return Status(ErrorKind::kSessionClosed, "the session is closed");
    auto block = std::make_shared<BufferBlock>();
    block->size = bytes;
    if (!local()) {
      block->heap = std::make_unique<char[]>(std::max<uint64_t>(bytes, 1));
      block->data = block->heap.get();
      return PinnedBuffer(std::move(block));
    }
    uint64_t need = AlignUp(std::max<uint64_t>(bytes, 1));
    if (need > slab_size()) {
      return Status(ErrorKind::kQuotaExceeded, "a pinned buffer of " + std::to_string(bytes) +
                                                   " bytes does not fit in one slab of " +
                                                   std::to_string(slab_size()) +
                                                   " bytes (the daemon's --slab-size)");
    }
    if (!arena_->Allocate(need, &block->slab, &block->slab_offset)) {
      FERRY_RETURN_IF_ERROR(AcquireSlab());
      if (!arena_->Allocate(need, &block->slab, &block->slab_offset)) {
        return Status(ErrorKind::kInternal, "a fresh slab has no room");
      }
    }
    block->reserved = need;
    block->arena = arena_;
    block->data = block->slab->base + block->slab_offset;
    return PinnedBuffer(std::move(block));
  }

  /// The reused buffer blocking transfers stage through; invalid when none can be had.
  PinnedBuffer* Staging() {
    if (!staging_.valid() && !staging_failed_) {
      auto b =
          Allocate(std::min(kStagingBytes, slab_size()) / (2 * kBufferAlign) * (2 * kBufferAlign));
      if (b.ok() && b->size() >= 2 * kBufferAlign) {
        staging_ = std::move(*b);
      } else {
        staging_failed_ = true;
      }
    }
    return staging_.valid() ? &staging_ : nullptr;
  }

 private:
  Status SlabSocketError(const std::string& what) {
    if (slab_fd_ >= 0) ::close(slab_fd_);
    slab_fd_ = -1;
    return Status(ErrorKind::kUnavailable, "slab socket " + opened_.slab_socket() + ": " + what);
  }

  // Send one request on the slab socket (connecting and presenting the token on first use)
  // and receive its 24-byte answer and the fd that came with it (-1: none).
  Status SlabRequest(uint32_t op, char (&reply)[24], int* fd) {
    *fd = -1;
    if (slab_fd_ < 0) {
      if (slab_token_used_) return SlabSocketError("the connection was lost");
      slab_token_used_ = true;
      slab_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr = {};
      addr.sun_family = AF_UNIX;
      const std::string& path = opened_.slab_socket();
      if (slab_fd_ < 0 || path.size() >= sizeof(addr.sun_path)) return SlabSocketError("bad path");
      std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
      if (::connect(slab_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        return SlabSocketError(std::strerror(errno));
      }
      std::string hello = "FSL1" + opened_.slab_token();
      char answer[8];
      if (::send(slab_fd_, hello.data(), hello.size(), MSG_NOSIGNAL) !=
              static_cast<ssize_t>(hello.size()) ||
          ::recv(slab_fd_, answer, sizeof(answer), MSG_WAITALL) != sizeof(answer)) {
        return SlabSocketError("no answer to the token");
      }
      if (le::Get32(answer) != 0) return SlabSocketError("the daemon refused the token");
    }
    char request[8] = {};
    le::Put32(request, op);
    if (::send(slab_fd_, request, sizeof(request), MSG_NOSIGNAL) != sizeof(request)) {
      return SlabSocketError("send failed");
    }
    iovec iov = {reply, sizeof(reply)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(slab_fd_, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        std::memcpy(fd, CMSG_DATA(c), sizeof(int));
      }
    }
    if (n != sizeof(reply)) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
      return SlabSocketError("short answer");
    }
    return Status::Ok();
  }

  // Ask the daemon for one more slab over the slab socket and map it.
  Status AcquireSlab() {
    char reply[24];
    int fd = -1;
    FERRY_RETURN_IF_ERROR(SlabRequest(1, reply, &fd));
    uint32_t kind = le::Get32(reply);
    if (kind != 0) {
      if (fd >= 0) ::close(fd);
      const int k = kind > static_cast<uint32_t>(kLastErrorKind) ? -1 : static_cast<int>(kind);
      const ErrorKind known = k < 0 ? ErrorKind::kInternal : static_cast<ErrorKind>(k);
      return Status::FromWire(
          static_cast<int>(CanonicalCode(known)), k < 0 ? static_cast<int>(kind) : k,
          "the daemon gave no slab (" + std::string(ErrorKindName(known)) +
              (known == ErrorKind::kQuotaExceeded
                   ? ": the session's --session-pinned-quota is reached, or the "
                     "daemon's --pinned-budget is held by slabs in use)"
                   : ")"));
    }
    if (fd < 0) return SlabSocketError("no fd came with the slab");
    auto m = std::make_shared<SlabMapping>();
    m->id = le::Get64(reply + 8);
    m->size = le::Get64(reply + 16);
    void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return Status(ErrorKind::kInternal, "mmap of a slab failed");
    m->base = static_cast<char*>(p);
    arena_->Add(std::move(m));
    return Status::Ok();
  }
  // Send `m` after Open: numbered, through the submit ring when the session has one and the
  // message is not too large for it, else through the stream. A full ring is waited on, the
  // way a stream's write waits for flow control: the daemon takes records only while the
  // session is below its in-flight limit. False when the stream is gone.
  bool Send(v1::ClientMessage& m) {
    if (ring_) {
      m.set_sequence(next_sequence_++);
      for (int tries = 0;; ++tries) {
        const RingWriter::Wrote wrote = ring_->Write(m);
        if (wrote == RingWriter::Wrote::kWritten) return true;
        if (wrote == RingWriter::Wrote::kTooLarge) break;
        if (tries % 64 == 63) {
          std::lock_guard lock(mu_);
          if (!dead_.ok()) return false;
        }
        if (tries < 256) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
    }
    return stream_->Write(m);
  }

  // Map the session's submit ring (read-write) and take its doorbell. Without them (an error
  // here) every message goes through the stream, unnumbered.
  void MapSubmitRing() {
    char reply[24];
    int fd = -1;
    if (!SlabRequest(3, reply, &fd).ok()) return;
    const uint64_t capacity = le::Get64(reply + 8), size = le::Get64(reply + 16);
    void* p = MAP_FAILED;
    if (le::Get32(reply) == 0 && fd >= 0 && capacity >= 4096 && (capacity & (capacity - 1)) == 0 &&
        size == RingWriter::kHeaderBytes + capacity) {
      p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (fd >= 0) ::close(fd);
    if (p == MAP_FAILED) return;
    int doorbell = -1;
    if (!SlabRequest(4, reply, &doorbell).ok() || le::Get32(reply) != 0 || doorbell < 0) {
      if (doorbell >= 0) ::close(doorbell);
      ::munmap(p, size);
      return;
    }
    ring_ = std::make_unique<RingWriter>(static_cast<char*>(p), capacity, doorbell);
  }

  // Map the session's completion board (read-only), where the daemon posts how far the
  // session's submits have completed. Without it (an error here) waits take the messages'
  // word only, as with a remote daemon.
  void MapCompletionBoard() {
    char reply[24];
    int fd = -1;
    if (!SlabRequest(2, reply, &fd).ok()) return;
    const uint64_t size = le::Get64(reply + 16);
    if (le::Get32(reply) == 0 && fd >= 0 && size >= 16) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        board_map_ = p;
        board_map_bytes_ = size;
        board_ = static_cast<const std::atomic<uint64_t>*>(p);
      }
    }
    if (fd >= 0) ::close(fd);
  }

  // Submits [first, last], as far as the board may answer for them: not while any submit up
  // to `last` has Download ops, whose bytes come only in messages. Call with mu_ held.
  struct BoardRange {
    uint64_t first = 0, last = 0;
  };
  std::optional<BoardRange> BoardFor(uint64_t first, uint64_t last) const {
    if (!board_ || first > last) return std::nullopt;
    if (!download_targets_.empty() && download_targets_.begin()->first <= last) {
      return std::nullopt;
    }
    return BoardRange{first, last};
  }
  // What the board says of the submits of `r`: not all completed yet (`*through`, when
  // given, is the completed_through read), all completed and succeeded, or completed with a
  // failure among them or after them (its error comes only in a message). Lock-free.
  enum class BoardAnswer { kNotYet, kSucceeded, kAskTheMessages };
  BoardAnswer ReadBoard(const BoardRange& r, uint64_t* through = nullptr) const {
    // The daemon writes last_failed before completed_through (release).
    const uint64_t completed = board_[0].load(std::memory_order_acquire);
    if (through) *through = completed;
    if (completed < r.last) return BoardAnswer::kNotYet;
    return board_[1].load(std::memory_order_relaxed) < r.first ? BoardAnswer::kSucceeded
                                                               : BoardAnswer::kAskTheMessages;
  }
  bool BoardSaysSucceeded(const BoardRange& r) const {
    return ReadBoard(r) == BoardAnswer::kSucceeded;
  }

  bool OutcomeLocked(uint64_t first, uint64_t last, Status* status) {
    Status first_failure;
    for (uint64_t id = first; id <= last; ++id) {
      auto it = tracked_.find(id);
      if (it != tracked_.end() && it->second) {
        if (first_failure.ok() && !it->second->ok()) first_failure = *it->second;
        continue;
      }
      if (!dead_.ok()) {  // the stream ended before this completion
        *status = dead_;
        return true;
      }
      return false;
    }
    *status = first_failure;
    return true;
  }

 public:
 private:
  Status StreamFailure(const char* what) {
    grpc::Status s = stream_->Finish();
    shut_down_ = true;
    closed_ = true;
    return Status(ErrorKind::kUnavailable, std::string(what) + ": " + s.error_message());
  }
  Status DeadOr(const char* what) {
    std::lock_guard lock(mu_);
    return dead_.ok() ? Status(ErrorKind::kSessionClosed, what) : dead_;
  }

  // Wait until `done()` (evaluated with mu_ held, as `lock` holds it), or until the
  // completion board says the submits of `board` all succeeded: then return true (and
  // done() may not hold yet; the messages come later). For up to the client's wait_spin,
  // poll the board and the reader's message count instead of sleeping, so an answer that
  // comes quickly is seen without waking this thread; then sleep on the board's futex when
  // there is a board range, else on cv_. Returns with `lock` held.
  template <typename Done>
  bool Wait(std::unique_lock<std::mutex>& lock, Done done,
            std::optional<BoardRange> board = std::nullopt) {
    if (done()) return false;
    if (board && BoardSaysSucceeded(*board)) return true;
    const auto until = std::chrono::steady_clock::now() + client_->options.wait_spin;
    uint64_t seen = answers_.load(std::memory_order_acquire);
    lock.unlock();
    while (std::chrono::steady_clock::now() < until) {
      if (board && BoardSaysSucceeded(*board)) {
        lock.lock();
        return true;
      }
      if (answers_.load(std::memory_order_acquire) == seen) {
        std::this_thread::yield();
        continue;
      }
      lock.lock();
      if (done()) return false;
      seen = answers_.load(std::memory_order_acquire);
      lock.unlock();
    }
    if (board) {
      // Sleep on the board: the daemon wakes its futex at every post, so a long transfer's
      // success is seen as soon as it is posted, not after the Completed message. A failure
      // in range is read from the messages; a stream that died posts nothing, so the sleep
      // is bounded (kBoardSleep) to look at the messages' side now and then.
      for (;;) {
        uint64_t through = 0;
        const BoardAnswer answer = ReadBoard(*board, &through);
        if (answer == BoardAnswer::kSucceeded) {
          lock.lock();
          return true;
        }
        if (answer == BoardAnswer::kAskTheMessages) break;  // a failure's error is a message
        lock.lock();
        if (done()) return false;
        lock.unlock();
        timespec timeout = {0, kBoardSleep.count()};
        (void)::syscall(SYS_futex, board_, FUTEX_WAIT, static_cast<uint32_t>(through), &timeout,
                        nullptr, 0);
      }
    }
    lock.lock();
    cv_.wait(lock, done);
    return false;
  }
  // The longest a wait sleeps on the board before it looks at the messages' side again.
  static constexpr std::chrono::nanoseconds kBoardSleep{1'000'000};

  void ReadLoop() {
    v1::ServerMessage m;
    while (stream_->Read(&m)) {
      std::lock_guard lock(mu_);
      answers_.fetch_add(1, std::memory_order_release);  // for waiters polling (Wait)
      switch (m.kind_case()) {
        case v1::ServerMessage::kDownloadChunk: {
          const auto& c = m.download_chunk();
          auto t = download_targets_.find(c.submit_id());
          if (t == download_targets_.end()) break;
          auto d = t->second.find(c.op_index());
          if (d == t->second.end()) break;
          auto [dest, length] = d->second;
          uint64_t end = 0;
          if (__builtin_add_overflow(c.offset(), c.data().size(), &end) || end > length) {
            dead_ = Status(ErrorKind::kProtocolViolation, "download chunk out of range");
            cv_.notify_all();
            return;
          }
          std::memcpy(static_cast<char*>(dest) + c.offset(), c.data().data(), c.data().size());
          break;
        }
        case v1::ServerMessage::kCompleted: {
          const auto& c = m.completed();
          last_completed_ = c.submit_id();
          download_targets_.erase(c.submit_id());
          if (auto t = tracked_.find(c.submit_id()); t != tracked_.end()) {
            t->second = c.has_error() ? FromProto(c.error()) : Status::Ok();
          }
          if (c.has_error()) failures_[c.submit_id()] = FromProto(c.error());
          cv_.notify_all();
          break;
        }
        case v1::ServerMessage::kSynchronized:
          last_synchronized_ = m.synchronized().sync_id();
          cv_.notify_all();
          break;
        case v1::ServerMessage::kClosed:
          closed_stats_ = FromProto(m.closed().stats());
          cv_.notify_all();
          break;
        case v1::ServerMessage::kError:
          dead_ = FromProto(m.error());
          cv_.notify_all();
          break;
        case v1::ServerMessage::kDraining:
          draining_ = true;
          break;
        default:
          break;
      }
    }
    std::lock_guard lock(mu_);
    if (dead_.ok()) {
      dead_ = closed_stats_ ? Status(ErrorKind::kSessionClosed, "the session is closed")
                            : Status(ErrorKind::kUnavailable,
                                     "the daemon ended the session stream (daemon gone?)");
    }
    cv_.notify_all();
  }

  std::shared_ptr<ClientState> client_;
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
  std::thread reader_;
  v1::Opened opened_;

  // Owner thread only.
  v1::Submit pending_;
  uint64_t next_handle_ = 1;
  uint64_t next_submit_id_ = 1;
  uint64_t last_submitted_ = 0;
  bool closed_ = false;
  bool shut_down_ = false;

  // Shared with the reader thread.
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t last_completed_ = 0;          // guarded by mu_
  std::atomic<uint64_t> answers_{0};     // messages the reader applied, for Wait
  uint64_t last_synchronized_ = 0;       // guarded by mu_
  uint64_t synchronized_through_ = 0;    // the last submit a Synchronize covered; mu_
  std::map<uint64_t, Status> failures_;  // guarded by mu_
  std::map<uint64_t, std::map<uint32_t, std::pair<void*, uint64_t>>>
      download_targets_;                               // guarded by mu_
  std::optional<SessionStats> closed_stats_;           // guarded by mu_
  Status dead_;                                        // guarded by mu_; set once the stream ends
  std::atomic<bool> draining_{false};                  // the daemon said it is draining
  std::map<uint64_t, std::optional<Status>> tracked_;  // pending transfers' submits; mu_

  // Shared memory and pending transfers (owner thread).
  std::shared_ptr<SlabArena> arena_ = std::make_shared<SlabArena>();
  int slab_fd_ = -1;
  bool slab_token_used_ = false;
  // The completion board (read-only shared memory; null: none): [0] completed_through,
  // [1] last_failed (docs/protocol.md). Mapped at Open, unmapped when the state is destroyed.
  const std::atomic<uint64_t>* board_ = nullptr;
  void* board_map_ = nullptr;
  uint64_t board_map_bytes_ = 0;
  // The submit ring (null: none), and the next message's sequence number.
  std::unique_ptr<RingWriter> ring_;
  uint64_t next_sequence_ = 1;
  PinnedBuffer staging_;
  bool staging_failed_ = false;
  std::vector<std::shared_ptr<PendingState>> detached_;
};

}  // namespace internal

// --- Client ------------------------------------------------------------------------------

namespace {

// Adds "authorization: Bearer <token>" to every call of a channel (call credentials would
// need TLS; a token also guards plaintext loopback TCP).
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::string token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel that owns the factory
};

// PEM text as given, or the contents of the file it names.
Result<std::string> PemOrFile(const std::string& value, const char* what) {
  if (value.empty() || value.find("-----BEGIN") != std::string::npos) return value;
  std::ifstream in(value, std::ios::binary);
  if (!in)
    return Status(ErrorKind::kInvalidArgument, std::string("cannot read ") + what + " " + value);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

Result<Client> Client::connect(const std::string& target, const ClientOptions& options) {
  auto state = std::make_shared<internal::ClientState>();
  state->target = target;
  state->options = options;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const bool tcp = target.rfind("unix:", 0) != 0;
  if (tcp && (!options.tls_ca_cert.empty() || !options.tls_client_cert.empty())) {
    grpc::SslCredentialsOptions ssl;
    FERRY_ASSIGN_OR_RETURN(ssl.pem_root_certs, PemOrFile(options.tls_ca_cert, "TLS CA"));
    FERRY_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                           PemOrFile(options.tls_client_cert, "TLS client certificate"));
    FERRY_ASSIGN_OR_RETURN(ssl.pem_private_key,
                           PemOrFile(options.tls_client_key, "TLS client key"));
    credentials = grpc::SslCredentials(ssl);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (tcp && !options.bearer_token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(options.bearer_token));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(internal::kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(internal::kMaxMessageBytes));
  // Reconnect quickly to a daemon that restarted (gRPC's default first backoff is 1 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  state->channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      internal::GrpcTarget(target), credentials, args, std::move(interceptors));
  if (!state->channel->WaitForConnected(std::chrono::system_clock::now() +
                                        options.connect_timeout)) {
    return Status(ErrorKind::kUnavailable, "no ferry daemon answers at " + target);
  }
  state->stub = v1::SessionService::NewStub(state->channel);
  return Client(std::move(state));
}

Result<Session> Client::open_session(const SessionOptions& options) {
  // A daemon that is restarting or rebuilding its device (after a device fault) answers
  // UNAVAILABLE for a moment: retry, reconnecting, for up to the connect timeout.
  auto deadline = std::chrono::system_clock::now() + state_->options.connect_timeout;
  for (;;) {
    if (state_->channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
      state_->channel->WaitForConnected(deadline);
    }
    auto state = std::make_shared<internal::SessionState>();
    Status opened = state->Open(state_, options);
    if (opened.ok()) return Session(std::move(state));
    if (opened.kind() != ErrorKind::kUnavailable || std::chrono::system_clock::now() >= deadline) {
      return opened;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

const std::string& Client::target() const { return state_->target; }

namespace {
// Record the release of `*handle` into its session's next submit (no message of its own)
// while the session is open, and forget the handle. `record` fills the op.
template <typename RecordFn>
void RecordRelease(const std::weak_ptr<internal::SessionState>& session, uint64_t* handle,
                   RecordFn record) {
  if (*handle == 0) return;
  if (auto s = session.lock(); s && !s->closed()) record(*s->Record(), *handle);
  *handle = 0;
}
}  // namespace

// --- Tensor ------------------------------------------------------------------------------

Tensor::Tensor(Tensor&& o) noexcept
    : session_(std::move(o.session_)),
      handle_(std::exchange(o.handle_, 0)),
      dtype_(o.dtype_),
      shape_(std::move(o.shape_)),
      elements_(std::exchange(o.elements_, 0)) {}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    Release();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    elements_ = std::exchange(o.elements_, 0);
  }
  return *this;
}

Tensor::~Tensor() { Release(); }

void Tensor::Release() {
  RecordRelease(session_, &handle_,
                [](v1::Op& op, uint64_t h) { op.mutable_free_tensor()->set_handle(h); });
}

// --- Module, Graph -------------------------------------------------------------------------

Module::Module(Module&& o) noexcept
    : session_(std::move(o.session_)), handle_(std::exchange(o.handle_, 0)) {}
Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    Release();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Module::~Module() { Release(); }

void Module::Release() {
  RecordRelease(session_, &handle_,
                [](v1::Op& op, uint64_t h) { op.mutable_unload_module()->set_handle(h); });
}

Graph::Graph(Graph&& o) noexcept
    : session_(std::move(o.session_)), handle_(std::exchange(o.handle_, 0)) {}
Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    Release();
    session_ = std::move(o.session_);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}
Graph::~Graph() { Release(); }

void Graph::Release() {
  RecordRelease(session_, &handle_,
                [](v1::Op& op, uint64_t h) { op.mutable_free_graph()->set_handle(h); });
}

// --- Session -----------------------------------------------------------------------------

Session::Session(std::shared_ptr<internal::SessionState> state) : state_(std::move(state)) {}
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;
Session::~Session() = default;

uint64_t Session::id() const { return state_->opened().session_id(); }
bool Session::draining() const { return state_->draining(); }
const std::string& Session::backend() const { return state_->opened().backend(); }
uint64_t Session::device_bytes_quota() const { return state_->opened().device_bytes_quota(); }

Tensor Session::create_tensor(DType dtype, const Shape& shape) {
  uint64_t handle = state_->NextHandle();
  auto* c = state_->Record()->mutable_create_tensor();
  c->set_handle(handle);
  c->set_dtype(internal::ToProto(dtype));
  for (int64_t d : shape.dims()) c->add_shape(d);
  auto count = shape.ElementCount();
  return Tensor(state_, handle, dtype, shape, count.ok() ? *count : 0);
}

void Session::free(Tensor&& tensor) {
  Tensor t = std::move(tensor);
  t.Release();
}

void Session::fill(const Tensor& t, double value) {
  auto* f = state_->Record()->mutable_fill();
  f->set_tensor(t.handle());
  f->set_value(value);
}

void Session::copy(const Tensor& src, const Tensor& dst) {
  auto* c = state_->Record()->mutable_copy();
  c->set_src(src.handle());
  c->set_dst(dst.handle());
}

namespace {
void RecordBinary(internal::SessionState& s, v1::BinaryKind kind, const Tensor& a, const Tensor& b,
                  const Tensor& out) {
  auto* op = s.Record()->mutable_binary();
  op->set_kind(kind);
  op->set_a(a.handle());
  op->set_b(b.handle());
  op->set_out(out.handle());
}
}  // namespace

void Session::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::ADD, a, b, out);
}
void Session::sub(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::SUB, a, b, out);
}
void Session::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::MUL, a, b, out);
}
void Session::div(const Tensor& a, const Tensor& b, const Tensor& out) {
  RecordBinary(*state_, v1::DIV, a, b, out);
}

void Session::scale(const Tensor& x, double alpha, const Tensor& out) {
  auto* op = state_->Record()->mutable_scale();
  op->set_x(x.handle());
  op->set_alpha(alpha);
  op->set_out(out.handle());
}

void Session::axpy(double alpha, const Tensor& x, const Tensor& y) {
  auto* op = state_->Record()->mutable_axpy();
  op->set_alpha(alpha);
  op->set_x(x.handle());
  op->set_y(y.handle());
}

void Session::sum(const Tensor& in, const Tensor& out) {
  auto* op = state_->Record()->mutable_reduce_sum();
  op->set_in(in.handle());
  op->set_out(out.handle());
}

void Session::gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& o) {
  auto* op = state_->Record()->mutable_gemm();
  op->set_a(a.handle());
  op->set_b(b.handle());
  op->set_c(c.handle());
  op->set_trans_a(o.trans_a);
  op->set_trans_b(o.trans_b);
  op->set_alpha(o.alpha);
  op->set_beta(o.beta);
}

void Session::write_bytes(const Tensor& t, uint64_t offset, const void* data, uint64_t bytes) {
  auto* op = state_->Record()->mutable_upload();
  op->set_tensor(t.handle());
  op->set_offset(offset);
  op->set_data(data, bytes);
}

Module Session::load_module(ModuleFormat format, std::string_view image) {
  uint64_t handle = state_->NextHandle();
  auto* op = state_->Record()->mutable_load_module();
  op->set_handle(handle);
  op->set_format(static_cast<v1::ModuleFormat>(format));
  op->set_image(image.data(), image.size());
  return Module(state_, handle);
}

void Session::launch(const Module& module, std::string_view function, Dim3 grid, Dim3 block,
                     const std::vector<KernelArg>& args, uint32_t shared_bytes) {
  auto* op = state_->Record()->mutable_launch();
  op->set_module(module.handle());
  op->set_function(function.data(), function.size());
  for (uint32_t d : {grid.x, grid.y, grid.z}) op->add_grid(d);
  for (uint32_t d : {block.x, block.y, block.z}) op->add_block(d);
  op->set_shared_bytes(shared_bytes);
  for (const KernelArg& a : args) {
    v1::KernelArg* k = op->add_args();
    switch (a.kind()) {
      case KernelArg::Kind::kTensor:
        k->set_tensor(a.integer());
        break;
      case KernelArg::Kind::kI32:
        k->set_i32(static_cast<int32_t>(a.real()));
        break;
      case KernelArg::Kind::kU32:
        k->set_u32(static_cast<uint32_t>(a.integer()));
        break;
      case KernelArg::Kind::kI64:
        k->set_i64(static_cast<int64_t>(a.integer()));
        break;
      case KernelArg::Kind::kU64:
        k->set_u64(a.integer());
        break;
      case KernelArg::Kind::kF32:
        k->set_f32(static_cast<float>(a.real()));
        break;
      case KernelArg::Kind::kF64:
        k->set_f64(a.real());
        break;
    }
  }
}

Graph Session::begin_graph() {
  uint64_t handle = state_->NextHandle();
  state_->Record()->mutable_begin_graph()->set_handle(handle);
  return Graph(state_, handle);
}

void Session::end_graph() { state_->Record()->mutable_end_graph(); }

void Session::launch_graph(const Graph& graph) {
  state_->Record()->mutable_launch_graph()->set_graph(graph.handle());
}

size_t Session::recorded_ops() const { return state_->recorded(); }

Status Session::submit() { return state_->Submit().status(); }

Status Session::synchronize() { return state_->Synchronize(); }

Result<SessionStats> Session::close() { return state_->Close(); }

Status Session::DtypeMismatch(const Tensor& t) {
  return Status(ErrorKind::kDtypeMismatch, "the element type does not match tensor " +
                                               std::to_string(t.handle()) + " (" +
                                               std::string(DTypeName(t.dtype())) + ")");
}

// --- PinnedBuffer, PendingTransfer ----------------------------------------------------------

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept : block_(std::move(o.block_)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) block_ = std::move(o.block_);
  return *this;
}
PinnedBuffer::~PinnedBuffer() = default;
void* PinnedBuffer::data() { return block_ ? block_->data : nullptr; }
const void* PinnedBuffer::data() const { return block_ ? block_->data : nullptr; }
uint64_t PinnedBuffer::size() const { return block_ ? block_->size : 0; }
bool PinnedBuffer::is_shared() const { return block_ && block_->slab; }

PendingTransfer::PendingTransfer(PendingTransfer&& o) noexcept : state_(std::move(o.state_)) {}
PendingTransfer& PendingTransfer::operator=(PendingTransfer&& o) noexcept {
  if (this != &o) {
    Detach();
    state_ = std::move(o.state_);
  }
  return *this;
}
PendingTransfer::~PendingTransfer() { Detach(); }

void PendingTransfer::Detach() {
  if (!state_ || state_->waited) return;
  if (state_->first_id != 0) {
    if (auto s = state_->session.lock()) s->Detach(std::move(state_));
  }
  state_.reset();
}

Result<bool> PendingTransfer::is_ready() const {
  if (!state_ || state_->waited) {
    return Status(ErrorKind::kInvalidArgument, "no transfer: moved from or already waited for");
  }
  if (state_->first_id == 0) return state_->refused;
  auto s = state_->session.lock();
  if (!s) return Status(ErrorKind::kSessionClosed, "the session is gone");
  Status outcome;
  if (!s->Outcome(state_->first_id, state_->last_id, &outcome)) return false;
  if (!outcome.ok()) return outcome;
  return true;
}

Transfer PendingTransfer::wait() {
  Transfer t;
  if (!state_ || state_->waited) {
    t.status = Status(ErrorKind::kInvalidArgument, "no transfer: moved from or already waited for");
    return t;
  }
  if (state_->first_id == 0) {
    t.status = state_->refused;
  } else if (auto s = state_->session.lock()) {
    t.status = s->WaitOutcome(state_->first_id, state_->last_id);
  } else {
    t.status = Status(ErrorKind::kSessionClosed, "the session is gone");
  }
  state_->waited = true;
  t.tensor = std::move(state_->tensor);
  t.buffer = std::move(state_->buffer);
  state_.reset();
  return t;
}

// --- Session: shared memory and pending transfers ----------------------------------------

Result<PinnedBuffer> Session::pinned_buffer(uint64_t bytes) { return state_->Allocate(bytes); }

uint64_t Session::slab_size() const { return state_->slab_size(); }

namespace {

// Check what a pending transfer is given; OK means it may be sent.
Status CheckTransfer(const std::shared_ptr<internal::SessionState>& session,
                     const std::weak_ptr<internal::SessionState>& tensor_session,
                     const Tensor& tensor, const PinnedBuffer& buffer) {
  if (!tensor.valid()) {
    return Status(ErrorKind::kInvalidHandle, "the tensor was moved from (or never created)");
  }
  if (!buffer.valid()) {
    return Status(ErrorKind::kInvalidArgument, "the buffer was moved from (or never allocated)");
  }
  if (tensor_session.lock() != session) {
    return Status(ErrorKind::kInvalidHandle, "the tensor belongs to another session");
  }
  if (buffer.size() < tensor.byte_size()) {
    return Status(ErrorKind::kOutOfRange, "a buffer of " + std::to_string(buffer.size()) +
                                              " bytes cannot hold tensor " +
                                              std::to_string(tensor.handle()) + " of " +
                                              std::to_string(tensor.byte_size()) + " bytes");
  }
  return Status::Ok();
}

}  // namespace

PendingUpload Session::upload_pending(PinnedBuffer&& buffer, Tensor&& tensor) {
  auto p = std::make_shared<internal::PendingState>();
  p->session = state_;
  p->tensor = std::move(tensor);
  p->buffer = std::move(buffer);
  p->refused = CheckTransfer(state_, p->tensor.session_, p->tensor, p->buffer);
  if (p->refused.ok()) p->refused = state_->Submit().status();  // what was recorded first
  if (!p->refused.ok()) return PendingUpload(std::move(p));
  const uint64_t bytes = p->tensor.byte_size();
  const uint64_t h = p->tensor.handle();
  const char* data = static_cast<const char*>(p->buffer.data());
  uint64_t off = 0;
  do {
    if (p->buffer.is_shared()) {
      auto* op = state_->Record()->mutable_upload_from_slab();
      op->set_tensor(h);
      op->set_slab(p->buffer.block_->slab->id);
      op->set_slab_offset(p->buffer.block_->slab_offset);
      op->set_length(bytes);
      off = bytes;
    } else {  // inline, 1 MiB per op, a few MiB per submit
      uint64_t window_end = std::min(bytes, off + internal::kUploadSubmitBytes);
      do {
        uint64_t n = std::min(internal::kUploadChunkBytes, window_end - off);
        write_bytes(p->tensor, off, data + off, n);
        off += n;
      } while (off < window_end);
    }
    auto id = state_->Submit({}, true);
    if (!id.ok()) {
      p->refused = id.status();
      break;
    }
    if (!p->first_id) p->first_id = *id;
    p->last_id = *id;
  } while (off < bytes);
  if (!p->refused.ok() && p->first_id) {
    // Part of it was sent: the outcome of what was sent decides; report the send error.
    p->refused = Status::Ok();
  }
  return PendingUpload(std::move(p));
}

PendingDownload Session::download_pending(Tensor&& tensor, PinnedBuffer&& buffer) {
  auto p = std::make_shared<internal::PendingState>();
  p->session = state_;
  p->tensor = std::move(tensor);
  p->buffer = std::move(buffer);
  p->refused = CheckTransfer(state_, p->tensor.session_, p->tensor, p->buffer);
  if (p->refused.ok()) p->refused = state_->Submit().status();
  if (!p->refused.ok()) return PendingDownload(std::move(p));
  const uint64_t bytes = p->tensor.byte_size();
  const uint64_t h = p->tensor.handle();
  char* out = static_cast<char*>(p->buffer.data());
  uint64_t off = 0;
  do {
    std::vector<std::pair<uint32_t, std::pair<void*, uint64_t>>> targets;
    if (p->buffer.is_shared()) {
      auto* op = state_->Record()->mutable_download_to_slab();
      op->set_tensor(h);
      op->set_slab(p->buffer.block_->slab->id);
      op->set_slab_offset(p->buffer.block_->slab_offset);
      op->set_length(bytes);
      off = bytes;
    } else {  // the bytes come inline, written by the reader straight into the buffer
      uint64_t n = std::min(internal::kDownloadSubmitBytes, bytes - off);
      auto* d = state_->Record()->mutable_download();
      d->set_tensor(h);
      d->set_offset(off);
      d->set_length(n);
      targets.push_back({0u, {out + off, n}});
      off += n;
    }
    auto id = state_->Submit(std::move(targets), true);
    if (!id.ok()) {
      p->refused = id.status();
      break;
    }
    if (!p->first_id) p->first_id = *id;
    p->last_id = *id;
  } while (off < bytes);
  if (!p->refused.ok() && p->first_id) p->refused = Status::Ok();
  return PendingDownload(std::move(p));
}

Status Session::upload_bytes(const Tensor& t, const void* data, uint64_t bytes) {
  if (t.valid() && bytes != t.byte_size()) {
    return Status(ErrorKind::kShapeMismatch,
                  "upload of " + std::to_string(bytes) + " bytes into tensor " +
                      std::to_string(t.handle()) + " of " + std::to_string(t.byte_size()));
  }
  if (state_->local() && bytes > 0) {
    if (PinnedBuffer* staging = state_->Staging()) {
      // Through shared memory: copy a half of the staging buffer while the daemon DMAs
      // from the other one.
      FERRY_RETURN_IF_ERROR(state_->Submit().status());
      const uint64_t half = staging->size() / 2;
      char* base = static_cast<char*>(staging->data());
      uint64_t ids[2] = {0, 0};
      Status result;
      uint64_t k = 0;
      for (uint64_t off = 0; off < bytes && result.ok(); off += half, k ^= 1) {
        if (ids[k]) {
          Status s = state_->WaitSubmit(ids[k]);
          ids[k] = 0;
          if (!s.ok()) {
            result = s;
            break;
          }
        }
        uint64_t n = std::min(half, bytes - off);
        internal::ParallelCopy(base + k * half, static_cast<const char*>(data) + off, n);
        auto* op = state_->Record()->mutable_upload_from_slab();
        op->set_tensor(t.handle());
        op->set_offset(off);
        op->set_slab(staging->block_->slab->id);
        op->set_slab_offset(staging->block_->slab_offset + k * half);
        op->set_length(n);
        auto id = state_->Submit();
        if (!id.ok()) {
          result = id.status();
          break;
        }
        ids[k] = *id;
      }
      for (uint64_t id : {std::min(ids[0], ids[1]), std::max(ids[0], ids[1])}) {
        if (!id) continue;
        Status s = state_->WaitSubmit(id);
        if (result.ok() && !s.ok()) result = s;
      }
      return result;
    }
  }
  // Flush what is recorded, then send the bytes in submits of a few MiB each, each made of
  // Upload ops of at most 1 MiB; wait for all of them.
  FERRY_RETURN_IF_ERROR(state_->Submit().status());
  const char* p = static_cast<const char*>(data);
  uint64_t first = 0, last = 0;
  uint64_t off = 0;
  do {
    uint64_t window_end = std::min(bytes, off + internal::kUploadSubmitBytes);
    do {
      uint64_t n = std::min(internal::kUploadChunkBytes, window_end - off);
      write_bytes(t, off, p + off, n);
      off += n;
    } while (off < window_end);
    FERRY_ASSIGN_OR_RETURN(last, state_->Submit());
    if (!first) first = last;
  } while (off < bytes);
  Status result;
  for (uint64_t id = first; id && id <= last; ++id) {
    Status s = state_->WaitSubmit(id);
    if (result.ok() && !s.ok()) result = s;
  }
  return result;
}

Status Session::download_bytes(const Tensor& t, void* out, uint64_t bytes) {
  if (t.valid() && bytes != t.byte_size()) {
    return Status(ErrorKind::kShapeMismatch,
                  "download of " + std::to_string(bytes) + " bytes from tensor " +
                      std::to_string(t.handle()) + " of " + std::to_string(t.byte_size()));
  }
  if (state_->local() && bytes > 0) {
    if (PinnedBuffer* staging = state_->Staging()) {
      // Through shared memory: the daemon fills one half while the other is copied out.
      FERRY_RETURN_IF_ERROR(state_->Submit().status());
      const uint64_t half = staging->size() / 2;
      char* base = static_cast<char*>(staging->data());
      struct Chunk {
        uint64_t id = 0, off = 0, n = 0;
      } chunks[2];
      Status result;
      uint64_t next = 0;
      auto send = [&](int k) -> Status {
        uint64_t n = std::min(half, bytes - next);
        auto* op = state_->Record()->mutable_download_to_slab();
        op->set_tensor(t.handle());
        op->set_offset(next);
        op->set_slab(staging->block_->slab->id);
        op->set_slab_offset(staging->block_->slab_offset + k * half);
        op->set_length(n);
        FERRY_ASSIGN_OR_RETURN(chunks[k].id, state_->Submit());
        chunks[k].off = next;
        chunks[k].n = n;
        next += n;
        return Status::Ok();
      };
      for (int k = 0; k < 2 && next < bytes && result.ok(); ++k) result = send(k);
      for (int k = 0; chunks[k].id; k ^= 1) {
        Status s = state_->WaitSubmit(chunks[k].id);
        chunks[k].id = 0;
        if (result.ok() && !s.ok()) result = s;
        if (result.ok()) {
          internal::ParallelCopy(static_cast<char*>(out) + chunks[k].off, base + k * half,
                                 chunks[k].n);
          if (next < bytes) result = send(k);
        }
        if (!chunks[k ^ 1].id) break;
      }
      return result;
    }
  }
  FERRY_RETURN_IF_ERROR(state_->Submit().status());
  uint64_t first = 0, last = 0;
  uint64_t off = 0;
  do {
    uint64_t n = std::min(internal::kDownloadSubmitBytes, bytes - off);
    auto* d = state_->Record()->mutable_download();
    d->set_tensor(t.handle());
    d->set_offset(off);
    d->set_length(n);
    FERRY_ASSIGN_OR_RETURN(last, state_->Submit({{0u, {static_cast<char*>(out) + off, n}}}));
    if (!first) first = last;
    off += n;
  } while (off < bytes);
  Status result;
  for (uint64_t id = first; id && id <= last; ++id) {
    Status s = state_->WaitSubmit(id);
    if (result.ok() && !s.ok()) result = s;
  }
  return result;
}

}  // namespace ferry
