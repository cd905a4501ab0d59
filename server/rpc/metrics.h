// Prometheus metrics: a latency histogram sessions record into, the text exposition of the
// daemon's state, and a minimal HTTP/1.1 server that serves it on --metrics-listen.
//
// Every series carries the labels gpu="<ordinal>" and UUID="<uuid>", as DCGM's exporter
// does, so ferry's series join DCGM's on a node.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::rpc {

struct SessionServiceContext;

/// A fixed-bucket latency histogram. Record and Snapshot are lock-free and safe from any
/// thread; a snapshot taken while records land may be off by the records in flight.
class LatencyHistogram {
 public:
  /// Upper bounds of the buckets, in seconds (the last bucket, +Inf, is implicit).
  static constexpr std::array<double, 16> kBoundsSeconds = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};

  void Record(std::chrono::nanoseconds latency);

  struct Snapshot {
    std::array<uint64_t, kBoundsSeconds.size() + 1> buckets{};  // not cumulative; last: +Inf
    uint64_t count = 0;
    double sum_seconds = 0;
  };
  Snapshot snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBoundsSeconds.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

/// What the metrics endpoint (MetricsServer) counts of its own connections, since start.
struct MetricsEndpointStats {
  /// Connections closed to make room for a new one, the endpoint holding its most: before
  /// their request was read (waiting), or while their answer was written (answering).
  uint64_t evicted_waiting = 0;
  uint64_t evicted_answering = 0;
};

/// Render the daemon's metrics in the Prometheus text exposition format 0.0.4, with the
/// metrics endpoint's own counts `endpoint`.
/// Thread-safe: reads only counters, gauges and snapshots.
std::string RenderMetrics(const SessionServiceContext& context,
                          std::chrono::steady_clock::time_point started_at,
                          const MetricsEndpointStats& endpoint);

/// Read the bearer tokens of --metrics-token-file: one per line, surrounding whitespace
/// ignored, blank lines and lines starting with '#' skipped. INVALID_ARGUMENT when the file
/// cannot be read, holds no token, or a line holds more than one word (a token has no blanks;
/// token-file's `NAME TOKEN` lines are not metrics tokens).
Result<std::vector<std::string>> LoadMetricsTokens(const std::string& path);

/// True when `authorization` (the value of a request's Authorization header, surrounding
/// whitespace removed; null when the request has none) is "Bearer <token>" (the scheme in any
/// case) for one of `tokens`. Every token is compared, each in time that depends only on the
/// lengths: the time says neither which token matched nor how much of one.
bool MetricsRequestAuthorized(const std::vector<std::string>& tokens,
                              const std::string_view* authorization);

/// A minimal HTTP/1.1 server: GET /metrics answers 200 with `render(the endpoint's counts)`,
/// anything else 404 (405 for other methods). With tokens, a request that does not carry one of
/// them (MetricsRequestAuthorized) answers 401 with "WWW-Authenticate: Bearer" and no metrics,
/// whatever its path. One request per connection, closed after the reply.
///
/// Bounded against whoever reaches it, token or not (the token is checked once the request is
/// read): it holds at most 64 connections (descriptors) at once, each for at most 5 s from its
/// accept. A connection accepted while it holds 64 closes the oldest one still waiting for its
/// request (else, every one answering, the oldest of those), so idle connections cannot keep
/// a scraper out; MetricsEndpointStats counts those it closed.
///
/// Runs on its own thread; `render` is called there, with the endpoint's counts.
class MetricsServer {
 public:
  /// Listen on "HOST:PORT" (port 0 picks one). `tokens` empty: no token needed.
  static Result<std::unique_ptr<MetricsServer>> Start(
      const std::string& host_port, std::function<std::string(const MetricsEndpointStats&)> render,
      std::vector<std::string> tokens = {});
  /// Stop listening, close connections, join the thread.
  ~MetricsServer();

  /// The bound address, port resolved: "HOST:PORT".
  const std::string& endpoint() const;

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::rpc
