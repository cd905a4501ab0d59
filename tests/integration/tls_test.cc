// Remote access: TLS (server-only and mutual), the bearer token, and raw kernels refused
// for TCP sessions. A test CA and certificates are made with the openssl CLI at test time.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "ferry/client.h"
#include "ferryd_process.h"

namespace ferry {
namespace {

class TestPki {
 public:
  TestPki() {
    std::ofstream(path("server.ext"))
        << "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n";
    std::ofstream(path("client.ext")) << "extendedKeyUsage=clientAuth\n";
    ok_ = Run(Ca("ca") + " && " + Ca("other-ca") + " && " + Leaf("server", "ca") + " && " +
              Leaf("client", "ca") + " && " + Leaf("stranger", "other-ca", "client"));
    std::ofstream(path("token")) << "s3cret-token\n";
  }
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return dir_.path(name); }

 private:
  static bool Run(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }
  std::string Key(const std::string& name) const {
    return "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out " +
           path(name + ".key") + " 2>/dev/null";
  }
  std::string Ca(const std::string& name) const {
    return Key(name) + " && openssl req -x509 -new -key " + path(name + ".key") + " -out " +
           path(name + ".crt") + " -days 2 -subj /CN=" + name + " 2>/dev/null";
  }
  std::string Leaf(const std::string& name, const std::string& ca,
                   const std::string& ext = "") const {
    std::string e = ext.empty() ? name : ext;
    return Key(name) + " && openssl req -new -key " + path(name + ".key") + " -out " +
           path(name + ".csr") + " -subj /CN=" + name + " 2>/dev/null && openssl x509 -req -in " +
           path(name + ".csr") + " -CA " + path(ca + ".crt") + " -CAkey " + path(ca + ".key") +
           " -CAcreateserial -days 2 -extfile " + path(e + ".ext") + " -out " +
           path(name + ".crt") + " 2>/dev/null";
  }
  testing::TempDir dir_{"ferry-pki"};
  bool ok_ = false;
};

ClientOptions Quick() {
  ClientOptions o;
  o.connect_timeout = std::chrono::milliseconds(1500);
  return o;
}

// Open a session and move some bytes: the whole path works.
Status RoundTrip(const std::string& target, const ClientOptions& options) {
  auto client = Client::connect(target, options);
  if (!client.ok()) return client.status();
  return client->with_session([](Session& s) -> Status {
    std::vector<float> x(256, 2.0f);
    Tensor a = s.create_tensor<float>({256});
    FERRY_RETURN_IF_ERROR(s.upload(a, x));
    auto back = s.download<float>(a);
    if (!back.ok()) return back.status();
    return *back == x ? Status::Ok() : Status(ErrorKind::kInternal, "wrong bytes");
  });
}

TEST(TlsTest, TlsConnectsWithTheRightCaOnly) {
  TestPki pki;
  ASSERT_TRUE(pki.ok());
  testing::FerrydProcess daemon(
      {"--tls-cert", pki.path("server.crt"), "--tls-key", pki.path("server.key")}, /*tcp=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  ClientOptions o = Quick();
  o.tls_ca_cert = pki.path("ca.crt");
  Status s = RoundTrip(daemon.tcp_target(), o);
  EXPECT_TRUE(s.ok()) << s.ToString();

  // PEM text works as well as a path.
  std::ifstream in(pki.path("ca.crt"));
  o.tls_ca_cert.assign(std::istreambuf_iterator<char>(in), {});
  EXPECT_TRUE(RoundTrip(daemon.tcp_target(), o).ok());

  ClientOptions wrong = Quick();
  wrong.tls_ca_cert = pki.path("other-ca.crt");
  EXPECT_FALSE(RoundTrip(daemon.tcp_target(), wrong).ok());
  // Plaintext to a TLS endpoint fails too; the unix endpoint stays plain.
  EXPECT_FALSE(RoundTrip(daemon.tcp_target(), Quick()).ok());
  EXPECT_TRUE(RoundTrip(daemon.unix_target(), Quick()).ok());
}

TEST(TlsTest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  TestPki pki;
  ASSERT_TRUE(pki.ok());
  testing::FerrydProcess daemon({"--tls-cert", pki.path("server.crt"), "--tls-key",
                                 pki.path("server.key"), "--tls-client-ca", pki.path("ca.crt")},
                                /*tcp=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  ClientOptions o = Quick();
  o.tls_ca_cert = pki.path("ca.crt");
  EXPECT_FALSE(RoundTrip(daemon.tcp_target(), o).ok()) << "no client certificate";
  o.tls_client_cert = pki.path("stranger.crt");
  o.tls_client_key = pki.path("stranger.key");
  EXPECT_FALSE(RoundTrip(daemon.tcp_target(), o).ok()) << "a certificate of another CA";
  o.tls_client_cert = pki.path("client.crt");
  o.tls_client_key = pki.path("client.key");
  Status s = RoundTrip(daemon.tcp_target(), o);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(TlsTest, BearerTokenIsRequiredOnTcpAndChecked) {
  TestPki pki;
  testing::FerrydProcess daemon({"--token-file", pki.path("token")}, /*tcp=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  EXPECT_FALSE(RoundTrip(daemon.tcp_target(), Quick()).ok());
  ClientOptions o = Quick();
  o.bearer_token = "s3cret-tokem";
  EXPECT_FALSE(RoundTrip(daemon.tcp_target(), o).ok());
  o.bearer_token = "s3cret-token";
  Status s = RoundTrip(daemon.tcp_target(), o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(RoundTrip(daemon.unix_target(), Quick()).ok()) << "unix endpoints stay plain";

  // ferryctl: the Admin service checks the token too.
  std::string ctl = testing::ProgramPath("FERRY_TEST_FERRYCTL", FERRYCTL_PATH) +
                    " status --target " + daemon.tcp_target();
  EXPECT_NE(std::system((ctl + " > /dev/null 2>&1").c_str()), 0);
  EXPECT_EQ(std::system((ctl + " --token-file " + pki.path("token") + " > /dev/null").c_str()), 0);
  // ferryctl health's grpc.health.v1 check carries the token too (ferryctl's calls share
  // libferry's channel, whose interceptor adds it to every call): healthy, exit 0.
  std::string health = testing::ProgramPath("FERRY_TEST_FERRYCTL", FERRYCTL_PATH) +
                       " health --target " + daemon.tcp_target() + " --token-file " +
                       pki.path("token");
  EXPECT_EQ(std::system((health + " > /dev/null").c_str()), 0);
}

TEST(TlsTest, RawKernelsAreRefusedForRemoteSessions) {
  TestPki pki;
  testing::FerrydProcess daemon({"--token-file", pki.path("token")}, /*tcp=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  ClientOptions o = Quick();
  o.bearer_token = "s3cret-token";
  auto client = Client::connect(daemon.tcp_target(), o);
  ASSERT_TRUE(client.ok());
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<float> x(64, 1.0f);
  Tensor a = session->create_tensor<float>({64});
  ASSERT_TRUE(session->upload(a, x).ok());  // a submit in flight before the refused one
  Module m = session->load_module(ModuleFormat::kPtx, ".version 7.0\n");
  Status s = session->synchronize();
  EXPECT_EQ(s.kind(), ErrorKind::kPermissionDenied) << s.ToString();
  EXPECT_EQ(s.code(), Code::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("remote"), std::string::npos) << s.ToString();
  // The session goes on.
  auto back = session->download<float>(a);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, x);
  // The refusal is the session's like any other: one failed submit in its counters.
  auto stats = session->close();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->failed_submits, 1u);
}

TEST(TlsTest, RefusesNonLoopbackTcpWithoutTlsOrToken) {
  testing::FerrydProcess daemon({"--listen", "tcp:0.0.0.0:0"});
  EXPECT_FALSE(daemon.ok());
  // For that reason, and no other.
  EXPECT_NE(daemon.log().find("refusing tcp:0.0.0.0:0: a TCP endpoint must authenticate its "
                              "clients"),
            std::string::npos)
      << daemon.log();
}

}  // namespace
}  // namespace ferry
