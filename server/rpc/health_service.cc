#include "rpc/health_service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

namespace ferry::rpc {

void EnableHealthService() { grpc::EnableDefaultHealthCheckService(true); }

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
