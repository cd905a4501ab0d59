// ferryctl: the operator's view of a ferry daemon. Parses the command line and runs one
// command (commands.h); exit codes are monitoring-style (0 ok, 1 warning, 2 critical).
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "ferry/version.h"

namespace {

constexpr const char* kUsage = R"(usage: ferryctl [options] COMMAND

commands:
  status             the daemon: device, memory, uptime, version, sessions, totals
  sessions [--by-uid]  one row per open session, then usage per identity (uid:N, or
                     remote for TCP peers) against its limits; --by-uid: only that. For a
                     caller that is not root, the daemon's uid or in its admin-group: that
                     caller's own sessions
  health [--canary]  checks, with exit codes 0 ok / 1 warning / 2 critical:
                     reachable, grpc.health.v1, draining, device-memory headroom, and
                     with --canary an upload -> scale+axpy -> download through the
                     daemon, every element checked
  drain [--wait]     ask the daemon to drain (finish in-flight work, then exit);
                     --wait: until it has stopped. Admins only (root, the daemon's
                     uid, its admin-group)
  metrics            fetch and print the Prometheus metrics of --metrics HOST:PORT
  top [--once]       who uses the GPU, live: uids and sessions by device time, with
                     busy share, device memory and transfer rates (keys: t time,
                     m memory, r transfer rate, q quit); --once: one view, two samples
                     --interval apart (a table, or JSON with --json). Non-admins see
                     their own uid only

options:
  --target T           unix:PATH, tcp:HOST:PORT, a socket path, or a device index N
                       (unix:/run/ferry/ferryd-N.sock); default unix:/run/ferry/ferryd-0.sock
  --json               one JSON value instead of a table (scripts)
  --timeout SECONDS    how long the daemon has to answer (default 3)
  --canary-elements N  f32 elements the canary moves (default 1048576)
  --canary-timeout S   how long the canary may take (default 20)
  --min-free PERCENT   health warns below this much free device memory (default 5)
  --wait-timeout S     drain --wait gives up after this long (default 120)
  --interval S         top: seconds between refreshes (default 1)
  --metrics HOST:PORT  ferryd's --metrics-listen endpoint (metrics)
  --tls-ca PATH        PEM CA of the daemon's certificate: speak TLS (tcp: targets)
  --tls-cert PATH      PEM client certificate, for mutual TLS
  --tls-key PATH       PEM key of --tls-cert
  --token-file PATH    file holding the bearer token for tcp: targets and for
                       metrics (ferryd's --token-file / --metrics-token-file): one
                       token, surrounding blanks and line breaks ignored
  --token -            read that token from stdin instead. A token itself is never
                       taken on the command line, where every local user can read it
                       (the process list)
  --version, --help

exit codes: 0 ok, 1 warning, 2 critical or unreachable, 3 usage error
)";

int Usage(const std::string& problem) {
  std::cerr << "ferryctl: " << problem << "\n(see ferryctl --help)\n";
  return ferry::ctl::kExitUsage;
}

// Why a --token VALUE other than "-" is refused, and what to use instead. The value is not
// repeated: it may be the token itself.
std::string TokenOnCommandLine(const std::string& value) {
  std::string instead = "--token-file PATH, or --token - to read it from stdin";
  if (value.size() > 1 && value[0] == '@') instead = "--token-file " + value.substr(1);
  return "--token takes no token or path on the command line, where every local user can "
         "read it in the process list: use " +
         instead;
}

bool ParseSeconds(const std::string& text, std::chrono::milliseconds* out) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || !(v > 0) || v > 86400) return false;
  *out = std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::ctl;
  std::vector<std::string> args(argv + 1, argv + argc);
  Options options;
  std::string command;
  std::string token_file;         // --token-file PATH
  bool token_from_stdin = false;  // --token -
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.rfind("--", 0) != 0) {
      if (!command.empty()) return Usage("unexpected argument: " + a);
      command = a;
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto switch_flag = [&](bool* out) {
      if (has_value) return false;
      *out = true;
      return true;
    };
    if (name == "help") {
      std::cout << kUsage;
      return kExitOk;
    }
    if (name == "version") {
      std::cout << "ferryctl " << ferry::kVersion << " (" << ferry::kGitCommit << ")\n";
      return kExitOk;
    }
    if (name == "json") {
      if (!switch_flag(&options.json)) return Usage("--json takes no value");
      continue;
    }
    if (name == "canary") {
      if (!switch_flag(&options.canary)) return Usage("--canary takes no value");
      continue;
    }
    if (name == "by-uid") {
      if (!switch_flag(&options.by_uid)) return Usage("--by-uid takes no value");
      continue;
    }
    if (name == "wait") {
      if (!switch_flag(&options.wait)) return Usage("--wait takes no value");
      continue;
    }
    if (name == "once") {
      if (!switch_flag(&options.once)) return Usage("--once takes no value");
      continue;
    }
    static const std::vector<std::string> kValued = {
        "target",       "timeout", "canary-elements", "canary-timeout", "min-free",
        "wait-timeout", "metrics", "tls-ca",          "tls-cert",       "tls-key",
        "token-file",   "token",   "interval"};
    if (std::find(kValued.begin(), kValued.end(), name) == kValued.end()) {
      return Usage("unknown option --" + name);
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return Usage("--" + name + " needs a value");
      value = args[++i];
    }
    if (name == "target") {
      if (value.empty()) return Usage("--target: empty");
      options.target = value;
    } else if (name == "metrics") {
      options.metrics_endpoint = value;
    } else if (name == "tls-ca") {
      options.tls_ca = value;
    } else if (name == "tls-cert") {
      options.tls_cert = value;
    } else if (name == "tls-key") {
      options.tls_key = value;
    } else if (name == "token") {
      if (value != "-") return Usage(TokenOnCommandLine(value));
      token_from_stdin = true;
    } else if (name == "token-file") {
      if (value.empty()) return Usage("--token-file: empty");
      token_file = value;
    } else if (name == "timeout") {
      if (!ParseSeconds(value, &options.timeout)) return Usage("--timeout: seconds, > 0");
    } else if (name == "canary-timeout") {
      if (!ParseSeconds(value, &options.canary_timeout)) {
        return Usage("--canary-timeout: seconds, > 0");
      }
    } else if (name == "interval") {
      if (!ParseSeconds(value, &options.interval)) return Usage("--interval: seconds, > 0");
    } else if (name == "wait-timeout") {
      if (!ParseSeconds(value, &options.wait_timeout)) return Usage("--wait-timeout: seconds, > 0");
    } else if (name == "canary-elements") {
      uint64_t n = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || p != value.data() + value.size() || n == 0 || n > (1u << 26)) {
        return Usage("--canary-elements: 1..67108864");
      }
      options.canary_elements = n;
    } else if (name == "min-free") {
      double v = -1;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || p != value.data() + value.size() || v < 0 || v > 100) {
        return Usage("--min-free: a percentage, 0..100");
      }
      options.min_free_fraction = v / 100.0;
    }
  }
  if (command.empty()) return Usage("no command given");
  if (token_from_stdin && !token_file.empty()) {
    return Usage("give the token one way: --token-file PATH or --token -");
  }
  std::string problem;
  if (token_from_stdin && !ReadToken(std::cin, &options.token, &problem)) {
    return Usage("--token -: stdin " + problem);
  }
  if (!token_file.empty()) {
    std::ifstream in(token_file, std::ios::binary);
    if (!in) return Usage("--token-file " + token_file + ": " + std::strerror(errno));
    if (!ReadToken(in, &options.token, &problem)) {
      return Usage("--token-file " + token_file + ": " + problem);
    }
  }
  if (options.canary && command != "health") return Usage("--canary belongs to health");
  if (options.wait && command != "drain") return Usage("--wait belongs to drain");
  if (options.once && command != "top") return Usage("--once belongs to top");
  if (command == "status") return RunStatus(options, std::cout, std::cerr);
  if (command == "sessions") return RunSessions(options, std::cout, std::cerr);
  if (command == "health") return RunHealth(options, std::cout, std::cerr);
  if (command == "drain") return RunDrain(options, std::cout, std::cerr);
  if (command == "metrics") return RunMetrics(options, std::cout, std::cerr);
  if (command == "top") return RunTop(options, std::cout, std::cerr);
  return Usage("unknown command '" + command + "'");
}
