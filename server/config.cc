#include "config.h"

#include <charconv>
#include <functional>
#include <map>

namespace ferry {
namespace {

Result<uint64_t> ParseUnsigned(const std::string& name, const std::string& text) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
    return Status(ErrorKind::kInvalidArgument, "--" + name + ": not a number: " + text);
  }
  return v;
}

}  // namespace

Result<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return Status(ErrorKind::kInvalidArgument, "empty size");
  uint64_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': mult = 1ull << 10; digits.pop_back(); break;
    case 'M': case 'm': mult = 1ull << 20; digits.pop_back(); break;
    case 'G': case 'g': mult = 1ull << 30; digits.pop_back(); break;
    default: break;
  }
  FERRY_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned("size", digits));
  uint64_t out = 0;
  if (!CheckedMul(v, mult, &out)) return Status(ErrorKind::kInvalidArgument, "size overflows");
  return out;
}

std::string FlagsHelp() {
  return R"(ferryd: the ferry GPU daemon (one process per GPU)

  --device N                 GPU ordinal to serve (default 0)
  --backend host|cuda|auto   device backend (default auto: CUDA when a GPU is visible)
  --listen ENDPOINT          unix:PATH or tcp:HOST:PORT (port 0 picks one); repeatable
                             (default unix:/run/ferry/ferryd-<N>.sock)
  --allow-insecure-remote    allow plaintext TCP on non-loopback addresses (development)
  --session-quota SIZE       default device-memory quota per session (default 1G)
  --max-session-quota SIZE   largest quota a client may ask for (default 16G)
  --max-in-flight N          default submits in flight per session (default 64)
  --max-sessions N           sessions open at once (default 1024)
  --device-memory-cap SIZE   device memory all sessions together may hold (default: all)
  --host-memory SIZE         emulated device memory of the host backend (default 8G)
  --max-message SIZE         largest gRPC message (default 64M)
  --executor-threads N       session executor threads (default: one per core, >= 2)
  --drain-timeout MS         on SIGTERM, how long open sessions may run on (default 10000)
  --ready-file PATH          write the bound endpoints there once serving
  --log-level LEVEL          trace|debug|info|warn|error (default info)
  --version, --help
)";
}

Result<DaemonConfig> ParseFlags(const std::vector<std::string>& args) {
  DaemonConfig c;
  c.daemon.session_defaults.device_bytes_quota = 1ull << 30;
  c.daemon.session_defaults.max_in_flight_submits = 64;
  bool listen_given = false;

  using Setter = std::function<Status(const std::string&)>;
  auto bytes = [](uint64_t* out) {
    return [out](const std::string& v) -> Status {
      FERRY_ASSIGN_OR_RETURN(*out, ParseBytes(v));
      return Status::Ok();
    };
  };
  std::map<std::string, Setter> with_value = {
      {"device",
       [&](const std::string& v) -> Status {
         FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned("device", v));
         if (n > 1024) return Status(ErrorKind::kInvalidArgument, "--device: out of range");
         c.device = static_cast<int>(n);
         return Status::Ok();
       }},
      {"backend",
       [&](const std::string& v) -> Status {
         if (v != "host" && v != "cuda" && v != "auto") {
           return Status(ErrorKind::kInvalidArgument, "--backend: host, cuda or auto");
         }
         c.backend = v;
         return Status::Ok();
       }},
      {"listen",
       [&](const std::string& v) -> Status {
         if (!listen_given) c.daemon.listen.clear();
         listen_given = true;
         c.daemon.listen.push_back(v);
         return Status::Ok();
       }},
      {"session-quota", bytes(&c.daemon.session_defaults.device_bytes_quota)},
      {"max-session-quota", bytes(&c.daemon.max_device_bytes_quota)},
      {"device-memory-cap", bytes(&c.daemon.device_bytes_cap)},
      {"host-memory", bytes(&c.host.memory_bytes)},
      {"max-message", bytes(&c.daemon.max_message_bytes)},
      {"max-in-flight",
       [&](const std::string& v) -> Status {
         FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned("max-in-flight", v));
         if (n == 0 || n > 65536) {
           return Status(ErrorKind::kInvalidArgument, "--max-in-flight: 1..65536");
         }
         c.daemon.session_defaults.max_in_flight_submits = static_cast<uint32_t>(n);
         return Status::Ok();
       }},
      {"max-sessions",
       [&](const std::string& v) -> Status {
         FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned("max-sessions", v));
         if (n == 0 || n > 1000000) {
           return Status(ErrorKind::kInvalidArgument, "--max-sessions: 1..1000000");
         }
         c.daemon.max_sessions = static_cast<uint32_t>(n);
         return Status::Ok();
       }},
      {"executor-threads",
       [&](const std::string& v) -> Status {
         FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned("executor-threads", v));
         if (n > 1024) return Status(ErrorKind::kInvalidArgument, "--executor-threads");
         c.daemon.executor_threads = static_cast<int>(n);
         return Status::Ok();
       }},
      {"drain-timeout",
       [&](const std::string& v) -> Status {
         FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned("drain-timeout", v));
         c.drain_timeout = std::chrono::milliseconds(n);
         return Status::Ok();
       }},
      {"ready-file",
       [&](const std::string& v) -> Status {
         c.ready_file = v;
         return Status::Ok();
       }},
      {"log-level",
       [&](const std::string& v) -> Status {
         c.log_level = v;
         return Status::Ok();
       }},
  };
  std::map<std::string, std::function<void()>> switches = {
      {"allow-insecure-remote", [&] { c.daemon.allow_insecure_remote = true; }},
      {"help", [&] { c.show_help = true; }},
      {"version", [&] { c.show_version = true; }},
  };

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      return Status(ErrorKind::kInvalidArgument, "unexpected argument: " + a);
    }
    std::string name = a.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (auto s = switches.find(name); s != switches.end()) {
      if (has_value) return Status(ErrorKind::kInvalidArgument, "--" + name + " takes no value");
      s->second();
      continue;
    }
    auto f = with_value.find(name);
    if (f == with_value.end()) {
      return Status(ErrorKind::kInvalidArgument, "unknown flag --" + name);
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return Status(ErrorKind::kInvalidArgument, "--" + name + " needs a value");
      }
      value = args[++i];
    }
    FERRY_RETURN_IF_ERROR(f->second(value));
  }
  if (!listen_given) {
    c.daemon.listen = {"unix:/run/ferry/ferryd-" + std::to_string(c.device) + ".sock"};
  }
  return c;
}

}  // namespace ferry
