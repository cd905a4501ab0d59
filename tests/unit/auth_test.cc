// The bearer-token check (server/rpc/auth.h): TokenChecker::Check's contract (OK for calls
// with a token, UNAUTHENTICATED otherwise), checked on real gRPC calls over TCP loopback to
// an in-process server whose handler runs Check; CheckToken's (calls on a Unix endpoint
// always pass); and the token file's rules.
#include "rpc/auth.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <string>

#include "temp_files.h"

namespace ferry::rpc {
namespace {

using TokenFile = ::ferry::testing::TempFile;

std::unique_ptr<TokenChecker> LoadToken(const std::string& contents) {
  TokenFile file(contents);
  auto checker = TokenChecker::Load(file.path());
  EXPECT_TRUE(checker.ok()) << checker.status().ToString();
  return checker.ok() ? std::move(*checker) : nullptr;
}

// Every call, whatever its method: run TokenChecker::Check on the call's context, remember the
// result and finish the call OK (the test reads what Check said, not what the client got).
class CheckingService final : public grpc::CallbackGenericService {
 public:
  explicit CheckingService(const TokenChecker* checker) : checker_(checker) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = checker_->Check(*ctx);
    }
    class Done final : public grpc::ServerGenericBidiReactor {
     public:
      Done() { StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK); }
      void OnDone() override { delete this; }

     private:
      grpc::Slice empty_;
      grpc::ByteBuffer reply_{&empty_, 1};  // an empty message: the unary call's one reply
    };
    return new Done;
  }

  std::optional<Status> last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  const TokenChecker* checker_;
  std::mutex mu_;
  std::optional<Status> last_;
};

class TokenCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checker_ = LoadToken("  s3cret-token\n");
    ASSERT_NE(checker_, nullptr);
    service_ = std::make_unique<CheckingService>(checker_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ && port_ > 0);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  // Make one call over TCP loopback (a remote peer: "ipv4:127.0.0.1:..."), with the
  // "authorization" metadata when given; return what Check said about it.
  Status CheckedCall(const std::optional<std::string>& authorization) {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                       grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (authorization) ctx.AddMetadata("authorization", *authorization);
    grpc::Slice empty;
    grpc::ByteBuffer req(&empty, 1), resp;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/test.Any/Call", grpc::StubOptions(), &req, &resp,
                   [&](grpc::Status s) { done.set_value(s); });
    grpc::Status s = done.get_future().get();
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::optional<Status> checked = service_->last();
    EXPECT_TRUE(checked.has_value()) << "the handler did not run";
    return checked.value_or(Status(ErrorKind::kInternal, "not checked"));
  }

  std::unique_ptr<TokenChecker> checker_;
  std::unique_ptr<CheckingService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(TokenCheckTest, RemotePeerWithTheTokenPasses) {
  Status s = CheckedCall("Bearer s3cret-token");  // the file's whitespace is not the token's
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// The contract says UNAUTHENTICATED (gRPC's code for a caller without valid credentials);
// it said INVALID_ARGUMENT once, and its callers re-typed it.
TEST_F(TokenCheckTest, RemotePeerWithoutTheTokenIsUnauthenticated) {
  for (const std::optional<std::string>& authorization :
       {std::optional<std::string>(), std::optional<std::string>("Bearer wrong-token"),
        std::optional<std::string>("Bearer s3cret-token2"),
        std::optional<std::string>("Bearer s3cret-toke"),
        std::optional<std::string>("s3cret-token"),
        std::optional<std::string>("Basic s3cret-token"), std::optional<std::string>("")}) {
    Status s = CheckedCall(authorization);
    EXPECT_EQ(s.code(), Code::kUnauthenticated)
        << (authorization ? "'" + *authorization + "'" : "no metadata") << ": " << s.ToString();
    EXPECT_EQ(s.kind(), ErrorKind::kPermissionDenied) << s.ToString();
  }
}

TEST(TokenCheckerTest, CheckAuthorizationSaysUnauthenticated) {
  auto checker = LoadToken("tok");
  ASSERT_NE(checker, nullptr);
  const std::string_view good = "Bearer tok", bad = "Bearer tik";
  EXPECT_TRUE(checker->CheckAuthorization(&good).ok());
  EXPECT_EQ(checker->CheckAuthorization(&bad).code(), Code::kUnauthenticated);
  EXPECT_EQ(checker->CheckAuthorization(nullptr).code(), Code::kUnauthenticated);
}

TEST(TokenCheckerTest, UnixEndpointsCallsAndNoCheckerPass) {
  auto checker = LoadToken("tok");
  ASSERT_NE(checker, nullptr);
  grpc::ServerContext local;  // no call, no metadata
  EXPECT_TRUE(CheckToken(checker.get(), local, /*tcp=*/false).ok()) << "a Unix endpoint's call";
  EXPECT_EQ(CheckToken(checker.get(), local, /*tcp=*/true).code(), Code::kUnauthenticated)
      << "a TCP endpoint's call without the token, whatever its peer string";
  EXPECT_TRUE(CheckToken(nullptr, local, /*tcp=*/true).ok()) << "no token configured";
}

TEST(TokenCheckerTest, TokenFileMustExistAndHoldAToken) {
  EXPECT_EQ(TokenChecker::Load("/nonexistent/ferry-token").status().kind(),
            ErrorKind::kInvalidArgument);
  TokenFile blank(" \n\t\n");
  EXPECT_EQ(TokenChecker::Load(blank.path()).status().kind(), ErrorKind::kInvalidArgument);
}

// A file of tenants: each named token is its tenant's; an unnamed one is shared ("").
TEST(TokenCheckerTest, NamedTokensSayWhoseTheyAre) {
  auto checker = LoadToken("# tenants\nalice  tok-a\n\n  bob tok-b  \nshared-tok\n");
  ASSERT_NE(checker, nullptr);
  auto tenant = [&](std::string_view auth) {
    auto t = checker->TenantOf(&auth);
    return t.ok() ? *t : "refused: " + t.status().message();
  };
  EXPECT_EQ(tenant("Bearer tok-a"), "alice");
  EXPECT_EQ(tenant("Bearer tok-b"), "bob");
  EXPECT_EQ(tenant("Bearer shared-tok"), "");
  EXPECT_EQ(tenant("Bearer alice"), "refused: the bearer token is not valid")
      << "a name is no token";
  EXPECT_EQ(tenant("Bearer tok-a "), "refused: the bearer token is not valid");
  EXPECT_EQ(tenant("tok-a"), "refused: the bearer token is not valid");
  grpc::ServerContext local;
  EXPECT_EQ(checker->TenantOf(local), "") << "a call without a token is no tenant";
}

TEST(TokenCheckerTest, BadTokenFilesAreRefusedNamingTheLine) {
  for (const char* text :
       {"# only a comment\n", "a b c\n", "al/ice tok\n", "alice tok\nalice tok2\n",
        "alice tok\nbob tok\n", "tok\ntok\n", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa tok\n"}) {
    TokenFile file(text);
    auto loaded = TokenChecker::Load(file.path());
    EXPECT_EQ(loaded.status().kind(), ErrorKind::kInvalidArgument) << text;
  }
  TokenFile twice("alice tok\nbob tok\n");
  EXPECT_NE(
      TokenChecker::Load(twice.path()).status().message().find("line 2: a token is given twice"),
      std::string::npos);
}

}  // namespace
}  // namespace ferry::rpc
