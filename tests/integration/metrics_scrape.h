// Reading a test ferryd's Prometheus metrics (--metrics-listen): its endpoint, a raw HTTP
// exchange with it, and the value of one sample. Header-only, for the integration tests.
#pragma once

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>
#include <string>

#include "ferryd_process.h"

namespace ferry::testing {

/// Return the HOST:PORT of `d`'s metrics endpoint (the "metrics:" line of its ready file), or
/// "" when it has none.
inline std::string MetricsEndpoint(const FerrydProcess& d) {
  for (const auto& e : d.endpoints()) {
    if (e.rfind("metrics:", 0) == 0) return e.substr(8);
  }
  return "";
}

/// Send `request` to `host_port` and return the whole response, headers included, read until
/// the server closes the connection ("" when the connection failed).
inline std::string HttpExchange(const std::string& host_port, const std::string& request) {
  const size_t colon = host_port.rfind(':');
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host_port.substr(0, colon).c_str(), host_port.substr(colon + 1).c_str(), &hints,
                  &res) != 0) {
    return "";
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
  bool ok = ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  std::string response;
  if (ok && ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
                static_cast<ssize_t>(request.size())) {
    char buf[8192];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, n);
  }
  ::close(fd);
  return response;
}

/// GET `path` from `host_port`; the whole response ("" when the connection failed).
inline std::string HttpGet(const std::string& host_port, const std::string& path) {
  return HttpExchange(host_port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
}

/// GET /metrics from `host_port`; the whole response, headers included ("" when the
/// connection failed). Value() reads samples from it as it is.
inline std::string Scrape(const std::string& host_port) { return HttpGet(host_port, "/metrics"); }

/// The body of an HTTP `response`: what follows its headers ("" when it has no end of headers).
inline std::string ResponseBody(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

/// Return the value of the first sample `name{labels...}` in `body` whose line contains
/// `label` ("": any labels), or -1 when there is none.
inline double Value(const std::string& body, const std::string& name,
                    const std::string& label = "") {
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0) continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

}  // namespace ferry::testing
