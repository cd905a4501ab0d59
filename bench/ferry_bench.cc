// ferry-bench: measure what ferry delivers on this machine, against an in-process baseline.
//
//   ferry-bench --target unix:/run/ferry/ferryd-0.sock --baseline --json out.json --svg out.svg
//   ferry-bench --spawn-daemon build/server/ferryd --quick --baseline
//
// This file is the composition root: flags, targets, the baseline device, which scenarios
// run, and the output. The scenarios live in scenario_*.cc, the bare transports in
// transports.cc, the tables/JSON/SVG in report.cc.
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

#include "backend/select.h"
#include "bench.h"
#include "ferry/v1/admin.grpc.pb.h"
#include "ferry/version.h"
#include "process.h"
#include "report.h"

namespace ferry::bench {
namespace {

constexpr const char* kUsage = R"(usage: ferry-bench [options]

Drive one or more ferryd daemons through ferry's client library and print, per scenario, a
table of what they achieved; with --baseline, beside each figure the same work done in this
process straight against the device (CUDA when a GPU is visible, else the host backend) and
the ratio daemon/baseline.

targets:
  --target unix:PATH|tcp:HOST:PORT   a daemon to measure; repeatable (results per target and
                                     for all targets pooled)
  --spawn-daemon PATH_TO_FERRYD      start a ferryd (--backend auto) on a temporary Unix
                                     socket for this run, and stop it at the end
  --tcp                              with --spawn-daemon: also listen on TCP loopback (port 0)
                                     and measure that endpoint too
  --daemon-arg ARG                   with --spawn-daemon: pass ARG to ferryd too; repeatable
                                     (e.g. --daemon-arg --copy-turns=0)
what to run:
  --scenario NAME                    transfers, latency, throughput, overlap, concurrency,
                                     open_close, sharing, memory, fault; repeatable
                                     (default: all); and shares, only when named: two
                                     uids' device time (needs root; see scenario_shares.cc)
  --baseline                         also run every scenario in process, plus the bare
                                     transports (socketpair ping-pong, gRPC echo)
  --baseline-backend auto|cuda|host  device of the in-process baseline (default auto)
  --baseline-mps                     (implies --baseline) start a private MPS control daemon
                                     and run the baselines of sharing, latency and
                                     throughput again as its clients (an "MPS" column), and
                                     the fault scenario's MPS arm; "n/a" with the reason
                                     where MPS or a GPU is missing
  --mps-control PATH                 nvidia-cuda-mps-control to use (default: PATH, then
                                     /usr/local/nvidia/bin)
  --quick                            small sizes and few iterations: finishes in seconds
  --sizes LIST                       transfer sizes, e.g. 16,64K,1M,8M,64M,256M
  --iterations N                     samples per small case (large transfers take fewer)
  --stream-depth N                   transfers in flight on the streamed route (default 4)
  --sessions LIST                    concurrency session counts (default 1,8,64)
  --processes LIST                   sharing process counts (default 1,4,8; quick 1,2)
  --ops-per-submit LIST              throughput rows' axpy per submit (default 1,8,64,512)
  --wait-spin US                     the clients' wait_spin: how long a wait polls before it
                                     sleeps (default: libferry's, 200)
output:
  --json FILE                        every table with the samples' summaries, the machine,
                                     ferry version and commit, and the date
  --svg FILE                         chart of transfer bandwidth against size
  --help
)";

[[noreturn]] void Usage(const std::string& error) {
  std::cerr << "ferry-bench: " << error << "\n(see ferry-bench --help)\n";
  std::exit(2);
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int> ParseCounts(const std::string& flag, const std::string& s) {
  std::vector<int> out;
  for (const auto& item : SplitList(s)) {
    int n = std::atoi(item.c_str());
    if (n < 1 || n > 4096) Usage(flag + ": counts are 1..4096, got " + item);
    out.push_back(n);
  }
  if (out.empty()) Usage(flag + " needs a list");
  return out;
}

/// --target's value: unix:PATH or tcp:HOST:PORT (anything else is a usage error).
std::string ParseTarget(const std::string& t) {
  if (t.rfind("unix:", 0) != 0 && t.rfind("tcp:", 0) != 0) {
    Usage("--target: unix:PATH or tcp:HOST:PORT, got " + t);
  }
  return t;
}

/// --scenario's value: a scenario of AllScenarios(), or shares, which runs only when asked
/// for (it needs root and runs 10 s).
std::string ParseScenario(const std::string& s) {
  const auto& all = AllScenarios();
  if (std::find(all.begin(), all.end(), s) == all.end() && s != "shares") {
    Usage("unknown scenario " + s);
  }
  return s;
}

/// --wait-spin: set the client library's spin time (microseconds) in the environment, before
/// any thread starts; worker processes inherit it.
void SetWaitSpin(const std::string& us) {
  if (us.empty() || us.find_first_not_of("0123456789") != std::string::npos) {
    Usage("--wait-spin: microseconds, got " + us);
  }
  ::setenv(kWaitSpinEnv, us.c_str(), 1);
}

/// Usage errors of flags that need one another: something to measure, and the flags that
/// only go with --spawn-daemon or --baseline-mps.
void CheckFlagCombinations(const Options& o) {
  if (o.targets.empty() && o.spawn_daemon.empty() && !o.baseline) {
    Usage("nothing to measure: pass --target, --spawn-daemon and/or --baseline");
  }
  if (o.spawn_tcp && o.spawn_daemon.empty()) Usage("--tcp goes with --spawn-daemon");
  if (!o.daemon_args.empty() && o.spawn_daemon.empty()) {
    Usage("--daemon-arg goes with --spawn-daemon");
  }
  if (!o.mps_control.empty() && !o.baseline_mps) Usage("--mps-control goes with --baseline-mps");
}

Options ParseFlags(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) Usage(a + " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--target") {
      o.targets.push_back(ParseTarget(value()));
    } else if (a == "--scenario") {
      o.scenarios.push_back(ParseScenario(value()));
    } else if (a == "--baseline") {
      o.baseline = true;
    } else if (a == "--baseline-mps") {
      o.baseline_mps = true;
      o.baseline = true;
    } else if (a == "--mps-control") {
      o.mps_control = value();
    } else if (a == "--baseline-backend") {
      o.baseline_backend = value();
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--json") {
      o.json_path = value();
    } else if (a == "--svg") {
      o.svg_path = value();
    } else if (a == "--sizes") {
      for (const auto& item : SplitList(value())) {
        auto b = ParseBytes(item);
        if (!b) Usage("--sizes: not a size: " + item);
        o.sizes.push_back(*b);
      }
    } else if (a == "--iterations") {
      o.iterations = std::atoi(value().c_str());
      if (o.iterations < 1) Usage("--iterations must be >= 1");
    } else if (a == "--stream-depth") {
      o.stream_depth = std::atoi(value().c_str());
      if (o.stream_depth < 1 || o.stream_depth > 64) Usage("--stream-depth must be 1..64");
    } else if (a == "--sessions") {
      o.sessions = ParseCounts(a, value());
    } else if (a == "--processes") {
      o.processes = ParseCounts(a, value());
    } else if (a == "--ops-per-submit") {
      o.ops_per_submit = ParseCounts(a, value());
    } else if (a == "--spawn-daemon") {
      o.spawn_daemon = value();
    } else if (a == "--daemon-arg") {
      o.daemon_args.push_back(value());
    } else if (a == "--tcp") {
      o.spawn_tcp = true;
    } else if (a == "--wait-spin") {
      SetWaitSpin(value());
    } else {
      Usage("unknown flag " + a);
    }
  }
  CheckFlagCombinations(o);
  return o;
}

/// Ask a daemon's Admin service what it is (version, backend, device).
TargetInfo DescribeTarget(const std::string& target) {
  TargetInfo info;
  info.target = target;
  std::string grpc_target = target.rfind("tcp:", 0) == 0 ? target.substr(4) : target;
  auto channel = grpc::CreateChannel(grpc_target, grpc::InsecureChannelCredentials());
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.set_wait_for_ready(true);
  v1::StatusReply reply;
  grpc::Status s = stub->Status(&ctx, v1::StatusRequest(), &reply);
  if (!s.ok()) Die("no ferry daemon answers at " + target + ": " + s.error_message());
  info.backend = reply.backend();
  info.device_name = reply.device_name();
  info.version = reply.version();
  return info;
}

// Cleanup at exit (also after Die): stop the spawned daemon and the MPS daemon, remove the
// temp dir.
SpawnedDaemon* g_daemon = nullptr;
MpsDaemon* g_mps = nullptr;
std::string g_temp_dir;
void CleanUp() {
  if (g_daemon) g_daemon->Stop();
  if (g_mps) g_mps->Stop();
  if (!g_temp_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(g_temp_dir, ec);
  }
}
// On SIGINT/SIGTERM: only async-signal-safe calls. Stop the spawned daemon, leave. (Workers
// notice their parent is gone: the sharing workers and the ping-pong peer by EOF on stdin,
// the echo server by its parent-death signal.)
// The MPS control daemon cannot be told "quit" from here (that takes a process): it gets
// SIGTERM, and its directories stay in /tmp.
volatile pid_t g_daemon_pid = -1;
volatile pid_t g_mps_pid = -1;
void OnSignal(int) {
  if (g_daemon_pid > 0) kill(g_daemon_pid, SIGTERM);
  if (g_mps_pid > 0) kill(g_mps_pid, SIGTERM);
  _exit(130);
}

/// Decide whether the MPS arm can run here; start the daemon (into `daemon`) when it can.
/// An MPS client is tried once before any figure depends on it.
void SetUpMps(Context& ctx, MpsDaemon& daemon, MpsInfo* info) {
  info->control = MpsDaemon::FindControl(ctx.options.mps_control);
  std::vector<std::string> missing;
  if (ctx.baseline->backend != "cuda") {
    // --baseline-backend host on a GPU machine is no "no GPU": say which it is.
    std::string what =
        ctx.options.baseline_backend == "auto" ? "no GPU visible" : "no CUDA baseline";
    missing.push_back(what + " (the baseline runs on the " + ctx.baseline->backend +
                      " backend: " + ctx.baseline->why + ")");
  }
  if (info->control.empty()) {
    missing.push_back(ctx.options.mps_control.empty()
                          ? "nvidia-cuda-mps-control not found in PATH or /usr/local/nvidia/bin"
                          : ctx.options.mps_control + " is not an executable file");
  }
  if (!missing.empty()) {
    for (const auto& m : missing) info->why_not += (info->why_not.empty() ? "" : "; ") + m;
    return;
  }
  std::string why;
  if (!daemon.Start(info->control, &why)) {
    info->why_not = "the MPS control daemon did not start: " + why;
    return;
  }
  g_mps = &daemon;
  g_mps_pid = daemon.pid();
  auto probe = RunWorkers(ctx.self_exe, 1, {"--worker", "mps-probe"}, daemon.env(),
                          std::chrono::seconds(60));
  const WorkerOutput& p = probe[0];
  if (!p.ok() || p.out.rfind("ok", 0) != 0) {
    std::string said = p.out;
    while (!said.empty() && said.back() == '\n') said.pop_back();
    info->why_not = "an MPS client could not run one kernel (status " + std::to_string(p.status) +
                    (said.empty() ? "" : ": " + said) + "); " + daemon.LogTail();
    g_mps_pid = -1;
    g_mps = nullptr;
    daemon.Stop();
    return;
  }
  info->daemon = &daemon;
}

}  // namespace

int MpsProbeWorkerMain() {
  AwaitGo();
  std::string why;
  auto dev = backend::CreateDevice("cuda", 0, backend::HostDeviceOptions{}, &why);
  if (!dev.ok()) {
    std::printf("error CreateDevice: %s\n", dev.status().ToString().c_str());
    return 0;
  }
  auto stream = (*dev)->CreateStream();
  if (!stream.ok()) {
    std::printf("error CreateStream: %s\n", stream.status().ToString().c_str());
    return 0;
  }
  auto d = (*stream)->Allocate(sizeof(float));
  Status st = d.ok() ? (*stream)->Fill(DType::kF32, *d, 1, 1.0) : d.status();
  if (st.ok()) st = WaitStream(**stream);
  if (d.ok()) (*stream)->Free(*d);
  if (st.ok()) st = WaitStream(**stream);
  if (st.ok()) {
    std::printf("ok\n");
  } else {
    std::printf("error %s\n", st.ToString().c_str());
  }
  return 0;
}

namespace {

/// The hidden worker modes: this program re-executed by itself with `--worker MODE ARGS...`.
int WorkerMain(const std::vector<std::string>& args) {
  std::vector<std::string> rest(args.begin() + 2, args.end());
  std::string mode = args.size() > 1 ? args[1] : "";
  if (mode == "sharing") return SharingWorkerMain(rest);
  if (mode == "shares") return SharesWorkerMain(rest);
  if (mode == "ops") return OpsWorkerMain(rest);
  if (mode == "fault") return FaultWorkerMain(rest);
  if (mode == "mps-probe") return MpsProbeWorkerMain();
  if (mode == "echo-server") return EchoServerMain(rest);
  if (mode == "pong") return PongWorkerMain();
  std::cerr << "ferry-bench: unknown worker " << mode << "\n";
  return 2;
}

/// Drop inherited MPS variables: they would make this process's own baseline context a
/// client of some other MPS daemon, and the "own context" column must not be one.
void DropInheritedMpsEnv() {
  for (const auto& var : kMpsEnvVars) {
    if (std::getenv(var.c_str())) {
      std::cerr << "ferry-bench: ignoring " << var << " from the environment\n";
      ::unsetenv(var.c_str());
    }
  }
}

/// Signal handling, the run's temp dir (removed at exit) and the path of this program.
void SetUpProcess(Context& ctx) {
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  char tmpl[] = "/tmp/ferry-bench-XXXXXX";
  if (!mkdtemp(tmpl)) Die("cannot make a temp dir");
  ctx.temp_dir = tmpl;
  g_temp_dir = ctx.temp_dir;
  std::atexit(CleanUp);
  ctx.self_exe = SelfExe();
}

/// Start --spawn-daemon's ferryd into `daemon` and add its endpoints to the targets; false
/// when it did not start.
bool SpawnDaemon(Context& ctx, SpawnedDaemon& daemon) {
  std::cerr << "ferry-bench: starting " << ctx.options.spawn_daemon << "\n";
  // The concurrency scenario's pending route holds one slab (64 MiB by default) per
  // session at once: give the spawned daemon a pinned budget for the most sessions plus
  // a margin (a budget is a ceiling; slabs are made on demand), never below its 1 GiB
  // default.
  int most_sessions = 64;
  for (int n : ctx.options.sessions) most_sessions = std::max(most_sessions, n);
  uint64_t budget_mib = std::max<uint64_t>(1024, (static_cast<uint64_t>(most_sessions) + 4) * 64);
  if (!daemon.Start(ctx.options.spawn_daemon, ctx.temp_dir, ctx.options.spawn_tcp, budget_mib,
                    ctx.options.daemon_args)) {
    return false;
  }
  g_daemon = &daemon;
  g_daemon_pid = daemon.pid();
  for (const auto& ep : daemon.endpoints()) ctx.options.targets.push_back(ep);
  return true;
}

/// Describe every target; a spawned daemon's get its pid.
void DescribeTargets(Context& ctx, const SpawnedDaemon& daemon) {
  for (const auto& t : ctx.options.targets) {
    ctx.targets.push_back(DescribeTarget(t));
    const auto& eps = daemon.endpoints();
    if (std::find(eps.begin(), eps.end(), t) != eps.end()) ctx.targets.back().pid = daemon.pid();
  }
}

/// The run's header on stdout: the version, the targets, the baseline, the MPS arm, the
/// cores and the scenarios to run.
void PrintRunHeader(const Context& ctx, const std::vector<std::string>& scenarios) {
  std::cout << "ferry-bench " << kVersion << " (" << kGitCommit << ")"
            << (ctx.options.quick ? ", quick mode" : "") << "\n";
  for (const auto& t : ctx.targets) {
    std::cout << "  target   " << t.target << ": ferryd " << t.version << ", " << t.backend
              << " backend, " << t.device_name << "\n";
  }
  if (ctx.baseline) {
    const BaselineInfo& baseline = *ctx.baseline;
    std::cout << "  baseline in process, " << baseline.backend << " backend ("
              << baseline.device->info().name << "): " << baseline.why << "\n";
    if (baseline.backend == "host") {
      std::cout << "  NOTE: no GPU visible: the baseline is the host backend (CPU emulation)\n";
    }
  } else {
    std::cout << "  no baseline (pass --baseline for in-process figures and ratios)\n";
  }
  if (ctx.mps) {
    if (ctx.mps->available()) {
      std::cout << "  MPS arm: clients of a private MPS control daemon (" << ctx.mps->control
                << ")\n";
    } else {
      std::cout << "  MPS arm: n/a: " << ctx.mps->why_not << "\n";
    }
  }
  std::cout << "  " << std::thread::hardware_concurrency() << " cores; scenarios:";
  for (const auto& s : scenarios) std::cout << " " << s;
  std::cout << std::endl;
}

/// The tables of scenario `name` (none for a name not listed here).
std::vector<Table> RunScenario(Context& ctx, const std::string& name) {
  std::vector<Table> tables;
  if (name == "transfers") tables = RunTransfers(ctx);
  if (name == "latency") tables = RunLatency(ctx);
  if (name == "throughput") tables = RunThroughput(ctx);
  if (name == "concurrency") tables = RunConcurrency(ctx);
  if (name == "open_close") tables = RunOpenClose(ctx);
  if (name == "sharing") tables = RunSharing(ctx);
  if (name == "overlap") tables = RunOverlap(ctx);
  if (name == "memory") tables = RunMemory(ctx);
  if (name == "shares") tables = RunShares(ctx);
  if (name == "fault") tables = RunFault(ctx);
  return tables;
}

/// Run the scenarios in order, printing each one's tables as they come; return them all.
/// The bare transports feed the latency floor and the transfers' gRPC rows: they go first.
std::vector<Table> RunScenarios(Context& ctx, const std::vector<std::string>& scenarios) {
  std::vector<Table> all;
  auto emit = [&](std::vector<Table> tables) {
    for (const Table& t : tables) PrintTable(std::cout, ctx, t);
    std::cout << std::flush;
    for (auto& t : tables) all.push_back(std::move(t));
  };
  bool wants_transports =
      std::find_if(scenarios.begin(), scenarios.end(), [](const std::string& s) {
        return s == "transfers" || s == "latency";
      }) != scenarios.end();
  if (ctx.baseline && wants_transports) {
    ctx.progress->Scenario("transports");
    auto t = RunTransports(ctx);
    ctx.progress->Done();
    emit(std::move(t));
  }
  for (const std::string& name : scenarios) {
    ctx.progress->Scenario(name);
    std::vector<Table> tables = RunScenario(ctx, name);
    ctx.progress->Done();
    emit(std::move(tables));
  }
  return all;
}

int Main(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "--worker") return WorkerMain(args);

  Context ctx;
  ctx.options = ParseFlags(args);
  ctx.options.command_line = "ferry-bench";
  for (const auto& a : args) ctx.options.command_line += " " + a;
  if (ctx.options.baseline_mps) DropInheritedMpsEnv();
  SetUpProcess(ctx);
  Progress progress;
  ctx.progress = &progress;

  SpawnedDaemon daemon;
  if (!ctx.options.spawn_daemon.empty() && !SpawnDaemon(ctx, daemon)) return 2;
  DescribeTargets(ctx, daemon);

  BaselineInfo baseline;
  if (ctx.options.baseline) {
    baseline.device = Check(backend::CreateDevice(ctx.options.baseline_backend, 0,
                                                  backend::HostDeviceOptions{}, &baseline.why),
                            "baseline device");
    baseline.backend = baseline.device->info().backend;
    ctx.baseline = &baseline;
  }
  // After the baseline device exists: its context (and ferryd's) never sees the MPS
  // variables, which only the MPS arm's children get.
  MpsDaemon mps_daemon;
  MpsInfo mps;
  if (ctx.options.baseline_mps) {
    SetUpMps(ctx, mps_daemon, &mps);
    ctx.mps = &mps;
  }

  std::vector<std::string> scenarios =
      ctx.options.scenarios.empty() ? AllScenarios() : ctx.options.scenarios;
  PrintRunHeader(ctx, scenarios);
  std::vector<Table> all = RunScenarios(ctx, scenarios);

  int rc = 0;
  if (!ctx.options.json_path.empty() && !WriteJson(ctx.options.json_path, ctx, all)) rc = 1;
  if (!ctx.options.svg_path.empty() && !WriteSvg(ctx.options.svg_path, ctx, all)) rc = 1;
  g_daemon_pid = -1;
  daemon.Stop();
  g_daemon = nullptr;
  g_mps_pid = -1;
  mps_daemon.Stop();
  g_mps = nullptr;
  return rc;
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) {
  // The same malloc tuning as ferryd (server/main.cc says why), as a client moving bulk bytes
  // inline should do; the bare gRPC baseline runs in this process, so it has it too.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
  std::vector<std::string> args(argv + 1, argv + argc);
  return ferry::bench::Main(args);
}
