// Scenario "fault": what a device fault in one client does to the others, and how long until
// a new client works again — once with the clients as MPS clients (--baseline-mps) and once
// as sessions of a ferryd started for this scenario alone (--spawn-daemon; the fault resets
// that daemon's device, so the daemon under test is not used). CUDA only: on the host
// backend the table says "skipped: needs a GPU".
//
// Per arm, N = 4 worker processes (this program re-executed as `ferry-bench --worker fault`)
// set up, print "ready" and start together on a go byte. Three ("others") run the sharing
// scenario's round (64 axpy(256) + upload and download of 1 MiB, waited on) until told to
// stop (a byte or EOF on stdin), printing each round's end time, or the first error and
// exit. The fourth (the culprit) runs three rounds, then launches a kernel that stores
// through a wild address (kWildPtx: the tensor's address XOR 0x7f0000000000, as in
// tests/integration/device_test.cc) and waits for it. From the moment of that launch, new
// workers ("probes": open a device or session, run one round) are started one after another
// until one succeeds or kRecoveryTimeout passes; the others are stopped once a probe
// succeeded (and at least kObserve after the fault), so that rounds they complete after the
// fault show whether they survived it.
// Times are CLOCK_MONOTONIC (steady_clock), comparable between the processes.
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <sstream>
#include <thread>

#include "backend/select.h"
#include "bench.h"
#include "process.h"

namespace ferry::bench {
namespace {

constexpr int kWorkers = 4;  // three others and the culprit
constexpr int kCulpritRounds = 3;
constexpr int64_t kAxpyElements = 256;
constexpr uint64_t kRoundBytes = 1ull << 20;
constexpr auto kObserve = std::chrono::seconds(3);
constexpr auto kSetupTimeout = std::chrono::seconds(120);
constexpr auto kRecoveryTimeout = std::chrono::seconds(60);
constexpr auto kVictimCap = std::chrono::seconds(300);  // a victim never runs longer

// One thread stores 1.0f through (p XOR 0x7f0000000000): an address no allocation has.
constexpr char kWildPtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry wild(
    .param .u64 wild_param_0
)
{
    .reg .f32 %f<2>;
    .reg .b64 %rd<4>;

    ld.param.u64 %rd1, [wild_param_0];
    xor.b64 %rd2, %rd1, 0x7f0000000000;
    cvta.to.global.u64 %rd3, %rd2;
    mov.f32 %f1, 0f3F800000;
    st.global.f32 [%rd3], %f1;
    ret;
}
)";

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// --- the workers --------------------------------------------------------------------------

/// The sharing round and the fault, through ferryd or in process. Errors are returned, never
/// fatal: what a worker sees is the measurement.
class Workload {
 public:
  virtual ~Workload() = default;
  /// 64 axpy + upload and download of 1 MiB, waited on.
  virtual Status Round() = 0;
  /// Launch the wild kernel (the culprit only) and wait: the fault's status.
  virtual Status Fault() = 0;
};

class DaemonWorkload : public Workload {
 public:
  static Result<std::unique_ptr<DaemonWorkload>> Open(const std::string& target, bool culprit) {
    auto client = Connect(target);
    if (!client.ok()) return client.status();
    std::unique_ptr<DaemonWorkload> w(new DaemonWorkload(std::move(client).value()));
    auto session = w->client_.open_session();
    if (!session.ok()) return session.status();
    w->s_.emplace(std::move(session).value());
    Session& s = *w->s_;
    w->t_ = s.create_tensor<uint8_t>({static_cast<int64_t>(kRoundBytes)});
    w->x_ = s.create_tensor<float>({kAxpyElements});
    w->y_ = s.create_tensor<float>({kAxpyElements});
    s.fill(w->x_, 1.0);
    s.fill(w->y_, 0.0);
    if (culprit) w->module_.emplace(s.load_module(ModuleFormat::kPtx, kWildPtx));
    FERRY_RETURN_IF_ERROR(s.synchronize());
    return w;
  }
  Status Round() override {
    Session& s = *s_;
    for (int k = 0; k < 64; ++k) s.axpy(1e-6, x_, y_);
    FERRY_RETURN_IF_ERROR(s.submit());
    FERRY_RETURN_IF_ERROR(s.upload_bytes(t_, buf_.data(), kRoundBytes));
    return s.download_bytes(t_, buf_.data(), kRoundBytes);
  }
  Status Fault() override {
    s_->launch(*module_, "wild", {1}, {1}, {KernelArg::tensor(t_)});
    return s_->synchronize();
  }

 private:
  explicit DaemonWorkload(Client client) : client_(std::move(client)), buf_(kRoundBytes) {}
  Client client_;
  std::optional<Session> s_;
  Tensor t_, x_, y_;
  std::optional<Module> module_;
  HostBuffer buf_;
};

class InProcessWorkload : public Workload {
 public:
  static Result<std::unique_ptr<InProcessWorkload>> Open(bool culprit) {
    std::unique_ptr<InProcessWorkload> w(new InProcessWorkload());
    std::string why;
    FERRY_ASSIGN_OR_RETURN(w->dev_,
                           backend::CreateDevice("cuda", 0, backend::HostDeviceOptions{}, &why));
    FERRY_ASSIGN_OR_RETURN(w->stream_, w->dev_->CreateStream());
    FERRY_RETURN_IF_ERROR(w->dev_->RegisterHostMemory(w->buf_.data(), kRoundBytes));
    w->registered_ = true;
    backend::Stream& st = *w->stream_;
    FERRY_ASSIGN_OR_RETURN(w->d_, st.Allocate(kRoundBytes));
    FERRY_ASSIGN_OR_RETURN(w->x_, st.Allocate(kAxpyElements * sizeof(float)));
    FERRY_ASSIGN_OR_RETURN(w->y_, st.Allocate(kAxpyElements * sizeof(float)));
    FERRY_RETURN_IF_ERROR(st.Fill(DType::kF32, w->x_, kAxpyElements, 1.0));
    FERRY_RETURN_IF_ERROR(st.Fill(DType::kF32, w->y_, kAxpyElements, 0.0));
    if (culprit) {
      FERRY_ASSIGN_OR_RETURN(
          w->module_, w->dev_->LoadModule(backend::ModuleFormat::kPtx, std::string_view(kWildPtx)));
    }
    FERRY_RETURN_IF_ERROR(WaitStream(st));
    return w;
  }
  ~InProcessWorkload() override {
    // After a fault the context is gone: what is left is released with it.
    if (registered_) (void)dev_->UnregisterHostMemory(buf_.data());
  }
  Status Round() override {
    backend::Stream& st = *stream_;
    for (int k = 0; k < 64; ++k) {
      FERRY_RETURN_IF_ERROR(st.Axpy(DType::kF32, 1e-6, x_, y_, kAxpyElements));
    }
    FERRY_RETURN_IF_ERROR(st.CopyHostToDevice(d_, buf_.data(), kRoundBytes));
    FERRY_RETURN_IF_ERROR(st.CopyDeviceToHost(buf_.data(), d_, kRoundBytes));
    return WaitStream(st);
  }
  Status Fault() override {
    backend::KernelArg arg;
    arg.kind = backend::KernelArg::Kind::kPointer;
    arg.pointer = d_;
    FERRY_RETURN_IF_ERROR(stream_->Launch(*module_, "wild", backend::LaunchConfig{}, {arg}));
    return WaitStream(*stream_);
  }

 private:
  InProcessWorkload() : buf_(kRoundBytes) {}
  std::unique_ptr<backend::Device> dev_;
  std::unique_ptr<backend::Stream> stream_;
  std::shared_ptr<backend::Module> module_;
  backend::DevicePtr d_ = 0, x_ = 0, y_ = 0;
  HostBuffer buf_;
  bool registered_ = false;
};

Result<std::unique_ptr<Workload>> OpenWorkload(const std::string& mode, const std::string& where,
                                               bool culprit) {
  if (mode == "daemon") {
    auto w = DaemonWorkload::Open(where, culprit);
    if (!w.ok()) return w.status();
    return std::unique_ptr<Workload>(std::move(w).value());
  }
  auto w = InProcessWorkload::Open(culprit);
  if (!w.ok()) return w.status();
  return std::unique_ptr<Workload>(std::move(w).value());
}

/// One line to the parent, at once. Errors keep to one line.
void Say(const std::string& what) {
  std::string line = what;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

/// True once the parent wrote a byte to stdin or closed it.
bool StopRequested() {
  pollfd p{0, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// --- the parent ---------------------------------------------------------------------------

struct ArmResult {
  std::string label;
  std::string not_run;  // why the arm did not run, or ""
  int others_ok = 0, others_failed = 0;
  int rounds_after = 0;        // rounds the others completed after the fault
  std::string others_error;    // the first error one of them saw
  std::string culprit_saw;     // the culprit's own status
  double recovered_ms = kNaN;  // fault to a new client's first round done; NaN: not in time
  int probes = 0;              // new clients tried
};

std::vector<std::string> WorkerArgs(const std::string& role, const std::string& mode,
                                    const std::string& where) {
  return {"--worker", "fault", "--role", role, "--mode", mode, "--where", where};
}

void Reap(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  if (WaitChild(pid, grace) == -1) {
    kill(pid, SIGKILL);
    WaitChild(pid, std::chrono::seconds(5));
  }
}

/// Spawn an arm's workers: three others, then the culprit. `env`: their environment.
std::vector<Child> SpawnArmWorkers(Context& ctx, const std::string& mode, const std::string& where,
                                   const EnvChanges& env) {
  std::vector<Child> workers;
  for (int i = 0; i < kWorkers; ++i) {
    bool culprit = i == kWorkers - 1;
    workers.push_back(SpawnChild(ctx.self_exe,
                                 WorkerArgs(culprit ? "culprit" : "other", mode, where), true, true,
                                 "", -1, env));
  }
  return workers;
}

/// Give up on an arm: kill every worker, let the readers of `others_out` (the others'
/// stdout, once started) see EOF, then close our ends.
void KillArm(std::vector<Child>& workers, std::vector<std::future<std::string>>& others_out) {
  for (Child& c : workers) {
    if (c.pid <= 0) continue;
    kill(c.pid, SIGKILL);
    Reap(c.pid, std::chrono::seconds(5));
  }
  for (auto& f : others_out) f.get();
  for (Child& c : workers) {
    close(c.stdin_fd);
    close(c.stdout_fd);
  }
}

/// Read the culprit's lines (its rounds, the launch, the fault it sees) into r.culprit_saw;
/// return when its kernel was launched (ns since the epoch), 0 when it never was.
int64_t ReadCulprit(const Child& culprit, ArmResult& r) {
  int64_t fault_ns = 0;
  std::string line;
  auto culprit_deadline = Clock::now() + kSetupTimeout;
  while (ReadLineUntil(culprit.stdout_fd, &line, culprit_deadline)) {
    std::istringstream in(line);
    std::string word;
    in >> word;
    if (word == "launch") in >> fault_ns;
    if (word == "fault" || word == "error") {
      int64_t ns;
      in >> ns;
      std::getline(in, r.culprit_saw);
      if (!r.culprit_saw.empty() && r.culprit_saw[0] == ' ') r.culprit_saw.erase(0, 1);
      if (word == "error") r.culprit_saw = "failed before its launch: " + r.culprit_saw;
      break;
    }
  }
  return fault_ns;
}

/// Start new clients, one after another, until one runs a round or `recovery_deadline`
/// passes; count them in r.probes and set r.recovered_ms (from `fault_ns`) when one did.
void ProbeRecovery(Context& ctx, const std::string& label, const std::string& mode,
                   const std::string& where, const EnvChanges& env, int64_t fault_ns,
                   Clock::time_point recovery_deadline, ArmResult& r) {
  std::string line;
  while (Clock::now() < recovery_deadline) {
    ctx.progress->Case(label + ": new client " + std::to_string(r.probes + 1));
    Child p = SpawnChild(ctx.self_exe, WorkerArgs("probe", mode, where), false, true, "", -1, env);
    if (p.pid <= 0) break;
    ++r.probes;
    bool ok = false;
    if (ReadLineUntil(p.stdout_fd, &line, recovery_deadline)) {  // its one answer
      std::istringstream in(line);
      std::string word;
      int64_t ns = 0;
      in >> word >> ns;
      if (word == "ok") {
        r.recovered_ms = static_cast<double>(ns - fault_ns) / 1e6;
        ok = true;
      }
    }
    close(p.stdout_fd);
    Reap(p.pid, std::chrono::seconds(1));  // killed when it did not answer in time
    if (ok) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// What one of the others printed: its rounds after the fault (added to r.rounds_after),
/// whether it said it stopped, and whether it failed (the first error into r.others_error).
void ReadOtherOutput(const std::string& out, int64_t fault_ns, ArmResult& r, bool* stopped,
                     bool* failed) {
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string word;
    int64_t ns = 0;
    in >> word >> ns;
    if (word == "round" && ns > fault_ns) ++r.rounds_after;
    if (word == "stopped") *stopped = true;
    if (word == "error") {
      *failed = true;
      std::string msg;
      std::getline(in, msg);
      if (r.others_error.empty()) r.others_error = msg.empty() ? msg : msg.substr(1);
    }
  }
}

/// Stop the others and count those that ran on unharmed (r.others_ok) and those that did
/// not (r.others_failed). One that does not stop (hung in a call) is killed, which ends its
/// output too.
void StopOthers(std::vector<Child>& workers, std::vector<std::future<std::string>>& others_out,
                int64_t fault_ns, ArmResult& r) {
  for (int i = 0; i + 1 < kWorkers; ++i) {
    WriteAll(workers[i].stdin_fd, "s", 1);
    close(workers[i].stdin_fd);
  }
  for (int i = 0; i + 1 < kWorkers; ++i) {
    Child& c = workers[i];
    int status = WaitChild(c.pid, std::chrono::seconds(30));
    bool hung = status == -1;
    if (hung) {
      kill(c.pid, SIGKILL);
      WaitChild(c.pid, std::chrono::seconds(5));
    }
    const std::string out = others_out[i].get();
    close(c.stdout_fd);
    c.pid = -1;
    bool stopped = false, failed = false;
    ReadOtherOutput(out, fault_ns, r, &stopped, &failed);
    if (hung && r.others_error.empty()) r.others_error = "hung (killed after the fault)";
    bool ok = stopped && !failed && !hung && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    (ok ? r.others_ok : r.others_failed) += 1;
  }
}

/// Run one arm: four workers (three others, one culprit), then probes. `env`: the workers'
/// environment (MPS clients, or none).
ArmResult RunArm(Context& ctx, const std::string& label, const std::string& mode,
                 const std::string& where, const EnvChanges& env) {
  ArmResult r;
  r.label = label;
  std::vector<Child> workers = SpawnArmWorkers(ctx, mode, where, env);
  std::vector<std::future<std::string>> others_out;  // the others' stdout, once started
  auto setup_deadline = Clock::now() + kSetupTimeout;
  for (Child& c : workers) {
    std::string line;
    if (c.pid <= 0 || !ReadLineUntil(c.stdout_fd, &line, setup_deadline) || line != "ready") {
      r.not_run = "a worker did not set up: " + (line.empty() ? "no answer" : line);
      KillArm(workers, others_out);
      return r;
    }
  }
  for (Child& c : workers) WriteAll(c.stdin_fd, "g", 1);
  // The others print a line per round: read them all along, on threads of their own, so
  // that none ever waits on a full pipe (ReadAll returns at EOF: when the worker is gone).
  for (int i = 0; i + 1 < kWorkers; ++i) {
    others_out.push_back(std::async(std::launch::async, ReadAll, workers[i].stdout_fd));
  }

  Child& culprit = workers.back();
  const int64_t fault_ns = ReadCulprit(culprit, r);
  if (fault_ns == 0) {
    r.not_run = "the culprit did not launch its kernel" +
                (r.culprit_saw.empty() ? std::string() : ": " + r.culprit_saw);
    KillArm(workers, others_out);
    return r;
  }
  if (r.culprit_saw.empty()) r.culprit_saw = "no answer from its wait (killed)";
  close(culprit.stdin_fd);
  Reap(culprit.pid, std::chrono::seconds(30));
  close(culprit.stdout_fd);

  auto fault_at = Clock::now() - std::chrono::nanoseconds(NowNs() - fault_ns);
  ProbeRecovery(ctx, label, mode, where, env, fault_ns, fault_at + kRecoveryTimeout, r);

  // The others: stopped now (after at least kObserve), then what each saw.
  std::this_thread::sleep_until(std::max(Clock::now(), fault_at + kObserve));
  StopOthers(workers, others_out, fault_ns, r);
  return r;
}

std::string FormatMs(double ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f ms", ms);
  return buf;
}

Row ArmRow(const ArmResult& a) {
  Row row;
  row.label = a.label;
  if (!a.not_run.empty()) {
    row.cells = {"n/a", "-", "-", "-", "-"};
    return row;
  }
  row.cells = {
      std::to_string(a.others_ok) + " ok / " + std::to_string(a.others_failed) + " failed",
      std::to_string(a.rounds_after),
      std::isnan(a.recovered_ms) ? "none within " + std::to_string(kRecoveryTimeout.count()) + " s"
                                 : FormatMs(a.recovered_ms) + " (" + std::to_string(a.probes) +
                                       (a.probes == 1 ? " try)" : " tries)"),
      a.others_error.empty() ? "-" : a.others_error, a.culprit_saw.empty() ? "-" : a.culprit_saw};
  row.params = {{"others_ok", a.others_ok},
                {"others_failed", a.others_failed},
                {"rounds_after_fault", a.rounds_after},
                {"recovery_ms", a.recovered_ms},
                {"new_clients_tried", a.probes}};
  return row;
}

}  // namespace

std::vector<Table> RunFault(Context& ctx) {
  Table table;
  table.scenario = "fault";
  table.baseline_description = "MPS clients vs ferryd sessions, " + std::to_string(kWorkers) +
                               " processes each, one of them faulting the device";
  table.text_columns = {"others ok / failed", "rounds after the fault",
                        "time to a working new client", "what the others saw",
                        "what the culprit saw"};
  bool cuda = ctx.baseline && ctx.baseline->backend == "cuda";
  for (const auto& t : ctx.targets) cuda = cuda || t.backend == "cuda";
  table.notes = {
      std::to_string(kWorkers) +
          " processes run the sharing round (64 axpy(256) + 1 MiB up and "
          "down, waited on); one of them, after " +
          std::to_string(kCulpritRounds) +
          " rounds, launches a PTX kernel storing through a wild address and waits",
      "others ok / failed: the other " + std::to_string(kWorkers - 1) +
          " processes, each stopped at its first error or at least " +
          std::to_string(kObserve.count()) +
          " s after the fault; rounds after the fault: rounds they completed after it",
      "time to a working new client: from the faulting launch until a newly started process "
      "(a new session / a new MPS client) has run one round; new processes are tried one "
      "after another for up to " +
          std::to_string(kRecoveryTimeout.count()) + " s"};
  if (!cuda) {
    table.notes.insert(table.notes.begin(),
                       "skipped: needs a GPU (the host backend runs no "
                       "kernels)");
    for (const char* arm : {"MPS", "ferryd"}) {
      Row row;
      row.label = arm;
      row.cells = {"skipped", "-", "-", "-", "-"};
      table.rows.push_back(std::move(row));
    }
    return {table};
  }

  // MPS arm.
  if (ctx.mps && ctx.mps->available()) {
    ctx.progress->Case("MPS clients");
    ArmResult a = RunArm(ctx, "MPS", "inprocess", "cuda", ctx.mps->daemon->env());
    if (!a.not_run.empty()) table.notes.push_back("MPS: n/a: " + a.not_run);
    table.rows.push_back(ArmRow(a));
  } else {
    ArmResult a;
    a.label = "MPS";
    a.not_run = ctx.mps ? ctx.mps->why_not : "pass --baseline-mps";
    table.notes.push_back("MPS: n/a: " + a.not_run);
    table.rows.push_back(ArmRow(a));
  }

  // ferryd arm: a ferryd of its own, raw kernels allowed for this user.
  ArmResult d;
  d.label = "ferryd";
  if (ctx.options.spawn_daemon.empty()) {
    d.not_run =
        "needs --spawn-daemon (the fault resets the device of the daemon it runs on: "
        "a ferryd is started for it)";
  } else {
    std::string dir = ctx.temp_dir + "/fault";
    mkdir(dir.c_str(), 0700);
    std::vector<std::string> args = {"--raw-kernels", "uid:" + std::to_string(getuid())};
    args.insert(args.end(), ctx.options.daemon_args.begin(), ctx.options.daemon_args.end());
    SpawnedDaemon daemon;
    ctx.progress->Case("ferryd sessions");
    if (!daemon.Start(ctx.options.spawn_daemon, dir, false, 0, args)) {
      d.not_run = "its ferryd did not start (log above)";
    } else {
      d = RunArm(ctx, "ferryd", "daemon", daemon.endpoints().front(), WithoutMps());
    }
    daemon.Stop();
  }
  if (!d.not_run.empty()) table.notes.push_back("ferryd: n/a: " + d.not_run);
  table.rows.push_back(ArmRow(d));
  return {table};
}

int FaultWorkerMain(const std::vector<std::string>& args) {
  std::string role, mode, where;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--role") role = args[i + 1];
    if (args[i] == "--mode") mode = args[i + 1];
    if (args[i] == "--where") where = args[i + 1];
  }
  if (role != "other" && role != "culprit" && role != "probe") {
    std::fprintf(stderr, "fault worker: --role other|culprit|probe\n");
    return 2;
  }
  // A worker leaves as a program hit by an error does: at once, with no teardown of its
  // device or session (which after a fault can take long, and is not what is measured).
  auto leave = [](const std::string& last_words) {
    Say(last_words);
    std::_Exit(0);
  };
  auto w = OpenWorkload(mode, where, role == "culprit");
  if (role == "probe") {
    // A new client: open, one round, say when it was done.
    Status st = w.ok() ? (*w)->Round() : w.status();
    leave((st.ok() ? "ok " : "error ") + std::to_string(NowNs()) + " " + st.ToString());
  }
  if (!w.ok()) leave("error setting up: " + w.status().ToString());
  AwaitGo();
  Workload& work = **w;
  if (role == "culprit") {
    for (int r = 0; r < kCulpritRounds; ++r) {
      Status st = work.Round();
      if (!st.ok()) leave("error " + std::to_string(NowNs()) + " " + st.ToString());
    }
    Say("launch " + std::to_string(NowNs()));
    Status st = work.Fault();
    leave("fault " + std::to_string(NowNs()) + " " + st.ToString());
  }
  auto until = Clock::now() + kVictimCap;
  while (!StopRequested() && Clock::now() < until) {
    Status st = work.Round();
    if (!st.ok()) leave("error " + std::to_string(NowNs()) + " " + st.ToString());
    Say("round " + std::to_string(NowNs()));
  }
  Say("stopped");
  return 0;
}

}  // namespace ferry::bench
