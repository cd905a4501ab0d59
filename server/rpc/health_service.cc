#include "rpc/health_service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "grpc/health/v1/health.pb.h"

namespace ferry::rpc {

void EnableHealthService() {
  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's health service has no protobuf descriptor; server reflection describes only what
  // the generated pool holds. Naming a message of grpc/health/v1/health.proto links that file
  // into the binary (a static library's unreferenced object would be dropped), and linking
  // it registers the file in the pool before main runs.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
}

void SetAcceptingSessions(grpc::Server* server, bool accepting) {
  if (server == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", accepting);
  health->SetServingStatus(kSessionServiceName, accepting);
  health->SetServingStatus(kAdminServiceName, true);
}

void ShutdownHealth(grpc::Server* server) {
  if (server == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->Shutdown();
}

}  // namespace ferry::rpc
