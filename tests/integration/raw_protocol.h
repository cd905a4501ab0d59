// For tests that speak the raw ferry.v1 protocol: a session stream without libferry in
// between (so a test can send what libferry never would), and builders of ops.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/v1/session.grpc.pb.h"
#include "ferry/v1/session.pb.h"

namespace ferry::testing {

/// One Session stream to a daemon, driven message by message.
class RawStream {
 public:
  explicit RawStream(const std::string& target) {
    channel_ = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
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
  /// Send an Open (and read nothing).
  bool SendOpen(uint32_t version = v1::PROTOCOL_VERSION_CURRENT) {
    v1::ClientMessage m;
    m.mutable_open()->set_protocol_version(version);
    m.mutable_open()->set_client_name("raw");
    return Send(m);
  }
  /// Open the session: the Opened, or nullopt when the daemon answered anything else.
  std::optional<v1::Opened> Open() {
    if (!SendOpen()) return std::nullopt;
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

}  // namespace ferry::testing
