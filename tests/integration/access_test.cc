// Who may do what (docs/security.md): raw kernels only for the peers config lists, Drain and
// the full session list only for admins. Tests about uids run real ferryd processes and the
// test client as two real users (root only: they create the users and switch to them;
// skipped otherwise).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "other_user.h"

namespace ferry {
namespace {

using testing::EnsureUser;
using testing::FerrydProcess;
using testing::RunAs;

constexpr char kUserA[] = "ferrytest_a";
constexpr char kUserB[] = "ferrytest_b";
constexpr char kUserC[] = "ferrytest_c";

// Why two-user tests cannot run here, or "" when they can.
std::string TwoUsersUnavailable() {
  if (geteuid() != 0) return "needs root to create and switch to test users";
  if (!EnsureUser(kUserA) || !EnsureUser(kUserB) || !EnsureUser(kUserC)) {
    return "useradd could not create the test users";
  }
  if (std::string why = testing::CannotRunAs(kUserB); !why.empty()) {
    return "the test client cannot be run as another user: " + why;
  }
  return "";
}

// The exit code of a run of the test client as `user`; -1 when it did not exit normally.
int ExitCode(const std::string& user, const std::vector<std::string>& args, std::string* output) {
  char tmpl[] = "/tmp/ferry-access-out-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  int status = RunAs(user, args, tmpl);
  std::ifstream in(tmpl);
  output->assign(std::istreambuf_iterator<char>(in), {});
  unlink(tmpl);
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// True when `d` ends by itself within 30 s, as a drain makes it (it turns zombie before any
// signal of ours).
bool EndsByItself(const FerrydProcess& d) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream stat("/proc/" + std::to_string(d.pid()) + "/stat");
    std::string pid, comm, state;
    stat >> pid >> comm >> state;
    if (!stat || state == "Z") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// One submit that creates a tensor and loads a module, in this process (the daemon's uid).
Status RawKernelSubmit(const std::string& target, bool* tensor_exists_after) {
  auto client = Client::connect(target);
  if (!client.ok()) return client.status();
  auto session = client->open_session();
  if (!session.ok()) return session.status();
  Tensor t = session->create_tensor<float>({16});
  session->load_module(ModuleFormat::kPtx, ".version 7.0\n.target sm_50\n");
  Status s = session->synchronize();
  std::vector<float> x(16, 1.0f);
  *tensor_exists_after = session->upload(t, x).ok();
  // Built-in ops go on either way.
  Tensor u = session->create_tensor<float>({16});
  EXPECT_TRUE(session->upload(u, x).ok());
  auto back = session->download<float>(u);
  EXPECT_TRUE(back.ok() && *back == x);
  return s;
}

TEST(AccessTest, RawKernelsAreOffByDefaultEvenForTheDaemonsOwnUid) {
  FerrydProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  bool exists = true;
  Status s = RawKernelSubmit(d.unix_target(), &exists);
  EXPECT_EQ(s.kind(), ErrorKind::kPermissionDenied) << s.ToString();
  EXPECT_EQ(s.code(), Code::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("raw-kernels"), std::string::npos) << s.ToString();
  EXPECT_FALSE(exists) << "the refused submit's CreateTensor ran: the refusal was not whole";
}

TEST(AccessTest, RawKernelsReachTheBackendForAListedUid) {
  FerrydProcess d({"--raw-kernels", "uid:" + std::to_string(getuid())});
  ASSERT_TRUE(d.ok()) << d.log();
  bool exists = false;
  Status s = RawKernelSubmit(d.unix_target(), &exists);
  EXPECT_NE(s.kind(), ErrorKind::kPermissionDenied) << s.ToString();
  if (testing::TestBackend() == "host") {
    // The host backend has no PTX: the module got as far as the backend.
    EXPECT_EQ(s.kind(), ErrorKind::kUnsupported) << s.ToString();
  }
}

TEST(AccessTest, RawKernelsAreRefusedForAnUnlistedUidAndAllowedByUidOrGroup) {
  if (std::string why = TwoUsersUnavailable(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(testing::EnsureUserInGroup(kUserC, "ferrytest_gpu"));
  FerrydProcess d({"--raw-kernels", std::string("uid:") + kUserA + ",gid:ferrytest_gpu"});
  ASSERT_TRUE(d.ok()) << d.log();
  ASSERT_TRUE(testing::OpenSocketsToEveryone(d));
  std::string out;
  // B is not listed: refused whole, and its session goes on (test client exit codes).
  EXPECT_EQ(ExitCode(kUserB, {d.unix_target(), "raw-kernel"}, &out),
            static_cast<int>(ErrorKind::kPermissionDenied))
      << out;
  EXPECT_NE(out.find("uid " + std::to_string(testing::UidOf(kUserB))), std::string::npos) << out;
  // A by uid, C by a supplementary group: the submit reaches the backend.
  for (const char* user : {kUserA, kUserC}) {
    int code = ExitCode(user, {d.unix_target(), "raw-kernel"}, &out);
    EXPECT_NE(code, static_cast<int>(ErrorKind::kPermissionDenied)) << user << ": " << out;
    EXPECT_NE(code, 100) << user << ": the session broke: " << out;
    if (testing::TestBackend() == "host") {
      EXPECT_EQ(code, static_cast<int>(ErrorKind::kUnsupported)) << user << ": " << out;
    }
  }
}

TEST(AccessTest, DrainIsRefusedForANonAdminUidAndTheDaemonKeepsServing) {
  if (std::string why = TwoUsersUnavailable(); !why.empty()) GTEST_SKIP() << why;
  FerrydProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  ASSERT_TRUE(testing::OpenSocketsToEveryone(d));
  std::string out;
  EXPECT_EQ(ExitCode(kUserB, {d.unix_target(), "drain"}, &out), 7) << out;
  v1::StatusReply status = d.AdminStatus();
  EXPECT_FALSE(status.draining()) << status.version();
  // Still serving: a session opens and moves bytes.
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok());
  Status s = client->with_session([](Session& session) -> Status {
    Tensor t = session.create_tensor<float>({8});
    std::vector<float> x(8, 2.0f);
    FERRY_RETURN_IF_ERROR(session.upload(t, x));
    return session.download<float>(t).status();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(AccessTest, DrainIsGrantedToTheAdminGroup) {
  if (std::string why = TwoUsersUnavailable(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(testing::EnsureUserInGroup(kUserC, "ferrytest_adm"));
  FerrydProcess d({"--admin-group", "ferrytest_adm"});
  ASSERT_TRUE(d.ok()) << d.log();
  ASSERT_TRUE(testing::OpenSocketsToEveryone(d));
  std::string out;
  EXPECT_EQ(ExitCode(kUserB, {d.unix_target(), "drain"}, &out), 7) << out;
  EXPECT_EQ(ExitCode(kUserC, {d.unix_target(), "drain"}, &out), 0) << out;
  EXPECT_TRUE(EndsByItself(d)) << "the admin group's drain did not end the daemon";
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

TEST(AccessTest, DrainIsGrantedToTheUidsAdminsLists) {
  if (std::string why = TwoUsersUnavailable(); !why.empty()) GTEST_SKIP() << why;
  FerrydProcess d({"--admins", std::string("uid:") + kUserC});
  ASSERT_TRUE(d.ok()) << d.log();
  ASSERT_TRUE(testing::OpenSocketsToEveryone(d));
  std::string out;
  EXPECT_EQ(ExitCode(kUserB, {d.unix_target(), "drain"}, &out), 7) << out;
  EXPECT_FALSE(d.AdminStatus().draining());
  EXPECT_EQ(ExitCode(kUserC, {d.unix_target(), "drain"}, &out), 0) << out;
  EXPECT_TRUE(EndsByItself(d)) << "the listed uid's drain did not end the daemon";
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

TEST(AccessTest, ListSessionsShowsANonAdminUidOnlyItsOwnSessions) {
  if (std::string why = TwoUsersUnavailable(); !why.empty()) GTEST_SKIP() << why;
  FerrydProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  ASSERT_TRUE(testing::OpenSocketsToEveryone(d));
  // Root's session stays open while B lists.
  auto client = Client::connect(d.unix_target());
  ASSERT_TRUE(client.ok());
  auto root_session = client->open_session();
  ASSERT_TRUE(root_session.ok()) << root_session.status().ToString();
  std::string out;
  // 0: B saw its own session and usage identity and none of another uid (3: it saw root's
  // session, 5: root's identity).
  EXPECT_EQ(ExitCode(kUserB, {d.unix_target(), "list-sessions"}, &out), 0) << out;
  // Root, an admin, sees its own.
  auto channel = grpc::CreateChannel(d.unix_target(), grpc::InsecureChannelCredentials());
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  v1::ListSessionsReply reply;
  ASSERT_TRUE(stub->ListSessions(&ctx, v1::ListSessionsRequest(), &reply).ok());
  bool root_seen = false;
  for (const auto& s : reply.sessions()) root_seen |= s.has_uid() && s.uid() == 0;
  EXPECT_TRUE(root_seen) << reply.DebugString();
}

}  // namespace
}  // namespace ferry
