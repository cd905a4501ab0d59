// Scenario "sharing": N separate client processes (N = 1, 4, 8; quick: 1, 2) running the
// same workload at once:
//   * through one ferryd (each process opens one session on the target), once per transfer
//     route: "blocking" (upload_bytes / download_bytes from ordinary memory) and "pinned"
//     (one PinnedBuffer — memory the daemon has registered and DMAs from — moved through
//     upload_pending / download_pending + wait() every round; "pinned-inline" on a tcp:
//     target, where the same API sends the bytes inline),
//   * (baseline) each process in process on its own device — backend::CreateDevice("auto"):
//     its own CUDA context when a GPU is visible, its own host-backend emulation otherwise —
//     which is what programs do today without a daemon, and
//   * (--baseline-mps) the same in-process processes as clients of one MPS daemon, and
//   * (baseline, a table of its own) N threads of this one process, each with its own stream
//     of one device (on CUDA one context), one launch per axpy and batched: what any daemon
//     that owns one context could reach, without ferryd's RPC and hand-offs.
// The baseline and MPS processes copy from a registered buffer; both routes' rows show the
// same baseline and MPS figures. A third row per count, "blocking vs pageable", sets the
// blocking route against baseline and MPS processes that copy from ordinary (pageable)
// memory, as a program without a daemon does when its bytes are in ordinary memory (the CUDA
// runtime stages them through pinned memory of its own): the same work on both sides.
// The processes are this program re-executed as `ferry-bench --worker sharing ...` (through
// RunWorkers). Each sets up (one untimed warm-up round: a session's first transfer maps its
// first slab, as the baseline registers its buffer before the start), prints "ready", waits
// for a go byte on stdin (so all start together), runs R rounds of
//     64 x axpy(256) in one submit | upload 1 MiB | download 1 MiB
// (in process: 64 Axpy launches, H2D and D2H of a registered buffer, or of a pageable one with
// `--memory pageable`, one wait), and prints
// its counts, its elapsed time and each round's time on stdout.
// Figures: ops/s and GB/s = all processes' small ops / bytes over the slowest process's
// elapsed time; round p50 / p99 (ms) over every round of every process; max/min = the
// slowest process's elapsed time / the fastest's (how evenly the device was shared; the
// target is <= 1.25).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "backend/select.h"
#include "bench.h"
#include "process.h"

namespace ferry::bench {
namespace {

constexpr int kOpsPerRound = 64;
constexpr int64_t kAxpyElements = 256;
constexpr uint64_t kRoundBytes = 1ull << 20;

struct SharingRun {
  double ops = 0, bytes = 0, wall_ns = 0;
  std::vector<double> elapsed_ns;  // each process's
  Samples rounds;
  void Merge(const SharingRun& o) {
    ops += o.ops;
    bytes += o.bytes;
    wall_ns += o.wall_ns;
    elapsed_ns.insert(elapsed_ns.end(), o.elapsed_ns.begin(), o.elapsed_ns.end());
    rounds.Append(o.rounds);
  }
  /// The slowest process's elapsed time over the fastest's.
  double spread() const {
    if (elapsed_ns.empty()) return kNaN;
    auto [lo, hi] = std::minmax_element(elapsed_ns.begin(), elapsed_ns.end());
    return *lo > 0 ? *hi / *lo : kNaN;
  }
};

/// Parse the workers' outputs (PrintResult's) into one run.
SharingRun Collect(const std::vector<std::string>& outputs) {
  SharingRun run;
  for (const std::string& out : outputs) {
    std::istringstream in(out);
    std::string word;
    double ops = 0, bytes = 0, elapsed = 0;
    if (!(in >> word >> ops >> bytes >> elapsed) || word != "result") {
      Die("a sharing worker printed no result");
    }
    double ns;
    while (in >> ns) run.rounds.Add(ns);
    run.ops += ops;
    run.bytes += bytes;
    run.wall_ns = std::max(run.wall_ns, elapsed);
    run.elapsed_ns.push_back(elapsed);
  }
  return run;
}

/// Run `n` workers with `args`, started together, none of them an MPS client.
SharingRun RunOwn(const Context& ctx, int n, const std::vector<std::string>& args) {
  std::vector<std::string> outputs;
  for (const WorkerOutput& w :
       RunWorkers(ctx.self_exe, n, args, WithoutMps(), std::chrono::seconds(600))) {
    if (!w.ok()) Die("a sharing worker failed (status " + std::to_string(w.status) + ")");
    outputs.push_back(w.out);
  }
  return Collect(outputs);
}

enum class Route { kBlocking, kPinned };
const Route kRoutes[] = {Route::kBlocking, Route::kPinned};
std::string RouteLabel(Route r, const std::string& target) {
  if (r == Route::kBlocking) return "blocking";
  return IsRemote(target) ? "pinned-inline" : "pinned";
}

std::vector<std::string> WorkerArgs(const std::string& mode, const std::string& where, int rounds,
                                    Route route = Route::kBlocking) {
  return {"--worker", "sharing",
          "--mode",   mode,
          "--where",  where,
          "--rounds", std::to_string(rounds),
          "--route",  route == Route::kPinned ? "pinned" : "blocking"};
}

/// An in-process worker's host memory: registered (pinned) first, or ordinary pageable memory.
enum class HostMemory { kRegistered, kPageable };

std::vector<std::string> InProcessArgs(const std::string& where, int rounds, HostMemory memory) {
  std::vector<std::string> args = WorkerArgs("inprocess", where, rounds);
  args.push_back("--memory");
  args.push_back(memory == HostMemory::kPageable ? "pageable" : "registered");
  return args;
}

void PrintResult(double ops, double bytes, double elapsed_ns, const Samples& rounds) {
  std::printf("result %.0f %.0f %.0f\n", ops, bytes, elapsed_ns);
  for (double ns : rounds.ns) std::printf("%.0f\n", ns);
  std::fflush(stdout);
}

int DaemonWorker(const std::string& target, int rounds, Route route) {
  auto client = Check(Connect(target), "connect " + target);
  auto s = Check(client.open_session(), "open_session");
  RoundTensors tensors = CreateRoundTensors(s, kRoundBytes, kAxpyElements);
  Tensor& t = tensors.t;
  HostBuffer buf(kRoundBytes);
  PinnedBuffer pinned;
  if (route == Route::kPinned) {
    pinned = Check(s.pinned_buffer(kRoundBytes), "pinned_buffer");
    std::memset(pinned.data(), 0x5a, kRoundBytes);  // touch once, untimed
  }
  Check(s.synchronize(), "setup");
  auto round = [&] {
    for (int k = 0; k < kOpsPerRound; ++k) s.axpy(1e-6, tensors.x, tensors.y);
    Check(s.submit(), "submit");
    if (route == Route::kPinned) {
      // The buffer and the tensor go into each transfer and come back.
      PendingRoundTrip(s, /*upload=*/true, pinned, t);
      PendingRoundTrip(s, /*upload=*/false, pinned, t);
    } else {
      Check(s.upload_bytes(t, buf.data(), kRoundBytes), "upload");
      Check(s.download_bytes(t, buf.data(), kRoundBytes), "download");
    }
  };
  round();  // warm-up, untimed: the session's first transfer maps its slab
  Check(s.synchronize(), "warm-up");
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

// One stream's share of the in-process work: its buffers, and the round of the header
// comment (64 Axpy launches, or one batch of them, H2D and D2H of a registered buffer, or of
// a pageable one, one wait).
class InProcessStream {
 public:
  InProcessStream(backend::Device& dev, bool batched, HostMemory memory = HostMemory::kRegistered)
      : dev_(dev),
        batched_(batched),
        registered_(memory == HostMemory::kRegistered),
        buf_(kRoundBytes) {
    stream_ = Check(dev.CreateStream(), "CreateStream");
    if (registered_) {
      Check(dev.RegisterHostMemory(buf_.data(), kRoundBytes), "RegisterHostMemory");
    }
    d_ = Check(stream_->Allocate(kRoundBytes), "Allocate");
    x_ = Check(stream_->Allocate(kAxpyElements * sizeof(float)), "Allocate");
    y_ = Check(stream_->Allocate(kAxpyElements * sizeof(float)), "Allocate");
    Check(stream_->Fill(DType::kF32, x_, kAxpyElements, 1.0), "Fill");
    Check(stream_->Fill(DType::kF32, y_, kAxpyElements, 0.0), "Fill");
    Round();  // warm-up, untimed, as the daemon worker's
  }
  ~InProcessStream() {
    stream_->Free(d_);
    stream_->Free(x_);
    stream_->Free(y_);
    Check(WaitStream(*stream_), "free");
    if (registered_) Check(dev_.UnregisterHostMemory(buf_.data()), "UnregisterHostMemory");
  }
  void Round() {
    if (batched_) Check(stream_->BeginBatch(), "BeginBatch");
    for (int k = 0; k < kOpsPerRound; ++k) {
      Check(stream_->Axpy(DType::kF32, 1e-6, x_, y_, kAxpyElements), "Axpy");
    }
    if (batched_) Check(stream_->EndBatch(), "EndBatch");
    Check(stream_->CopyHostToDevice(d_, buf_.data(), kRoundBytes), "H2D");
    Check(stream_->CopyDeviceToHost(buf_.data(), d_, kRoundBytes), "D2H");
    Check(WaitStream(*stream_), "wait");
  }
  /// `rounds` rounds, each timed into `samples`; the whole run's ns.
  double Run(int rounds, Samples& samples) {
    auto start = Clock::now();
    for (int r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      Round();
      samples.Add(NsSince(t0));
    }
    return NsSince(start);
  }

 private:
  backend::Device& dev_;
  const bool batched_;
  const bool registered_;
  HostBuffer buf_;
  std::unique_ptr<backend::Stream> stream_;
  backend::DevicePtr d_ = 0, x_ = 0, y_ = 0;
};

int InProcessWorker(const std::string& kind, int rounds, HostMemory memory) {
  std::string why;
  auto dev = Check(backend::CreateDevice(kind, 0, backend::HostDeviceOptions{}, &why),
                   "CreateDevice " + kind);
  Samples samples;
  double elapsed = 0;
  {
    InProcessStream stream(*dev, /*batched=*/false, memory);
    AwaitGo();
    elapsed = stream.Run(rounds, samples);
  }
  PrintResult(static_cast<double>(rounds) * kOpsPerRound, 2.0 * rounds * kRoundBytes, elapsed,
              samples);
  return 0;
}

// `n` threads of this process, each with its own stream of one device (on CUDA one context),
// running the same rounds at once: the most a daemon that owns one context can get, with
// none of ferryd's hops (no RPC, no hand-off between threads). `batched`: the 64 Axpy go as
// one batch (BeginBatch/EndBatch), as ferryd sends a submit's run of kernels (on CUDA, with
// the backend's default options, one fused kernel: CudaDeviceOptions::fuse_elementwise).
SharingRun RunOneContext(const std::string& kind, int n, int rounds, bool batched) {
  std::string why;
  auto dev = Check(backend::CreateDevice(kind, 0, backend::HostDeviceOptions{}, &why),
                   "CreateDevice " + kind);
  std::vector<std::unique_ptr<InProcessStream>> streams;
  for (int i = 0; i < n; ++i) streams.push_back(std::make_unique<InProcessStream>(*dev, batched));
  std::vector<Samples> samples(n);
  std::vector<double> elapsed(n);
  std::atomic<int> waiting{n};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      waiting.fetch_sub(1);
      while (waiting.load() > 0) std::this_thread::yield();  // all start together
      elapsed[i] = streams[i]->Run(rounds, samples[i]);
    });
  }
  for (auto& t : threads) t.join();
  streams.clear();
  SharingRun run;
  for (int i = 0; i < n; ++i) {
    run.ops += static_cast<double>(rounds) * kOpsPerRound;
    run.bytes += 2.0 * rounds * kRoundBytes;
    run.wall_ns = std::max(run.wall_ns, elapsed[i]);
    run.elapsed_ns.push_back(elapsed[i]);
    run.rounds.Append(samples[i]);
  }
  return run;
}

/// One row: `d` through the daemon (null: none), `b` in process on own devices, `m` as MPS
/// clients (null: not measured).
Row SharingRow(const std::string& label, int n, const SharingRun* d, const SharingRun* b,
               const SharingRun* m, const Context& ctx) {
  auto opss = [](const SharingRun* r) { return r ? r->ops / (r->wall_ns / 1e9) : kNaN; };
  auto gbps = [](const SharingRun* r) { return r ? r->bytes / r->wall_ns : kNaN; };
  auto q = [](const SharingRun* r, double Summary::*f) {
    return r ? Summarize(r->rounds).*f / 1e6 : kNaN;
  };
  auto spread = [](const SharingRun* r) { return r ? r->spread() : kNaN; };
  Row row{label,
          {{"ops/s", opss(d), opss(b), MpsFigure(ctx, opss(m))},
           {"GB/s", gbps(d), gbps(b), MpsFigure(ctx, gbps(m))},
           {"round p50 ms", q(d, &Summary::p50), q(b, &Summary::p50),
            MpsFigure(ctx, q(m, &Summary::p50))},
           {"round p99 ms", q(d, &Summary::p99), q(b, &Summary::p99),
            MpsFigure(ctx, q(m, &Summary::p99))},
           {"max/min", spread(d), spread(b), MpsFigure(ctx, spread(m)), false}}};
  row.params = {{"processes", n}};
  if (d) row.summaries.push_back({"daemon_rounds", Summarize(d->rounds)});
  if (b) row.summaries.push_back({"baseline_rounds", Summarize(b->rounds)});
  if (m) row.summaries.push_back({"mps_rounds", Summarize(m->rounds)});
  return row;
}

/// What the sharing scenario measured, per process count counts[i]. The _pageable runs copy
/// from ordinary memory; baseline runs are empty without --baseline, MPS runs without the
/// MPS arm.
struct SharingMeasurements {
  std::vector<int> counts;
  int rounds = 0;
  std::vector<SharingRun> base, base_pageable, mps, mps_pageable;
  // One context, n threads (batched and not).
  std::vector<SharingRun> one_context, one_context_batched;
  bool with_mps = false;
  std::vector<std::vector<std::vector<SharingRun>>> daemon;  // [target][i][route]
};

/// Run the baseline: counts[i] processes each on its own device (registered and pageable
/// memory), then counts[i] threads on one device. Needs ctx.baseline.
void MeasureSharingBaseline(Context& ctx, SharingMeasurements& m) {
  for (size_t i = 0; i < m.counts.size(); ++i) {
    ctx.progress->Case("baseline " + std::to_string(m.counts[i]) + " processes, own device each");
    m.base[i] = RunOwn(ctx, m.counts[i],
                       InProcessArgs(ctx.baseline->backend, m.rounds, HostMemory::kRegistered));
    ctx.progress->Case("baseline " + std::to_string(m.counts[i]) +
                       " processes, own device each, pageable");
    m.base_pageable[i] = RunOwn(
        ctx, m.counts[i], InProcessArgs(ctx.baseline->backend, m.rounds, HostMemory::kPageable));
  }
  // Beside own contexts and MPS, in a table of its own, what any single-context daemon could
  // reach on this machine.
  for (size_t i = 0; i < m.counts.size(); ++i) {
    ctx.progress->Case("baseline " + std::to_string(m.counts[i]) + " threads, one device");
    m.one_context[i] = RunOneContext(ctx.baseline->backend, m.counts[i], m.rounds, false);
    m.one_context_batched[i] = RunOneContext(ctx.baseline->backend, m.counts[i], m.rounds, true);
  }
}

/// Run counts[i] MPS client processes (registered and pageable memory). Needs the MPS arm.
void MeasureSharingMps(Context& ctx, SharingMeasurements& m) {
  for (size_t i = 0; i < m.counts.size(); ++i) {
    ctx.progress->Case("MPS " + std::to_string(m.counts[i]) + " processes");
    m.mps[i] = Collect(
        RunMpsWorkers(ctx, m.counts[i], InProcessArgs("cuda", m.rounds, HostMemory::kRegistered)));
    ctx.progress->Case("MPS " + std::to_string(m.counts[i]) + " processes, pageable");
    m.mps_pageable[i] = Collect(
        RunMpsWorkers(ctx, m.counts[i], InProcessArgs("cuda", m.rounds, HostMemory::kPageable)));
  }
}

/// Run counts[i] daemon client processes on every target, once per route.
void MeasureSharingTargets(Context& ctx, SharingMeasurements& m) {
  m.daemon.resize(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    const std::string& target = ctx.targets[t].target;
    for (int n : m.counts) {
      m.daemon[t].emplace_back();
      for (Route route : kRoutes) {
        ctx.progress->Case(target + " " + std::to_string(n) + " processes, " +
                           RouteLabel(route, target));
        m.daemon[t].back().push_back(RunOwn(ctx, n, WorkerArgs("daemon", target, m.rounds, route)));
      }
    }
  }
}

/// The rows of the sharing table of `which` (a target, kAllTargets or kNoTarget): per count,
/// a row per route plus the blocking route against pageable copies (baseline only: a row per
/// count and host memory).
std::vector<Row> SharingRows(const Context& ctx, const SharingMeasurements& m, int which) {
  std::vector<Row> rows;
  for (size_t i = 0; i < m.counts.size(); ++i) {
    const int count = m.counts[i];
    std::string n = std::to_string(count) + (count == 1 ? " process" : " processes");
    const SharingRun* b = ctx.baseline ? &m.base[i] : nullptr;
    const SharingRun* mp = m.with_mps ? &m.mps[i] : nullptr;
    const SharingRun* b_pageable = ctx.baseline ? &m.base_pageable[i] : nullptr;
    const SharingRun* m_pageable = m.with_mps ? &m.mps_pageable[i] : nullptr;
    if (which == kNoTarget) {
      rows.push_back(SharingRow(n, count, nullptr, b, mp, ctx));
      Row pageable = SharingRow(n + ", pageable", count, nullptr, b_pageable, m_pageable, ctx);
      pageable.tags.push_back({"baseline", "pageable"});
      rows.push_back(std::move(pageable));
      continue;
    }
    for (size_t r = 0; r < std::size(kRoutes); ++r) {
      SharingRun d;
      if (which >= 0) d = m.daemon[which][i][r];
      if (which == kAllTargets) {
        for (auto& t : m.daemon) d.Merge(t[i][r]);
      }
      std::string target = which >= 0 ? ctx.targets[which].target : "";
      Row row = SharingRow(n + ", " + RouteLabel(kRoutes[r], target), count, &d, b, mp, ctx);
      row.tags.push_back({"route", RouteLabel(kRoutes[r], target)});
      rows.push_back(std::move(row));
      if (kRoutes[r] != Route::kBlocking) continue;
      // The blocking route again, against processes that copy from ordinary memory.
      Row pageable =
          SharingRow(n + ", blocking vs pageable", count, &d, b_pageable, m_pageable, ctx);
      pageable.tags.push_back({"route", "blocking"});
      pageable.tags.push_back({"baseline", "pageable"});
      rows.push_back(std::move(pageable));
    }
  }
  return rows;
}

/// The notes under the sharing table of `which`.
std::vector<std::string> SharingNotes(const Context& ctx, const SharingMeasurements& m, int which) {
  std::vector<std::string> notes = {
      "each process: " + std::to_string(m.rounds) + " rounds of " + std::to_string(kOpsPerRound) +
          " axpy(256) in one submit + upload and "
          "download of 1 MiB; all processes start together",
      "blocking = upload_bytes/download_bytes from ordinary memory; pinned = one "
      "PinnedBuffer (memory the daemon registered) moved through "
      "upload_pending/download_pending + wait() each round (pinned-inline: tcp target, "
      "bytes inline)",
      "ops/s (small ops), GB/s: all processes' work / the slowest process's time; round "
      "p50/p99 over all rounds of all processes; max/min = slowest / fastest process's "
      "elapsed time (target <= 1.25)",
      "daemon: one session per process through the target; baseline: each process in "
      "process on its own device (own " +
          std::string(ctx.baseline ? ctx.baseline->backend : "device") +
          (ctx.baseline && ctx.baseline->backend == "cuda" ? " context" : " emulation") +
          "), copying from a registered buffer; the same baseline figures on both routes' "
          "rows",
      "blocking vs pageable: the blocking route's figures against baseline (and MPS) "
      "processes that copy from ordinary, unregistered (pageable) memory, as a program "
      "whose bytes are in ordinary memory does without a daemon"};
  std::string mps_note = MpsNote(ctx, "the baseline's processes");
  if (!mps_note.empty()) notes.push_back(mps_note);
  if (which == kAllTargets) notes.push_back("all targets: summed, samples pooled");
  return notes;
}

/// The table of one context's threads (batched and not) against own processes and MPS.
/// Needs ctx.baseline.
Table OneContextTable(const Context& ctx, const SharingMeasurements& m) {
  Table t;
  t.scenario = "sharing";
  t.target = "";
  t.daemon_label = "one context";
  t.baseline_label = "own contexts";
  t.baseline_description = "threads of one process on one device, against own processes";
  for (size_t i = 0; i < m.counts.size(); ++i) {
    const SharingRun* mp = m.with_mps ? &m.mps[i] : nullptr;
    for (bool batched : {false, true}) {
      const SharingRun& one = batched ? m.one_context_batched[i] : m.one_context[i];
      Row row = SharingRow(std::to_string(m.counts[i]) + " threads, " +
                               (batched ? "batched" : "one launch per axpy"),
                           m.counts[i], &one, &m.base[i], mp, ctx);
      row.tags.push_back({"arm", batched ? "one-context-batched" : "one-context"});
      t.rows.push_back(std::move(row));
    }
  }
  t.notes = {"one context: N threads of this process, each on its own stream of one " +
                 ctx.baseline->backend +
                 " device, running the processes' rounds at once (no RPC, no hand-off between "
                 "threads): the ceiling of any daemon that owns one context; batched = the 64 "
                 "axpy as one batch (BeginBatch/EndBatch), as ferryd sends a submit's kernels "
                 "(on CUDA one fused kernel, as in ferryd unless --fuse-elementwise=false)",
             "own contexts and MPS: the same figures as the table above"};
  return t;
}

}  // namespace

std::vector<Table> RunSharing(Context& ctx) {
  SharingMeasurements m;
  m.counts = !ctx.options.processes.empty() ? ctx.options.processes
             : ctx.options.quick            ? std::vector<int>{1, 2}
                                            : std::vector<int>{1, 4, 8};
  m.rounds = ctx.options.quick ? 5 : 100;
  for (auto* runs : {&m.base, &m.base_pageable, &m.mps, &m.mps_pageable, &m.one_context,
                     &m.one_context_batched}) {
    runs->resize(m.counts.size());
  }
  if (ctx.baseline) MeasureSharingBaseline(ctx, m);
  m.with_mps = ctx.mps && ctx.mps->available();
  if (m.with_mps) MeasureSharingMps(ctx, m);
  MeasureSharingTargets(ctx, m);
  std::vector<Table> tables = BuildTables(
      ctx, "sharing", [&](int which) { return SharingRows(ctx, m, which); },
      [&](int which) { return SharingNotes(ctx, m, which); });
  if (ctx.baseline) tables.push_back(OneContextTable(ctx, m));
  return tables;
}

int SharingWorkerMain(const std::vector<std::string>& args) {
  std::string mode, where;
  Route route = Route::kBlocking;
  HostMemory memory = HostMemory::kRegistered;
  int rounds = 10;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--mode") mode = args[i + 1];
    if (args[i] == "--where") where = args[i + 1];
    if (args[i] == "--rounds") rounds = std::max(1, std::atoi(args[i + 1].c_str()));
    if (args[i] == "--route" && args[i + 1] == "pinned") route = Route::kPinned;
    if (args[i] == "--memory" && args[i + 1] == "pageable") memory = HostMemory::kPageable;
  }
  if (mode == "daemon") return DaemonWorker(where, rounds, route);
  if (mode == "inprocess") return InProcessWorker(where, rounds, memory);
  std::fprintf(stderr, "sharing worker: --mode daemon|inprocess\n");
  return 2;
}

}  // namespace ferry::bench
