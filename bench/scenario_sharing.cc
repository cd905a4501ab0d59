// Scenario "sharing": N separate client processes (N = 1, 4, 8; quick: 1, 2) running the
// same workload at once, twice:
//   * through one ferryd (each process opens one session on the target), and
//   * (baseline) each process in process on its own device — backend::CreateDevice("auto"):
//     its own CUDA context when a GPU is visible, its own host-backend emulation otherwise —
//     which is what programs do today without a daemon.
// The processes are this program re-executed as `ferry-bench --worker sharing ...`. Each sets
// up (one untimed warm-up round), prints "ready", waits for a go byte on stdin (so all start together), runs R rounds of
//     64 x axpy(256) in one submit | upload 1 MiB (blocking) | download 1 MiB (blocking)
// (in process: 64 Axpy launches, H2D and D2H of a registered buffer, one wait), and prints
// its counts and each round's time on stdout.
// Figures: ops/s and GB/s = all processes' small ops / bytes over the slowest process's
// elapsed time; round p50 / p99 (ms) over every round of every process.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "backend/select.h"
#include "bench.h"
#include "process.h"

namespace ferry::bench {
namespace {

constexpr int kOpsPerRound = 64;
constexpr int64_t kAxpyElements = 256;
constexpr uint64_t kRoundBytes = 1ull << 20;

struct ProcessResult {
  double ops = 0, bytes = 0, elapsed_ns = 0;
  Samples rounds;
};

struct SharingRun {
  double ops = 0, bytes = 0, wall_ns = 0;
  Samples rounds;
  void Merge(const SharingRun& o) {
    ops += o.ops;
    bytes += o.bytes;
    wall_ns += o.wall_ns;
    rounds.Append(o.rounds);
  }
};

/// Start `n` workers with `args`, start them together, collect their results.
SharingRun RunWorkers(const Context& ctx, int n, const std::vector<std::string>& args) {
  std::vector<Child> children;
  for (int i = 0; i < n; ++i) {
    Child c = SpawnChild(ctx.self_exe, args, true, true);
    if (c.pid <= 0) Die("cannot start a sharing worker");
    children.push_back(c);
  }
  for (Child& c : children) {
    std::string line;
    if (!ReadLine(c.stdout_fd, &line) || line != "ready") Die("a sharing worker failed to set up");
  }
  for (Child& c : children) {
    if (!WriteAll(c.stdin_fd, "g", 1)) Die("cannot start a sharing worker");
    close(c.stdin_fd);
  }
  SharingRun run;
  for (Child& c : children) {
    std::istringstream in(ReadAll(c.stdout_fd));
    close(c.stdout_fd);
    int status = WaitChild(c.pid, std::chrono::seconds(120));
    std::string word;
    ProcessResult r;
    if (!(in >> word >> r.ops >> r.bytes >> r.elapsed_ns) || word != "result" ||
        !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      Die("a sharing worker failed (exit status " + std::to_string(status) + ")");
    }
    double ns;
    while (in >> ns) r.rounds.Add(ns);
    run.ops += r.ops;
    run.bytes += r.bytes;
    run.wall_ns = std::max(run.wall_ns, r.elapsed_ns);
    run.rounds.Append(r.rounds);
  }
  return run;
}

std::vector<std::string> WorkerArgs(const std::string& mode, const std::string& where, int rounds) {
  return {"--worker", "sharing", "--mode",   mode,
          "--where",  where,     "--rounds", std::to_string(rounds)};
}

/// Wait for the parent's go byte on stdin.
void AwaitGo() {
  std::printf("ready\n");
  std::fflush(stdout);
  char go;
  if (read(0, &go, 1) != 1) std::exit(3);
}

void PrintResult(double ops, double bytes, double elapsed_ns, const Samples& rounds) {
  std::printf("result %.0f %.0f %.0f\n", ops, bytes, elapsed_ns);
  for (double ns : rounds.ns) std::printf("%.0f\n", ns);
  std::fflush(stdout);
}

int DaemonWorker(const std::string& target, int rounds) {
  auto client = Check(Connect(target), "connect " + target);
  auto s = Check(client.open_session(), "open_session");
  Tensor t = s.create_tensor<uint8_t>({static_cast<int64_t>(kRoundBytes)});
  Tensor x = s.create_tensor<float>({kAxpyElements});
  Tensor y = s.create_tensor<float>({kAxpyElements});
  s.fill(x, 1.0);
  s.fill(y, 0.0);
  HostBuffer buf(kRoundBytes);
  auto round = [&] {
    for (int k = 0; k < kOpsPerRound; ++k) s.axpy(1e-6, x, y);
    Check(s.submit(), "submit");
    Check(s.upload_bytes(t, buf.data(), kRoundBytes), "upload");
    Check(s.download_bytes(t, buf.data(), kRoundBytes), "download");
  };
  round();  // warm-up, untimed: the session's first transfer maps its slab (as the baseline
            // registers its buffer before the start)
  Check(s.synchronize(), "setup");
  AwaitGo();
  Samples samples;
  auto start = Clock::now();
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    round();
    samples.Add(NsSince(t0));
  }
  Check(s.synchronize(), "synchronize");
  double elapsed = NsSince(start);
  Check(s.close().status(), "close");
  PrintResult(static_cast<double>(rounds) * kOpsPerRound, 2.0 * rounds * kRoundBytes, elapsed,
              samples);
  return 0;
}

int InProcessWorker(const std::string& kind, int rounds) {
  std::string why;
  auto dev = Check(backend::CreateDevice(kind, 0, backend::HostDeviceOptions{}, &why),
                   "CreateDevice " + kind);
  auto stream = Check(dev->CreateStream(), "CreateStream");
  HostBuffer buf(kRoundBytes);
  Check(dev->RegisterHostMemory(buf.data(), kRoundBytes), "RegisterHostMemory");
  auto d = Check(stream->Allocate(kRoundBytes), "Allocate");
  auto x = Check(stream->Allocate(kAxpyElements * sizeof(float)), "Allocate");
  auto y = Check(stream->Allocate(kAxpyElements * sizeof(float)), "Allocate");
  Check(stream->Fill(DType::kF32, x, kAxpyElements, 1.0), "Fill");
  Check(stream->Fill(DType::kF32, y, kAxpyElements, 0.0), "Fill");
  auto round = [&] {
    for (int k = 0; k < kOpsPerRound; ++k) {
      Check(stream->Axpy(DType::kF32, 1e-6, x, y, kAxpyElements), "Axpy");
    }
    Check(stream->CopyHostToDevice(d, buf.data(), kRoundBytes), "H2D");
    Check(stream->CopyDeviceToHost(buf.data(), d, kRoundBytes), "D2H");
    Check(WaitStream(*stream), "wait");
  };
  round();  // warm-up, untimed, as the daemon worker's
  Check(WaitStream(*stream), "setup");
  AwaitGo();
  Samples samples;
  auto start = Clock::now();
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    round();
    samples.Add(NsSince(t0));
  }
  double elapsed = NsSince(start);
  stream->Free(d);
  stream->Free(x);
  stream->Free(y);
  Check(WaitStream(*stream), "free");
  Check(dev->UnregisterHostMemory(buf.data()), "UnregisterHostMemory");
  PrintResult(static_cast<double>(rounds) * kOpsPerRound, 2.0 * rounds * kRoundBytes, elapsed,
              samples);
  return 0;
}

Row SharingRow(int n, const SharingRun* d, const SharingRun* b) {
  auto opss = [](const SharingRun* r) { return r ? r->ops / (r->wall_ns / 1e9) : kNaN; };
  auto gbps = [](const SharingRun* r) { return r ? r->bytes / r->wall_ns : kNaN; };
  auto q = [](const SharingRun* r, double Summary::*f) {
    return r ? Summarize(r->rounds).*f / 1e6 : kNaN;
  };
  Row row{std::to_string(n) + (n == 1 ? " process" : " processes"),
          {{"ops/s", opss(d), opss(b)},
           {"GB/s", gbps(d), gbps(b)},
           {"round p50 ms", q(d, &Summary::p50), q(b, &Summary::p50)},
           {"round p99 ms", q(d, &Summary::p99), q(b, &Summary::p99)}}};
  row.params = {{"processes", n}};
  if (d) row.summaries.push_back({"daemon_rounds", Summarize(d->rounds)});
  if (b) row.summaries.push_back({"baseline_rounds", Summarize(b->rounds)});
  return row;
}

}  // namespace

std::vector<Table> RunSharing(Context& ctx) {
  std::vector<int> counts = !ctx.options.processes.empty() ? ctx.options.processes
                            : ctx.options.quick            ? std::vector<int>{1, 2}
                                                           : std::vector<int>{1, 4, 8};
  int rounds = ctx.options.quick ? 5 : 100;
  std::vector<SharingRun> base(counts.size());
  if (ctx.baseline) {
    for (size_t i = 0; i < counts.size(); ++i) {
      ctx.progress->Case("baseline " + std::to_string(counts[i]) + " processes, own device each");
      base[i] = RunWorkers(ctx, counts[i], WorkerArgs("inprocess", ctx.baseline->backend, rounds));
    }
  }
  std::vector<std::vector<SharingRun>> daemon(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    for (int n : counts) {
      ctx.progress->Case(ctx.targets[t].target + " " + std::to_string(n) + " processes");
      daemon[t].push_back(RunWorkers(ctx, n, WorkerArgs("daemon", ctx.targets[t].target, rounds)));
    }
  }
  return BuildTables(
      ctx, "sharing",
      [&](int which) {
        std::vector<Row> rows;
        for (size_t i = 0; i < counts.size(); ++i) {
          SharingRun d;
          if (which >= 0) d = daemon[which][i];
          if (which == kAllTargets) {
            for (auto& t : daemon) d.Merge(t[i]);
          }
          rows.push_back(SharingRow(counts[i], which == kNoTarget ? nullptr : &d,
                                    ctx.baseline ? &base[i] : nullptr));
        }
        return rows;
      },
      [&](int which) {
        std::vector<std::string> notes = {
            "each process: " + std::to_string(rounds) + " rounds of " +
                std::to_string(kOpsPerRound) +
                " axpy(256) in one submit + upload and "
                "download of 1 MiB (blocking); all processes start together",
            "ops/s (small ops), GB/s: all processes' work / the slowest process's time; round "
            "p50/p99 over all rounds of all processes",
            "daemon: one session per process through the target; baseline: each process in "
            "process on its own device (own " +
                std::string(ctx.baseline ? ctx.baseline->backend : "device") +
                (ctx.baseline && ctx.baseline->backend == "cuda" ? " context" : " emulation") +
                ")"};
        if (which == kAllTargets) notes.push_back("all targets: summed, samples pooled");
        return notes;
      });
}

int SharingWorkerMain(const std::vector<std::string>& args) {
  std::string mode, where;
  int rounds = 10;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--mode") mode = args[i + 1];
    if (args[i] == "--where") where = args[i + 1];
    if (args[i] == "--rounds") rounds = std::max(1, std::atoi(args[i + 1].c_str()));
  }
  if (mode == "daemon") return DaemonWorker(where, rounds);
  if (mode == "inprocess") return InProcessWorker(where, rounds);
  std::fprintf(stderr, "sharing worker: --mode daemon|inprocess\n");
  return 2;
}

}  // namespace ferry::bench
