#include "rpc/auth.h"

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/server_interceptor.h>

#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "session/registry.h"

namespace ferry::rpc {
namespace {

Result<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status(ErrorKind::kInvalidArgument, std::string("cannot read ") + what + " " + path);
  std::ostringstream out;
  out << in.rdbuf();
  if (out.str().empty()) {
    return Status(ErrorKind::kInvalidArgument, std::string(what) + " " + path + " is empty");
  }
  return out.str();
}

}  // namespace

Result<std::shared_ptr<grpc::ServerCredentials>> MakeTcpCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) {
    if (!tls.client_ca.empty()) {
      return Status(ErrorKind::kInvalidArgument, "--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) {
    return Status(ErrorKind::kInvalidArgument, "--tls-cert and --tls-key go together");
  }
  grpc::SslServerCredentialsOptions opts(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  FERRY_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(tls.cert, "TLS certificate"));
  FERRY_ASSIGN_OR_RETURN(pair.private_key, ReadPem(tls.key, "TLS key"));
  opts.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca.empty()) {
    FERRY_ASSIGN_OR_RETURN(opts.pem_root_certs, ReadPem(tls.client_ca, "TLS client CA"));
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

bool IsRemotePeer(std::string_view peer) {
  return peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  // Walk the expected length whatever the input, so timing says nothing about the prefix.
  for (size_t i = 0; i < b.size(); ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

Result<std::vector<TokenFileLine>> ReadTokenFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorKind::kInvalidArgument, "cannot read " + what + " " + path);
  std::vector<TokenFileLine> lines;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string word; words >> word;) w.push_back(word);
    if (w.empty() || w[0][0] == '#') continue;
    lines.push_back(TokenFileLine{number, std::move(w)});
  }
  if (in.bad()) return Status(ErrorKind::kInvalidArgument, "cannot read " + what + " " + path);
  if (lines.empty()) {
    return Status(ErrorKind::kInvalidArgument, what + " " + path + " holds no token");
  }
  return lines;
}

Result<std::unique_ptr<TokenChecker>> TokenChecker::Load(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::vector<TokenFileLine> lines, ReadTokenFile(path, "token file"));
  std::vector<Token> tokens;
  std::set<std::string> names, seen;
  for (const TokenFileLine& line : lines) {
    const std::vector<std::string>& w = line.words;
    auto bad = [&](const std::string& why) {
      return Status(ErrorKind::kInvalidArgument,
                    "token file " + path + " line " + std::to_string(line.number) + ": " + why);
    };
    if (w.size() > 2) return bad("expected TOKEN or NAME TOKEN");
    Token t;
    if (w.size() == 2) {
      if (!session::IsTenantName(w[0])) return bad("a tenant name is 1..32 of A-Z a-z 0-9 _ . -");
      if (!names.insert(w[0]).second) return bad("tenant " + w[0] + " is given twice");
      t.tenant = w[0];
    }
    t.token = w.back();
    if (!seen.insert(t.token).second) return bad("a token is given twice");
    tokens.push_back(std::move(t));
  }
  return std::unique_ptr<TokenChecker>(new TokenChecker(std::move(tokens)));
}

namespace {

// UNAUTHENTICATED, the gRPC code a caller without valid credentials gets; the kind says the
// peer is not let in.
Status Unauthenticated(std::string message) {
  return Status(Code::kUnauthenticated, ErrorKind::kPermissionDenied, std::move(message));
}

// The value of the "authorization" metadata, if any.
std::optional<std::string_view> Authorization(
    const std::multimap<grpc::string_ref, grpc::string_ref>& md) {
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(const TokenChecker* checker, grpc::experimental::ServerRpcInfo* info)
      : checker_(checker), info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      grpc::ServerContextBase* ctx = info_->server_context();
      if (ctx) {
        std::optional<std::string_view> auth = Authorization(*methods->GetRecvInitialMetadata());
        Status s = checker_->CheckAuthorization(auth ? &*auth : nullptr);
        if (!s.ok()) {
          // The client sees UNAUTHENTICATED; whatever the handler sends after this fails.
          grpc_call_cancel_with_status(ctx->c_call(), GRPC_STATUS_UNAUTHENTICATED,
                                       s.message().c_str(), nullptr);
        }
      }
    }
    methods->Proceed();
  }

 private:
  const TokenChecker* checker_;
  grpc::experimental::ServerRpcInfo* info_;
};

class TokenInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const TokenChecker* checker) : checker_(checker) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new TokenInterceptor(checker_, info);
  }

 private:
  const TokenChecker* checker_;
};

}  // namespace

Result<std::string> TokenChecker::TenantOf(const std::string_view* authorization) const {
  if (!authorization) return Unauthenticated("this daemon needs a bearer token");
  constexpr std::string_view kBearer = "Bearer ";
  std::string_view value = *authorization;
  if (value.rfind(kBearer, 0) != 0) return Unauthenticated("the bearer token is not valid");
  value.remove_prefix(kBearer.size());
  // Every token is compared, so the time says nothing about which one matched.
  const Token* match = nullptr;
  for (const Token& t : tokens_) {
    if (ConstantTimeEquals(value, t.token)) match = &t;
  }
  if (!match) return Unauthenticated("the bearer token is not valid");
  return match->tenant;
}

Status TokenChecker::Check(const grpc::ServerContextBase& context) const {
  std::optional<std::string_view> auth = Authorization(context.client_metadata());
  return CheckAuthorization(auth ? &*auth : nullptr);
}

std::string TokenChecker::TenantOf(const grpc::ServerContextBase& context) const {
  std::optional<std::string_view> auth = Authorization(context.client_metadata());
  auto tenant = TenantOf(auth ? &*auth : nullptr);
  return tenant.ok() ? *tenant : "";
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeTokenInterceptorFactory(
    const TokenChecker* checker) {
  return std::make_unique<TokenInterceptorFactory>(checker);
}

Status CheckToken(const TokenChecker* checker, const grpc::ServerContextBase& context, bool tcp) {
  return tcp && checker ? checker->Check(context) : Status::Ok();
}

}  // namespace ferry::rpc
