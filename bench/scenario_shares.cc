// Scenario "shares" (opt-in: --scenario shares): do uid weights (ferryd's uid-weights, with
// device-turns or copy turns to make sessions wait) give two tenants the device time they
// are weighted for? Two worker processes, each switched to its own uid (kUidA and kUidB; so
// ferry-bench must run as root), each open one session on the first target and keep the
// device busy for the same wall time (10 s; --quick 2 s): submits of 16 axpy ops on 4M f32
// elements, up to 4 in flight. Each worker reports its session's device time as the daemon
// measured it (SessionStats.device_busy_ns at close). The table gives each uid's device
// seconds and share, and the ratio A / B, to compare with the weights the daemon was given,
// e.g. --spawn-daemon ferryd --daemon-arg --uid-weights=uid:60001=2,uid:60002=1
// --daemon-arg --device-turns=1 (expect about 2).
//
// The daemon's socket must let both uids connect: a daemon this run spawned gets its socket
// dir and sockets opened to them; for another target, see its socket's mode and group.
// Where they cannot connect, the table says so instead of figures.
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "bench.h"
#include "process.h"

namespace ferry::bench {
namespace {

constexpr uid_t kUidA = 60001;
constexpr uid_t kUidB = 60002;
constexpr int64_t kElements = 4 << 20;
constexpr int kOpsPerSubmit = 16;
constexpr int kInFlight = 4;

struct WorkerResult {
  bool ok = false;
  double busy_ns = 0, submits = 0;
};

Child StartWorker(const Context& ctx, const std::string& target, uid_t uid, int seconds) {
  return SpawnChild(ctx.self_exe,
                    {"--worker", "shares", "--where", target, "--uid", std::to_string(uid),
                     "--seconds", std::to_string(seconds)},
                    true, true);
}

}  // namespace

int SharesWorkerMain(const std::vector<std::string>& args) {
  std::string target;
  uid_t uid = 0;
  int seconds = 10;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--where") target = args[i + 1];
    if (args[i] == "--uid") uid = static_cast<uid_t>(std::stoul(args[i + 1]));
    if (args[i] == "--seconds") seconds = std::stoi(args[i + 1]);
  }
  // Become the tenant: no supplementary groups, its own gid and uid.
  if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) {
    std::printf("error cannot switch to uid %u (run ferry-bench as root)\n", uid);
    return 0;
  }
  auto client = Connect(target);
  if (!client.ok()) {
    std::printf("error uid %u cannot connect to %s: %s\n", uid, target.c_str(),
                client.status().ToString().c_str());
    return 0;
  }
  auto s = client->open_session();
  if (!s.ok()) {
    std::printf("error uid %u cannot open a session: %s\n", uid, s.status().ToString().c_str());
    return 0;
  }
  Tensor x = s->create_tensor<float>({kElements});
  Tensor y = s->create_tensor<float>({kElements});
  s->fill(x, 1.0);
  s->fill(y, 0.0);
  Check(s->synchronize(), "setup");
  std::printf("ready\n");
  std::fflush(stdout);
  char go;
  if (read(0, &go, 1) != 1) return 3;
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  uint64_t submits = 0;
  while (Clock::now() < end) {
    for (int k = 0; k < kOpsPerSubmit; ++k) s->axpy(1e-6, x, y);
    Check(s->submit(), "submit");
    ++submits;
    // Keep a few submits in flight: wait for all every kInFlight submits.
    if (submits % kInFlight == 0) Check(s->synchronize(), "synchronize");
  }
  auto stats = Check(s->close(), "close");
  std::printf("result %llu %llu\n", static_cast<unsigned long long>(stats.device_busy_ns),
              static_cast<unsigned long long>(submits));
  std::fflush(stdout);
  return 0;
}

std::vector<Table> RunShares(Context& ctx) {
  Table table;
  table.scenario = "shares";
  table.target = ctx.targets.empty() ? "" : ctx.targets.front().target;
  table.daemon_label = "ferryd";
  if (ctx.targets.empty()) {
    table.notes.push_back("skipped: no daemon target");
    return {table};
  }
  if (::geteuid() != 0) {
    table.notes.push_back("skipped: needs root, to run its two workers as uids " +
                          std::to_string(kUidA) + " and " + std::to_string(kUidB));
    return {table};
  }
  // A daemon this run spawned (--spawn-daemon) listens in this run's 0700 temp dir: let the
  // two uids reach its sockets, as they could a system ferryd's (0660, group ferry).
  if (table.target.rfind("unix:", 0) == 0 && !ctx.temp_dir.empty()) {
    const std::string path = table.target.substr(5);
    if (path.rfind(ctx.temp_dir + "/", 0) == 0) {
      (void)::chmod(path.substr(0, path.rfind('/')).c_str(), 0711);
      (void)::chmod(ctx.temp_dir.c_str(), 0711);
      (void)::chmod(path.c_str(), 0666);
      (void)::chmod((path + ".slabs").c_str(), 0666);
    }
  }
  const int seconds = ctx.options.quick ? 2 : 10;
  Child a = StartWorker(ctx, table.target, kUidA, seconds);
  Child b = StartWorker(ctx, table.target, kUidB, seconds);
  std::string problem;
  for (Child* c : {&a, &b}) {
    std::string line;
    if (c->pid <= 0 || !ReadLine(c->stdout_fd, &line) || line != "ready") {
      problem += (problem.empty() ? "" : "; ") + (line.empty() ? "a worker failed" : line);
    }
  }
  WorkerResult results[2];
  if (problem.empty()) {
    for (Child* c : {&a, &b}) {
      if (!WriteAll(c->stdin_fd, "g", 1)) problem = "cannot start a worker";
    }
  }
  Child* children[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    Child& c = *children[i];
    if (c.stdin_fd >= 0) close(c.stdin_fd);
    std::istringstream in(c.stdout_fd >= 0 ? ReadAll(c.stdout_fd) : "");
    if (c.stdout_fd >= 0) close(c.stdout_fd);
    if (c.pid > 0) WaitChild(c.pid, std::chrono::seconds(seconds + 120));
    std::string word;
    if (in >> word && word == "result" && in >> results[i].busy_ns >> results[i].submits) {
      results[i].ok = true;
    }
  }
  if (!problem.empty() || !results[0].ok || !results[1].ok) {
    table.notes.push_back("not measured: " + (problem.empty() ? "a worker failed" : problem));
    return {table};
  }
  const double total = results[0].busy_ns + results[1].busy_ns;
  const uid_t uids[2] = {kUidA, kUidB};
  for (int i = 0; i < 2; ++i) {
    Row row("uid " + std::to_string(uids[i]),
            {Figure{"device s", results[i].busy_ns / 1e9, kNaN},
             Figure{"share %", total > 0 ? 100.0 * results[i].busy_ns / total : kNaN, kNaN},
             Figure{"submits", results[i].submits, kNaN}});
    row.params.push_back({"uid", static_cast<double>(uids[i])});
    table.rows.push_back(std::move(row));
  }
  table.rows.push_back(
      Row("ratio A / B",
          {Figure{"device s",
                  results[1].busy_ns > 0 ? results[0].busy_ns / results[1].busy_ns : kNaN, kNaN}}));
  table.notes.push_back(
      "device time per uid over " + std::to_string(seconds) +
      " s of both keeping the device busy (SessionStats.device_busy_ns); compare the ratio "
      "with the daemon's uid-weights (e.g. uid:60001=2,uid:60002=1 with device-turns=1: "
      "about 2). Without weights or turns the sessions share as CUDA interleaves them.");
  return {table};
}

}  // namespace ferry::bench
