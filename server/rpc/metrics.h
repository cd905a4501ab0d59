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

/// Render the daemon's metrics in the Prometheus text exposition format 0.0.4.
/// Thread-safe: reads only counters, gauges and snapshots.
std::string RenderMetrics(const SessionServiceContext& context,
                          std::chrono::steady_clock::time_point started_at);

/// A minimal HTTP/1.1 server: GET /metrics answers 200 with `render()`, anything else 404
/// (405 for other methods). One connection at a time per request, closed after the reply.
/// Runs on its own thread; `render` is called there.
class MetricsServer {
 public:
  /// Listen on "HOST:PORT" (port 0 picks one).
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& host_port,
                                                      std::function<std::string()> render);
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
