// Remote access: TLS credentials for TCP endpoints, the bearer-token check, and what counts
// as a remote peer. Unix endpoints (and sockets inherited through systemd) stay plain: the
// file system guards them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace grpc {
class ServerCredentials;
class ServerContextBase;
namespace experimental {
class ServerInterceptorFactoryInterface;
}
}  // namespace grpc

namespace ferry::rpc {

struct TlsFiles {
  std::string cert;       // PEM server certificate chain
  std::string key;        // PEM private key
  std::string client_ca;  // PEM CA bundle; set: clients must present a certificate it signed
  bool enabled() const { return !cert.empty() || !key.empty(); }
};

/// Return the credentials for TCP endpoints: TLS (mutual when `tls.client_ca` is set) when
/// `tls` is enabled, else insecure. INVALID_ARGUMENT when a file cannot be read or only one
/// of cert and key is given.
Result<std::shared_ptr<grpc::ServerCredentials>> MakeTcpCredentials(const TlsFiles& tls);

/// True for a gRPC peer string of a TCP connection ("ipv4:..." or "ipv6:..."). For logs and
/// tests only: whether a call came in over TCP is what the gRPC server it arrived on says
/// (ferryd serves its TCP endpoints from a server of their own), never its peer string, which
/// gRPC may leave empty for a call it has already cancelled.
bool IsRemotePeer(std::string_view peer);

/// Compare in time that depends only on the lengths, not on where the bytes differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

/// One line of a token file that says something: its number (from 1) and its words.
struct TokenFileLine {
  int number = 0;
  std::vector<std::string> words;
};
/// Read the token file at `path`, which error messages call `what` ("token file"): its lines
/// split into words at blanks, blank lines and lines starting with '#' left out.
/// INVALID_ARGUMENT "cannot read WHAT PATH" when it cannot be read, "WHAT PATH holds no
/// token" when no line is left.
Result<std::vector<TokenFileLine>> ReadTokenFile(const std::string& path, const std::string& what);

/// The bearer tokens TCP clients must send as "authorization: Bearer <token>" metadata, and
/// the tenant each names. Immutable after Load; thread-safe.
///
/// The token file holds one token per line (blank lines and lines starting with '#'
/// skipped, surrounding whitespace ignored): `TOKEN` alone is a shared token, whose peers are
/// together the identity "remote"; `NAME TOKEN` is tenant NAME's (IsTenantName), whose peers
/// are the identity "remote:NAME", with limits of its own (session/registry.h). A file of one
/// token is what it always was.
class TokenChecker {
 public:
  /// Read the tokens from `path`; INVALID_ARGUMENT when it cannot be read, holds no token, a
  /// line has more than two words or a bad name, or a name or token is given twice.
  static Result<std::unique_ptr<TokenChecker>> Load(const std::string& path);

  /// OK when the call carries one of the tokens; UNAUTHENTICATED otherwise.
  Status Check(const grpc::ServerContextBase& context) const;
  /// OK when `authorization` (the metadata's value; null when absent) is
  /// "Bearer <token>" for one of the tokens; UNAUTHENTICATED otherwise.
  Status CheckAuthorization(const std::string_view* authorization) const {
    return TenantOf(authorization).status();
  }
  /// The tenant of the token `authorization` carries ("" for a shared token);
  /// UNAUTHENTICATED when it carries none of them. Takes as long whichever token matches.
  Result<std::string> TenantOf(const std::string_view* authorization) const;
  /// The tenant of the call's token; "" for a shared token or none.
  std::string TenantOf(const grpc::ServerContextBase& context) const;

 private:
  struct Token {
    std::string tenant;  // "": shared
    std::string token;
  };
  explicit TokenChecker(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}
  const std::vector<Token> tokens_;
};

/// Check a call that came in on a TCP endpoint (`tcp`) against `checker` (null: no token
/// configured, everything passes): OK, or UNAUTHENTICATED as TokenChecker::Check says; callers
/// pass the code on as it is. A call on a Unix endpoint (`tcp` false) always passes: the file
/// system guards those.
Status CheckToken(const TokenChecker* checker, const grpc::ServerContextBase& context, bool tcp);

/// Return a server interceptor factory that holds every call to `checker` before any handler
/// sees it: every method, the daemon's own and gRPC's (health, reflection) alike. For the
/// server of the TCP endpoints only. A call without the token is cancelled with
/// UNAUTHENTICATED as soon as its metadata arrives, so a handler that still runs cannot send
/// anything (the daemon's own handlers check again). `checker` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeTokenInterceptorFactory(
    const TokenChecker* checker);

}  // namespace ferry::rpc
