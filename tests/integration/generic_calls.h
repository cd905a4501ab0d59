// gRPC calls made without the called service's generated code (grpc::GenericStub, bytes in and
// out), for tests of the operator-facing services (grpc.health.v1, server reflection) that
// must not link a copy of those services' descriptors. Each call has a 10 s deadline. Safe to
// call from any thread; each call makes its own completion queue.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ferry::testing {

/// The bytes of `buffer`, joined.
inline std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (buffer.Dump(&slices).ok()) {
    for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

/// Call the unary `method` ("/package.Service/Method") with the encoded `request`; the call's
/// status, and the encoded response in `response` when it is OK.
inline grpc::Status UnaryBytesCall(std::shared_ptr<grpc::Channel> channel,
                                   const std::string& method, const std::string& request,
                                   std::string* response) {
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::GenericStub stub(std::move(channel));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status s = done.get_future().get();
  if (s.ok()) *response = Flatten(resp);
  return s;
}

/// One grpc.reflection.v1alpha ServerReflectionInfo stream: send the encoded
/// ServerReflectionRequest `request`, read one answer, half-close and finish. The answer's
/// bytes, or nullopt with what went wrong in `error` ("start failed", "write failed" or
/// "read failed: " and the call's error).
inline std::optional<std::string> ReflectionExchange(std::shared_ptr<grpc::Channel> channel,
                                                     const std::string& request,
                                                     std::string* error) {
  grpc::GenericStub stub(std::move(channel));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto step = [&](intptr_t want) {
    return cq.Next(&tag, &ok) && ok && reinterpret_cast<intptr_t>(tag) == want;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool started = step(1), written = false, read = false;
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  if (started) {
    call->Write(req, reinterpret_cast<void*>(2));
    written = step(2);
  }
  if (written) {
    call->Read(&resp, reinterpret_cast<void*>(3));
    read = step(3);
    call->WritesDone(reinterpret_cast<void*>(4));
    step(4);
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!started) *error = "start failed";
  if (started && !written) *error = "write failed";
  if (written && !read) *error = "read failed: " + status.error_message();
  if (!read) return std::nullopt;
  return Flatten(resp);
}

}  // namespace ferry::testing
