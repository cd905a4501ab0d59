#include "channel.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace ferry::internal {
namespace {

// Adds "authorization: Bearer <token>" to every call of a channel (call credentials would
// need TLS; a token also guards plaintext loopback TCP).
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::string token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel that owns the factory
};

// PEM text as given, or the contents of the file it names.
Result<std::string> PemOrFile(const std::string& value, const char* what) {
  if (value.empty() || value.find("-----BEGIN") != std::string::npos) return value;
  std::ifstream in(value, std::ios::binary);
  if (!in)
    return Status(ErrorKind::kInvalidArgument, std::string("cannot read ") + what + " " + value);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

std::string GrpcTarget(const std::string& target) {
  if (target.rfind("tcp:", 0) == 0) return target.substr(4);
  return target;  // "unix:PATH" and gRPC's own schemes pass through
}

Result<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                   const ClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const bool tcp = target.rfind("unix:", 0) != 0;
  if (tcp && (!options.tls_ca_cert.empty() || !options.tls_client_cert.empty())) {
    grpc::SslCredentialsOptions ssl;
    FERRY_ASSIGN_OR_RETURN(ssl.pem_root_certs, PemOrFile(options.tls_ca_cert, "TLS CA"));
    FERRY_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                           PemOrFile(options.tls_client_cert, "TLS client certificate"));
    FERRY_ASSIGN_OR_RETURN(ssl.pem_private_key,
                           PemOrFile(options.tls_client_key, "TLS client key"));
    credentials = grpc::SslCredentials(ssl);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (tcp && !options.bearer_token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(options.bearer_token));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  // Reconnect quickly to a daemon that restarted (gRPC's default first backoff is 1 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  return grpc::experimental::CreateCustomChannelWithInterceptors(GrpcTarget(target), credentials,
                                                                 args, std::move(interceptors));
}

}  // namespace ferry::internal
