// Reaching the daemon (docs/security.md): every method of a TCP endpoint behind the token
// (gRPC's health and reflection included), no TCP endpoint that authenticates no client
// without --allow-insecure-remote (loopback included), and socket files others cannot reach.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ferryd_process.h"

namespace ferry {
namespace {

using testing::FerrydProcess;

// A unary call through a generic stub: gRPC's own services (health) have no generated stub
// here. Return the status, and the reply's bytes in `reply`.
grpc::Status GenericUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::string& request, const std::string& token,
                          std::string* reply) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1);
  auto call = stub.PrepareUnaryCall(&ctx, method, req, &cq);
  call->StartCall();
  grpc::ByteBuffer resp;
  grpc::Status status;
  call->Finish(&resp, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  std::vector<grpc::Slice> slices;
  reply->clear();
  if (status.ok() && resp.Dump(&slices).ok()) {
    for (const auto& s : slices) reply->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// One request on the server reflection stream, through a generic stub; the reply's bytes.
grpc::Status ReflectionListServices(const std::shared_ptr<grpc::Channel>& channel,
                                    const std::string& token, std::string* reply) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](int want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(want));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  step(1);
  // ServerReflectionRequest { list_services = "" } (field 7, length-delimited).
  const std::string request("\x3a\x00", 2);
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1);
  call->Write(req, reinterpret_cast<void*>(2));
  step(2);
  call->WritesDone(reinterpret_cast<void*>(3));
  step(3);
  grpc::ByteBuffer resp;
  call->Read(&resp, reinterpret_cast<void*>(4));
  reply->clear();
  if (step(4)) {
    std::vector<grpc::Slice> slices;
    if (resp.Dump(&slices).ok()) {
      for (const auto& s : slices)
        reply->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    // Drain the rest of the stream before Finish.
    for (int i = 0; i < 16; ++i) {
      call->Read(&resp, reinterpret_cast<void*>(5));
      if (!step(5)) break;
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(6));
  step(6);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST(EndpointAuthTest, HealthAndReflectionOnTcpNeedTheToken) {
  char tmpl[] = "/tmp/ferry-token-XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(tmpl) << "health-token\n";
  FerrydProcess d({"--token-file", tmpl}, /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  auto tcp = grpc::CreateChannel(d.tcp_target().substr(4), grpc::InsecureChannelCredentials());
  const std::string kHealthCheck = "/grpc.health.v1.Health/Check";
  std::string reply;

  grpc::Status s = GenericUnary(tcp, kHealthCheck, "", "", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  s = GenericUnary(tcp, kHealthCheck, "", "wrong-token", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  s = GenericUnary(tcp, kHealthCheck, "", "health-token", &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply, std::string("\x08\x01", 2)) << "HealthCheckResponse { status: SERVING }";

  s = ReflectionListServices(tcp, "", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_EQ(reply.find("ferry.v1"), std::string::npos) << "reflection answered without the token";
  s = ReflectionListServices(tcp, "health-token", &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(reply.find("ferry.v1.Admin"), std::string::npos);

  // The Admin service too (it checked the token already; now with the same code as the rest).
  auto stub = v1::Admin::NewStub(tcp);
  grpc::ClientContext ctx;
  v1::StatusReply status;
  EXPECT_EQ(stub->Status(&ctx, v1::StatusRequest(), &status).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // The Unix endpoint stays open to whoever reaches its socket.
  auto local = grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials());
  s = GenericUnary(local, kHealthCheck, "", "", &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  unlink(tmpl);
}

TEST(EndpointAuthTest, TcpWithoutTokenOrMutualTlsNeedsAllowInsecureRemoteEvenOnLoopback) {
  char tmpl[] = "/tmp/ferry-insecure-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  pid_t pid = testing::Spawn(
      testing::FerrydPath(),
      {"--backend", testing::TestBackend(), "--listen", "unix:" + dir + "/ferryd.sock", "--listen",
       "tcp:127.0.0.1:0", "--ready-file", dir + "/ready"},
      dir + "/ferryd.log");
  ASSERT_GT(pid, 0);
  int status = testing::WaitExit(pid, std::chrono::seconds(20));
  if (status == -1) kill(pid, SIGKILL), testing::WaitExit(pid, std::chrono::seconds(5));
  std::ifstream in(dir + "/ferryd.log");
  std::string log(std::istreambuf_iterator<char>(in), {});
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) != 0)
      << "ferryd served loopback TCP that authenticates no client:\n"
      << log;
  EXPECT_NE(log.find("--allow-insecure-remote"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(dir + "/ready"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  // Said explicitly, it starts (FerrydProcess passes the flag for tcp without a token).
  FerrydProcess allowed({}, /*tcp=*/true);
  EXPECT_TRUE(allowed.ok()) << allowed.log();
}

TEST(EndpointAuthTest, SocketFilesAreNeverWorldAccessible) {
  // Started with umask 0: the sockets' modes come from ferryd alone.
  mode_t old = umask(0);
  FerrydProcess d;
  umask(old);
  ASSERT_TRUE(d.ok()) << d.log();
  const std::string sock = d.unix_target().substr(5);
  for (const std::string& path : {sock, sock + ".slabs"}) {
    struct stat st {};
    ASSERT_EQ(lstat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISSOCK(st.st_mode)) << path;
    EXPECT_EQ(st.st_mode & 0007, 0u) << path << " mode " << std::oct << (st.st_mode & 0777);
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path << " mode " << std::oct << (st.st_mode & 0777);
  }
}

}  // namespace
}  // namespace ferry
