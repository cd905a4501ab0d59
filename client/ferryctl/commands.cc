#include "commands.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <istream>
#include <memory>
#include <ostream>
#include <sstream>
#include <thread>
#include <vector>

#include "admin_client.h"
#include "ferry/client.h"
#include "ferry/v1/admin.pb.h"
#include "output.h"

namespace ferry::ctl {
namespace {

using internal::RpcStatus;

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The client options that say how to reach the daemon securely: the TLS files and the
// bearer token of the command line; the rest libferry's defaults.
ClientOptions SecureClientOptions(const Options& options) {
  ClientOptions o;
  o.tls_ca_cert = options.tls_ca;
  o.tls_client_cert = options.tls_cert;
  o.tls_client_key = options.tls_key;
  o.bearer_token = options.token;
  return o;
}

// One connection to a daemon's Admin service; every call has the options' deadline. The
// channel (TLS, bearer token) is libferry's (client/src/admin_client.h).
class AdminConnection {
 public:
  explicit AdminConnection(const Options& options) {
    ClientOptions o = SecureClientOptions(options);
    auto client = internal::AdminClient::Create(FerryTarget(options.target), o, options.timeout);
    if (client.ok()) {
      client_ = std::move(*client);
    } else {
      setup_failure_ = RpcStatus{kSetupFailed, client.status().message()};
    }
  }

  // The code of a call that could not be made: the channel could not be set up.
  static constexpr int kSetupFailed = -1;

  RpcStatus Status(v1::StatusReply* reply) {
    return client_ ? client_->GetStatus(reply) : setup_failure_;
  }
  RpcStatus ListSessions(v1::ListSessionsReply* reply) {
    return client_ ? client_->ListSessions(reply) : setup_failure_;
  }
  RpcStatus Drain(v1::DrainReply* reply) {
    return client_ ? client_->Drain(reply) : setup_failure_;
  }
  // Return the status number (1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN) in *serving_status.
  RpcStatus HealthCheck(const std::string& service, int* serving_status) {
    return client_ ? client_->HealthCheck(service, serving_status) : setup_failure_;
  }

 private:
  std::unique_ptr<internal::AdminClient> client_;
  RpcStatus setup_failure_;
};

// Report a failed Admin call; return the exit code (always critical).
int ReportRpcFailure(const Options& options, const RpcStatus& s, std::ostream& err) {
  if (s.code == AdminConnection::kSetupFailed) {
    err << "ferryctl: " << s.message << "\n";
  } else if (s.code == static_cast<int>(Code::kUnavailable) ||
             s.code == static_cast<int>(Code::kDeadlineExceeded)) {
    err << "ferryctl: cannot reach ferryd at " << options.target << ": " << s.message << "\n";
  } else {
    err << "ferryctl: ferryd at " << options.target << " answered " << s.code << ": " << s.message
        << "\n";
  }
  return kExitCritical;
}

std::string StatusJson(const Options& options, const v1::StatusReply& r) {
  return JsonObject()
      .Add("target", options.target)
      .Add("version", r.version())
      .Add("backend", r.backend())
      .Add("device_ordinal", r.device_ordinal())
      .Add("device_name", r.device_name())
      .Add("device_uuid", r.device_uuid())
      .Add("driver_version", r.driver_version())
      .Add("device_total_bytes", r.device_total_bytes())
      .Add("device_free_bytes", r.device_free_bytes())
      .Add("device_bytes_in_use", r.device_bytes_in_use())
      .Add("uptime_ms", r.uptime_ms())
      .Add("sessions_open", r.sessions_open())
      .Add("sessions_total", r.sessions_total())
      .Add("submits_in_flight", r.submits_in_flight())
      .Add("submits_total", r.submits_total())
      .Add("ops_total", r.ops_total())
      .Add("bytes_uploaded_total", r.bytes_uploaded_total())
      .Add("bytes_downloaded_total", r.bytes_downloaded_total())
      .Add("live_tensors", r.live_tensors())
      .Add("draining", r.draining())
      .Add("device_resets", r.device_resets())
      .Add("last_fault", r.last_fault())
      .Add("last_recovery_ms", r.last_recovery_ms())
      .Add("slabs_total", r.slabs_total())
      .Add("slabs_in_use", r.slabs_in_use())
      .Add("slabs_kept", r.slabs_kept())
      .Add("slab_bytes", r.slab_bytes())
      .Add("slab_size", r.slab_size())
      .Add("staging_slabs", r.staging_slabs())
      .Add("staging_bytes_in_use", r.staging_bytes_in_use())
      .Add("copy_turns", r.copy_turns())
      .Add("copy_turns_waiting", r.copy_turns_waiting())
      .Add("copy_turn_waits_total", r.copy_turn_waits_total())
      .Add("submit_rings", r.submit_rings())
      .Add("submit_ring_messages_total", r.submit_ring_messages_total())
      .str();
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * static_cast<double>(part) / whole);
  return buf;
}

// --- health ------------------------------------------------------------------------------

enum class Level { kOk = 0, kWarning = 1, kCritical = 2 };

const char* LevelName(Level l) {
  switch (l) {
    case Level::kOk:
      return "OK";
    case Level::kWarning:
      return "WARNING";
    case Level::kCritical:
      return "CRITICAL";
  }
  return "?";
}

struct Check {
  std::string name;
  Level level = Level::kOk;
  std::string detail;
  std::string extra_json;  // more fields for --json, as ",\"k\":v..." (the canary's)
};

struct CanaryResult {
  bool ok = false;
  std::string detail;
  uint64_t elements = 0;
  uint64_t mismatches = 0;
  double connect_ms = 0, open_ms = 0, upload_ms = 0, compute_download_ms = 0, close_ms = 0;
  double total_ms = 0;
};

// The canary's f32 patterns x and y, multiples of 1/4 well inside f32's exact range, and
// the z = 2x + 0.5y every backend computes from them exactly.
struct CanaryPatterns {
  std::vector<float> x, y, expect;
};
CanaryPatterns MakeCanaryPatterns(uint64_t n) {
  CanaryPatterns p{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (uint64_t i = 0; i < n; ++i) {
    p.x[i] = static_cast<float>(i % 1021) * 0.25f - 127.5f;
    p.y[i] = static_cast<float>(i % 509) * 0.5f - 64.0f;
    p.expect[i] = 2.0f * p.x[i] + 0.5f * p.y[i];
  }
  return p;
}

// Upload the patterns into tx and ty, compute tz = 2x + 0.5y (scale then axpy), download it
// into *z and synchronize, timing the upload and the rest into r. False, with r.detail
// saying which step failed, when one did.
bool CanaryRoundTrip(Session& session, const CanaryPatterns& p, const Tensor& tx, const Tensor& ty,
                     const Tensor& tz, std::vector<float>* z, CanaryResult& r) {
  auto t = Clock::now();
  if (Status s = session.upload(tx, p.x); !s.ok()) {
    r.detail = "upload: " + s.ToString();
    return false;
  }
  if (Status s = session.upload(ty, p.y); !s.ok()) {
    r.detail = "upload: " + s.ToString();
    return false;
  }
  r.upload_ms = MillisSince(t);
  t = Clock::now();
  session.scale(tx, 2.0, tz);
  session.axpy(0.5, ty, tz);
  auto downloaded = session.download<float>(tz);
  r.compute_download_ms = MillisSince(t);
  if (!downloaded.ok()) {
    r.detail = "scale+axpy+download: " + downloaded.status().ToString();
    return false;
  }
  if (Status s = session.synchronize(); !s.ok()) {
    r.detail = "synchronize: " + s.ToString();
    return false;
  }
  *z = std::move(*downloaded);
  return true;
}

// The detail of a canary that got `z` back instead of `expect`: how many elements are wrong
// (into r.mismatches) and the first of them; "" when every element matches.
std::string CanaryMismatches(const std::vector<float>& z, const std::vector<float>& expect,
                             CanaryResult& r) {
  const uint64_t n = expect.size();
  uint64_t first_bad = n;
  for (uint64_t i = 0; i < n; ++i) {
    if (z[i] != expect[i]) {
      if (r.mismatches++ == 0) first_bad = i;
    }
  }
  if (r.mismatches == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%llu of %llu elements wrong; first at %llu: got %g, want %g",
                static_cast<unsigned long long>(r.mismatches), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(first_bad), static_cast<double>(z[first_bad]),
                static_cast<double>(expect[first_bad]));
  return buf;
}

// The detail of a canary that passed: what moved, and how long each step took.
std::string CanaryPassed(const CanaryResult& r) {
  const uint64_t n = r.elements;
  return std::to_string(n) + " f32 elements: uploaded " + HumanBytes(2 * n * sizeof(float)) +
         ", ran scale+axpy, downloaded " + HumanBytes(n * sizeof(float)) +
         ", every element matches; took " + HumanMillis(r.total_ms) + " (connect " +
         HumanMillis(r.connect_ms) + ", open " + HumanMillis(r.open_ms) + ", upload " +
         HumanMillis(r.upload_ms) + ", compute+download " + HumanMillis(r.compute_download_ms) +
         ", close " + HumanMillis(r.close_ms) + ")";
}

// Upload two known f32 patterns, z = 2x + 0.5y on the device (scale then axpy), download z
// and compare every element. The patterns are multiples of 1/4 well inside f32's exact
// range, so the result is exact on every backend: any difference is corruption.
CanaryResult RunCanary(const Options& options) {
  CanaryResult r;
  const uint64_t n = options.canary_elements;
  r.elements = n;
  auto start = Clock::now();
  const CanaryPatterns patterns = MakeCanaryPatterns(n);
  auto t = Clock::now();
  ClientOptions client_options = SecureClientOptions(options);
  client_options.client_name = "ferryctl-canary";
  client_options.connect_timeout = options.timeout;
  auto client = Client::connect(FerryTarget(options.target), client_options);
  r.connect_ms = MillisSince(t);
  if (!client.ok()) {
    r.detail = "connect: " + client.status().ToString();
    return r;
  }
  t = Clock::now();
  SessionOptions session_options;
  session_options.device_bytes_quota = 3 * n * sizeof(float) + (1u << 20);
  auto session = client->open_session(session_options);
  r.open_ms = MillisSince(t);
  if (!session.ok()) {
    r.detail = "open session: " + session.status().ToString();
    return r;
  }
  const Shape shape({static_cast<int64_t>(n)});
  Tensor tx = session->create_tensor<float>(shape);
  Tensor ty = session->create_tensor<float>(shape);
  Tensor tz = session->create_tensor<float>(shape);
  std::vector<float> z;
  if (!CanaryRoundTrip(*session, patterns, tx, ty, tz, &z, r)) return r;
  std::string mismatches = CanaryMismatches(z, patterns.expect, r);
  t = Clock::now();
  auto closed = session->close();
  r.close_ms = MillisSince(t);
  r.total_ms = MillisSince(start);
  if (r.mismatches > 0) {
    r.detail = mismatches;
    return r;
  }
  if (!closed.ok()) {
    r.detail = "close: " + closed.status().ToString();
    return r;
  }
  r.ok = true;
  r.detail = CanaryPassed(r);
  return r;
}

Check CanaryCheck(const Options& options, std::ostream& out) {
  Check c{"canary"};
  // Run it on a thread of its own so a daemon that hangs mid-transfer cannot hang a
  // monitoring probe: past the deadline ferryctl reports and exits.
  auto promise = std::make_shared<std::promise<CanaryResult>>();
  std::future<CanaryResult> future = promise->get_future();
  std::thread([promise, options] { promise->set_value(RunCanary(options)); }).detach();
  if (future.wait_for(options.canary_timeout) != std::future_status::ready) {
    c.level = Level::kCritical;
    c.detail = "no result within " + HumanMillis(options.canary_timeout.count());
    if (options.json) {
      out << JsonObject()
                 .Add("target", options.target)
                 .Add("status", "critical")
                 .Add("exit_code", kExitCritical)
                 .AddRaw("checks", JsonArray({JsonObject()
                                                  .Add("name", c.name)
                                                  .Add("status", "critical")
                                                  .Add("detail", c.detail)
                                                  .str()}))
                 .str()
          << "\n";
    } else {
      out << "CRITICAL  canary  " << c.detail << "\nhealth: CRITICAL\n";
    }
    out.flush();
    std::fflush(nullptr);
    std::_Exit(kExitCritical);  // the canary thread is stuck in a call: do not wait for it
  }
  CanaryResult r = future.get();
  c.level = r.ok ? Level::kOk : Level::kCritical;
  c.detail = r.detail;
  char timing[256];
  std::snprintf(timing, sizeof(timing),
                ",\"elements\":%llu,\"mismatches\":%llu,\"total_ms\":%.3f,\"connect_ms\":%.3f,"
                "\"open_ms\":%.3f,\"upload_ms\":%.3f,\"compute_download_ms\":%.3f,"
                "\"close_ms\":%.3f",
                static_cast<unsigned long long>(r.elements),
                static_cast<unsigned long long>(r.mismatches), r.total_ms, r.connect_ms, r.open_ms,
                r.upload_ms, r.compute_download_ms, r.close_ms);
  c.extra_json = timing;
  return c;
}

}  // namespace

bool ReadToken(std::istream& in, std::string* token, std::string* problem) {
  // Read one byte past the limit, so a longer input (or /dev/zero) is found without
  // reading it all.
  std::string text(kMaxTokenBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) {
    *problem = "cannot be read";
    return false;
  }
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxTokenBytes) {
    *problem = "holds more than " + std::to_string(kMaxTokenBytes) + " bytes: not a token";
    return false;
  }
  const size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) {
    *problem = "holds no token";
    return false;
  }
  text = text.substr(b, e - b + 1);
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      *problem =
          "holds more than a token (a blank, line break or control byte inside): give "
          "just the token";
      return false;
    }
  }
  *token = std::move(text);
  return true;
}

std::string FerryTarget(const std::string& target) {
  if (AllDigits(target)) return "unix:/run/ferry/ferryd-" + target + ".sock";
  if (!target.empty() && target[0] == '/') return "unix:" + target;
  return target;
}

int RunStatus(const Options& options, std::ostream& out, std::ostream& err) {
  AdminConnection admin(options);
  v1::StatusReply r;
  RpcStatus s = admin.Status(&r);
  if (!s.ok()) return ReportRpcFailure(options, s, err);
  if (options.json) {
    out << StatusJson(options, r) << "\n";
    return kExitOk;
  }
  out << RenderKeyValues({
      {"target", options.target},
      {"device", std::to_string(r.device_ordinal()) + "  " + r.device_name()},
      {"uuid", r.device_uuid().empty() ? "-" : r.device_uuid()},
      {"backend", r.backend()},
      {"driver", r.driver_version().empty() ? "-" : r.driver_version()},
      {"memory total", HumanBytes(r.device_total_bytes())},
      {"memory free", HumanBytes(r.device_free_bytes()) + " (" +
                          Percent(r.device_free_bytes(), r.device_total_bytes()) + ")"},
      {"memory in use", HumanBytes(r.device_bytes_in_use()) + " by sessions"},
      {"uptime", HumanDuration(r.uptime_ms())},
      {"version", r.version()},
      {"sessions", std::to_string(r.sessions_open()) + " open, " +
                       std::to_string(r.sessions_total()) + " total"},
      {"submits", std::to_string(r.submits_in_flight()) + " in flight, " +
                      std::to_string(r.submits_total()) + " total"},
      {"ops", std::to_string(r.ops_total()) + " total"},
      {"bytes up", HumanBytes(r.bytes_uploaded_total())},
      {"bytes down", HumanBytes(r.bytes_downloaded_total())},
      {"tensors", std::to_string(r.live_tensors()) + " live"},
      {"pinned pool", std::to_string(r.slabs_total()) + " slabs (" +
                          std::to_string(r.slabs_in_use()) + " held by sessions, " +
                          std::to_string(r.slabs_kept()) + " of them kept for a next session), " +
                          HumanBytes(r.slab_bytes()) + "; staging " +
                          std::to_string(r.staging_slabs()) + " slabs, " +
                          HumanBytes(r.staging_bytes_in_use()) + " in use"},
      {"copy turns", r.copy_turns() == 0
                         ? std::string("no limit")
                         : std::to_string(r.copy_turns()) + " per direction; " +
                               std::to_string(r.copy_turns_waiting()) + " waiting, " +
                               std::to_string(r.copy_turn_waits_total()) + " waits total"},
      {"submit rings", std::to_string(r.submit_rings()) + " open; " +
                           std::to_string(r.submit_ring_messages_total()) + " messages total"},
      {"draining", r.draining() ? "yes" : "no"},
      {"device resets", std::to_string(r.device_resets())},
      {"last fault", r.last_fault().empty() ? "-"
                                            : r.last_fault() + " (recovered in " +
                                                  HumanDuration(r.last_recovery_ms()) + ")"},
  });
  return kExitOk;
}

namespace {

// What the UID column shows for a TCP peer: its identity ("remote:NAME" for a tenant), "-"
// from a daemon too old to say.
std::string RemoteIdentity(const v1::SessionInfo& i) {
  return i.identity().empty() ? "-" : i.identity();
}

// "used/limit" ("used" alone when there is no limit).
std::string OfLimit(const std::string& used, uint64_t limit, const std::string& limit_text) {
  return limit == 0 ? used : used + "/" + limit_text;
}

// The identities' usage against their limits, as a table or (--json) an array.
void PrintUsage(const Options& options, const v1::ListSessionsReply& reply, std::ostream& out) {
  if (options.json) {
    std::vector<std::string> items;
    for (const v1::UidUsage& u : reply.usage()) {
      items.push_back(JsonObject()
                          .Add("identity", u.identity())
                          .Add("sessions", u.sessions())
                          .Add("device_bytes", u.device_bytes())
                          .Add("pinned_bytes", u.pinned_bytes())
                          .Add("submits_in_flight", u.submits_in_flight())
                          .Add("max_sessions", u.max_sessions())
                          .Add("max_device_bytes", u.max_device_bytes())
                          .Add("max_pinned_bytes", u.max_pinned_bytes())
                          .Add("max_submits_in_flight", u.max_submits_in_flight())
                          .Add("in_flight_bytes", u.in_flight_bytes())
                          .Add("max_in_flight_bytes", u.max_in_flight_bytes())
                          .Add("objects", u.objects())
                          .Add("max_objects", u.max_objects())
                          .Add("queued_commands", u.queued_commands())
                          .Add("max_queued_commands", u.max_queued_commands())
                          .str());
    }
    out << JsonArray(items) << "\n";
    return;
  }
  Table table;
  table.AddColumn("IDENTITY");
  table.AddColumn("SESSIONS", true);
  table.AddColumn("DEVICE", true);
  table.AddColumn("PINNED", true);
  table.AddColumn("IN-FLIGHT", true);
  table.AddColumn("HELD", true);  // bytes its submits hold in the daemon
  table.AddColumn("OBJECTS", true);
  table.AddColumn("QUEUED", true);  // device commands on its sessions' streams
  for (const v1::UidUsage& u : reply.usage()) {
    table.AddRow(
        {u.identity(),
         OfLimit(std::to_string(u.sessions()), u.max_sessions(), std::to_string(u.max_sessions())),
         OfLimit(HumanBytes(u.device_bytes()), u.max_device_bytes(),
                 HumanBytes(u.max_device_bytes())),
         OfLimit(HumanBytes(u.pinned_bytes()), u.max_pinned_bytes(),
                 HumanBytes(u.max_pinned_bytes())),
         OfLimit(std::to_string(u.submits_in_flight()), u.max_submits_in_flight(),
                 std::to_string(u.max_submits_in_flight())),
         OfLimit(HumanBytes(u.in_flight_bytes()), u.max_in_flight_bytes(),
                 HumanBytes(u.max_in_flight_bytes())),
         OfLimit(std::to_string(u.objects()), u.max_objects(), std::to_string(u.max_objects())),
         OfLimit(std::to_string(u.queued_commands()), u.max_queued_commands(),
                 std::to_string(u.max_queued_commands()))});
  }
  out << table.Render();
}

}  // namespace

int FetchSessions(const Options& options, v1::ListSessionsReply* reply, std::ostream& err) {
  AdminConnection admin(options);
  RpcStatus s = admin.ListSessions(reply);
  return s.ok() ? kExitOk : ReportRpcFailure(options, s, err);
}

namespace {

// One session's cumulative counters, as a JSON object.
std::string SessionStatsJson(const v1::SessionStats& st) {
  return JsonObject()
      .Add("submits", st.submits())
      .Add("failed_submits", st.failed_submits())
      .Add("ops", st.ops())
      .Add("kernel_launches", st.kernel_launches())
      .Add("bytes_uploaded", st.bytes_uploaded())
      .Add("bytes_downloaded", st.bytes_downloaded())
      .Add("tensors_created", st.tensors_created())
      .Add("peak_device_bytes", st.peak_device_bytes())
      .Add("device_busy_ns", st.device_busy_ns())
      .Add("graph_launches", st.graph_launches())
      .Add("kernel_batches", st.kernel_batches())
      .Add("h2d_bytes", st.h2d_bytes())
      .Add("h2d_ns", st.h2d_ns())
      .Add("d2h_bytes", st.d2h_bytes())
      .Add("d2h_ns", st.d2h_ns())
      .str();
}

// One open session, as a JSON object; uid and pid are known only for local (Unix-socket)
// clients, and absent from the object otherwise.
std::string SessionJson(const v1::SessionInfo& i) {
  JsonObject item;
  item.Add("session_id", i.session_id()).Add("client_name", i.client_name()).Add("peer", i.peer());
  if (i.has_uid()) item.Add("uid", i.uid());
  if (i.has_pid()) item.Add("pid", i.pid());
  item.Add("identity", i.identity());
  return item.Add("age_ms", i.age_ms())
      .Add("submits_in_flight", i.submits_in_flight())
      .Add("device_bytes", i.device_bytes())
      .Add("live_tensors", i.live_tensors())
      .AddRaw("stats", SessionStatsJson(i.stats()))
      .str();
}

// The open sessions as a table, one row each.
std::string SessionsTable(const v1::ListSessionsReply& reply) {
  Table table;
  table.AddColumn("ID", true);
  table.AddColumn("CLIENT");
  table.AddColumn("PEER");
  table.AddColumn("UID", true);
  table.AddColumn("PID", true);
  table.AddColumn("AGE", true);
  table.AddColumn("IN-FLIGHT", true);
  table.AddColumn("DEVICE", true);
  table.AddColumn("TENSORS", true);
  table.AddColumn("OPS", true);
  table.AddColumn("UP", true);
  table.AddColumn("DOWN", true);
  for (const v1::SessionInfo& i : reply.sessions()) {
    table.AddRow({std::to_string(i.session_id()), i.client_name().empty() ? "-" : i.client_name(),
                  i.peer(), i.has_uid() ? std::to_string(i.uid()) : RemoteIdentity(i),
                  i.has_pid() ? std::to_string(i.pid()) : "-", HumanDuration(i.age_ms()),
                  std::to_string(i.submits_in_flight()), HumanBytes(i.device_bytes()),
                  std::to_string(i.live_tensors()), std::to_string(i.stats().ops()),
                  HumanBytes(i.stats().bytes_uploaded()),
                  HumanBytes(i.stats().bytes_downloaded())});
  }
  return table.Render();
}

// The grpc.health.v1 check of a daemon that answered Status with r.
Check GrpcHealthCheck(AdminConnection& admin, const v1::StatusReply& r) {
  int serving = 0;
  RpcStatus hs = admin.HealthCheck("", &serving);
  if (hs.code == static_cast<int>(Code::kUnimplemented)) {
    return {"grpc-health", Level::kOk, "grpc.health.v1 not offered by this ferryd"};
  }
  if (!hs.ok())
    return {"grpc-health", Level::kCritical, "grpc.health.v1 Check failed: " + hs.message};
  if (serving == 1) return {"grpc-health", Level::kOk, "SERVING"};
  // Not serving while draining is expected (the draining check warns); otherwise the
  // daemon refuses sessions for a reason of its own (device lost).
  return {"grpc-health", r.draining() ? Level::kWarning : Level::kCritical,
          serving == 2 ? "NOT_SERVING" : "status " + std::to_string(serving)};
}

// Whether the daemon accepts sessions (a warning while draining).
Check DrainingCheck(const v1::StatusReply& r) {
  return {"draining", r.draining() ? Level::kWarning : Level::kOk,
          r.draining() ? "draining: new sessions are refused"
                       : "accepting sessions (" + std::to_string(r.sessions_open()) + " open)"};
}

// Free device memory against --min-free (a warning under it, or when the total is unknown).
Check MemoryHeadroomCheck(const Options& options, const v1::StatusReply& r) {
  uint64_t total = r.device_total_bytes(), free = r.device_free_bytes();
  bool low = total == 0 || static_cast<double>(free) < options.min_free_fraction * total;
  return {"memory-headroom", low ? Level::kWarning : Level::kOk,
          HumanBytes(free) + " of " + HumanBytes(total) + " free (" + Percent(free, total) +
              (low ? ", under " : ", threshold ") +
              Percent(static_cast<uint64_t>(options.min_free_fraction * 1000), 1000) + ")"};
}

// Every health check, in order: reachable, then (when it answered) grpc.health.v1,
// draining, memory headroom and with --canary the canary (skipped while draining).
std::vector<Check> HealthChecks(const Options& options, std::ostream& out) {
  std::vector<Check> checks;
  AdminConnection admin(options);
  v1::StatusReply r;
  auto t = Clock::now();
  RpcStatus s = admin.Status(&r);
  double rtt = MillisSince(t);
  if (!s.ok()) {
    checks.push_back({"reachable", Level::kCritical,
                      "cannot reach ferryd at " + options.target + ": " + s.message});
    return checks;
  }
  checks.push_back({"reachable", Level::kOk,
                    "ferryd " + r.version() + " answered in " + HumanMillis(rtt) + " (device " +
                        std::to_string(r.device_ordinal()) + " " + r.device_name() + ", " +
                        r.backend() + " backend)"});
  checks.push_back(GrpcHealthCheck(admin, r));
  checks.push_back(DrainingCheck(r));
  checks.push_back(MemoryHeadroomCheck(options, r));
  if (options.canary) {
    if (r.draining()) {
      checks.push_back({"canary", Level::kWarning, "skipped: the daemon is draining"});
    } else {
      checks.push_back(CanaryCheck(options, out));
    }
  }
  return checks;
}

// A level as --json spells it.
const char* LevelJsonName(Level l) {
  return l == Level::kOk ? "ok" : l == Level::kWarning ? "warning" : "critical";
}

// The health report as one JSON object: the overall status and every check.
std::string HealthJson(const Options& options, const std::vector<Check>& checks, Level worst) {
  std::vector<std::string> items;
  for (const Check& c : checks) {
    std::string obj = JsonObject()
                          .Add("name", c.name)
                          .Add("status", LevelJsonName(c.level))
                          .Add("detail", c.detail)
                          .str();
    if (!c.extra_json.empty()) obj = obj.substr(0, obj.size() - 1) + c.extra_json + "}";
    items.push_back(obj);
  }
  return JsonObject()
      .Add("target", options.target)
      .Add("status", LevelJsonName(worst))
      .Add("exit_code", static_cast<int>(worst))
      .AddRaw("checks", JsonArray(items))
      .str();
}

}  // namespace

int RunSessions(const Options& options, std::ostream& out, std::ostream& err) {
  AdminConnection admin(options);
  v1::ListSessionsReply reply;
  RpcStatus s = admin.ListSessions(&reply);
  if (!s.ok()) return ReportRpcFailure(options, s, err);
  if (options.by_uid) {
    if (reply.usage().empty() && !options.json) {
      out << "no uid holds anything on " << options.target << "\n";
    } else {
      PrintUsage(options, reply, out);
    }
    return kExitOk;
  }
  if (options.json) {
    std::vector<std::string> items;
    for (const v1::SessionInfo& i : reply.sessions()) items.push_back(SessionJson(i));
    out << JsonArray(items) << "\n";
    return kExitOk;
  }
  if (reply.sessions().empty()) {
    out << "no open sessions on " << options.target << "\n";
    return kExitOk;
  }
  out << SessionsTable(reply);
  if (!reply.usage().empty()) {  // per identity, against its limits (used/limit)
    out << "\n";
    PrintUsage(options, reply, out);
  }
  return kExitOk;
}

int RunHealth(const Options& options, std::ostream& out, std::ostream& err) {
  (void)err;
  const std::vector<Check> checks = HealthChecks(options, out);
  Level worst = Level::kOk;
  for (const Check& c : checks) worst = std::max(worst, c.level);
  if (options.json) {
    out << HealthJson(options, checks, worst) << "\n";
  } else {
    Table table;
    table.AddColumn("STATUS");
    table.AddColumn("CHECK");
    table.AddColumn("DETAIL");
    for (const Check& c : checks) table.AddRow({LevelName(c.level), c.name, c.detail});
    out << table.Render() << "health: " << LevelName(worst) << "\n";
  }
  return static_cast<int>(worst);
}

int RunDrain(const Options& options, std::ostream& out, std::ostream& err) {
  AdminConnection admin(options);
  v1::DrainReply reply;
  RpcStatus s = admin.Drain(&reply);
  if (!s.ok()) return ReportRpcFailure(options, s, err);
  bool stopped = false;
  auto start = Clock::now();
  if (options.wait) {
    // The daemon lets in-flight work finish (up to its --drain-timeout), then exits: wait
    // until it no longer answers.
    while (Clock::now() - start < options.wait_timeout) {
      v1::StatusReply r;
      RpcStatus st = admin.Status(&r);
      if (st.code == static_cast<int>(Code::kUnavailable)) {
        stopped = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (options.json) {
    JsonObject o;
    o.Add("target", options.target).Add("draining", true);
    if (options.wait) o.Add("stopped", stopped).Add("waited_ms", MillisSince(start));
    out << o.str() << "\n";
  } else {
    out << "ferryd at " << options.target << " is draining";
    if (options.wait) {
      out << (stopped ? "; it stopped after " + HumanMillis(MillisSince(start))
                      : "; still answering after " + HumanMillis(MillisSince(start)));
    }
    out << "\n";
  }
  if (options.wait && !stopped) {
    err << "ferryctl: ferryd at " << options.target << " did not stop within "
        << HumanMillis(options.wait_timeout.count()) << "\n";
    return kExitCritical;
  }
  return kExitOk;
}

int RunMetrics(const Options& options, std::ostream& out, std::ostream& err) {
  // A plain HTTP/1.1 GET of ferryd's --metrics-listen endpoint.
  std::string ep = options.metrics_endpoint;
  if (ep.rfind("http://", 0) == 0) ep = ep.substr(7);
  std::string path = "/metrics";
  if (size_t slash = ep.find('/'); slash != std::string::npos) {
    path = ep.substr(slash);
    ep = ep.substr(0, slash);
  }
  size_t colon = ep.rfind(':');
  if (ep.empty() || colon == std::string::npos) {
    err << "ferryctl: metrics needs --metrics HOST:PORT (ferryd's --metrics-listen)\n";
    return kExitUsage;
  }
  std::string host = ep.substr(0, colon), port = ep.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res) {
    err << "ferryctl: cannot resolve " << ep << "\n";
    return kExitCritical;
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{static_cast<time_t>(options.timeout.count() / 1000),
             static_cast<suseconds_t>((options.timeout.count() % 1000) * 1000)};
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  bool connected = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  if (!connected) {
    if (fd >= 0) ::close(fd);
    err << "ferryctl: cannot reach metrics at " << ep << "\n";
    return kExitCritical;
  }
  // --token: the endpoint's --metrics-token-file asks for it.
  const std::string authorization =
      options.token.empty() ? "" : "Authorization: Bearer " + options.token + "\r\n";
  std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + ep + "\r\n" + authorization +
                        "Accept: text/plain\r\nConnection: close\r\n\r\n";
  bool sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
              static_cast<ssize_t>(request.size());
  std::string response;
  char buf[16384];
  for (ssize_t n; sent && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, n);
  ::close(fd);
  size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos || response.rfind("HTTP/1.", 0) != 0) {
    err << "ferryctl: no HTTP reply from " << ep << "\n";
    return kExitCritical;
  }
  std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200 ") == std::string::npos) {
    err << "ferryctl: " << ep << path << ": " << status_line << "\n";
    return kExitCritical;
  }
  out << response.substr(header_end + 4);
  return kExitOk;
}

}  // namespace ferry::ctl
