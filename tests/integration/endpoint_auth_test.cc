// Reaching the daemon (docs/security.md): every method of a TCP endpoint behind the token
// (gRPC's health and reflection included), no TCP endpoint that authenticates no client
// without --allow-insecure-remote (loopback included), and socket files others cannot reach.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "library_checks.h"

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
  const testing::TempFile token_file("health-token\n");
  ASSERT_FALSE(token_file.path().empty());
  FerrydProcess d({"--token-file", token_file.path()}, /*tcp=*/true);
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
}

// A TCP connection to `host_port` ("127.0.0.1:PORT"), or -1.
int ConnectTcp(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  if (::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) != 1) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the daemon closed `fd` (EOF or reset, after whatever it sent) within `timeout`.
bool ClosedWithin(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
}

// gRPC accepts TCP connections itself and cannot count them, so each is closed once it has
// carried no call for tcp-idle-timeout, or not finished its handshake by then: a peer that
// never authenticates holds no descriptor for long. A client with the token reconnects by
// itself when it next calls.
TEST(EndpointAuthTest, IdleAndSilentTcpConnectionsAreClosed) {
  const testing::TempFile token_file("idle-token\n");
  ASSERT_FALSE(token_file.path().empty());
  FerrydProcess d({"--token-file", token_file.path(), "--tcp-idle-timeout", "1000"}, /*tcp=*/true);
  ASSERT_TRUE(d.ok()) << d.log();
  const std::string host_port = d.tcp_target().substr(4);
  // One that sends nothing (no HTTP/2 preface), one that sends the preface and its SETTINGS
  // and no call, and one whose only call is refused for want of the token.
  const int silent = ConnectTcp(host_port);
  const int settled = ConnectTcp(host_port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(settled, 0);
  const std::string preface = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
                              std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
  ASSERT_EQ(::send(settled, preface.data(), preface.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(preface.size()));
  auto refused = grpc::CreateChannel(host_port, grpc::InsecureChannelCredentials());
  std::string reply;
  EXPECT_EQ(GenericUnary(refused, "/grpc.health.v1.Health/Check", "", "", &reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ClosedWithin(silent, std::chrono::seconds(10))) << "no handshake";
  EXPECT_TRUE(ClosedWithin(settled, std::chrono::seconds(10))) << "no call";
  // The refused client's connection went the same way: its channel is no longer connected.
  EXPECT_TRUE(
      testing::Eventually([&] { return refused->GetState(false) != GRPC_CHANNEL_READY; }, 10));
  ::close(silent);
  ::close(settled);
  // A client with the token: its idle connection is closed between sessions, and its next
  // session reconnects.
  ClientOptions options;
  options.bearer_token = "idle-token";
  auto client = Client::connect(d.tcp_target(), options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  for (int i = 0; i < 2; ++i) {
    auto session = client->open_session();
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    ASSERT_NO_FATAL_FAILURE(testing::ExpectRoundTrip(*session, 4, 2.5f));
    EXPECT_TRUE(session->close().ok());
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // idle: closed
  }
  EXPECT_EQ(d.Stop(), 0) << d.log();
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

// A daemon that listens on TCP alone still has its pinned staging: remote sessions' inline
// transfers go through it, rather than into ordinary memory, whose copies hold an executor
// thread until the stream's earlier work is done.
TEST(EndpointAuthTest, ADaemonOnTcpAloneStagesInlineTransfers) {
  char tmpl[] = "/tmp/ferry-tcp-only-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  pid_t pid = testing::Spawn(testing::FerrydPath(),
                             {"--backend", testing::TestBackend(), "--listen", "tcp:127.0.0.1:0",
                              "--allow-insecure-remote", "--ready-file", dir + "/ready"},
                             dir + "/ferryd.log");
  ASSERT_GT(pid, 0);
  std::string target;
  for (int i = 0; i < 2000 && target.empty(); ++i) {
    std::ifstream in(dir + "/ready");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("tcp:", 0) == 0) target = line;
    }
    if (target.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(target.empty()) << "no tcp: endpoint in the ready file";
  // A remote session's inline upload and download, byte-exact.
  auto client = Client::connect(target);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Status s = client->with_session([](Session& session) -> Status {
    Tensor t = session.create_tensor<float>({1 << 18});
    std::vector<float> x(1 << 18);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    FERRY_RETURN_IF_ERROR(session.upload(t, x));
    FERRY_ASSIGN_OR_RETURN(std::vector<float> back, session.download<float>(t));
    if (back != x) return Status(ErrorKind::kInternal, "the download differs from the upload");
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  // They went through staging (taken when first needed, kept).
  auto stub = v1::Admin::NewStub(
      grpc::CreateChannel(target.substr(4), grpc::InsecureChannelCredentials()));  // no "tcp:"
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatusReply status;
  ASSERT_TRUE(stub->Status(&ctx, v1::StatusRequest(), &status).ok());
  EXPECT_GT(status.staging_slabs(), 0u) << status.DebugString();
  EXPECT_GE(status.staged_bytes_total(), 2u << 20) << status.DebugString();
  kill(pid, SIGTERM);
  EXPECT_NE(testing::WaitExit(pid, std::chrono::seconds(20)), -1);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
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
