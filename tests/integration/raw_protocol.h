// For tests that speak the raw ferry.v1 protocol: a session stream without libferry in
// between (so a test can send what libferry never would), and builders of ops.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/v1/session.grpc.pb.h"
#include "ferry/v1/session.pb.h"

namespace ferry::testing {

/// Send one byte on `fd` (a Unix socket, as far as the sender knows) with the descriptor
/// `passed` attached (SCM_RIGHTS); sendmsg's result (errno set when -1). System calls only:
/// safe in a forked child.
inline ssize_t SendWithDescriptor(int fd, int passed, int flags = MSG_NOSIGNAL) {
  char byte = 'F';
  iovec iov = {&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &passed, sizeof(int));
  return ::sendmsg(fd, &msg, flags);
}

/// Receive up to `size` bytes on `fd` into `buf`, and the descriptor sent with them
/// (SCM_RIGHTS) into `*passed` (-1 when none came); recvmsg's result (errno set when -1).
inline ssize_t ReceiveWithDescriptor(int fd, void* buf, size_t size, int* passed,
                                     int flags = MSG_CMSG_CLOEXEC) {
  iovec iov = {buf, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(fd, &msg, flags);
  *passed = -1;
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(passed, CMSG_DATA(c), sizeof(int));
    }
  }
  return n;
}

/// One Session stream to a daemon, driven message by message.
class RawStream {
 public:
  /// With a deadline (when not 0): a test that waits for a message that never comes fails
  /// when it passes (its reads end) instead of hanging.
  explicit RawStream(const std::string& target,
                     std::chrono::seconds deadline = std::chrono::seconds(0))
      : RawStream(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()), deadline) {}
  /// Over a channel made elsewhere (e.g. from a connected fd); with a deadline when not 0.
  explicit RawStream(std::shared_ptr<grpc::Channel> channel,
                     std::chrono::seconds deadline = std::chrono::seconds(0))
      : channel_(std::move(channel)) {
    if (deadline.count() > 0) ctx_.set_deadline(std::chrono::system_clock::now() + deadline);
    stub_ = v1::SessionService::NewStub(channel_);
    stream_ = stub_->Session(&ctx_);
  }
  ~RawStream() {
    if (!finished_) {
      ctx_.TryCancel();
      stream_->Finish();
    }
  }
  bool Send(const v1::ClientMessage& m) { return stream_->Write(m); }
  /// End the client's side of the stream (a half-close).
  bool WritesDone() { return stream_->WritesDone(); }
  /// Send `m`, letting gRPC hold it back to go with later messages (buffer hint): many small
  /// messages go faster. The next plain Send flushes it.
  bool SendBuffered(const v1::ClientMessage& m) {
    return stream_->Write(m, grpc::WriteOptions().set_buffer_hint());
  }
  /// Send an Open (and read nothing); `successes_on_board`: Open.successes_on_board.
  bool SendOpen(uint32_t version = v1::PROTOCOL_VERSION_CURRENT, bool successes_on_board = false) {
    v1::ClientMessage m;
    m.mutable_open()->set_protocol_version(version);
    m.mutable_open()->set_client_name("raw");
    m.mutable_open()->set_successes_on_board(successes_on_board);
    return Send(m);
  }
  /// Open the session: the Opened, or nullopt when the daemon answered anything else.
  std::optional<v1::Opened> Open(bool successes_on_board = false) {
    if (!SendOpen(v1::PROTOCOL_VERSION_CURRENT, successes_on_board)) return std::nullopt;
    return ReadOpened();
  }
  /// Open the session asking for at most `max_in_flight_submits` submits in flight (an Open
  /// with nothing else set): the Opened, or nullopt when the daemon answered anything else.
  std::optional<v1::Opened> OpenWithMaxInFlight(uint32_t max_in_flight_submits) {
    v1::ClientMessage m;
    m.mutable_open()->set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
    m.mutable_open()->set_max_in_flight_submits(max_in_flight_submits);
    if (!Send(m)) return std::nullopt;
    return ReadOpened();
  }
  /// Read the answer to an Open: the Opened, or nullopt when it is anything else.
  std::optional<v1::Opened> ReadOpened() {
    auto r = Read();
    if (!r || !r->has_opened()) return std::nullopt;
    return r->opened();
  }
  std::optional<v1::ServerMessage> Read() {
    v1::ServerMessage m;
    if (!stream_->Read(&m)) return std::nullopt;
    return m;
  }
  bool Submit(uint64_t id, std::vector<v1::Op> ops) {
    v1::ClientMessage m;
    m.mutable_submit()->set_submit_id(id);
    for (auto& op : ops) *m.mutable_submit()->add_ops() = op;
    return Send(m);
  }
  /// Read until the Completed for `id`; its error (kind NONE on success). Inline download
  /// chunks on the way are appended to `chunks` when given.
  v1::Error Completion(uint64_t id, std::string* chunks = nullptr) {
    while (auto m = Read()) {
      if (m->has_download_chunk() && chunks) *chunks += m->download_chunk().data();
      if (m->has_completed() && m->completed().submit_id() == id) return m->completed().error();
      if (m->has_error()) return m->error();
    }
    v1::Error e;
    e.set_kind(v1::SESSION_CLOSED);
    return e;
  }
  /// Close the session, read everything up to the end of the stream, and finish it.
  void Close() {
    v1::ClientMessage m;
    m.mutable_close();
    stream_->Write(m);
    stream_->WritesDone();
    while (Read()) {
    }
    Finish();
  }
  /// Send a Close numbered `sequence` (once a session numbers its messages, every later one
  /// is numbered), read to the end of the stream and finish it: true if the Close was sent,
  /// a Closed came, and the stream ended OK.
  bool CloseNumbered(uint64_t sequence) {
    v1::ClientMessage m;
    m.set_sequence(sequence);
    m.mutable_close();
    if (!Send(m)) return false;
    bool closed = false;
    while (auto r = Read()) closed |= r->has_closed();
    return Finish().ok() && closed;
  }
  grpc::Status Finish() {
    finished_ = true;
    return stream_->Finish();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SessionService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  bool finished_ = false;
};

/// A session stream whose client messages are sent as raw bytes: a test can send what no
/// ClientMessage serializes to (a string that is not UTF-8, a malformed field), or a message
/// too large to build as one (an op bomb), and reads the daemon's answers as ServerMessages.
class RawBytesStream {
 public:
  explicit RawBytesStream(const std::string& target)
      : channel_(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
        method_("/ferry.v1.SessionService/Session", grpc::internal::RpcMethod::BIDI_STREAMING,
                channel_),
        stream_(
            grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::ServerMessage>::Create(
                channel_.get(), method_, &ctx_)) {}
  ~RawBytesStream() {
    if (!finished_) {
      ctx_.TryCancel();
      stream_->Finish();
    }
  }
  bool Send(const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    return stream_->Write(buffer);
  }
  bool Send(const v1::ClientMessage& m) { return Send(m.SerializeAsString()); }
  std::optional<v1::ServerMessage> Read() {
    v1::ServerMessage m;
    if (!stream_->Read(&m)) return std::nullopt;
    return m;
  }
  bool WritesDone() { return stream_->WritesDone(); }
  grpc::Status Finish() {
    finished_ = true;
    return stream_->Finish();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::internal::RpcMethod method_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, v1::ServerMessage>> stream_;
  bool finished_ = false;
};

// Written out here rather than taken from ferry/little_endian.h, so that these tests check
// the wire format independently of the code under test.
inline uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}
inline uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// A new connection to the Unix socket at `path`; its fd, or -1 when it could not connect.
inline int ConnectUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), std::min(path.size() + 1, sizeof(addr.sun_path)));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One connection on the slab socket, spoken byte by byte (docs/protocol.md, "slab socket").
class RawSlabConnection {
 public:
  explicit RawSlabConnection(const std::string& path) : fd_(ConnectUnix(path)) {}
  // Take a connection made elsewhere (e.g. as another uid); owns `connected_fd`.
  explicit RawSlabConnection(int connected_fd) : fd_(connected_fd) {}
  ~RawSlabConnection() { Close(); }
  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Present the token; the daemon's answer kind (0: bound), or -1 when it sent nothing.
  // `magic` is the hello's first four bytes ("FSL1" is the protocol's).
  int Hello(const std::string& token, const std::string& magic = "FSL1") {
    return Send(magic + token) ? HelloAnswer() : -1;
  }
  // Read the 8-byte answer to a hello sent with Send; its kind, or -1 when none came.
  int HelloAnswer() {
    char reply[8];
    if (::recv(fd_, reply, sizeof(reply), MSG_WAITALL) != sizeof(reply)) return -1;
    return static_cast<int>(Get32(reply));
  }
  struct Slab {
    uint32_t kind = 0;  // 0: granted
    uint64_t id = 0, size = 0;
    int fd = -1;
  };
  // Ask for one slab; nullopt when the connection broke.
  std::optional<Slab> Acquire() { return Request(1); }
  // Ask for the session's completion board (its size in `size`).
  std::optional<Slab> Board() { return Request(2); }
  // Ask for the session's submit ring (capacity in `id`, mapping size in `size`) and its
  // doorbell (an eventfd).
  std::optional<Slab> Ring() { return Request(3); }
  std::optional<Slab> Doorbell() { return Request(4); }
  // Send request `op`; the answer, or nullopt when the connection broke.
  std::optional<Slab> Request(char op) {
    if (!Send(RequestBytes(op))) return std::nullopt;
    return Answer();
  }
  // The 8 bytes of request `op`.
  static std::string RequestBytes(char op) { return std::string{op, 0, 0, 0, 0, 0, 0, 0}; }
  // Send `bytes` as they are (a hello, requests, or both at once); false when not all went.
  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Read one 24-byte answer and its fd; nullopt when the connection ended or broke first.
  std::optional<Slab> Answer() {
    char reply[24];
    Slab s;
    const ssize_t n =
        ReceiveWithDescriptor(fd_, reply, sizeof(reply), &s.fd, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    if (n != sizeof(reply)) {
      if (s.fd >= 0) ::close(s.fd);
      return std::nullopt;
    }
    s.kind = Get32(reply);
    s.id = Get64(reply + 8);
    s.size = Get64(reply + 16);
    return s;
  }

 private:
  int fd_ = -1;
};

// A session opened over a RawStream, and a slab connection that presented the session's token:
// where most tests of the slab socket start. bound() says whether all of it worked; when it is
// false, the rest is not meaningful (check it first: ASSERT_TRUE(s.bound())).
class RawSlabSession {
 public:
  explicit RawSlabSession(const std::string& target, bool successes_on_board = false,
                          std::chrono::seconds deadline = std::chrono::seconds(0))
      : raw(target, deadline), opened(raw.Open(successes_on_board)) {
    if (!opened) return;
    conn = std::make_unique<RawSlabConnection>(opened->slab_socket());
    bound_ = conn->Hello(opened->slab_token()) == 0;
  }
  bool bound() const { return bound_; }

  RawStream raw;
  std::optional<v1::Opened> opened;  // nullopt: the daemon answered the Open otherwise
  std::unique_ptr<RawSlabConnection> conn;

 private:
  bool bound_ = false;
};

// The memory behind a descriptor the slab socket granted (a slab, the board), mapped with
// `prot` and shared; the descriptor is closed once mapped, the mapping unmapped when this goes.
// ok() is false when the answer was a refusal, had no descriptor, or could not be mapped.
class MappedAnswer {
 public:
  MappedAnswer(const std::optional<RawSlabConnection::Slab>& answer, int prot) {
    if (!answer || answer->kind != 0 || answer->fd < 0) return;
    id_ = answer->id;
    size_ = answer->size;
    void* p = ::mmap(nullptr, size_, prot, MAP_SHARED, answer->fd, 0);
    ::close(answer->fd);
    if (p != MAP_FAILED) map_ = p;
  }
  ~MappedAnswer() {
    if (map_) ::munmap(map_, size_);
  }
  MappedAnswer(const MappedAnswer&) = delete;
  MappedAnswer& operator=(const MappedAnswer&) = delete;
  bool ok() const { return map_ != nullptr; }
  uint64_t id() const { return id_; }
  uint64_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(map_);
  }

 private:
  void* map_ = nullptr;
  uint64_t id_ = 0, size_ = 0;
};

// A raw client's side of the ring: maps it from the slab socket and writes records, as the
// layout says (written here from the protocol, not shared with libferry).
class RawRing {
 public:
  // Open a session on `raw` and take its ring and doorbell: whether both worked.
  bool OpenAndMap(RawStream& raw) {
    auto opened = raw.Open();
    return opened && Map(*opened);
  }
  // Take the ring and doorbell of the session `opened` describes.
  bool Map(const v1::Opened& opened) {
    if (!opened.submit_ring()) return false;
    conn_ = std::make_unique<RawSlabConnection>(opened.slab_socket());
    if (conn_->Hello(opened.slab_token()) != 0) return false;
    auto ring = conn_->Ring();
    auto bell = conn_->Doorbell();
    if (!ring || ring->kind != 0 || ring->fd < 0 || !bell || bell->kind != 0 || bell->fd < 0) {
      return false;
    }
    capacity_ = ring->id;
    size_ = ring->size;
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, ring->fd, 0);
    ::close(ring->fd);
    doorbell_ = bell->fd;
    if (p == MAP_FAILED) return false;
    map_ = static_cast<char*>(p);
    return size_ == 4096 + capacity_;
  }
  ~RawRing() {
    if (map_) ::munmap(map_, size_);
    if (doorbell_ >= 0) ::close(doorbell_);
  }

  // Write `m` as the next record, waiting (up to 60 s) until the daemon has taken enough to
  // make room, and ring.
  void Write(const v1::ClientMessage& m) { WriteBytes(m.SerializeAsString()); }
  void WriteBytes(const std::string& bytes) { SetHead(Place(bytes)); }
  // Write `messages` as the next records and make them visible at once (one store of head,
  // one doorbell), so that the poller finds them all together.
  void WriteTogether(const std::vector<v1::ClientMessage>& messages) {
    for (const auto& m : messages) head_ = Place(m.SerializeAsString());
    SetHead(head_);
  }
  // Store head and ring the doorbell (always: a raw client may).
  void SetHead(uint64_t head) {
    head_ = head;
    reinterpret_cast<std::atomic<uint64_t>*>(map_)->store(head_);
    const uint64_t one = 1;
    (void)!::write(doorbell_, &one, sizeof(one));  // an eventfd (a socket from older daemons)
  }
  void Put32(uint64_t at, uint32_t v) { std::memcpy(map_ + 4096 + at, &v, 4); }
  uint64_t capacity() const { return capacity_; }
  int doorbell() const { return doorbell_; }

 private:
  // Copy `bytes` in as the record after head_, waiting (up to 60 s) for room; the head that
  // makes it visible (not stored).
  uint64_t Place(const std::string& bytes) {
    const uint64_t need = 8 + ((bytes.size() + 7) & ~uint64_t{7});
    uint64_t at = head_ % capacity_;
    const uint64_t skip = at + need > capacity_ ? capacity_ - at : 0;
    for (int i = 0; i < 600000; ++i) {
      const uint64_t tail = reinterpret_cast<std::atomic<uint64_t>*>(map_ + 64)->load();
      if (head_ + skip + need - tail <= capacity_) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (at + need > capacity_) {
      Put32(at, 0xFFFFFFFFu);
      head_ += capacity_ - at;
      at = 0;
    }
    Put32(at, static_cast<uint32_t>(bytes.size()));
    Put32(at + 4, 0);
    std::memcpy(map_ + 4096 + at + 8, bytes.data(), bytes.size());
    return head_ + need;
  }

  std::unique_ptr<RawSlabConnection> conn_;
  char* map_ = nullptr;
  uint64_t capacity_ = 0, size_ = 0, head_ = 0;
  int doorbell_ = -1;
};

// What keeps `m`, a message read from a raw stream, from being an Error of kind `kind` whose
// message contains `what`: "" when nothing does.
inline std::string NotAnErrorSaying(const std::optional<v1::ServerMessage>& m, v1::ErrorKind kind,
                                    const std::string& what) {
  if (!m) return "no message";
  if (!m->has_error()) return "a message that is not an Error";
  if (m->error().kind() != kind) {
    return "an Error of kind " + v1::ErrorKind_Name(m->error().kind()) + ": " +
           m->error().message();
  }
  if (m->error().message().find(what) == std::string::npos) {
    return "an Error saying: " + m->error().message();
  }
  return "";
}

inline v1::Op Create(uint64_t h, v1::DType dtype, std::vector<int64_t> shape) {
  v1::Op op;
  auto* c = op.mutable_create_tensor();
  c->set_handle(h);
  c->set_dtype(dtype);
  for (auto d : shape) c->add_shape(d);
  return op;
}
inline v1::Op Fill(uint64_t h, double v) {
  v1::Op op;
  op.mutable_fill()->set_tensor(h);
  op.mutable_fill()->set_value(v);
  return op;
}
inline v1::Op Download(uint64_t h, uint64_t off, uint64_t len) {
  v1::Op op;
  op.mutable_download()->set_tensor(h);
  op.mutable_download()->set_offset(off);
  op.mutable_download()->set_length(len);
  return op;
}
inline v1::Op InlineUpload(uint64_t h, uint64_t offset, std::string data) {
  v1::Op op;
  op.mutable_upload()->set_tensor(h);
  op.mutable_upload()->set_offset(offset);
  op.mutable_upload()->set_data(std::move(data));
  return op;
}
inline v1::Op Axpy(double alpha, uint64_t x, uint64_t y) {
  v1::Op op;
  op.mutable_axpy()->set_alpha(alpha);
  op.mutable_axpy()->set_x(x);
  op.mutable_axpy()->set_y(y);
  return op;
}

// CUDA C++ of a kernel that spins for `cycles` clock ticks, then writes v into x[0..3]
// (an H200 ticks about 1.98 G a second).
constexpr const char* kSpinSource = R"(
extern "C" __global__ void spin(float* x, float v, unsigned long long cycles) {
  long long start = clock64();
  while ((unsigned long long)(clock64() - start) < cycles) {
  }
  for (int i = 0; i < 4; ++i) x[i] = v;
}
)";
// Load kSpinSource as module `module`.
inline v1::Op LoadSpin(uint64_t module) {
  v1::Op load;
  load.mutable_load_module()->set_handle(module);
  load.mutable_load_module()->set_format(v1::CUDA_SOURCE);
  load.mutable_load_module()->set_image(kSpinSource);
  return load;
}
// One launch of `spin` from `module` on tensor `x` (at least 4 f32).
inline v1::Op Spin(uint64_t module, uint64_t x, float v, uint64_t cycles) {
  v1::Op launch;
  auto* l = launch.mutable_launch();
  l->set_module(module);
  l->set_function("spin");
  l->add_grid(1);
  l->add_block(1);
  l->add_args()->set_tensor(x);
  l->add_args()->set_f32(v);
  l->add_args()->set_u64(cycles);
  return launch;
}

}  // namespace ferry::testing
