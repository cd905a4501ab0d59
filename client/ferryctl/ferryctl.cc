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
#include <iterator>
#include <optional>
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

/// What the command line asks for.
struct CommandLine {
  ferry::ctl::Options options;
  std::string command;
  std::string token_file;         // --token-file PATH
  bool token_from_stdin = false;  // --token -
};

/// The options that take no value, and the Options field each sets.
struct SwitchOption {
  const char* name;
  bool ferry::ctl::Options::*field;
};
constexpr SwitchOption kSwitches[] = {{"json", &ferry::ctl::Options::json},
                                      {"canary", &ferry::ctl::Options::canary},
                                      {"by-uid", &ferry::ctl::Options::by_uid},
                                      {"wait", &ferry::ctl::Options::wait},
                                      {"once", &ferry::ctl::Options::once}};

/// The options that take a value (--name VALUE or --name=VALUE).
const std::vector<std::string>& ValuedOptions() {
  static const std::vector<std::string> kValued = {
      "target",       "timeout", "canary-elements", "canary-timeout", "min-free",
      "wait-timeout", "metrics", "tls-ca",          "tls-cert",       "tls-key",
      "token-file",   "token",   "interval"};
  return kValued;
}

/// Apply the numeric option `name` (a valued option other than the paths and the token):
/// "" when applied, else the usage problem.
std::string ApplyNumericOption(const std::string& name, const std::string& value,
                               ferry::ctl::Options& options) {
  if (name == "timeout") {
    if (!ParseSeconds(value, &options.timeout)) return "--timeout: seconds, > 0";
  } else if (name == "canary-timeout") {
    if (!ParseSeconds(value, &options.canary_timeout)) return "--canary-timeout: seconds, > 0";
  } else if (name == "interval") {
    if (!ParseSeconds(value, &options.interval)) return "--interval: seconds, > 0";
  } else if (name == "wait-timeout") {
    if (!ParseSeconds(value, &options.wait_timeout)) return "--wait-timeout: seconds, > 0";
  } else if (name == "canary-elements") {
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || p != value.data() + value.size() || n == 0 || n > (1u << 26)) {
      return "--canary-elements: 1..67108864";
    }
    options.canary_elements = n;
  } else if (name == "min-free") {
    double v = -1;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || p != value.data() + value.size() || v < 0 || v > 100) {
      return "--min-free: a percentage, 0..100";
    }
    options.min_free_fraction = v / 100.0;
  }
  return "";
}

/// Apply valued option `name` (one of ValuedOptions()): "" when applied, else the usage
/// problem.
std::string ApplyValuedOption(const std::string& name, const std::string& value, CommandLine& cl) {
  ferry::ctl::Options& options = cl.options;
  if (name == "target") {
    if (value.empty()) return "--target: empty";
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
    if (value != "-") return TokenOnCommandLine(value);
    cl.token_from_stdin = true;
  } else if (name == "token-file") {
    if (value.empty()) return "--token-file: empty";
    cl.token_file = value;
  } else {
    return ApplyNumericOption(name, value, options);
  }
  return "";
}

/// Parse the arguments into cl, in order: the command and the options. Returns the exit
/// code when ferryctl is done already (--help, --version, a usage error), else nullopt.
std::optional<int> ParseArgs(const std::vector<std::string>& args, CommandLine& cl) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.rfind("--", 0) != 0) {
      if (!cl.command.empty()) return Usage("unexpected argument: " + a);
      cl.command = a;
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "help") {
      std::cout << kUsage;
      return ferry::ctl::kExitOk;
    }
    if (name == "version") {
      std::cout << "ferryctl " << ferry::kVersion << " (" << ferry::kGitCommit << ")\n";
      return ferry::ctl::kExitOk;
    }
    auto sw = std::find_if(std::begin(kSwitches), std::end(kSwitches),
                           [&](const SwitchOption& s) { return name == s.name; });
    if (sw != std::end(kSwitches)) {
      if (has_value) return Usage("--" + name + " takes no value");
      cl.options.*(sw->field) = true;
      continue;
    }
    const auto& valued = ValuedOptions();
    if (std::find(valued.begin(), valued.end(), name) == valued.end()) {
      return Usage("unknown option --" + name);
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return Usage("--" + name + " needs a value");
      value = args[++i];
    }
    if (std::string problem = ApplyValuedOption(name, value, cl); !problem.empty()) {
      return Usage(problem);
    }
  }
  return std::nullopt;
}

/// Read the bearer token (--token - or --token-file) into cl.options.token. Returns the
/// usage exit code when it cannot be read or is given both ways, else nullopt.
std::optional<int> ReadTokenOption(CommandLine& cl) {
  if (cl.token_from_stdin && !cl.token_file.empty()) {
    return Usage("give the token one way: --token-file PATH or --token -");
  }
  std::string problem;
  if (cl.token_from_stdin && !ferry::ctl::ReadToken(std::cin, &cl.options.token, &problem)) {
    return Usage("--token -: stdin " + problem);
  }
  if (!cl.token_file.empty()) {
    std::ifstream in(cl.token_file, std::ios::binary);
    if (!in) return Usage("--token-file " + cl.token_file + ": " + std::strerror(errno));
    if (!ferry::ctl::ReadToken(in, &cl.options.token, &problem)) {
      return Usage("--token-file " + cl.token_file + ": " + problem);
    }
  }
  return std::nullopt;
}

/// Run `command` (its command-specific switches checked first); its exit code.
int RunCommand(const std::string& command, const ferry::ctl::Options& options) {
  using namespace ferry::ctl;
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  CommandLine cl;
  if (std::optional<int> done = ParseArgs(args, cl)) return *done;
  if (cl.command.empty()) return Usage("no command given");
  if (std::optional<int> bad = ReadTokenOption(cl)) return *bad;
  return RunCommand(cl.command, cl.options);
}
