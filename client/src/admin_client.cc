#include "admin_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <future>
#include <vector>

#include "channel.h"
#include "ferry/v1/admin.grpc.pb.h"

namespace ferry::internal {
namespace {

RpcStatus FromGrpc(const grpc::Status& s) {
  return RpcStatus{static_cast<int>(s.error_code()), s.error_message()};
}

}  // namespace

struct AdminClient::Impl {
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Admin::Stub> stub;

  template <typename Reply, typename Method, typename Request>
  RpcStatus Call(Method method, const Request& request, Reply* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    return FromGrpc(((*stub).*method)(&ctx, request, reply));
  }
};

Result<std::unique_ptr<AdminClient>> AdminClient::Create(const std::string& target,
                                                         const ClientOptions& options,
                                                         std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->timeout = timeout;
  FERRY_ASSIGN_OR_RETURN(impl->channel, MakeChannel(target, options));
  impl->stub = v1::Admin::NewStub(impl->channel);
  return std::unique_ptr<AdminClient>(new AdminClient(std::move(impl)));
}

AdminClient::AdminClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminClient::~AdminClient() = default;

RpcStatus AdminClient::GetStatus(v1::StatusReply* reply) {
  return impl_->Call(&v1::Admin::Stub::Status, v1::StatusRequest(), reply);
}

RpcStatus AdminClient::ListSessions(v1::ListSessionsReply* reply) {
  return impl_->Call(&v1::Admin::Stub::ListSessions, v1::ListSessionsRequest(), reply);
}

RpcStatus AdminClient::Drain(v1::DrainReply* reply) {
  return impl_->Call(&v1::Admin::Stub::Drain, v1::DrainRequest(), reply);
}

RpcStatus AdminClient::HealthCheck(const std::string& service, int* serving_status) {
  // HealthCheckRequest { string service = 1; }
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));  // names are < 128 bytes
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + impl_->timeout);
  grpc::GenericStub stub(impl_->channel);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer,
                 &response_buffer, [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status s = done.get_future().get();
  if (!s.ok()) return FromGrpc(s);
  // HealthCheckResponse { ServingStatus status = 1; } (a varint; absent means UNKNOWN).
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response_buffer.Dump(&slices).ok()) {
    for (const auto& sl : slices)
      bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  *serving_status = 0;
  if (bytes.size() >= 2 && bytes[0] == 0x08) *serving_status = static_cast<unsigned char>(bytes[1]);
  return FromGrpc(s);
}

}  // namespace ferry::internal
