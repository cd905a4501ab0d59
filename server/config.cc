#include "config.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "rpc/access.h"
#include "session/copy_turns.h"

namespace ferry {
namespace {

// Where a setting came from; a later source overrides an earlier one.
enum class Source { kDefault, kFile, kFlags };

Status Invalid(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}

Result<uint64_t> ParseUnsigned(const std::string& text) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
    return Invalid("not a number: " + text);
  }
  return v;
}

Result<bool> ParseBool(const std::string& text) {
  static const std::set<std::string> yes = {"true", "yes", "on", "1"};
  static const std::set<std::string> no = {"false", "no", "off", "0"};
  if (yes.count(text)) return true;
  if (no.count(text)) return false;
  return Invalid("expected true or false, got '" + text + "'");
}

Status CheckEndpoint(const std::string& ep) {
  if (ep.rfind("unix:", 0) == 0) {
    if (ep.size() == 5) return Invalid("empty unix socket path");
    return Status::Ok();
  }
  if (ep.rfind("tcp:", 0) == 0) {
    std::string hp = ep.substr(4);
    size_t colon = hp.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) {
      return Invalid("expected tcp:HOST:PORT, got " + ep);
    }
    auto port = ParseUnsigned(hp.substr(colon + 1));
    if (!port.ok() || *port > 65535) return Invalid("bad port in " + ep);
    return Status::Ok();
  }
  return Invalid("endpoint must be unix:PATH or tcp:HOST:PORT, got " + ep);
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The settings every source can give, with their parsers. Holds the config being built;
// not copyable (the setters point into it).
class Settings {
 public:
  Settings() {
    c_.daemon.session_defaults.device_bytes_quota = 1ull << 30;
    c_.daemon.session_defaults.max_in_flight_submits = 64;
    auto bytes = [](uint64_t* out) {
      return [out](const std::string& v) -> Status {
        FERRY_ASSIGN_OR_RETURN(*out, ParseBytes(v));
        return Status::Ok();
      };
    };
    auto path = [](std::string* out) {
      return [out](const std::string& v) -> Status {
        *out = v;
        return Status::Ok();
      };
    };
    auto bounded = [](uint64_t lo, uint64_t hi, auto assign) {
      return [=](const std::string& v) -> Status {
        FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned(v));
        if (n < lo || n > hi) {
          return Invalid("out of range " + std::to_string(lo) + ".." + std::to_string(hi));
        }
        assign(n);
        return Status::Ok();
      };
    };
    // A count, or "auto": derived at start (std::nullopt).
    auto bounded_or_auto = [bounded](uint64_t lo, uint64_t hi, std::optional<uint32_t>* out) {
      return [=](const std::string& v) -> Status {
        if (v == "auto") {
          out->reset();
          return Status::Ok();
        }
        return bounded(lo, hi, [out](uint64_t n) { *out = static_cast<uint32_t>(n); })(v);
      };
    };
    setters_ = {
        {"device", bounded(0, 1024, [this](uint64_t n) { c_.device = static_cast<int>(n); })},
        {"backend",
         [this](const std::string& v) -> Status {
           if (v != "host" && v != "cuda" && v != "auto") return Invalid("host, cuda or auto");
           c_.backend = v;
           return Status::Ok();
         }},
        {"listen",
         [this](const std::string& v) -> Status {
           FERRY_RETURN_IF_ERROR(CheckEndpoint(v));
           // The first endpoint from a source replaces those of earlier sources.
           if (listen_source_ != current_) c_.daemon.listen.clear();
           listen_source_ = current_;
           c_.daemon.listen.push_back(v);
           return Status::Ok();
         }},
        {"allow-insecure-remote",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(c_.daemon.allow_insecure_remote, ParseBool(v));
           return Status::Ok();
         }},
        {"allow-remote-raw-kernels",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(c_.daemon.allow_remote_raw_kernels, ParseBool(v));
           return Status::Ok();
         }},
        {"raw-kernels",
         [this](const std::string& v) -> Status {
           // Names are resolved here too, so --check-config finds an unknown user or group.
           FERRY_RETURN_IF_ERROR(rpc::AccessList::Parse(v).status());
           c_.daemon.raw_kernels = v;
           return Status::Ok();
         }},
        {"admins",
         [this](const std::string& v) -> Status {
           FERRY_RETURN_IF_ERROR(rpc::AccessList::Parse(v).status());
           c_.daemon.admins = v;
           return Status::Ok();
         }},
        {"admin-group",
         [this](const std::string& v) -> Status {
           if (!v.empty()) FERRY_RETURN_IF_ERROR(rpc::ResolveGroup(v).status());
           c_.daemon.admin_group = v;
           return Status::Ok();
         }},
        {"tls-cert", path(&c_.daemon.tls.cert)},
        {"tls-key", path(&c_.daemon.tls.key)},
        {"tls-client-ca", path(&c_.daemon.tls.client_ca)},
        {"token-file", path(&c_.daemon.token_file)},
        {"metrics-listen",
         [this](const std::string& v) -> Status {
           if (!v.empty()) {
             size_t colon = v.rfind(':');
             if (colon == std::string::npos || colon == 0) return Invalid("expected HOST:PORT");
             auto port = ParseUnsigned(v.substr(colon + 1));
             if (!port.ok() || *port > 65535) return Invalid("bad port in " + v);
           }
           c_.daemon.metrics_listen = v;
           return Status::Ok();
         }},
        {"metrics-token-file", path(&c_.daemon.metrics_token_file)},
        {"metrics-max-identities", bounded(1, 65536,
                                           [this](uint64_t n) {
                                             c_.daemon.metrics_max_identities =
                                                 static_cast<uint32_t>(n);
                                           })},
        {"metrics-identity-idle-timeout", bounded(0, 86400000,
                                                  [this](uint64_t n) {
                                                    c_.daemon.metrics_identity_idle_timeout =
                                                        std::chrono::milliseconds(n);
                                                  })},
        {"session-quota", bytes(&c_.daemon.session_defaults.device_bytes_quota)},
        {"max-session-quota", bytes(&c_.daemon.max_device_bytes_quota)},
        {"device-memory-cap", bytes(&c_.daemon.device_bytes_cap)},
        {"host-memory", bytes(&c_.host.memory_bytes)},
        {"rpc-bandwidth-probe",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(c_.daemon.rpc_bandwidth_probe, ParseBool(v));
           return Status::Ok();
         }},
        {"tcp-idle-timeout", bounded(0, 86400000,
                                     [this](uint64_t n) {
                                       c_.daemon.tcp_idle_timeout = std::chrono::milliseconds(n);
                                     })},
        {"max-message",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseBytes(v));
           // gRPC takes the limit as an int.
           if (n < 4096 || n > (1ull << 31) - 1) return Invalid("out of range 4K..2G-1");
           c_.daemon.max_message_bytes = n;
           return Status::Ok();
         }},
        {"max-in-flight", bounded(1, 65536,
                                  [this](uint64_t n) {
                                    c_.daemon.session_defaults.max_in_flight_submits =
                                        static_cast<uint32_t>(n);
                                  })},
        {"session-in-flight-bytes",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseBytes(v));
           // At least libferry's inline transfer messages (8 MiB) and what they are charged.
           if (n != 0 && n < (16ull << 20)) return Invalid("0 (no limit) or at least 16M");
           c_.daemon.session_defaults.max_in_flight_bytes = n;
           return Status::Ok();
         }},
        {"in-flight-bytes",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseBytes(v));
           if (n != 0 && n < (16ull << 20)) return Invalid("0 (no limit) or at least 16M");
           c_.daemon.in_flight_bytes = n;
           return Status::Ok();
         }},
        {"session-max-submit-ops",
         bounded(0, 1ull << 32,
                 [this](uint64_t n) { c_.daemon.session_defaults.max_ops_per_submit = n; })},
        {"session-max-tensors",
         bounded(0, 1ull << 32,
                 [this](uint64_t n) { c_.daemon.session_defaults.max_tensors = n; })},
        {"session-max-modules",
         bounded(0, 1ull << 32,
                 [this](uint64_t n) { c_.daemon.session_defaults.max_modules = n; })},
        {"session-max-graphs",
         bounded(0, 1ull << 32, [this](uint64_t n) { c_.daemon.session_defaults.max_graphs = n; })},
        {"session-max-graph-ops",
         bounded(0, 1ull << 32,
                 [this](uint64_t n) { c_.daemon.session_defaults.max_graph_ops = n; })},
        {"max-objects", bounded(0, 1ull << 40, [this](uint64_t n) { c_.daemon.max_objects = n; })},
        {"max-sessions", bounded_or_auto(1, 1000000, &c_.daemon.max_sessions)},
        {"max-sessionless-streams", bounded(0, 1000000,
                                            [this](uint64_t n) {
                                              c_.daemon.sessionless_streams.total =
                                                  static_cast<uint32_t>(n);
                                            })},
        {"max-sessionless-streams-per-uid", bounded(0, 1000000,
                                                    [this](uint64_t n) {
                                                      c_.daemon.sessionless_streams.per_identity =
                                                          static_cast<uint32_t>(n);
                                                    })},
        {"max-local-connections", bounded_or_auto(0, 1000000, &c_.daemon.local_connections.total)},
        {"max-local-connections-per-uid",
         bounded_or_auto(0, 1000000, &c_.daemon.local_connections.per_uid)},
        {"open-timeout",
         bounded(0, 600000,
                 [this](uint64_t n) { c_.daemon.open_timeout = std::chrono::milliseconds(n); })},
        {"uid-limits",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(session::UidLimitRule rule, session::ParseUidLimitRule(v));
           auto& rules = c_.daemon.uid_limits;
           // The first rule from a source replaces those of earlier sources (back to the
           // built-in default rule, which stays first).
           if (uid_limits_source_ != current_) rules = {session::DefaultUidLimitRule()};
           uid_limits_source_ = current_;
           if (rule.match == session::UidLimitRule::Match::kDefault) {
             if (default_rule_given_ == current_)
               return Invalid("a default: rule is already given");
             default_rule_given_ = current_;
             rules.front() = rule;
             return Status::Ok();
           }
           for (size_t i = 1; i < rules.size(); ++i) {
             if (rules[i].match == rule.match && rules[i].id == rule.id &&
                 rules[i].tenant == rule.tenant) {
               return Invalid("a rule for the same uid, gid or remote is already given: " + v);
             }
           }
           rules.push_back(rule);
           return Status::Ok();
         }},
        {"executor-threads",
         bounded(0, 1024,
                 [this](uint64_t n) { c_.daemon.executor_threads = static_cast<int>(n); })},
        {"cuda-work-queues",
         bounded(0, 32, [this](uint64_t n) { c_.cuda_work_queues = static_cast<int>(n); })},
        {"cuda-module-loading",
         [this](const std::string& v) -> Status {
           if (v != "eager" && v != "lazy" && v != "environment") {
             return Invalid("eager|lazy|environment");
           }
           c_.cuda_module_loading = v;
           return Status::Ok();
         }},
        {"nvrtc-timeout",
         bounded(100, 3600ull * 1000,
                 [this](uint64_t n) { c_.cuda.nvrtc_timeout = std::chrono::milliseconds(n); })},
        {"nvrtc-memory",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseBytes(v));
           if (n < (256ull << 20)) return Invalid("at least 256M");
           c_.cuda.nvrtc_memory = n;
           return Status::Ok();
         }},
        {"nvrtc-concurrency",
         bounded(0, 256, [this](uint64_t n) { c_.cuda.nvrtc_concurrency = static_cast<int>(n); })},
        {"fuse-elementwise",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(c_.cuda.fuse_elementwise, ParseBool(v));
           return Status::Ok();
         }},
        {"streams-ahead",
         bounded(0, 256, [this](uint64_t n) { c_.cuda.streams_ahead = static_cast<uint32_t>(n); })},
        {"copy-turns",
         bounded(0, 1024, [this](uint64_t n) { c_.daemon.copy_turns = static_cast<uint32_t>(n); })},
        {"copy-turn-size", bytes(&c_.daemon.copy_turn_bytes)},
        {"device-turns",
         bounded(0, 1024,
                 [this](uint64_t n) { c_.daemon.device_turns = static_cast<uint32_t>(n); })},
        {"uid-weights",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(auto weights, session::ParseUidWeights(v));
           c_.daemon.uid_weights = std::move(weights);
           return Status::Ok();
         }},
        {"kernel-batch", bounded(0, 65536,
                                 [this](uint64_t n) {
                                   c_.daemon.session_defaults.kernel_batch =
                                       static_cast<uint32_t>(n);
                                 })},
        {"submit-run", bounded(0, 1024,
                               [this](uint64_t n) {
                                 c_.daemon.session_defaults.submit_run = static_cast<uint32_t>(n);
                               })},
        {"staging-wait", bounded(0, 60000,
                                 [this](uint64_t n) {
                                   c_.daemon.session_defaults.staging_wait_ms =
                                       static_cast<uint32_t>(n);
                                 })},
        {"session-queued-commands", bounded(0, 960,
                                            [this](uint64_t n) {
                                              c_.daemon.session_defaults.max_queued_commands =
                                                  static_cast<uint32_t>(n);
                                            })},
        {"queued-commands",
         bounded(0, 1000000, [this](uint64_t n) { c_.daemon.queued_commands = n; })},
        {"slab-size",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseBytes(v));
           if (n == 0 || n % 4096 != 0 || n > (1ull << 40)) {
             return Invalid("a non-zero multiple of 4K");
           }
           c_.daemon.slab_pool.slab_size = n;
           return Status::Ok();
         }},
        {"pinned-budget", bytes(&c_.daemon.slab_pool.budget)},
        {"submit-ring",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseBytes(v));
           if (n != 0 && (n < 4096 || n > (16ull << 20) || (n & (n - 1)) != 0)) {
             return Invalid("0 (off) or a power of two from 4K to 16M");
           }
           c_.daemon.submit_ring_bytes = n;
           return Status::Ok();
         }},
        {"session-pinned-quota", bytes(&c_.daemon.session_pinned_quota)},
        {"initial-slabs", bounded(0, 65536,
                                  [this](uint64_t n) {
                                    c_.daemon.slab_pool.initial_slabs = static_cast<uint32_t>(n);
                                  })},
        {"staging-slabs",
         bounded(0, 65536,
                 [this](uint64_t n) { c_.daemon.staging_slabs = static_cast<uint32_t>(n); })},
        {"slab-hello-timeout", bounded(1, 60000,
                                       [this](uint64_t n) {
                                         c_.daemon.slab_broker.hello_timeout =
                                             std::chrono::milliseconds(n);
                                       })},
        {"slab-max-connections", bounded(1, 1000000,
                                         [this](uint64_t n) {
                                           c_.daemon.slab_broker.max_connections =
                                               static_cast<uint32_t>(n);
                                         })},
        {"slab-max-pending-per-uid", bounded(1, 1000000,
                                             [this](uint64_t n) {
                                               c_.daemon.slab_broker.max_pending_per_uid =
                                                   static_cast<uint32_t>(n);
                                             })},
        {"slab-grant-threads", bounded(0, 64,
                                       [this](uint64_t n) {
                                         c_.daemon.slab_broker.grant_threads =
                                             static_cast<uint32_t>(n);
                                       })},
        {"drain-timeout",
         bounded(0, 24ull * 3600 * 1000,
                 [this](uint64_t n) { c_.drain_timeout = std::chrono::milliseconds(n); })},
        // Hidden (not in --help): arms a device fault on the host backend after N ops, for
        // the fault-recovery integration tests. 0: off.
        {"host-fault-after-ops-for-test",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(c_.host_fault_after_ops_for_test, ParseUnsigned(v));
           return Status::Ok();
         }},
        // Hidden: the host device cannot be rebuilt after a fault, so ferryd takes the
        // restart path a CUDA context needs (tests of that path). Takes true/false.
        {"host-rebuild-fails-for-test",
         [this](const std::string& v) -> Status {
           FERRY_ASSIGN_OR_RETURN(c_.host_rebuild_fails_for_test, ParseBool(v));
           return Status::Ok();
         }},
        {"ready-file",
         [this](const std::string& v) -> Status {
           c_.ready_file = v;
           return Status::Ok();
         }},
        {"log-level",
         [this](const std::string& v) -> Status {
           static const std::set<std::string> levels = {"trace", "debug",    "info", "warn",
                                                        "error", "critical", "off"};
           if (!levels.count(v)) return Invalid("trace|debug|info|warn|error|critical|off");
           c_.log_level = v;
           return Status::Ok();
         }},
    };
  }
  Settings(const Settings&) = delete;
  Settings& operator=(const Settings&) = delete;

  /// True for the command-line actions (--help, --version, --check-config): switches that
  /// take no value and cannot be set in the file.
  static bool IsAction(const std::string& name) {
    return name == "help" || name == "version" || name == "check-config";
  }
  /// True for switches: on the command line a bare --NAME means true; the settings among them
  /// (not the actions) also take --NAME=true|false, with the words the file takes.
  static bool IsSwitch(const std::string& name) {
    return IsAction(name) || name == "allow-insecure-remote" || name == "allow-remote-raw-kernels";
  }
  bool Known(const std::string& name) const { return setters_.count(name) > 0; }

  /// Apply one setting (a switch's value is "true" or "false"); the message of an error
  /// does not name the setting (the caller knows how it was spelled).
  Status Set(const std::string& name, const std::string& value, Source source) {
    current_ = source;
    if (IsAction(name)) {
      // Command-line switches only: ParseFlags passes "true".
      (name == "help"      ? c_.show_help
       : name == "version" ? c_.show_version
                           : c_.check_config) = true;
      return Status::Ok();
    }
    auto it = setters_.find(name);
    if (it == setters_.end()) return Invalid("unknown setting");
    // A value is one line of the config file, and --check-config prints it as one: a flag's
    // value with a line break would print as settings of its own.
    if (value.find_first_of("\r\n") != std::string::npos) {
      return Invalid("a value may not contain a line break");
    }
    return it->second(value);
  }

  /// Return the config built, after the checks that span settings (those ferryd would
  /// otherwise fail at start on). Opens no file: an unreadable TLS, token or metrics token
  /// file is found at start.
  Result<DaemonConfig> Finish() {
    if (listen_source_ == Source::kDefault) {
      c_.daemon.listen = {"unix:/run/ferry/ferryd-" + std::to_string(c_.device) + ".sock"};
    }
    const auto& pool = c_.daemon.slab_pool;
    if (pool.budget < pool.slab_size) {
      return Invalid("pinned-budget (" + FormatBytes(pool.budget) + ") is below slab-size (" +
                     FormatBytes(pool.slab_size) + "): the pool could not hold one slab");
    }
    const auto& tls = c_.daemon.tls;
    if (!tls.cert.empty() && tls.key.empty()) return Invalid("tls-cert needs tls-key");
    if (tls.cert.empty() && !tls.key.empty()) return Invalid("tls-key needs tls-cert");
    if (!tls.client_ca.empty() && tls.cert.empty()) {
      return Invalid("tls-client-ca needs tls-cert and tls-key");
    }
    return c_;
  }

 private:
  DaemonConfig c_;
  Source current_ = Source::kDefault;
  Source listen_source_ = Source::kDefault;
  Source uid_limits_source_ = Source::kDefault;
  Source default_rule_given_ = Source::kDefault;
  std::map<std::string, std::function<Status(const std::string&)>> setters_;
};

// `text` without a trailing comment: from a '#' after whitespace on, trimmed.
std::string StripComment(const std::string& text) {
  for (size_t i = 1; i < text.size(); ++i) {
    if (text[i] == '#' && (text[i - 1] == ' ' || text[i - 1] == '\t')) {
      return Trim(text.substr(0, i));
    }
  }
  return Trim(text);
}

// The value after a line's '=': "quoted" (taken as it is, '#' and blanks included, with \"
// and \\ for a quote and a backslash; only a comment may follow the closing quote), or bare
// (up to a trailing comment, trimmed). FormatConfig writes what this reads back.
Result<std::string> ParseValue(const std::string& text) {
  const std::string rest = Trim(text);
  if (rest.empty() || rest.front() != '"') return StripComment(rest);
  std::string value;
  for (size_t i = 1; i < rest.size(); ++i) {
    if (rest[i] == '\\' && i + 1 < rest.size()) {
      value += rest[++i];
    } else if (rest[i] == '"') {
      const std::string after = Trim(rest.substr(i + 1));
      if (!after.empty() && after.front() != '#') {
        return Invalid("text after the closing quote: '" + after + "'");
      }
      return value;
    } else {
      value += rest[i];
    }
  }
  return Invalid("a quoted value without its closing quote");
}

// `value` as ParseValue reads it back: quoted (with \" and \\), or nothing when empty.
std::string Quoted(const std::string& value) {
  if (value.empty()) return "";
  std::string out = " \"";
  for (char ch : value) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// Apply a config file's text to `settings`; errors say "ORIGIN:LINE: ...".
Status ApplyConfigText(const std::string& text, const std::string& origin, Settings& settings) {
  std::istringstream in(text);
  std::string raw;
  std::map<std::string, int> seen;  // setting -> line it was set on
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    std::string where = origin + ":" + std::to_string(line_no) + ": ";
    std::string line = Trim(raw);
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return Invalid(where + "expected 'name = value', got '" + StripComment(line) + "'");
    }
    std::string name = Trim(line.substr(0, eq));
    auto value = ParseValue(line.substr(eq + 1));
    if (!value.ok()) return Invalid(where + name + ": " + value.status().message());
    if (name.rfind("--", 0) == 0) name = name.substr(2);
    if (name == "config" || Settings::IsAction(name)) {
      return Invalid(where + "'" + name + "' can only be given on the command line");
    }
    if (!settings.Known(name)) return Invalid(where + "unknown setting '" + name + "'");
    if (name != "listen" && name != "uid-limits") {
      auto [it, fresh] = seen.emplace(name, line_no);
      if (!fresh) {
        return Invalid(where + "'" + name + "' is already set on line " +
                       std::to_string(it->second));
      }
    }
    Status s = settings.Set(name, *value, Source::kFile);
    if (!s.ok()) return Invalid(where + name + ": " + s.message());
  }
  return Status::Ok();
}

Result<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Invalid(path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Invalid("cannot read config file " + path);
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return Invalid("cannot read config file " + path);
  return out.str();
}

}  // namespace

Result<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return Invalid("empty size");
  uint64_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      mult = 1ull << 10;
      digits.pop_back();
      break;
    case 'M':
    case 'm':
      mult = 1ull << 20;
      digits.pop_back();
      break;
    case 'G':
    case 'g':
      mult = 1ull << 30;
      digits.pop_back();
      break;
    default:
      break;
  }
  FERRY_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(digits));
  uint64_t out = 0;
  if (!CheckedMul(v, mult, &out)) return Invalid("size overflows");
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes != 0) {
    if (bytes % (1ull << 30) == 0) return std::to_string(bytes >> 30) + "G";
    if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + "M";
    if (bytes % (1ull << 10) == 0) return std::to_string(bytes >> 10) + "K";
  }
  return std::to_string(bytes);
}

std::string FlagsHelp() {
  return R"(ferryd: the ferry GPU daemon (one process per GPU)

Flags take "--name VALUE" or "--name=VALUE". A switch (a flag shown without VALUE) alone
means true; --allow-insecure-remote and --allow-remote-raw-kernels also take =true or =false.

  --config PATH              read settings from PATH first (default /etc/ferry/ferryd.conf
                             when it exists; --config= reads none). Lines are
                             "name = value" with the flag names below; flags win
  --check-config             validate flags and config file, print the effective
                             configuration and exit (0 valid, 2 invalid)
  --device N                 GPU ordinal to serve (default 0)
  --backend host|cuda|auto   device backend (default auto: CUDA when a GPU is visible)
  --listen ENDPOINT          unix:PATH or tcp:HOST:PORT (port 0 picks one); repeatable
                             (default unix:/run/ferry/ferryd-<N>.sock)
  --allow-insecure-remote    allow TCP endpoints that authenticate no client (neither
                             --token-file nor --tls-client-ca), loopback included: any
                             peer that reaches one gets in (development only)
  --tls-cert PATH            PEM certificate chain: TCP endpoints speak TLS (default: none)
  --tls-key PATH             PEM private key of --tls-cert (default: none)
  --tls-client-ca PATH       PEM CA bundle: TCP clients must present a certificate it signed
                             (mutual TLS; default: none)
  --token-file PATH          TCP clients must send "authorization: Bearer <token>" with a
                             token of PATH, one per line: TOKEN (shared: identity remote)
                             or NAME TOKEN (tenant NAME: identity remote:NAME, limits of
                             its own) (default: none). Unix endpoints stay plain
  --allow-remote-raw-kernels let TCP clients load and launch raw kernels (default: refused);
                             such a client is trusted with every session's data
  --raw-kernels LIST         local peers that may load and launch raw kernels (PTX, CUBIN,
                             CUDA C++): comma list of uid:USER and gid:GROUP, names or
                             numbers, e.g. uid:1000,gid:gpuadmin (default: none; others get
                             PERMISSION_DENIED). They are trusted with every session's data
  --admins LIST              local peers that may drain the daemon and list every session,
                             besides the daemon's own uid: comma list of uid:USER and
                             gid:GROUP (default uid:0; "" leaves root out, as a host whose
                             containers run as root needs)
  --admin-group GROUP        a group added to --admins (default: none)
  --metrics-listen HOST:PORT serve Prometheus metrics at http://HOST:PORT/metrics
                             (port 0 picks one; default: off)
  --metrics-token-file PATH  requests to --metrics-listen must send "Authorization: Bearer
                             <token>" with a token of PATH, one per line; others get 401
                             (default: none, the metrics are open to whoever reaches them)
  --metrics-max-identities N usage identities (uid + client name) with their own
                             accounting and metrics labels, 1..65536; more fold into
                             uid="other" (default 256)
  --metrics-identity-idle-timeout MS  a usage identity none of whose sessions has been
                             open for this long is forgotten: its series leave the metrics
                             (the daemon's totals keep its counts) and its place is free
                             for a new one, 0..86400000 (default 600000; 0: never)
  --session-quota SIZE       default device-memory quota per session (default 1G)
  --max-session-quota SIZE   largest quota a client may ask for (default 16G)
  --max-in-flight N          default submits in flight per session (default 64)
  --session-in-flight-bytes SIZE  bytes a session's submits may hold in the daemon, read
                             and not yet answered (inline uploads, downloads, ops); at the
                             limit the daemon stops reading the session (default 256M;
                             0: no limit; else at least 16M)
  --in-flight-bytes SIZE     bytes all sessions' submits may hold in the daemon together;
                             a submit past it is refused with QUOTA_EXCEEDED, and a session
                             holding some stops reading when less than max-message is left
                             (default 4G; 0: no limit; else at least 16M)
  --session-max-submit-ops N  ops one submit may carry, each LaunchGraph counted as the
                             ops its graph recorded; past it the submit is refused with
                             QUOTA_EXCEEDED (default 1048576; 0: no limit)
  --session-max-tensors N    live tensors per session (default 65536; 0: no limit)
  --session-max-modules N    loaded modules per session (default 256; 0: no limit)
  --session-max-graphs N     recorded graphs per session (default 4096; 0: no limit)
  --session-max-graph-ops N  ops recorded into a session's live graphs, together
                             (default 262144; 0: no limit)
  --max-objects N            live tensors, modules and graphs and ops recorded into graphs
                             all sessions may hold together; a submit that could pass it is
                             refused with QUOTA_EXCEEDED (default 4194304; 0: no limit)
  --max-sessions N           sessions open at once (default auto: an eighth of the
                             descriptor limit, at most 1024)
  --max-sessionless-streams N   session streams that carry no session (before their Open,
                             or ended and not yet closed by their client), held at once;
                             past it a new stream is reset (libferry retries) (default
                             1024; 0: no limit)
  --max-sessionless-streams-per-uid N  the same, per uid (every TCP peer together counts as
                             one, "remote") (default 64; 0: no limit)
  --max-local-connections N  connections to the Unix endpoints held at once; past it a
                             new one is closed at once (root and ferryd's uid are never
                             refused) (default auto: half the descriptor limit, at most
                             4096; 0: no limit)
  --max-local-connections-per-uid N  the same, per uid (default auto: a quarter of
                             max-local-connections, at most 1024; 0: no limit)
  --open-timeout MS          a session stream that has not sent Open by then is ended
                             DEADLINE_EXCEEDED, 0..600000 (default 5000; 0: never)
  --uid-limits RULE          per-identity limits, repeatable: SELECTOR:KEY=VALUE,... with
                             SELECTOR default, remote (each TCP identity), remote:NAME (a
                             token-file tenant), uid:N or gid:N and
                             KEY sessions, device, pinned, inflight-bytes, objects, queued
                             (N, SIZE, P% of the daemon's) or inflight (N); VALUE none: no
                             limit (default default:sessions=50%,device=50%,pinned=50%,
                             inflight=4096,inflight-bytes=50%,objects=50%,queued=50%; root
                             (while in --admins) and ferryd's own uid exempt unless a uid:
                             rule names them)
  --device-memory-cap SIZE   device memory all sessions together may hold (default: all)
  --host-memory SIZE         emulated device memory of the host backend (default 8G)
  --max-message SIZE         largest gRPC message (default 64M)
  --rpc-bandwidth-probe BOOL let gRPC grow each TCP stream's receive window to the
                             measured bandwidth-delay product (16M or more): faster large
                             inline transfers over high-latency links, but each stream the
                             daemon stops reading may then buffer that much (default true;
                             Unix endpoints never probe)
  --tcp-idle-timeout MS      a TCP connection that carries no call for this long, or has
                             not finished its handshake (TLS, HTTP/2 settings) by then, is
                             closed; clients reconnect when they next call, 0..86400000
                             (default 60000; 0: gRPC's, no idle limit and 120 s handshakes)
  --executor-threads N       session executor threads (default: a quarter of the cores,
                             at least 2); as many long-lane threads come with them, for
                             long work: large graphs' instantiations, module loads,
                             inline transfers without staging
  --cuda-work-queues N       hardware work queues of the CUDA context, 1..32 (default 0:
                             CUDA's, 8); fewer save host memory (docs/operations.md)
  --cuda-module-loading MODE eager: every kernel is loaded when the CUDA context is made
                             (cuBLAS's too, opened then);
                             lazy: on its first launch, which may wait for every session's
                             queued work; environment: CUDA_MODULE_LOADING's, else CUDA's
                             (lazy) (default environment; docs/operations.md)
  --nvrtc-timeout MS         wall-clock (and CPU) time one CUDA C++ module's compile may
                             take, 100..3600000 (default 30000)
  --nvrtc-memory SIZE        address space of one CUDA C++ module's compile, at least 256M
                             (default 4G)
  --nvrtc-concurrency N      CUDA C++ compiles at once, 0..256; one more is refused with
                             BUSY (default 0: a quarter of the cores, at least 1; at most
                             the executor threads less one)
  --fuse-elementwise BOOL    run each run of consecutive f32/f64 fill, add, sub, mul,
                             div, scale and axpy ops of a kernel batch or a graph as one
                             kernel where the results are the same (default true)
  --streams-ahead N          fresh CUDA streams made ahead for the next sessions to open
                             on, 0..256; closed sessions' streams are destroyed on the same
                             thread (default 4; 0: made at the open, destroyed at the close)
  --copy-turns N             submits copying copy-turn-size or more one way that run at
                             once, per direction; the rest wait their turn, one identity
                             at most half while another waits (default 4; 0: no limit)
  --copy-turn-size SIZE      bytes a submit copies one way from which it takes a turn
                             (default 4M)
  --device-turns N           submits of all sessions on the device at once, 0..1024; the
                             rest wait, ordered by uid-weights (default 0: no limit)
  --uid-weights LIST         uid:N=W,remote=W,remote:NAME=W,...: weights (1..1000, default 1) by which
                             waiting submits of different uids get copy and device turns,
                             up to half of the turns each while another waits (default:
                             none, every identity weighs 1)
  --kernel-batch N           a run of N or more kernel ops (fill, binary, scale, axpy) in
                             one submit goes to the device as one batch: on CUDA one graph
                             launch, its graph kept and updated (default 8; 0: never)
  --submit-run N             submits taken from a submit ring at once go to the device
                             as runs of at most N: one completion watch per run, and one
                             batch for its kernel-only submits when it holds kernel-batch
                             ops or more (default 32; 0 or 1: each submit on its own)
  --staging-wait MS          how long a submit waits for staging room for its inline
                             bytes before it copies directly (default 100; 0: never waits)
  --session-queued-commands N  device commands a session keeps on its stream, 0..960;
                             a submit with more enqueues in parts as earlier ones complete,
                             so no executor thread waits in CUDA's launch queue (default
                             128; 0: no limit)
  --queued-commands N        device commands all sessions keep queued together, below one
                             hardware work queue's room, whatever work queue CUDA gives each
                             stream (default 896; 0: no limit)
  --slab-size SIZE           size of a shared-memory slab for local clients (default 64M)
  --pinned-budget SIZE       pinned shared memory all slabs may take (default 1G)
  --initial-slabs N          fresh slabs made and registered at start, and kept ready
                             (made again ahead as they are handed out; default 1)
  --session-pinned-quota SIZE  slab bytes one session may hold (default 256M; 0: no limit)
  --submit-ring SIZE         each local session's submit ring, through which its client
                             sends messages by shared memory instead of gRPC (default 64K;
                             0: off; a power of two from 4K to 16M)
  --staging-slabs N          pool slabs the daemon takes to stage inline transfers (all of
                             a remote client's, a local one's small ones), when they need
                             them; a submit waits for room (default 4; 0: none)
  --slab-hello-timeout MS    slab-socket connections that send no hello by then are
                             closed, 1..60000 (default 1000)
  --slab-max-connections N   slab-socket connections open at once (default 4096)
  --slab-max-pending-per-uid N  slab-socket connections of one uid not yet past their
                             hello, and of those closed with answers unread (default 32)
  --slab-grant-threads N     threads that answer slab acquires, each making a slab when
                             none is ready, 0..64 (default 0: one per core, 1 to 16)
  --drain-timeout MS         on SIGTERM, how long open sessions may run on (default 10000)
  --ready-file PATH          write the bound endpoints there once serving
  --log-level LEVEL          trace|debug|info|warn|error|critical|off (default info)
  --version, --help
)";
}

Result<DaemonConfig> ParseFlags(const std::vector<std::string>& args,
                                const std::string& default_config) {
  // Pass 1: split the command line into (name, value) pairs, so --config is known before
  // anything else is applied.
  Settings settings;
  std::vector<std::pair<std::string, std::string>> flags;
  std::optional<std::string> config_flag;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) return Invalid("unexpected argument: " + a);
    std::string name = a.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (Settings::IsSwitch(name)) {
      // A bare switch never takes the next argument as its value.
      if (has_value && Settings::IsAction(name)) return Invalid("--" + name + " takes no value");
      flags.emplace_back(name, has_value ? value : "true");
      continue;
    }
    if (name != "config" && !settings.Known(name)) return Invalid("unknown flag --" + name);
    if (!has_value) {
      if (i + 1 >= args.size()) return Invalid("--" + name + " needs a value");
      value = args[++i];
    }
    if (name == "config") {
      if (config_flag) return Invalid("--config given twice");
      config_flag = value;
    } else {
      flags.emplace_back(name, value);
    }
  }

  // Pass 2: the file, then the flags over it.
  std::string config_path;
  if (config_flag) {
    config_path = *config_flag;
  } else if (!default_config.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(default_config, ec)) config_path = default_config;
  }
  if (!config_path.empty()) {
    FERRY_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    FERRY_RETURN_IF_ERROR(ApplyConfigText(text, config_path, settings));
  }
  for (const auto& [name, value] : flags) {
    Status s = settings.Set(name, value, Source::kFlags);
    if (!s.ok()) return Invalid("--" + name + ": " + s.message());
  }
  FERRY_ASSIGN_OR_RETURN(DaemonConfig c, settings.Finish());
  c.config_path = config_path;
  return c;
}

Result<DaemonConfig> ParseConfigText(const std::string& text, const std::string& origin) {
  Settings settings;
  FERRY_RETURN_IF_ERROR(ApplyConfigText(text, origin, settings));
  auto c = settings.Finish();
  if (!c.ok()) return Invalid(origin + ": " + c.status().message());
  return c;
}

std::string FormatConfig(const DaemonConfig& c) {
  std::ostringstream out;
  out << "# ferryd effective configuration";
  if (!c.config_path.empty()) out << " (flags over " << c.config_path << ")";
  out << "\n";
  out << "device = " << c.device << "\n";
  out << "backend = " << c.backend << "\n";
  for (const std::string& ep : c.daemon.listen) out << "listen =" << Quoted(ep) << "\n";
  out << "allow-insecure-remote = " << (c.daemon.allow_insecure_remote ? "true" : "false") << "\n";
  out << "tls-cert =" << Quoted(c.daemon.tls.cert) << "\n";
  out << "tls-key =" << Quoted(c.daemon.tls.key) << "\n";
  out << "tls-client-ca =" << Quoted(c.daemon.tls.client_ca) << "\n";
  out << "token-file =" << Quoted(c.daemon.token_file) << "\n";
  out << "allow-remote-raw-kernels = " << (c.daemon.allow_remote_raw_kernels ? "true" : "false")
      << "\n";
  out << "raw-kernels =" << Quoted(c.daemon.raw_kernels) << "\n";
  out << "admins =" << Quoted(c.daemon.admins) << "\n";
  out << "admin-group =" << Quoted(c.daemon.admin_group) << "\n";
  out << "metrics-listen =" << Quoted(c.daemon.metrics_listen) << "\n";
  out << "metrics-token-file =" << Quoted(c.daemon.metrics_token_file) << "\n";
  out << "metrics-max-identities = " << c.daemon.metrics_max_identities << "\n";
  out << "metrics-identity-idle-timeout = " << c.daemon.metrics_identity_idle_timeout.count()
      << (c.daemon.metrics_identity_idle_timeout.count() == 0 ? "  # never" : "") << "\n";
  out << "session-quota = " << FormatBytes(c.daemon.session_defaults.device_bytes_quota) << "\n";
  out << "max-session-quota = " << FormatBytes(c.daemon.max_device_bytes_quota) << "\n";
  out << "max-in-flight = " << c.daemon.session_defaults.max_in_flight_submits << "\n";
  const session::SessionConfig& sd = c.daemon.session_defaults;
  auto limit = [](uint64_t n) { return n == 0 ? "  # no limit" : ""; };
  out << "session-in-flight-bytes = " << FormatBytes(sd.max_in_flight_bytes)
      << limit(sd.max_in_flight_bytes) << "\n";
  out << "in-flight-bytes = " << FormatBytes(c.daemon.in_flight_bytes)
      << limit(c.daemon.in_flight_bytes) << "\n";
  out << "session-max-submit-ops = " << sd.max_ops_per_submit << limit(sd.max_ops_per_submit)
      << "\n";
  out << "session-max-tensors = " << sd.max_tensors << limit(sd.max_tensors) << "\n";
  out << "session-max-modules = " << sd.max_modules << limit(sd.max_modules) << "\n";
  out << "session-max-graphs = " << sd.max_graphs << limit(sd.max_graphs) << "\n";
  out << "session-max-graph-ops = " << sd.max_graph_ops << limit(sd.max_graph_ops) << "\n";
  out << "max-objects = " << c.daemon.max_objects << limit(c.daemon.max_objects) << "\n";
  if (c.daemon.max_sessions) {
    out << "max-sessions = " << *c.daemon.max_sessions << "\n";
  } else {
    out << "max-sessions = auto  # an eighth of the descriptor limit, at most 1024\n";
  }
  out << "max-sessionless-streams = " << c.daemon.sessionless_streams.total
      << limit(c.daemon.sessionless_streams.total) << "\n";
  out << "max-sessionless-streams-per-uid = " << c.daemon.sessionless_streams.per_identity
      << limit(c.daemon.sessionless_streams.per_identity) << "\n";
  // auto: derived from the descriptor limit at start.
  auto derived = [&](const char* name, const std::optional<uint32_t>& v, const char* how) {
    if (v) {
      out << name << " = " << *v << limit(*v) << "\n";
    } else {
      out << name << " = auto  # " << how << "\n";
    }
  };
  derived("max-local-connections", c.daemon.local_connections.total,
          "half the descriptor limit, at most 4096");
  derived("max-local-connections-per-uid", c.daemon.local_connections.per_uid,
          "a quarter of max-local-connections, at most 1024");
  out << "open-timeout = " << c.daemon.open_timeout.count()
      << (c.daemon.open_timeout.count() == 0 ? "  # never" : "") << "\n";
  for (const auto& rule : c.daemon.uid_limits) {
    out << "uid-limits = " << session::FormatUidLimitRule(rule) << "\n";
  }
  out << "device-memory-cap = " << FormatBytes(c.daemon.device_bytes_cap)
      << (c.daemon.device_bytes_cap == 0 ? "  # all of the device's memory" : "") << "\n";
  out << "host-memory = " << FormatBytes(c.host.memory_bytes) << "\n";
  out << "max-message = " << FormatBytes(c.daemon.max_message_bytes) << "\n";
  out << "rpc-bandwidth-probe = " << (c.daemon.rpc_bandwidth_probe ? "true" : "false") << "\n";
  out << "tcp-idle-timeout = " << c.daemon.tcp_idle_timeout.count()
      << (c.daemon.tcp_idle_timeout.count() == 0 ? "  # gRPC's" : "") << "\n";
  out << "executor-threads = " << c.daemon.executor_threads
      << (c.daemon.executor_threads == 0 ? "  # a quarter of the cores, at least 2" : "") << "\n";
  out << "cuda-work-queues = " << c.cuda_work_queues
      << (c.cuda_work_queues == 0 ? "  # CUDA's default (8)" : "") << "\n";
  out << "cuda-module-loading = " << c.cuda_module_loading << "\n";
  out << "nvrtc-timeout = " << c.cuda.nvrtc_timeout.count() << "\n";
  out << "nvrtc-memory = " << FormatBytes(c.cuda.nvrtc_memory) << "\n";
  out << "nvrtc-concurrency = " << c.cuda.nvrtc_concurrency
      << (c.cuda.nvrtc_concurrency == 0 ? "  # a quarter of the cores, at least 1" : "") << "\n";
  out << "fuse-elementwise = " << (c.cuda.fuse_elementwise ? "true" : "false") << "\n";
  out << "streams-ahead = " << c.cuda.streams_ahead
      << (c.cuda.streams_ahead == 0 ? "  # made at the open" : "") << "\n";
  out << "copy-turns = " << c.daemon.copy_turns << (c.daemon.copy_turns == 0 ? "  # no limit" : "")
      << "\n";
  out << "copy-turn-size = " << FormatBytes(c.daemon.copy_turn_bytes) << "\n";
  out << "device-turns = " << c.daemon.device_turns
      << (c.daemon.device_turns == 0 ? "  # no limit" : "") << "\n";
  out << "uid-weights =" << Quoted(session::FormatUidWeights(c.daemon.uid_weights)) << "\n";
  out << "kernel-batch = " << c.daemon.session_defaults.kernel_batch
      << (c.daemon.session_defaults.kernel_batch == 0 ? "  # off" : "") << "\n";
  out << "submit-run = " << c.daemon.session_defaults.submit_run
      << (c.daemon.session_defaults.submit_run <= 1 ? "  # off" : "") << "\n";
  out << "staging-wait = " << c.daemon.session_defaults.staging_wait_ms << "\n";
  out << "session-queued-commands = " << c.daemon.session_defaults.max_queued_commands
      << (c.daemon.session_defaults.max_queued_commands == 0 ? "  # no limit" : "") << "\n";
  out << "queued-commands = " << c.daemon.queued_commands << limit(c.daemon.queued_commands)
      << "\n";
  out << "slab-size = " << FormatBytes(c.daemon.slab_pool.slab_size) << "\n";
  out << "pinned-budget = " << FormatBytes(c.daemon.slab_pool.budget) << "\n";
  out << "initial-slabs = " << c.daemon.slab_pool.initial_slabs << "\n";
  out << "session-pinned-quota = " << FormatBytes(c.daemon.session_pinned_quota) << "\n";
  out << "submit-ring = " << FormatBytes(c.daemon.submit_ring_bytes)
      << (c.daemon.submit_ring_bytes == 0 ? "  # off" : "") << "\n";
  out << "staging-slabs = " << c.daemon.staging_slabs << "\n";
  out << "slab-hello-timeout = " << c.daemon.slab_broker.hello_timeout.count() << "\n";
  out << "slab-max-connections = " << c.daemon.slab_broker.max_connections << "\n";
  out << "slab-max-pending-per-uid = " << c.daemon.slab_broker.max_pending_per_uid << "\n";
  out << "slab-grant-threads = " << c.daemon.slab_broker.grant_threads
      << (c.daemon.slab_broker.grant_threads == 0 ? "  # one per core, 1 to 16" : "") << "\n";
  out << "drain-timeout = " << c.drain_timeout.count() << "\n";
  out << "ready-file =" << Quoted(c.ready_file) << "\n";
  out << "log-level = " << c.log_level << "\n";
  // Hidden test-only settings, only when set (--help and the docs leave them out).
  if (c.host_fault_after_ops_for_test != 0) {
    out << "host-fault-after-ops-for-test = " << c.host_fault_after_ops_for_test << "\n";
  }
  if (c.host_rebuild_fails_for_test) out << "host-rebuild-fails-for-test = true\n";
  return out.str();
}

}  // namespace ferry
