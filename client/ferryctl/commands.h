// ferryctl's commands. Each writes its report to `out`, problems to `err`, and returns the
// process exit code:
//   0  ok
//   1  warning (health only: draining, low device-memory headroom)
//   2  critical: the daemon is unreachable, an RPC failed, the canary failed
//   3  usage error (UNKNOWN in monitoring terms)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace ferry::v1 {
class ListSessionsReply;
}  // namespace ferry::v1

namespace ferry::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitWarning = 1;
inline constexpr int kExitCritical = 2;
inline constexpr int kExitUsage = 3;

inline constexpr const char* kDefaultTarget = "unix:/run/ferry/ferryd-0.sock";

struct Options {
  /// unix:PATH, tcp:HOST:PORT, an absolute socket path, or a device index N (the default
  /// socket of ferryd@N).
  std::string target = kDefaultTarget;
  bool json = false;
  /// How long to wait for the daemon to answer one call.
  std::chrono::milliseconds timeout{3000};
  // health
  bool canary = false;
  uint64_t canary_elements = 1u << 20;
  std::chrono::milliseconds canary_timeout{20000};
  /// Warn when less than this fraction of device memory is free.
  double min_free_fraction = 0.05;
  // remote access (tcp: targets): PEM paths, and the bearer token itself ("": none), read
  // from --token-file or stdin (ReadToken)
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string token;
  // metrics: where ferryd's --metrics-listen serves ("HOST:PORT" or http://HOST:PORT[/metrics])
  std::string metrics_endpoint;
  // sessions: usage per identity (uid) only
  bool by_uid = false;
  // top: one view (two samples `interval` apart) instead of the live one
  bool once = false;
  std::chrono::milliseconds interval{1000};
  // drain
  bool wait = false;
  std::chrono::milliseconds wait_timeout{120000};
};

/// Read a bearer token from `in` (a --token-file, or stdin for --token -) into `*token`: its
/// text without surrounding blanks and line breaks, which must be one token of at most
/// kMaxTokenBytes with no blank, line break or other control byte inside (a file of
/// ferryd's, with a token per line or NAME TOKEN, is not one). False, with what is wrong in
/// `*problem` ("holds no token", ...), when it is not.
inline constexpr size_t kMaxTokenBytes = 4096;
bool ReadToken(std::istream& in, std::string* token, std::string* problem);

/// Return the target in ferry's syntax (what libferry's Client::connect takes).
std::string FerryTarget(const std::string& target);

int RunStatus(const Options& options, std::ostream& out, std::ostream& err);
int RunSessions(const Options& options, std::ostream& out, std::ostream& err);
int RunHealth(const Options& options, std::ostream& out, std::ostream& err);
int RunDrain(const Options& options, std::ostream& out, std::ostream& err);
int RunMetrics(const Options& options, std::ostream& out, std::ostream& err);
int RunTop(const Options& options, std::ostream& out, std::ostream& err);  // top.cc

/// Call Admin.ListSessions on the options' target (credentials, deadline); return kExitOk,
/// or report the failure to `err` and return its exit code.
int FetchSessions(const Options& options, v1::ListSessionsReply* reply, std::ostream& err);

}  // namespace ferry::ctl
