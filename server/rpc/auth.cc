#include "rpc/auth.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

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

Result<std::unique_ptr<TokenChecker>> TokenChecker::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorKind::kInvalidArgument, "cannot read token file " + path);
  std::ostringstream out;
  out << in.rdbuf();
  std::string token = out.str();
  size_t b = token.find_first_not_of(" \t\r\n");
  size_t e = token.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) {
    return Status(ErrorKind::kInvalidArgument, "token file " + path + " is empty");
  }
  return std::unique_ptr<TokenChecker>(new TokenChecker(token.substr(b, e - b + 1)));
}

Status TokenChecker::Check(const grpc::ServerContextBase& context) const {
  if (!IsRemotePeer(context.peer())) return Status::Ok();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return Status(ErrorKind::kInvalidArgument, "this daemon needs a bearer token");
  }
  std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  if (value.rfind(kBearer, 0) != 0 || !ConstantTimeEquals(value.substr(kBearer.size()), token_)) {
    return Status(ErrorKind::kInvalidArgument, "the bearer token is not valid");
  }
  return Status::Ok();
}

Status CheckToken(const TokenChecker* checker, const grpc::ServerContextBase& context) {
  return checker ? checker->Check(context) : Status::Ok();
}

}  // namespace ferry::rpc
