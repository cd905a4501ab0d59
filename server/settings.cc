#include "settings.h"

#include <charconv>
#include <map>
#include <set>
#include <sstream>

#include "rpc/access.h"
#include "session/copy_turns.h"
#include "session/registry.h"

namespace ferry {

namespace settings_internal {

Setting Declare(std::string name, std::string arg) {
  Setting s;
  s.name = std::move(name);
  s.arg = std::move(arg);
  return s;
}

Status Invalid(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}

Result<uint64_t> ParseCount(const std::string& text, uint64_t lo, uint64_t hi) {
  FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseUnsigned(text));
  if (n < lo || n > hi) {
    return Invalid("out of range " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return n;
}

std::string JoinChoices(const std::vector<std::string>& choices) {
  std::string out;
  for (const std::string& choice : choices) out += (out.empty() ? "" : "|") + choice;
  return out;
}

}  // namespace settings_internal

using settings_internal::Invalid;

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

Setting Setting::Help(std::string text) && {
  help = std::move(text);
  return std::move(*this);
}

Setting Setting::Arg(std::string text) && {
  arg = std::move(text);
  return std::move(*this);
}

Setting Setting::Note(const char* value, std::string meaning) && {
  notes.push_back({{value}, std::move(meaning)});
  return std::move(*this);
}

Setting Setting::Note(std::vector<std::string> values, std::string meaning) && {
  notes.push_back({std::move(values), std::move(meaning)});
  return std::move(*this);
}

Setting Setting::DerivedDefault(std::string text) && {
  derived_default = std::move(text);
  return std::move(*this);
}

Setting Setting::Quoted() && {
  quoted = true;
  return std::move(*this);
}

Setting Setting::CommandLineOnly() && {
  scope = SettingScope::kCommandLine;
  return std::move(*this);
}

Setting Setting::HiddenForTest() && {
  scope = SettingScope::kHiddenForTest;
  return std::move(*this);
}

const SettingNote* Setting::NoteFor(const std::string& value) const {
  for (const SettingNote& note : notes) {
    for (const std::string& v : note.values) {
      if (v == value) return &note;
    }
  }
  return nullptr;
}

const DaemonConfig& DefaultConfig() {
  static const DaemonConfig* config = new DaemonConfig();
  return *config;
}

const Setting* FindSetting(const std::string& name) {
  static const auto* by_name = [] {
    auto* map = new std::map<std::string, const Setting*, std::less<>>();
    for (const Setting& s : SettingsTable()) map->emplace(s.name, &s);
    return map;
  }();
  auto it = by_name->find(name);
  return it == by_name->end() ? nullptr : it->second;
}

std::string DocumentedDefault(const Setting& setting) {
  if (!setting.derived_default.empty()) return setting.derived_default;
  std::string out;
  for (const std::string& v : setting.get(DefaultConfig())) out += (out.empty() ? "" : ", ") + v;
  return out;
}

namespace {

// Where --help's text column starts, and how wide its lines may be.
constexpr size_t kHelpColumn = 29;
constexpr size_t kHelpWidth = 92;

// A note's values as --help names them: "0", "0 or 1", "\"\"" for the empty value.
std::string NoteValues(const SettingNote& note) {
  std::string out;
  for (size_t i = 0; i < note.values.size(); ++i) {
    if (i > 0) out += i + 1 == note.values.size() ? " or " : ", ";
    out += note.values[i].empty() ? "\"\"" : note.values[i];
  }
  return out;
}

// "default V: its meaning; W: another value's meaning", or "default: none" for an empty
// default (the empty value's note, if it has one, instead of "none").
std::string DefaultPhrase(const Setting& s) {
  const std::string d = DocumentedDefault(s);
  const SettingNote* own = s.NoteFor(d);
  std::string out = "default";
  if (d.empty()) {
    out += ": " + (own ? own->meaning : "none");
  } else {
    out += " " + d + (own ? ": " + own->meaning : "");
  }
  for (const SettingNote& note : s.notes) {
    if (&note != own) out += "; " + NoteValues(note) + ": " + note.meaning;
  }
  return out;
}

// `text`'s words on lines that start at kHelpColumn (the first after `first`, which is
// padded to it or followed by two blanks) and end by kHelpWidth. A word too long for a line
// is broken after a comma where it has one.
std::string Wrap(const std::string& first, const std::string& text) {
  std::string out = first;
  out += first.size() + 2 <= kHelpColumn ? std::string(kHelpColumn - first.size(), ' ') : "  ";
  size_t column = out.size();
  bool line_empty = true;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    while (true) {
      const size_t need = word.size() + (line_empty ? 0 : 1);
      if (column + need <= kHelpWidth) {
        if (!line_empty) out += ' ';
        out += word;
        column += need;
        line_empty = false;
        break;
      }
      // Break a long word after its last comma that fits, else start a new line for it.
      const size_t room = kHelpWidth - column - (line_empty ? 0 : 1);
      const size_t comma = word.size() > room && room > 0 ? word.rfind(',', room - 1) : word.npos;
      if (comma != word.npos && column + comma + 2 <= kHelpWidth) {
        if (!line_empty) out += ' ';
        out += word.substr(0, comma + 1);
        word = word.substr(comma + 1);
      } else if (line_empty) {  // nowhere to break it: it overflows its own line
        out += word;
        column += word.size();
        line_empty = false;
        break;
      }
      out += "\n" + std::string(kHelpColumn, ' ');
      column = kHelpColumn;
      line_empty = true;
    }
  }
  return out + "\n";
}

}  // namespace

std::string HelpEntry(const Setting& setting) {
  std::string first = "  --" + setting.name;
  if (!setting.arg.empty()) first += " " + setting.arg;
  std::string text = setting.help;
  if (setting.scope == SettingScope::kSetting) {
    // "(text) (default 1)" reads as "(text; default 1)".
    if (!text.empty() && text.back() == ')') {
      text.back() = ';';
      text += " " + DefaultPhrase(setting) + ")";
    } else {
      text += " (" + DefaultPhrase(setting) + ")";
    }
  }
  return Wrap(first, text);
}

std::string DumpLines(const Setting& setting, const DaemonConfig& config) {
  std::string out;
  for (const std::string& v : setting.get(config)) {
    out += setting.name + " =";
    if (!v.empty()) {
      if (setting.quoted) {
        out += " \"";
        for (char ch : v) {
          if (ch == '"' || ch == '\\') out += '\\';
          out += ch;
        }
        out += "\"";
      } else {
        out += " " + v;
      }
      // An empty value takes no note: the parser would read it as the value.
      if (const SettingNote* note = setting.NoteFor(v)) out += "  # " + note->meaning;
    }
    out += "\n";
  }
  return out;
}

// ---- The table ----

namespace {

// The member of DaemonConfig a setting lives in, as the kinds take it.
#define FERRY_FIELD(path) \
  [](auto& c) -> auto& { return c.path; }

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

Status CheckMetricsListen(const std::string& v) {
  if (v.empty()) return Status::Ok();
  size_t colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) return Invalid("expected HOST:PORT");
  auto port = ParseUnsigned(v.substr(colon + 1));
  if (!port.ok() || *port > 65535) return Invalid("bad port in " + v);
  return Status::Ok();
}

// Names are resolved here too, so --check-config finds an unknown user or group.
Status CheckAccessList(const std::string& v) { return rpc::AccessList::Parse(v).status(); }

Status CheckGroup(const std::string& v) {
  if (v.empty()) return Status::Ok();
  return rpc::ResolveGroup(v).status();
}

Status AddEndpoint(std::vector<std::string>& listen, const std::string& v,
                   const std::vector<std::string>&) {
  FERRY_RETURN_IF_ERROR(CheckEndpoint(v));
  listen.push_back(v);
  return Status::Ok();
}

// The built-in default rule stays first: a default: rule replaces it, once per source; other
// selectors follow, one rule each.
Status AddUidLimitRule(std::vector<session::UidLimitRule>& rules, const std::string& v,
                       const std::vector<std::string>& earlier) {
  FERRY_ASSIGN_OR_RETURN(session::UidLimitRule rule, session::ParseUidLimitRule(v));
  if (rule.match == session::UidLimitRule::Match::kDefault) {
    for (const std::string& e : earlier) {
      auto given = session::ParseUidLimitRule(e);
      if (given.ok() && given->match == session::UidLimitRule::Match::kDefault) {
        return Invalid("a default: rule is already given");
      }
    }
    rules.front() = rule;
    return Status::Ok();
  }
  for (size_t i = 1; i < rules.size(); ++i) {
    if (rules[i].match == rule.match && rules[i].id == rule.id && rules[i].tenant == rule.tenant) {
      return Invalid("a rule for the same uid, gid or remote is already given: " + v);
    }
  }
  rules.push_back(rule);
  return Status::Ok();
}

bool InFlightBytesOk(uint64_t n) { return n == 0 || n >= (16ull << 20); }

constexpr uint64_t kMaxU64 = ~0ull;

// The settings of where ferryd listens, whom it lets in, and its metrics endpoint.
std::vector<Setting> EndpointAndAccessSettings() {
  return {
      Text("config", "PATH", FERRY_FIELD(config_path))
          .CommandLineOnly()
          .Help(std::string("read settings from PATH first (default ") + kDefaultConfigPath +
                " when it exists; --config= reads none). Lines are \"name = value\" with the "
                "flag names below; flags win"),
      Action("check-config", FERRY_FIELD(check_config))
          .Help("validate flags and config file, print the effective configuration and exit "
                "(0 valid, 2 invalid)"),
      Count("device", FERRY_FIELD(device), 0, 1024).Help("GPU ordinal to serve"),
      Choice("backend", FERRY_FIELD(backend), {"host", "cuda", "auto"})
          .Help("device backend")
          .Note("auto", "CUDA when a GPU is visible"),
      Repeated("listen", "ENDPOINT", FERRY_FIELD(daemon.listen), AddEndpoint,
               [](const std::string& ep) { return ep; })
          .Help("unix:PATH or tcp:HOST:PORT (port 0 picks one); repeatable")
          .Quoted()
          .DerivedDefault(kDefaultListen),
      Switch("allow-insecure-remote", FERRY_FIELD(daemon.allow_insecure_remote))
          .Help("allow TCP endpoints that authenticate no client (neither --token-file nor "
                "--tls-client-ca), loopback included: any peer that reaches one gets in "
                "(development only)"),
      Text("tls-cert", "PATH", FERRY_FIELD(daemon.tls.cert))
          .Help("PEM certificate chain: TCP endpoints speak TLS"),
      Text("tls-key", "PATH", FERRY_FIELD(daemon.tls.key)).Help("PEM private key of --tls-cert"),
      Text("tls-client-ca", "PATH", FERRY_FIELD(daemon.tls.client_ca))
          .Help("PEM CA bundle: TCP clients must present a certificate it signed (mutual TLS)"),
      Text("token-file", "PATH", FERRY_FIELD(daemon.token_file))
          .Help("TCP clients must send \"authorization: Bearer <token>\" with a token of PATH, "
                "one per line: TOKEN (shared: identity remote) or NAME TOKEN (tenant NAME: "
                "identity remote:NAME, limits of its own); Unix endpoints stay plain"),
      Switch("allow-remote-raw-kernels", FERRY_FIELD(daemon.allow_remote_raw_kernels))
          .Help("let TCP clients load and launch raw kernels (else refused); such a client is "
                "trusted with every session's data"),
      Text("raw-kernels", "LIST", FERRY_FIELD(daemon.raw_kernels), CheckAccessList)
          .Help("local peers that may load and launch raw kernels (PTX, CUBIN, CUDA C++): "
                "comma list of uid:USER and gid:GROUP, names or numbers, e.g. "
                "uid:1000,gid:gpuadmin; others get PERMISSION_DENIED. They are trusted with "
                "every session's data"),
      Text("admins", "LIST", FERRY_FIELD(daemon.admins), CheckAccessList)
          .Help("local peers that may drain the daemon and list every session, besides the "
                "daemon's own uid: comma list of uid:USER and gid:GROUP")
          .Note("", "leaves root out, as a host whose containers run as root needs"),
      Text("admin-group", "GROUP", FERRY_FIELD(daemon.admin_group), CheckGroup)
          .Help("a group added to --admins"),
      Text("metrics-listen", "HOST:PORT", FERRY_FIELD(daemon.metrics_listen), CheckMetricsListen)
          .Help("serve Prometheus metrics at http://HOST:PORT/metrics; port 0 picks one")
          .Note("", "off"),
      Text("metrics-token-file", "PATH", FERRY_FIELD(daemon.metrics_token_file))
          .Help("requests to --metrics-listen must send \"Authorization: Bearer <token>\" with "
                "a token of PATH, one per line; others get 401")
          .Note("", "none, the metrics are open to whoever reaches them"),
      Count("metrics-max-identities", FERRY_FIELD(daemon.metrics_max_identities), 1, 65536)
          .Help("usage identities (uid + client name) with their own accounting and metrics "
                "labels, 1..65536; more fold into uid=\"other\""),
      Millis("metrics-identity-idle-timeout", FERRY_FIELD(daemon.metrics_identity_idle_timeout), 0,
             86400000)
          .Help("a usage identity none of whose sessions has been open for this long is "
                "forgotten: its series leave the metrics (the daemon's totals keep its counts) "
                "and its place is free for a new one, 0..86400000")
          .Note("0", "never"),
  };
}

// The settings of what one session may hold.
std::vector<Setting> SessionLimitSettings() {
  return {
      Size("session-quota", FERRY_FIELD(daemon.session_defaults.device_bytes_quota))
          .Help("default device-memory quota per session"),
      Size("max-session-quota", FERRY_FIELD(daemon.max_device_bytes_quota))
          .Help("largest quota a client may ask for"),
      Count("max-in-flight", FERRY_FIELD(daemon.session_defaults.max_in_flight_submits), 1, 65536)
          .Help("default submits in flight per session"),
      // At least libferry's inline transfer messages (8 MiB) and what they are charged.
      Size("session-in-flight-bytes", FERRY_FIELD(daemon.session_defaults.max_in_flight_bytes),
           {InFlightBytesOk, "0 (no limit) or at least 16M"})
          .Help("bytes a session's submits may hold in the daemon, read and not yet answered "
                "(inline uploads, downloads, ops); at the limit the daemon stops reading the "
                "session; 0 or at least 16M")
          .Note("0", "no limit"),
      Size("in-flight-bytes", FERRY_FIELD(daemon.in_flight_bytes),
           {InFlightBytesOk, "0 (no limit) or at least 16M"})
          .Help("bytes all sessions' submits may hold in the daemon together; a submit past it "
                "is refused with QUOTA_EXCEEDED, and a session holding some stops reading when "
                "less than max-message is left; 0 or at least 16M")
          .Note("0", "no limit"),
      Count("session-max-submit-ops", FERRY_FIELD(daemon.session_defaults.max_ops_per_submit), 0,
            1ull << 32)
          .Help("ops one submit may carry, each LaunchGraph counted as the ops its graph "
                "recorded; past it the submit is refused with QUOTA_EXCEEDED")
          .Note("0", "no limit"),
      Count("session-max-tensors", FERRY_FIELD(daemon.session_defaults.max_tensors), 0, 1ull << 32)
          .Help("live tensors per session")
          .Note("0", "no limit"),
      Count("session-max-modules", FERRY_FIELD(daemon.session_defaults.max_modules), 0, 1ull << 32)
          .Help("loaded modules per session")
          .Note("0", "no limit"),
      Count("session-max-graphs", FERRY_FIELD(daemon.session_defaults.max_graphs), 0, 1ull << 32)
          .Help("recorded graphs per session")
          .Note("0", "no limit"),
      Count("session-max-graph-ops", FERRY_FIELD(daemon.session_defaults.max_graph_ops), 0,
            1ull << 32)
          .Help("ops recorded into a session's live graphs, together")
          .Note("0", "no limit"),
      Count("max-objects", FERRY_FIELD(daemon.max_objects), 0, 1ull << 40)
          .Help("live tensors, modules and graphs and ops recorded into graphs all sessions "
                "may hold together; a submit that could pass it is refused with QUOTA_EXCEEDED")
          .Note("0", "no limit"),
  };
}

// The settings of what all sessions, streams and connections together may hold.
std::vector<Setting> DaemonLimitSettings() {
  return {
      CountOrAuto("max-sessions", FERRY_FIELD(daemon.max_sessions), 1, 1000000)
          .Help("sessions open at once")
          .Note("auto", "an eighth of the descriptor limit, at most 1024"),
      Count("max-sessionless-streams", FERRY_FIELD(daemon.sessionless_streams.total), 0, 1000000)
          .Help("session streams that carry no session (before their Open, or ended and not "
                "yet closed by their client), held at once; past it a new stream is reset "
                "(libferry retries)")
          .Note("0", "no limit"),
      Count("max-sessionless-streams-per-uid", FERRY_FIELD(daemon.sessionless_streams.per_identity),
            0, 1000000)
          .Help("the same, per uid (every TCP peer together counts as one, \"remote\")")
          .Note("0", "no limit"),
      CountOrAuto("max-local-connections", FERRY_FIELD(daemon.local_connections.total), 0, 1000000)
          .Help("connections to the Unix endpoints held at once; past it a new one is closed "
                "at once (root and ferryd's uid are never refused)")
          .Note("auto", "half the descriptor limit, at most 4096")
          .Note("0", "no limit"),
      CountOrAuto("max-local-connections-per-uid", FERRY_FIELD(daemon.local_connections.per_uid), 0,
                  1000000)
          .Help("the same, per uid")
          .Note("auto", "a quarter of max-local-connections, at most 1024")
          .Note("0", "no limit"),
      Millis("open-timeout", FERRY_FIELD(daemon.open_timeout), 0, 600000)
          .Help("a session stream that has not sent Open by then is ended DEADLINE_EXCEEDED, "
                "0..600000")
          .Note("0", "never"),
      Repeated("uid-limits", "RULE", FERRY_FIELD(daemon.uid_limits), AddUidLimitRule,
               session::FormatUidLimitRule)
          .Help("per-identity limits, repeatable: SELECTOR:KEY=VALUE,... with SELECTOR "
                "default, remote (each TCP identity), remote:NAME (a token-file tenant), uid:N "
                "or gid:N and KEY sessions, device, pinned, inflight-bytes, objects, queued (N, "
                "SIZE, P% of the daemon's) or inflight (N); VALUE none: no limit. Root (while "
                "in --admins) and ferryd's own uid are exempt unless a uid: rule names them"),
      Size("device-memory-cap", FERRY_FIELD(daemon.device_bytes_cap))
          .Help("device memory all sessions together may hold")
          .Note("0", "all of the device's memory"),
      Size("host-memory", FERRY_FIELD(host.memory_bytes))
          .Help("emulated device memory of the host backend"),
      // gRPC takes the limit as an int.
      Size("max-message", FERRY_FIELD(daemon.max_message_bytes),
           {[](uint64_t n) { return n >= 4096 && n <= (1ull << 31) - 1; }, "out of range 4K..2G-1"})
          .Help("largest gRPC message"),
  };
}

// The settings of the device, its compiler and the transports.
std::vector<Setting> DeviceSettings() {
  return {
      Bool("rpc-bandwidth-probe", FERRY_FIELD(daemon.rpc_bandwidth_probe))
          .Help("let gRPC grow each TCP stream's receive window to the measured bandwidth-delay "
                "product (16M or more): faster large inline transfers over high-latency links, "
                "but each stream the daemon stops reading may then buffer that much; Unix "
                "endpoints never probe"),
      Millis("tcp-idle-timeout", FERRY_FIELD(daemon.tcp_idle_timeout), 0, 86400000)
          .Help("a TCP connection that carries no call for this long, or has not finished its "
                "handshake (TLS, HTTP/2 settings) by then, is closed; clients reconnect when "
                "they next call, 0..86400000")
          .Note("0", "gRPC's, no idle limit and 120 s handshakes"),
      Count("executor-threads", FERRY_FIELD(daemon.executor_threads), 0, 1024)
          .Help("session executor threads; as many long-lane threads come with them, for long "
                "work: large graphs' instantiations, module loads, inline transfers without "
                "staging")
          .Note("0", "a quarter of the cores, at least 2"),
      Count("cuda-work-queues", FERRY_FIELD(cuda_work_queues), 0, 32)
          .Help("hardware work queues of the CUDA context, 0..32; fewer save host memory "
                "(docs/operations.md)")
          .Note("0", "CUDA's default, 8"),
      Choice("cuda-module-loading", FERRY_FIELD(cuda_module_loading),
             {"eager", "lazy", "environment"})
          .Help("eager: every kernel is loaded when the CUDA context is made (cuBLAS's too, "
                "opened then); lazy: on its first launch, which may wait for every session's "
                "queued work; environment: CUDA_MODULE_LOADING's, else CUDA's (lazy); see "
                "docs/operations.md"),
      Millis("nvrtc-timeout", FERRY_FIELD(cuda.nvrtc_timeout), 100, 3600ull * 1000)
          .Help("wall-clock (and CPU) time one CUDA C++ module's compile may take, "
                "100..3600000"),
      Size("nvrtc-memory", FERRY_FIELD(cuda.nvrtc_memory),
           {[](uint64_t n) { return n >= (256ull << 20); }, "at least 256M"})
          .Help("address space of one CUDA C++ module's compile, at least 256M"),
      Count("nvrtc-concurrency", FERRY_FIELD(cuda.nvrtc_concurrency), 0, 256)
          .Help("CUDA C++ compiles at once, 0..256; one more is refused with BUSY; at most the "
                "executor threads less one")
          .Note("0", "a quarter of the cores, at least 1"),
      Bool("fuse-elementwise", FERRY_FIELD(cuda.fuse_elementwise))
          .Help("run each run of consecutive f32/f64 fill, add, sub, mul, div, scale and axpy "
                "ops of a kernel batch or a graph as one kernel where the results are the "
                "same"),
      Count("streams-ahead", FERRY_FIELD(cuda.streams_ahead), 0, 256)
          .Help("fresh CUDA streams made ahead for the next sessions to open on, 0..256; closed "
                "sessions' streams are destroyed on the same thread")
          .Note("0", "made at the open, destroyed at the close"),
  };
}

// The settings of how sessions share the device: turns, weights, batches, queued commands.
std::vector<Setting> SchedulingSettings() {
  return {
      Count("copy-turns", FERRY_FIELD(daemon.copy_turns), 0, 1024)
          .Help("submits copying copy-turn-size or more one way that run at once, per "
                "direction; the rest wait their turn, one identity at most half while another "
                "waits")
          .Note("0", "no limit"),
      Size("copy-turn-size", FERRY_FIELD(daemon.copy_turn_bytes))
          .Help("bytes a submit copies one way from which it takes a turn"),
      Count("device-turns", FERRY_FIELD(daemon.device_turns), 0, 1024)
          .Help("submits of all sessions on the device at once, 0..1024; the rest wait, ordered "
                "by uid-weights")
          .Note("0", "no limit"),
      Parsed("uid-weights", "LIST", FERRY_FIELD(daemon.uid_weights), session::ParseUidWeights,
             session::FormatUidWeights)
          .Help("uid:N=W,remote=W,remote:NAME=W,...: weights (1..1000, default 1) by which "
                "waiting submits of different uids get copy and device turns, up to half of "
                "the turns each while another waits")
          .Note("", "none, every identity weighs 1"),
      Count("kernel-batch", FERRY_FIELD(daemon.session_defaults.kernel_batch), 0, 65536)
          .Help("a run of N or more kernel ops (fill, binary, scale, axpy) in one submit goes to "
                "the device as one batch: on CUDA one graph launch, its graph kept and updated")
          .Note("0", "never"),
      Count("submit-run", FERRY_FIELD(daemon.session_defaults.submit_run), 0, 1024)
          .Help("submits taken from a submit ring at once go to the device as runs of at most "
                "N: one completion watch per run, and one batch for its kernel-only submits "
                "when it holds kernel-batch ops or more")
          .Note({"0", "1"}, "each submit on its own"),
      Millis("staging-wait", FERRY_FIELD(daemon.session_defaults.staging_wait_ms), 0, 60000)
          .Help("how long a submit waits for staging room for its inline bytes before it copies "
                "directly")
          .Note("0", "never waits"),
      Count("session-queued-commands", FERRY_FIELD(daemon.session_defaults.max_queued_commands), 0,
            960)
          .Help("device commands a session keeps on its stream, 0..960; a submit with more "
                "enqueues in parts as earlier ones complete, so no executor thread waits in "
                "CUDA's launch queue")
          .Note("0", "no limit"),
      Count("queued-commands", FERRY_FIELD(daemon.queued_commands), 0, 1000000)
          .Help("device commands all sessions keep queued together, below one hardware work "
                "queue's room, whatever work queue CUDA gives each stream")
          .Note("0", "no limit"),
  };
}

// The settings of the shared-memory slabs and the slab socket.
std::vector<Setting> SharedMemorySettings() {
  return {
      Size("slab-size", FERRY_FIELD(daemon.slab_pool.slab_size),
           {[](uint64_t n) { return n != 0 && n % 4096 == 0 && n <= (1ull << 40); },
            "a non-zero multiple of 4K"})
          .Help("size of a shared-memory slab for local clients"),
      Size("pinned-budget", FERRY_FIELD(daemon.slab_pool.budget))
          .Help("pinned shared memory all slabs may take"),
      Count("initial-slabs", FERRY_FIELD(daemon.slab_pool.initial_slabs), 0, 65536)
          .Help("fresh slabs made and registered at start, and kept ready (made again ahead as "
                "they are handed out)"),
      Size("session-pinned-quota", FERRY_FIELD(daemon.session_pinned_quota))
          .Help("slab bytes one session may hold")
          .Note("0", "no limit"),
      Size("submit-ring", FERRY_FIELD(daemon.submit_ring_bytes),
           {[](uint64_t n) {
              return n == 0 || (n >= 4096 && n <= (16ull << 20) && (n & (n - 1)) == 0);
            },
            "0 (off) or a power of two from 4K to 16M"})
          .Help("each local session's submit ring, through which its client sends messages by "
                "shared memory instead of gRPC; 0 or a power of two from 4K to 16M")
          .Note("0", "off"),
      Count("staging-slabs", FERRY_FIELD(daemon.staging_slabs), 0, 65536)
          .Help("pool slabs the daemon takes to stage inline transfers (all of a remote "
                "client's, a local one's small ones), when they need them; a submit waits for "
                "room")
          .Note("0", "none"),
      Millis("slab-hello-timeout", FERRY_FIELD(daemon.slab_broker.hello_timeout), 1, 60000)
          .Help("slab-socket connections that send no hello by then are closed, 1..60000"),
      Count("slab-max-connections", FERRY_FIELD(daemon.slab_broker.max_connections), 1, 1000000)
          .Help("slab-socket connections open at once"),
      Count("slab-max-pending-per-uid", FERRY_FIELD(daemon.slab_broker.max_pending_per_uid), 1,
            1000000)
          .Help("slab-socket connections of one uid not yet past their hello, and of those "
                "closed with answers unread"),
      Count("slab-grant-threads", FERRY_FIELD(daemon.slab_broker.grant_threads), 0, 64)
          .Help("threads that answer slab acquires, each making a slab when none is ready, "
                "0..64")
          .Note("0", "one per core, 1 to 16"),
  };
}

// The settings of the process: drain, readiness, logs, and what tests set.
std::vector<Setting> ProcessSettings() {
  return {
      Millis("drain-timeout", FERRY_FIELD(drain_timeout), 0, 24ull * 3600 * 1000)
          .Help("on SIGTERM, how long open sessions may run on"),
      Text("ready-file", "PATH", FERRY_FIELD(ready_file))
          .Help("write the bound endpoints there once serving"),
      Choice("log-level", FERRY_FIELD(log_level),
             {"trace", "debug", "info", "warn", "error", "critical", "off"})
          .Help("what ferryd logs, from the level named up"),
      Action("version", FERRY_FIELD(show_version)).Help("print ferryd's version and exit"),
      Action("help", FERRY_FIELD(show_help)).Help("print this help and exit"),
      // Arms a device fault on the host backend after N ops, for the fault-recovery
      // integration tests; 0: off.
      Count("host-fault-after-ops-for-test", FERRY_FIELD(host_fault_after_ops_for_test), 0, kMaxU64)
          .HiddenForTest(),
      // The host device cannot be rebuilt after a fault, so ferryd takes the restart path a
      // CUDA context needs (tests of that path).
      Bool("host-rebuild-fails-for-test", FERRY_FIELD(host_rebuild_fails_for_test)).HiddenForTest(),
  };
}

std::vector<Setting> MakeTable() {
  // Every row: the kind and its bounds, the member, the help, the values that mean something;
  // the groups in the order --help and the configuration dump list them.
  std::vector<Setting> table;
  for (auto group : {EndpointAndAccessSettings, SessionLimitSettings, DaemonLimitSettings,
                     DeviceSettings, SchedulingSettings, SharedMemorySettings, ProcessSettings}) {
    for (Setting& s : group()) table.push_back(std::move(s));
  }
  return table;
}

#undef FERRY_FIELD

}  // namespace

const std::vector<Setting>& SettingsTable() {
  static const std::vector<Setting>* table = new std::vector<Setting>(MakeTable());
  return *table;
}

}  // namespace ferry
