#include "rpc/protobuf_log.h"

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace ferry::rpc {
namespace {

namespace pb = google::protobuf;

std::atomic<int64_t> next_line_ns{0};  // steady clock: when the next line may be logged
std::atomic<uint64_t> dropped{0};      // lines not logged since the last one that was

void Log(pb::LogLevel level, const char* file, int line, const std::string& message) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t next = next_line_ns.load();
  if (level != pb::LOGLEVEL_FATAL &&
      (now < next || !next_line_ns.compare_exchange_strong(
                         next, now + std::chrono::nanoseconds(std::chrono::seconds(1)).count()))) {
    dropped.fetch_add(1);
    return;
  }
  const uint64_t before = dropped.exchange(0);
  const std::string more =
      before ? " (and " + std::to_string(before) + " protobuf lines not logged before it)" : "";
  switch (level) {
    case pb::LOGLEVEL_INFO:
      spdlog::debug("protobuf: {} ({}:{}){}", message, file, line, more);
      break;
    case pb::LOGLEVEL_FATAL:
      spdlog::critical("protobuf: {} ({}:{}){}", message, file, line, more);
      break;
    default:
      spdlog::warn("protobuf: {} ({}:{}){}", message, file, line, more);
      break;
  }
}

}  // namespace

void RouteProtobufLogs() {
  static std::once_flag once;
  std::call_once(once, [] { pb::SetLogHandler(&Log); });
}

}  // namespace ferry::rpc
