// Scenarios "latency" and "throughput": what one tiny op costs, and how many tiny ops per
// second a session sustains.
//
// latency: one op, submit to completion seen by the caller, N times, one at a time.
//   * "fill, synchronize()": fill a 1-element f32 tensor, then Session::synchronize() (which
//     sends the Submit and a Synchronize, and returns on Synchronized).
//   * "fill + 1-elt download": fill, then Session::download_bytes of the 4-byte element (the
//     fill goes as one Submit, the download as a second; returns when its bytes and
//     Completed arrived) — the path of a program that reads a result back.
//   Baseline: in process, Stream::Fill (+ a 4-byte CopyDeviceToHost) then OnComplete, waited
//   on ("launch + completion"). The "floor" row compares the daemon's p50 with the bare
//   gRPC echo round trip + the in-process launch + completion: what the transport and the
//   device cost with nothing of ferry's own in between (the target is <= 1.2x).
//
// throughput: axpy on 256-element f32 tensors, K ops recorded per submit (K = 1, 8, 64,
//   512), submits pipelined (no waiting between them), one synchronize() at the end; ops/s =
//   ops / time from the first record to synchronize() returning. Baseline: the same number
//   of Stream::Axpy launches back to back on one stream, then one wait (ops per submit does
//   not apply in process, so every K row shows the same baseline). The runs of the baseline
//   and of every K row are interleaved, round after round, so that drift of the machine
//   between rows does not show up as a ratio.
//   Prepared graph replay: a graph of 100 axpy(256 f32) is recorded once
//   (begin_graph()/end_graph(), one submit), then replayed R times pipelined (launch_graph +
//   submit, no waiting), one synchronize(); kernels/s = 100 R / time. Baseline: the same 100
//   Stream::Axpy captured in process (BeginCapture/EndCapture) and LaunchGraph'ed R times
//   back to back on one stream, one wait.
//
// --baseline-mps: both scenarios' baselines again in a worker process (this program
// re-executed as `ferry-bench --worker ops ...`, through RunWorkers) that is an MPS client;
// its throughput runs come one after another, not interleaved with the daemon's.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "backend/select.h"
#include "bench.h"
#include "process.h"

namespace ferry::bench {
namespace {

constexpr int64_t kAxpyElements = 256;

struct LatencyCase {
  std::string label;
  bool download;  // read the element back instead of synchronize()
};
const LatencyCase kLatencyCases[] = {{"fill 1 elt, synchronize()", false},
                                     {"fill 1 elt + 1-elt download", true}};

Samples DaemonLatency(Session& s, const LatencyCase& c, int iterations) {
  Tensor t = s.create_tensor<float>({1});
  Check(s.synchronize(), "create");
  float value = 0;
  Samples out;
  int warmup = std::max(5, iterations / 20);
  for (int i = 0; i < warmup + iterations; ++i) {
    auto t0 = Clock::now();
    s.fill(t, i);
    Status st = c.download ? s.download_bytes(t, &value, sizeof value) : s.synchronize();
    double ns = NsSince(t0);
    Check(st, c.label);
    if (i >= warmup) out.Add(ns);
  }
  if (c.download && value != static_cast<float>(warmup + iterations - 1)) {
    Die("latency: the downloaded element is wrong");
  }
  return out;
}

Samples BaselineLatency(backend::Stream& stream, const LatencyCase& c, int iterations) {
  backend::DevicePtr d = Check(stream.Allocate(sizeof(float)), "Allocate");
  float value = 0;
  Samples out;
  int warmup = std::max(5, iterations / 20);
  for (int i = 0; i < warmup + iterations; ++i) {
    auto t0 = Clock::now();
    Check(stream.Fill(DType::kF32, d, 1, i), "Fill");
    if (c.download) Check(stream.CopyDeviceToHost(&value, d, sizeof value), "copy");
    Check(WaitStream(stream), "wait");
    double ns = NsSince(t0);
    if (i >= warmup) out.Add(ns);
  }
  stream.Free(d);
  Check(WaitStream(stream), "free");
  return out;
}

Row LatencyRow(const Context& ctx, const std::string& label, const Samples* d, const Samples* b,
               const Samples* m) {
  Summary ds = d ? Summarize(*d) : Summary{}, bs = b ? Summarize(*b) : Summary{};
  Summary ms = m ? Summarize(*m) : Summary{};
  Row r{label,
        {{"p50 us", ds.p50 / 1e3, bs.p50 / 1e3, MpsFigure(ctx, ms.p50 / 1e3)},
         {"p99 us", ds.p99 / 1e3, bs.p99 / 1e3, MpsFigure(ctx, ms.p99 / 1e3)},
         {"p99.9 us", ds.p999 / 1e3, bs.p999 / 1e3, MpsFigure(ctx, ms.p999 / 1e3)}}};
  if (d) r.summaries.push_back({"daemon", ds});
  if (b) r.summaries.push_back({"baseline", bs});
  if (m) r.summaries.push_back({"mps", ms});
  return r;
}

/// Ops recorded per submit, and the total ops of one timed run.
std::vector<int> OpsPerSubmit(const Context& ctx) {
  if (!ctx.options.ops_per_submit.empty()) return ctx.options.ops_per_submit;
  return {1, 8, 64, 512};
}
int TotalOps(const Context& ctx) { return ctx.options.quick ? 1024 : 16384; }

/// The daemon side of the axpy rows: one session's two tensors; Run times one run of
/// `total` axpy in submits of `per_submit`, then synchronize().
class DaemonAxpy {
 public:
  explicit DaemonAxpy(Session& s)
      : s_(s),
        x_(s.create_tensor<float>({kAxpyElements})),
        y_(s.create_tensor<float>({kAxpyElements})) {
    s_.fill(x_, 1.0);
    s_.fill(y_, 0.0);
    Check(s_.synchronize(), "setup");
  }
  double Run(int per_submit, int total) {
    auto t0 = Clock::now();
    for (int done = 0; done < total;) {
      for (int k = 0; k < per_submit && done < total; ++k, ++done) s_.axpy(1e-6, x_, y_);
      Check(s_.submit(), "submit");
    }
    Check(s_.synchronize(), "throughput synchronize");
    return NsSince(t0);
  }

 private:
  Session& s_;
  Tensor x_, y_;
};

/// The baseline of the axpy rows: `total` Stream::Axpy back to back, one wait.
class BaselineAxpy {
 public:
  explicit BaselineAxpy(backend::Stream& stream) : stream_(stream) {
    x_ = Check(stream_.Allocate(kAxpyElements * sizeof(float)), "Allocate");
    y_ = Check(stream_.Allocate(kAxpyElements * sizeof(float)), "Allocate");
    Check(stream_.Fill(DType::kF32, x_, kAxpyElements, 1.0), "Fill");
    Check(stream_.Fill(DType::kF32, y_, kAxpyElements, 0.0), "Fill");
    Check(WaitStream(stream_), "setup");
  }
  ~BaselineAxpy() {
    stream_.Free(x_);
    stream_.Free(y_);
    Check(WaitStream(stream_), "free");
  }
  double Run(int total) {
    auto t0 = Clock::now();
    for (int i = 0; i < total; ++i) {
      Check(stream_.Axpy(DType::kF32, 1e-6, x_, y_, kAxpyElements), "Axpy");
    }
    Check(WaitStream(stream_), "wait");
    return NsSince(t0);
  }

 private:
  backend::Stream& stream_;
  backend::DevicePtr x_ = 0, y_ = 0;
};

constexpr int kGraphOps = 100;
int GraphReplays(const Context& ctx) { return ctx.options.quick ? 20 : 200; }

Samples DaemonGraphReplay(Session& s, int replays, int runs) {
  Tensor x = s.create_tensor<float>({kAxpyElements});
  Tensor y = s.create_tensor<float>({kAxpyElements});
  s.fill(x, 1.0);
  s.fill(y, 0.0);
  Graph g = s.begin_graph();
  for (int i = 0; i < kGraphOps; ++i) s.axpy(1e-6, x, y);
  s.end_graph();
  Check(s.synchronize(), "recording a graph of " + std::to_string(kGraphOps) + " axpy");
  Samples out;
  for (int run = -1; run < runs; ++run) {  // run -1 warms up
    auto t0 = Clock::now();
    for (int r = 0; r < replays; ++r) {
      s.launch_graph(g);
      Check(s.submit(), "submit graph launch");
    }
    Check(s.synchronize(), "graph replay synchronize");
    if (run >= 0) out.Add(NsSince(t0));
  }
  return out;
}

Samples BaselineGraphReplay(backend::Stream& stream, int replays, int runs) {
  auto x = Check(stream.Allocate(kAxpyElements * sizeof(float)), "Allocate");
  auto y = Check(stream.Allocate(kAxpyElements * sizeof(float)), "Allocate");
  Check(stream.Fill(DType::kF32, x, kAxpyElements, 1.0), "Fill");
  Check(stream.Fill(DType::kF32, y, kAxpyElements, 0.0), "Fill");
  Check(WaitStream(stream), "setup");
  Check(stream.BeginCapture(), "BeginCapture");
  for (int i = 0; i < kGraphOps; ++i) {
    Check(stream.Axpy(DType::kF32, 1e-6, x, y, kAxpyElements), "Axpy (captured)");
  }
  auto graph = Check(stream.EndCapture(), "EndCapture");
  Samples out;
  for (int run = -1; run < runs; ++run) {
    auto t0 = Clock::now();
    for (int r = 0; r < replays; ++r) Check(stream.LaunchGraph(*graph), "LaunchGraph");
    Check(WaitStream(stream), "wait");
    if (run >= 0) out.Add(NsSince(t0));
  }
  graph.reset();
  stream.Free(x);
  stream.Free(y);
  Check(WaitStream(stream), "free");
  return out;
}

/// Samples by name, as the ops worker prints them: one line per name, "NAME v1 v2 ...".
using NamedSamples = std::map<std::string, Samples>;

void PrintSamples(const std::string& name, const Samples& s) {
  std::printf("%s", name.c_str());
  for (double v : s.ns) std::printf(" %.0f", v);
  std::printf("\n");
}

NamedSamples ParseSamples(const std::string& out) {
  NamedSamples named;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string name;
    if (!(in >> name)) continue;
    double v;
    Samples& s = named[name];
    while (in >> v) s.Add(v);
  }
  return named;
}

/// Run the ops worker once as an MPS client; its samples by name. Empty when the MPS arm
/// is not available.
NamedSamples RunMpsOps(Context& ctx, const std::vector<std::string>& args) {
  if (!ctx.mps || !ctx.mps->available()) return {};
  std::vector<std::string> all = {"--worker", "ops"};
  all.insert(all.end(), args.begin(), args.end());
  return ParseSamples(RunMpsWorkers(ctx, 1, all)[0]);
}

const Samples* Find(const NamedSamples& named, const std::string& name) {
  auto it = named.find(name);
  return it == named.end() ? nullptr : &it->second;
}

}  // namespace

int OpsWorkerMain(const std::vector<std::string>& args) {
  std::string what;
  int iterations = 100, total = 1024, runs = 3, replays = 20;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    int v = std::max(1, std::atoi(args[i + 1].c_str()));
    if (args[i] == "--what") what = args[i + 1];
    if (args[i] == "--iterations") iterations = v;
    if (args[i] == "--total") total = v;
    if (args[i] == "--runs") runs = v;
    if (args[i] == "--replays") replays = v;
  }
  std::string why;
  auto dev = Check(backend::CreateDevice("cuda", 0, backend::HostDeviceOptions{}, &why),
                   "CreateDevice cuda");
  auto stream = Check(dev->CreateStream(), "CreateStream");
  AwaitGo();
  if (what == "latency") {
    for (size_t i = 0; i < std::size(kLatencyCases); ++i) {
      PrintSamples("latency" + std::to_string(i),
                   BaselineLatency(*stream, kLatencyCases[i], iterations));
    }
  } else if (what == "throughput") {
    Samples axpy;
    {
      BaselineAxpy run(*stream);
      for (int r = -1; r < runs; ++r) {  // run -1 warms up
        double ns = run.Run(total);
        if (r >= 0) axpy.Add(ns);
      }
    }
    PrintSamples("axpy", axpy);
    PrintSamples("graph", BaselineGraphReplay(*stream, replays, runs));
  } else {
    std::fprintf(stderr, "ops worker: --what latency|throughput\n");
    return 2;
  }
  std::fflush(stdout);
  return 0;
}

std::vector<Table> RunLatency(Context& ctx) {
  int iterations = ctx.Iterations(5000, 300);
  const size_t n = std::size(kLatencyCases);
  std::vector<Samples> base(n);
  if (ctx.baseline) {
    auto stream = Check(ctx.baseline->device->CreateStream(), "CreateStream");
    for (size_t i = 0; i < n; ++i) {
      ctx.progress->Case("baseline " + kLatencyCases[i].label);
      base[i] = BaselineLatency(*stream, kLatencyCases[i], iterations);
    }
  }
  if (ctx.mps && ctx.mps->available()) ctx.progress->Case("MPS client");
  NamedSamples mps =
      RunMpsOps(ctx, {"--what", "latency", "--iterations", std::to_string(iterations)});
  std::vector<std::vector<Samples>> daemon(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    auto client = Check(Connect(ctx.targets[t].target), "connect");
    auto session = Check(client.open_session(), "open_session");
    for (size_t i = 0; i < n; ++i) {
      ctx.progress->Case(ctx.targets[t].target + " " + kLatencyCases[i].label);
      daemon[t].push_back(DaemonLatency(session, kLatencyCases[i], iterations));
    }
    Check(session.close().status(), "close");
  }

  return BuildTables(
      ctx, "latency",
      [&](int which) {
        std::vector<Row> rows;
        std::vector<Samples> d(n);
        for (size_t i = 0; i < n; ++i) {
          if (which >= 0) d[i] = daemon[which][i];
          if (which == kAllTargets) {
            for (auto& t : daemon) d[i].Append(t[i]);
          }
          rows.push_back(LatencyRow(
              ctx, kLatencyCases[i].label, which == kNoTarget ? nullptr : &d[i],
              ctx.baseline ? &base[i] : nullptr, Find(mps, "latency" + std::to_string(i))));
        }
        // The floor: bare gRPC echo round trip (same socket kind) + in-process launch.
        std::string target = which >= 0 ? ctx.targets[which].target
                                        : (ctx.targets.empty() ? "" : ctx.targets[0].target);
        const TransportFigures& tf = ctx.TransportFor(target);
        if (ctx.baseline && tf.measured && which != kNoTarget) {
          double floor = (Summarize(tf.grpc_small_rtt).p50 + Summarize(base[0]).p50) / 1e3;
          Row r{"fill, synchronize() vs floor (gRPC echo + launch)",
                {{"p50 us", Summarize(d[0]).p50 / 1e3, floor}}};
          r.tags.push_back({"baseline", "grpc_echo_plus_launch"});
          rows.push_back(std::move(r));
        }
        return rows;
      },
      [&](int which) {
        std::vector<std::string> notes = {
            "time = op recorded until the caller sees it complete, one op at a time, " +
                std::to_string(iterations) + " samples (p99.9 is the maximum below 1000)",
            "baseline = in-process Stream::Fill (+ 4 B CopyDeviceToHost) + OnComplete, waited "
            "on"};
        if (which != kNoTarget && ctx.baseline) {
          notes.push_back(
              "floor = bare gRPC 16 B echo p50 (transports table, same socket "
              "kind) + in-process fill+completion p50");
        }
        std::string mps_note = MpsNote(ctx, "the baseline, run in one worker process,");
        if (!mps_note.empty()) notes.push_back(mps_note);
        if (which == kAllTargets) notes.push_back("all targets: samples pooled");
        return notes;
      });
}

namespace {

/// What the throughput scenario measured: per ops-per-submit K the axpy runs, then the
/// graph replays (the entry after the K rows), for the baseline, each target and the MPS
/// client.
struct ThroughputMeasurements {
  int total = 0;    // axpy ops per run
  int runs = 0;     // timed runs of each row
  int replays = 0;  // graph replays per run
  std::vector<int> ks;
  Samples base, base_graph;
  std::vector<std::vector<Samples>> daemon;  // [target][K index, then the graph]
  NamedSamples mps;
};

/// The axpy runs, interleaved: one baseline run, then one run of every (target, K) row,
/// `runs` times after a warm-up round, so that every ratio compares samples of the same
/// minutes (the in-process launch rate of this VM drifts by tens of percent between calls,
/// and within one). `base_axpy` is null without a baseline.
void RunInterleavedAxpy(Context& ctx, ThroughputMeasurements& m, BaselineAxpy* base_axpy,
                        std::vector<std::unique_ptr<DaemonAxpy>>& axpy) {
  for (int run = -1; run < m.runs; ++run) {  // run -1 warms up
    ctx.progress->Case("axpy launches, round " + std::to_string(run + 2) + " of " +
                       std::to_string(m.runs + 1));
    if (base_axpy) {
      double ns = base_axpy->Run(m.total);
      if (run >= 0) m.base.Add(ns);
    }
    for (size_t t = 0; t < ctx.targets.size(); ++t) {
      for (size_t i = 0; i < m.ks.size(); ++i) {
        double ns = axpy[t]->Run(m.ks[i], m.total);
        if (run >= 0) m.daemon[t][i].Add(ns);
      }
    }
  }
}

/// Measure the axpy rows, then prepared graph replay (its rows are steady) on the same
/// stream and sessions: the baseline, then each target.
void MeasureThroughput(Context& ctx, ThroughputMeasurements& m) {
  std::unique_ptr<backend::Stream> stream;
  std::unique_ptr<BaselineAxpy> base_axpy;
  if (ctx.baseline) {
    stream = Check(ctx.baseline->device->CreateStream(), "CreateStream");
    base_axpy = std::make_unique<BaselineAxpy>(*stream);
  }
  std::vector<Client> clients;
  std::vector<Session> sessions;
  std::vector<std::unique_ptr<DaemonAxpy>> axpy;
  clients.reserve(ctx.targets.size());
  sessions.reserve(ctx.targets.size());
  m.daemon.resize(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    clients.push_back(Check(Connect(ctx.targets[t].target), "connect"));
    sessions.push_back(Check(clients.back().open_session(), "open_session"));
    axpy.push_back(std::make_unique<DaemonAxpy>(sessions.back()));
    m.daemon[t].resize(m.ks.size());
  }
  RunInterleavedAxpy(ctx, m, base_axpy.get(), axpy);
  axpy.clear();
  base_axpy.reset();
  if (stream) {
    ctx.progress->Case("baseline graph replay");
    m.base_graph = BaselineGraphReplay(*stream, m.replays, m.runs);
  }
  for (size_t t = 0; t < sessions.size(); ++t) {
    ctx.progress->Case(ctx.targets[t].target + " graph replay");
    m.daemon[t].push_back(DaemonGraphReplay(sessions[t], m.replays, m.runs));
    Check(sessions[t].close().status(), "close");
  }
}

/// A throughput row of `ops` kernels per run, from the run times of the daemon (`d`), the
/// baseline (`b`) and the MPS client (`mps`), each null when not measured: ops/s and us/op
/// from the median run, and the summaries of the samples.
Row OpsPerRunRow(const Context& ctx, const std::string& label, double ops, const Samples* d,
                 const Samples* b, const Samples* mps) {
  Summary ds = d ? Summarize(*d) : Summary{};
  Summary bs = b ? Summarize(*b) : Summary{};
  Summary ms = mps ? Summarize(*mps) : Summary{};
  Row r{
      label,
      {{"ops/s", ops / (ds.p50 / 1e9), ops / (bs.p50 / 1e9), MpsFigure(ctx, ops / (ms.p50 / 1e9))},
       {"us/op", ds.p50 / 1e3 / ops, bs.p50 / 1e3 / ops, MpsFigure(ctx, ms.p50 / 1e3 / ops)}}};
  if (d) r.summaries.push_back({"daemon", ds});
  if (b) r.summaries.push_back({"baseline", bs});
  if (mps) r.summaries.push_back({"mps", ms});
  return r;
}

/// The axpy row of K ops per submit, from daemon run times `d` (null: none).
Row AxpyThroughputRow(const Context& ctx, const ThroughputMeasurements& m, int k,
                      const Samples* d) {
  Row r = OpsPerRunRow(ctx, "axpy 256 f32, " + std::to_string(k) + " ops/submit", m.total, d,
                       ctx.baseline ? &m.base : nullptr, Find(m.mps, "axpy"));
  r.params = {{"ops_per_submit", k}, {"ops_per_run", m.total}};
  return r;
}

/// The prepared graph replay row of table `which`; it counts kernels, not graphs.
Row GraphReplayRow(const Context& ctx, const ThroughputMeasurements& m, int which) {
  Samples g = PooledSamples(m.daemon, which, m.ks.size());
  double kernels = static_cast<double>(kGraphOps) * m.replays;
  Row r = OpsPerRunRow(ctx, "graph of " + std::to_string(kGraphOps) + " axpy, replayed", kernels,
                       which == kNoTarget ? nullptr : &g, ctx.baseline ? &m.base_graph : nullptr,
                       Find(m.mps, "graph"));
  r.params = {{"graph_ops", kGraphOps}, {"replays_per_run", m.replays}};
  r.tags = {{"case", "graph_replay"}};
  return r;
}

/// The notes under the throughput table of `which`.
std::vector<std::string> ThroughputNotes(const Context& ctx, const ThroughputMeasurements& m,
                                         int which) {
  std::vector<std::string> notes = {
      "one run = " + std::to_string(m.total) +
          " axpy ops submitted without waiting, then synchronize(); ops/s = ops / p50 "
          "run time over " +
          std::to_string(m.runs) +
          " runs; the axpy rows' runs are interleaved (baseline, then each row, "
          "round after round)",
      "baseline = the same launches back to back on one in-process stream, one wait "
      "(same figure for every axpy row)",
      "graph row: " + std::to_string(kGraphOps) + " axpy recorded once as a graph, " +
          std::to_string(m.replays) +
          " launch_graph + submit per run, pipelined, one "
          "synchronize(); ops/s counts kernels; baseline = in-process "
          "BeginCapture/EndCapture, LaunchGraph back to back, one wait"};
  std::string mps_note =
      MpsNote(ctx, "the baseline, run in one worker process (its runs not interleaved),");
  if (!mps_note.empty()) notes.push_back(mps_note);
  if (which == kAllTargets) notes.push_back("all targets: run times pooled");
  return notes;
}

}  // namespace

std::vector<Table> RunThroughput(Context& ctx) {
  ThroughputMeasurements m;
  m.total = TotalOps(ctx);
  m.runs = ctx.options.quick ? 3 : 10;
  m.replays = GraphReplays(ctx);
  m.ks = OpsPerSubmit(ctx);
  MeasureThroughput(ctx, m);
  if (ctx.mps && ctx.mps->available()) ctx.progress->Case("MPS client");
  m.mps = RunMpsOps(ctx, {"--what", "throughput", "--total", std::to_string(m.total), "--runs",
                          std::to_string(m.runs), "--replays", std::to_string(m.replays)});
  return BuildTables(
      ctx, "throughput",
      [&](int which) {
        std::vector<Row> rows;
        for (size_t i = 0; i < m.ks.size(); ++i) {
          Samples d = PooledSamples(m.daemon, which, i);
          rows.push_back(AxpyThroughputRow(ctx, m, m.ks[i], which == kNoTarget ? nullptr : &d));
        }
        rows.push_back(GraphReplayRow(ctx, m, which));
        return rows;
      },
      [&](int which) { return ThroughputNotes(ctx, m, which); });
}

}  // namespace ferry::bench
