// ferry-bench: shared types of the benchmark driver.
//
// Every scenario measures the same work twice: through one or more ferryd daemons (the
// "daemon" figures, one set per --target) and, with --baseline, in this process straight
// against the device seam (server/backend/backend.h) with no daemon (the "baseline"
// figures). A scenario returns Tables; report.cc prints them, writes the JSON and the SVG.
//
// Threading: the driver runs scenarios one after another on the main thread; a scenario
// may start its own threads or processes and joins them before it returns.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ferry/client.h"

namespace ferry::bench {

// --- options ------------------------------------------------------------------------------

struct Options {
  std::vector<std::string> targets;    // "unix:PATH" / "tcp:HOST:PORT"
  std::vector<std::string> scenarios;  // empty: all
  bool baseline = false;
  // The MPS arm: sharing's, latency's and throughput's baselines again as MPS clients of a
  // private MPS control daemon (implies baseline), and the fault scenario's MPS arm.
  bool baseline_mps = false;
  std::string mps_control;  // path to nvidia-cuda-mps-control; empty: look it up
  bool quick = false;
  std::string json_path;
  std::string svg_path;
  std::vector<uint64_t> sizes;            // transfers sizes in bytes; empty: defaults
  int iterations = 0;                     // samples per small case; 0: default
  int stream_depth = 4;                   // transfers' streamed route: transfers in flight
  std::vector<int> sessions;              // concurrency session counts; empty: defaults
  std::vector<int> processes;             // sharing process counts; empty: defaults
  std::vector<int> ops_per_submit;        // throughput rows' ops per submit; empty: defaults
  std::string spawn_daemon;               // path to ferryd, or empty
  bool spawn_tcp = false;                 // the spawned daemon also listens on TCP loopback
  std::vector<std::string> daemon_args;   // more arguments for the spawned daemon
  std::string baseline_backend = "auto";  // auto|cuda|host for the in-process baseline
  std::string command_line;               // as run, for the JSON
};

/// The scenario names, in the order they run.
const std::vector<std::string>& AllScenarios();

// --- samples and their summary ------------------------------------------------------------

using Clock = std::chrono::steady_clock;

inline double NsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count();
}

/// Durations of repeated runs of one case, in nanoseconds. Pooling the samples of several
/// targets (Append) is how the "all targets" figures are made.
struct Samples {
  std::vector<double> ns;
  void Add(double v) { ns.push_back(v); }
  void Append(const Samples& o) { ns.insert(ns.end(), o.ns.begin(), o.ns.end()); }
  bool empty() const { return ns.empty(); }
};

/// Order statistics of Samples (nearest-rank percentiles: with fewer than 100 samples p99
/// is the maximum, and so on).
struct Summary {
  size_t n = 0;
  double min = NAN, p50 = NAN, p99 = NAN, p999 = NAN, mean = NAN, max = NAN;
};
Summary Summarize(const Samples& samples);

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// --- result tables ------------------------------------------------------------------------

/// One figure of a row: what the daemon achieved and what the in-process baseline did for
/// the same work. Either may be NaN (not measured). ratio() is daemon / baseline.
struct Figure {
  std::string metric;  // column header, with its unit: "p50 us", "GB/s"
  double daemon = kNaN;
  double baseline = kNaN;
  // The same work by the baseline run as MPS clients: absent where the figure has no MPS
  // arm (or --baseline-mps was not given); NaN where it has one that could not run (the
  // table's notes say why; printed "n/a").
  std::optional<double> mps;
  // False for figures that are themselves ratios (max/min): no daemon/baseline column.
  bool comparable = true;
  double ratio() const {
    if (!comparable) return kNaN;
    return (std::isnan(daemon) || std::isnan(baseline) || baseline == 0) ? kNaN : daemon / baseline;
  }
};

struct Row {
  Row() = default;
  Row(std::string l, std::vector<Figure> f) : label(std::move(l)), figures(std::move(f)) {}

  std::string label;  // the case: "upload blocking 8 MiB"
  std::vector<Figure> figures;
  // Machine-readable case parameters for the JSON and the chart (e.g. bytes, direction).
  std::vector<std::pair<std::string, double>> params;
  std::vector<std::pair<std::string, std::string>> tags;
  // Full order statistics of the samples behind the figures ("daemon", "baseline", ...).
  std::vector<std::pair<std::string, Summary>> summaries;
  std::vector<std::string> cells;  // a text table's row (Table::text_columns)
};

struct Table {
  std::string scenario;  // "transfers"
  std::string target;    // the daemon target, "all targets", or "" where not per target
  std::string daemon_label = "ferryd";
  std::string baseline_label = "baseline";
  std::string baseline_description;  // replaces the in-process device's in the title
  std::vector<Row> rows;
  std::vector<std::string> notes;  // printed under the table: what the numbers mean
  // A table of text cells instead of figures (the fault scenario): a header per column,
  // each row's Row::cells in that order.
  std::vector<std::string> text_columns;
};

// --- what every scenario gets -------------------------------------------------------------

/// One daemon under test, with what its Admin service says about it.
struct TargetInfo {
  std::string target;
  std::string backend;  // "host" or "cuda"
  std::string device_name;
  std::string version;
  int pid = -1;  // the daemon's process id when known (--spawn-daemon), else -1
};

/// The in-process baseline device (shared by all scenarios of the run).
struct BaselineInfo {
  std::unique_ptr<backend::Device> device;
  std::string backend;  // "host" or "cuda"
  std::string why;      // why this backend was chosen, from backend::CreateDevice
};

/// Figures of the bare transports, measured once per socket kind (see transports.h).
struct TransportFigures {
  bool measured = false;
  Samples socketpair_rtt;  // 16 B ping-pong between two processes
  Samples grpc_small_rtt;  // 16 B echo, one stream, sync client / callback server
  Samples grpc_bulk_up;    // 8 MiB request, 16 B reply
  Samples grpc_bulk_down;  // 16 B request, 8 MiB reply
  uint64_t bulk_bytes = 0;
};

class Progress;
class MpsDaemon;

/// The MPS arm (--baseline-mps): whether it can run here, and how to make a client.
struct MpsInfo {
  MpsDaemon* daemon = nullptr;  // running; null when not available
  std::string control;          // the nvidia-cuda-mps-control used
  std::string why_not;          // why the arm is "n/a" (daemon null)
  bool available() const { return daemon != nullptr; }
};

struct Context {
  Options options;
  std::vector<TargetInfo> targets;
  BaselineInfo* baseline = nullptr;  // null without --baseline
  MpsInfo* mps = nullptr;            // null without --baseline-mps
  std::string self_exe;              // this program, for worker processes
  std::string temp_dir;              // removed at exit
  Progress* progress = nullptr;
  /// Bare transports by socket kind ("unix", "tcp"); filled by RunTransports.
  TransportFigures unix_transport;
  TransportFigures tcp_transport;
  const TransportFigures& TransportFor(const std::string& target) const {
    return target.rfind("tcp:", 0) == 0 ? tcp_transport : unix_transport;
  }
  int Iterations(int full_default, int quick_default) const {
    if (options.iterations > 0) return options.iterations;
    return options.quick ? quick_default : full_default;
  }
};

/// Progress lines on stderr: one per case, overwritten in place on a terminal.
class Progress {
 public:
  void Scenario(const std::string& name);
  void Case(const std::string& what);
  void Done();

 private:
  std::string scenario_;
  Clock::time_point scenario_start_;
  bool tty_ = false;
  bool initialized_ = false;
};

// --- scenarios (one file per family) ------------------------------------------------------

std::vector<Table> RunTransfers(Context& ctx);    // scenario_transfers.cc
std::vector<Table> RunLatency(Context& ctx);      // scenario_ops.cc
std::vector<Table> RunThroughput(Context& ctx);   // scenario_ops.cc
std::vector<Table> RunConcurrency(Context& ctx);  // scenario_sessions.cc
std::vector<Table> RunOpenClose(Context& ctx);    // scenario_sessions.cc
std::vector<Table> RunSharing(Context& ctx);      // scenario_sharing.cc
std::vector<Table> RunOverlap(Context& ctx);      // scenario_overlap.cc
std::vector<Table> RunMemory(Context& ctx);       // scenario_memory.cc
std::vector<Table> RunShares(Context& ctx);       // scenario_shares.cc (opt-in)
std::vector<Table> RunFault(Context& ctx);        // scenario_fault.cc
/// Measure the bare transports (socketpair, gRPC echo) for the socket kinds the targets
/// use; returns the "transports" table. transports.cc.
std::vector<Table> RunTransports(Context& ctx);

/// The hidden --worker modes (sharing client, echo server, ...); return the exit code.
int SharingWorkerMain(const std::vector<std::string>& args);  // scenario_sharing.cc
int SharesWorkerMain(const std::vector<std::string>& args);   // scenario_shares.cc
int OpsWorkerMain(const std::vector<std::string>& args);      // scenario_ops.cc (MPS arm)
int FaultWorkerMain(const std::vector<std::string>& args);    // scenario_fault.cc
int MpsProbeWorkerMain();                                     // ferry_bench.cc
int EchoServerMain(const std::vector<std::string>& args);     // transports.cc
int PongWorkerMain();                                         // transports.cc

// --- small helpers shared by scenarios ----------------------------------------------------

/// Which daemon figures a table shows: one target's (its index), all targets pooled, or
/// none (a baseline-only run).
constexpr int kAllTargets = -1;
constexpr int kNoTarget = -2;
/// Make a scenario's tables: one per target, one for all targets pooled when there are
/// several, or one baseline-only table when there is no target. `rows(which)` and
/// `notes(which)` fill each (which is a target index, kAllTargets or kNoTarget).
std::vector<Table> BuildTables(const Context& ctx, const std::string& scenario,
                               const std::function<std::vector<Row>(int which)>& rows,
                               const std::function<std::vector<std::string>(int which)>& notes);
/// The samples table `which` shows for entry i: per_target[which][i] for a target, every
/// target's pooled for kAllTargets, none for kNoTarget.
Samples PooledSamples(const std::vector<std::vector<Samples>>& per_target, int which, size_t i);

/// The MPS figure of a row from the MPS arm's value `v`: absent without --baseline-mps, NaN
/// (printed "n/a") where the arm could not run here.
std::optional<double> MpsFigure(const Context& ctx, double v);
/// A table note on the MPS column: what it measured, or why it is n/a ("" without
/// --baseline-mps). `what` says what ran as MPS clients.
std::string MpsNote(const Context& ctx, const std::string& what);
/// Run `n` ferry-bench workers with `args` as clients of this run's MPS daemon (RunWorkers
/// with its environment); ctx.mps must be available. Die when one fails.
std::vector<std::string> RunMpsWorkers(const Context& ctx, int n,
                                       const std::vector<std::string>& args);

/// Block until all work enqueued on `stream` so far has completed (OnComplete + wait).
Status WaitStream(backend::Stream& stream);

/// "16 B", "64 KiB", "8 MiB".
std::string FormatBytes(uint64_t bytes);

/// True for a remote target ("tcp:HOST:PORT"): no shared memory, bytes travel inline.
inline bool IsRemote(const std::string& target) { return target.rfind("tcp:", 0) == 0; }
/// Parse "16", "64K", "64KiB", "8M", "1G" into bytes.
std::optional<uint64_t> ParseBytes(const std::string& text);

/// A sized, page-aligned host buffer (for copies and registration).
class HostBuffer {
 public:
  explicit HostBuffer(uint64_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  uint8_t* data() { return data_; }
  uint64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

/// Fail loudly: a benchmark that cannot do its work must not print numbers.
[[noreturn]] void Die(const std::string& what);
/// Return the value or Die with `what` and the status.
template <typename T>
T Check(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what + ": " + r.status().ToString());
  return std::move(r).value();
}
inline void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

/// The environment variable through which --wait-spin reaches this run's worker processes.
inline constexpr const char* kWaitSpinEnv = "FERRY_BENCH_WAIT_SPIN_US";
/// Connect to `target` with the client options of this run: libferry's defaults, except
/// ClientOptions::wait_spin when --wait-spin set kWaitSpinEnv.
Result<Client> Connect(const std::string& target);

/// A session's operands for rounds of transfers and small ops: `t`, a uint8 tensor of
/// `bytes` to move, and the axpy operands x (ones) and y (zeros) of `axpy_elements` floats
/// each. The creations and fills are recorded, not yet submitted.
struct RoundTensors {
  Tensor t, x, y;
};
RoundTensors CreateRoundTensors(Session& s, uint64_t bytes, int64_t axpy_elements);
/// Pass `pinned` and `t` through one pending transfer (upload: the buffer into the tensor;
/// download: the tensor into the buffer), wait for it and take both back; Die when it failed.
void PendingRoundTrip(Session& s, bool upload, PinnedBuffer& pinned, Tensor& t);

}  // namespace ferry::bench
