// Local (Unix-socket) clients: ferryd accepts their connections itself.
//
// gRPC's own Unix listener says nothing about who connected. So ferryd listens on its Unix
// endpoints itself (or adopts systemd's inherited sockets), accepts each connection on a
// thread of its own (systemd::SocketAcceptor), reads SO_PEERCRED, records the credentials
// here and only then hands the fd to gRPC, which names that peer "fd:N". A session stream
// looks its peer up here: a hit means a local client (it may use shared memory) with a known
// uid and pid, shown by `ferryctl sessions`.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "rpc/systemd_notify.h"
#include "session/registry.h"

namespace ferry::rpc {

class LocalConnections {
 public:
  /// Record the connection accepted as `fd` on `endpoint` ("unix:PATH"). Call before gRPC
  /// sees the fd. A later connection that reuses the fd number replaces the record (the
  /// earlier connection is closed by then, so no stream can still ask for it).
  void Add(int fd, std::string endpoint, const systemd::PeerCredentials& peer);

  /// Who is behind a gRPC peer name: the endpoint and credentials of a connection accepted
  /// here ("fd:N"), or only the address gRPC reports (TCP peers).
  session::PeerIdentity Identify(const std::string& grpc_peer) const;

 private:
  struct Entry {
    std::string endpoint;
    systemd::PeerCredentials peer;
  };
  mutable Mutex mu_;
  std::unordered_map<int, Entry> by_fd_ ABSL_GUARDED_BY(mu_);
};

/// Create a listening Unix stream socket at `path` (mode 0660, close-on-exec). A stale socket
/// file is replaced; a path where a daemon still accepts connections is refused.
Result<int> ListenUnix(const std::string& path);

}  // namespace ferry::rpc
