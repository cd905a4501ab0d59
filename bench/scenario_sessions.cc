// Scenarios "concurrency" and "open_close".
//
// concurrency: S sessions at once (S = 1, 8, 64; one thread each, all sessions opened from
//   one Client, i.e. one connection, as threads of one program would). After every session
//   is set up, all start together; each runs R rounds of
//     upload X bytes | download X bytes | 8 axpy(256) + synchronize()
//   with X = 8 MiB (quick: 1 MiB), once per transfer route:
//     blocking  upload_bytes / download_bytes from ordinary memory
//     pending   upload_pending / download_pending through one PinnedBuffer per session,
//               allocated before the start and moved through every transfer (buffer and
//               tensor taken back from wait()): the route the contract intends for bulk
//               data; through the session's shared-memory slab on a unix target, bytes
//               inline on a tcp target ("pending-inline"). Every local session holds a slab
//               of its own, so 64 sessions need 64 slabs of the daemon's pinned budget
//               (--spawn-daemon passes one large enough); where the budget is spent the
//               row is not measured and the notes say why.
//   Figures over the whole run (start signal to last session done = wall):
//     GB/s      all sessions' bytes moved / wall
//     ops/s     all sessions' small ops / wall
//     max/min   per-session fairness: highest / lowest per-session rate (bytes / its own
//               elapsed time); 1.0 is perfectly fair
//     xfer p99  p99 of single transfers (ms), all sessions pooled: latency under load
//     ops p99   p99 of one 8-op submit + synchronize() (us), pooled
//   Baseline: the same S threads in process, each with its own Stream on the one device
//   and a registered host buffer (one baseline for both routes).
//
// open_close: Client::open_session() and Session::close() (which waits for the daemon's
//   Closed) timed separately, N times on one Client. Baseline: Device::CreateStream() and
//   destroying the stream — what a session costs in process.
//   Also, for a local (unix) target, a session's first pinned_buffer(4 KiB), two ways:
//   - "kept stream": sessions opened and closed one after another on one Client, so each
//     opens on the stream the last one kept and starts with the slab it left unused
//     (docs/protocol.md, "Kept slabs"): no slab socket, no fresh slab;
//   - "new client": each session on a Client of its own, so its first buffer is the slab
//     socket's first acquire, i.e. a fresh slab (a slab a session held is destroyed, never
//     handed to another stream; the pool keeps --initial-slabs made ahead, so a grant rarely
//     makes its slab). As fast as the client goes: when that outpaces the pool's thread the
//     grant makes its slab itself, and the p99 shows it.
//   Baseline: allocating, touching and registering one slab's size (64 MiB) of host
//   memory — what getting pinned memory costs in process.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "bench.h"

namespace ferry::bench {
namespace {

constexpr int kSmallOps = 8;
constexpr int64_t kAxpyElements = 256;

/// A start line: every worker arrives after its setup; all leave together.
class StartGate {
 public:
  explicit StartGate(int n) : waiting_(n) {}
  void ArriveAndWait() {
    std::unique_lock lock(mu_);
    if (--waiting_ == 0) {
      start_ = Clock::now();
      cv_.notify_all();
    }
    cv_.wait(lock, [&] { return waiting_ == 0; });
  }
  Clock::time_point start() const { return start_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_;
  Clock::time_point start_;
};

enum class Route { kBlocking, kPending };
const Route kRoutes[] = {Route::kBlocking, Route::kPending};

/// The route as measured on `target`: the pending API goes inline for a remote session.
std::string RouteLabel(Route r, const std::string& target) {
  if (r == Route::kBlocking) return "blocking";
  return IsRemote(target) ? "pending-inline" : "pending";
}

/// What one session did.
struct SessionRun {
  double bytes = 0, ops = 0;
  Clock::time_point end;
  Samples transfers, small_ops;
};

/// What S sessions did together (several targets: merged).
struct ConcurrencyRun {
  double bytes = 0, ops = 0, wall_ns = 0;
  double fairness = kNaN;  // max/min per-session rate
  Samples transfers, small_ops;
  std::string skipped;  // non-empty: not measured, and why

  void Merge(const ConcurrencyRun& o) {
    if (!o.skipped.empty()) {
      skipped = o.skipped;
      return;
    }
    if (!skipped.empty()) return;
    bytes += o.bytes;
    ops += o.ops;
    wall_ns += o.wall_ns;
    fairness = std::isnan(fairness) ? o.fairness : std::max(fairness, o.fairness);
    transfers.Append(o.transfers);
    small_ops.Append(o.small_ops);
  }
};

ConcurrencyRun Combine(std::vector<SessionRun>& runs, Clock::time_point start) {
  ConcurrencyRun c;
  double lo = 1e300, hi = 0;
  Clock::time_point last = start;
  for (SessionRun& r : runs) {
    c.bytes += r.bytes;
    c.ops += r.ops;
    c.transfers.Append(r.transfers);
    c.small_ops.Append(r.small_ops);
    last = std::max(last, r.end);
    double rate = r.bytes / std::chrono::duration<double>(r.end - start).count();
    lo = std::min(lo, rate);
    hi = std::max(hi, rate);
  }
  c.wall_ns = std::chrono::duration<double, std::nano>(last - start).count();
  c.fairness = lo > 0 ? hi / lo : kNaN;
  return c;
}

/// Add one round's samples to `r`: the upload (t0..t1), the download (t1..t2) and the small
/// ops (t2..t3), and the bytes and ops it did.
void RecordRound(SessionRun& r, uint64_t bytes, Clock::time_point t0, Clock::time_point t1,
                 Clock::time_point t2, Clock::time_point t3) {
  r.transfers.Add(std::chrono::duration<double, std::nano>(t1 - t0).count());
  r.transfers.Add(std::chrono::duration<double, std::nano>(t2 - t1).count());
  r.small_ops.Add(std::chrono::duration<double, std::nano>(t3 - t2).count());
  r.bytes += 2.0 * static_cast<double>(bytes);
  r.ops += kSmallOps;
}

/// The sessions of a DaemonConcurrency run that got no pinned buffer: how many, and the
/// first one's error. Once any has, none is measured.
struct BufferShortage {
  std::mutex mu;
  std::string first;  // empty: every session so far got its buffer
  int sessions = 0;
};

/// One session of a DaemonConcurrency run, between open_session and close.
struct ConcurrencySession {
  Session& s;
  Route route;
  uint64_t bytes;
  RoundTensors tensors;
  std::unique_ptr<HostBuffer> buf;  // blocking route
  PinnedBuffer pinned;              // pending route

  /// Get the route's host memory: ordinary memory, or one pinned buffer (touched once,
  /// untimed). False, with the error in `shortage`, when the daemon's pinned budget is
  /// spent: the session must still reach the start line. Any other failure dies.
  bool GetBuffer(BufferShortage& shortage) {
    if (route == Route::kBlocking) {
      buf = std::make_unique<HostBuffer>(bytes);
      return true;
    }
    auto b = s.pinned_buffer(bytes);
    if (b.ok()) {
      pinned = std::move(b).value();
      std::memset(pinned.data(), 0x5a, pinned.size());
      return true;
    }
    if (b.status().kind() != ErrorKind::kQuotaExceeded) {
      Die("pinned_buffer(" + FormatBytes(bytes) + "): " + b.status().ToString());
    }
    std::lock_guard lock(shortage.mu);
    ++shortage.sessions;
    if (shortage.first.empty()) shortage.first = b.status().ToString();
    return false;
  }

  /// One timed round: upload, download, kSmallOps axpy and synchronize(), recorded in r.
  void Round(SessionRun& r) {
    auto t0 = Clock::now();
    if (route == Route::kBlocking) {
      Check(s.upload_bytes(tensors.t, buf->data(), bytes), "upload");
    } else {
      PendingRoundTrip(s, /*upload=*/true, pinned, tensors.t);
    }
    auto t1 = Clock::now();
    if (route == Route::kBlocking) {
      Check(s.download_bytes(tensors.t, buf->data(), bytes), "download");
    } else {
      PendingRoundTrip(s, /*upload=*/false, pinned, tensors.t);
    }
    auto t2 = Clock::now();
    for (int k = 0; k < kSmallOps; ++k) s.axpy(1e-6, tensors.x, tensors.y);
    Check(s.synchronize(), "small ops");
    auto t3 = Clock::now();
    RecordRound(r, bytes, t0, t1, t2, t3);
  }
};

ConcurrencyRun DaemonConcurrency(const std::string& target, Route route, int sessions,
                                 uint64_t bytes, int rounds) {
  auto client = Check(Connect(target), "connect " + target);
  StartGate gate(sessions);
  std::vector<SessionRun> runs(sessions);
  std::vector<std::thread> threads;
  BufferShortage shortage;
  for (int i = 0; i < sessions; ++i) {
    threads.emplace_back([&, i] {
      auto s = Check(client.open_session(), "open_session");
      ConcurrencySession cs{s, route, bytes, CreateRoundTensors(s, bytes, kAxpyElements)};
      bool have_buffer = cs.GetBuffer(shortage);
      Check(s.synchronize(), "setup");
      SessionRun& r = runs[i];
      gate.ArriveAndWait();
      // Leave as soon as any session lacks its buffer: the run is not measured.
      {
        std::lock_guard lock(shortage.mu);
        if (!shortage.first.empty()) have_buffer = false;
      }
      for (int round = 0; have_buffer && round < rounds; ++round) cs.Round(r);
      r.end = Clock::now();
      Check(s.close().status(), "close");
    });
  }
  for (auto& t : threads) t.join();
  if (!shortage.first.empty()) {
    ConcurrencyRun c;
    c.skipped = std::to_string(shortage.sessions) + " of " + std::to_string(sessions) +
                " sessions got no " + FormatBytes(bytes) + " pinned buffer (" + shortage.first +
                "): the daemon's pinned budget is spent; start it with a larger "
                "--pinned-budget";
    return c;
  }
  return Combine(runs, gate.start());
}

ConcurrencyRun BaselineConcurrency(backend::Device& dev, int sessions, uint64_t bytes, int rounds) {
  StartGate gate(sessions);
  std::vector<SessionRun> runs(sessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < sessions; ++i) {
    threads.emplace_back([&, i] {
      auto stream = Check(dev.CreateStream(), "CreateStream");
      HostBuffer buf(bytes);
      Check(dev.RegisterHostMemory(buf.data(), bytes), "RegisterHostMemory");
      auto d = Check(stream->Allocate(bytes), "Allocate");
      auto x = Check(stream->Allocate(kAxpyElements * sizeof(float)), "Allocate");
      auto y = Check(stream->Allocate(kAxpyElements * sizeof(float)), "Allocate");
      Check(stream->Fill(DType::kF32, x, kAxpyElements, 1.0), "Fill");
      Check(stream->Fill(DType::kF32, y, kAxpyElements, 0.0), "Fill");
      Check(WaitStream(*stream), "setup");
      SessionRun& r = runs[i];
      gate.ArriveAndWait();
      for (int round = 0; round < rounds; ++round) {
        auto t0 = Clock::now();
        Check(stream->CopyHostToDevice(d, buf.data(), bytes), "H2D");
        Check(WaitStream(*stream), "H2D");
        auto t1 = Clock::now();
        Check(stream->CopyDeviceToHost(buf.data(), d, bytes), "D2H");
        Check(WaitStream(*stream), "D2H");
        auto t2 = Clock::now();
        for (int k = 0; k < kSmallOps; ++k) {
          Check(stream->Axpy(DType::kF32, 1e-6, x, y, kAxpyElements), "Axpy");
        }
        Check(WaitStream(*stream), "small ops");
        auto t3 = Clock::now();
        RecordRound(r, bytes, t0, t1, t2, t3);
      }
      r.end = Clock::now();
      stream->Free(d);
      stream->Free(x);
      stream->Free(y);
      Check(WaitStream(*stream), "free");
      Check(dev.UnregisterHostMemory(buf.data()), "UnregisterHostMemory");
    });
  }
  for (auto& t : threads) t.join();
  return Combine(runs, gate.start());
}

Row ConcurrencyRow(int sessions, uint64_t bytes, const std::string& route, const ConcurrencyRun* d,
                   const ConcurrencyRun* b) {
  if (d && !d->skipped.empty()) d = nullptr;
  auto gbps = [](const ConcurrencyRun* r) { return r ? r->bytes / r->wall_ns : kNaN; };
  auto opss = [](const ConcurrencyRun* r) { return r ? r->ops / (r->wall_ns / 1e9) : kNaN; };
  auto fair = [](const ConcurrencyRun* r) { return r ? r->fairness : kNaN; };
  auto p99 = [](const ConcurrencyRun* r, Samples ConcurrencyRun::*s, double unit) {
    return r ? Summarize(r->*s).p99 / unit : kNaN;
  };
  Row row{std::to_string(sessions) + (sessions == 1 ? " session, " : " sessions, ") +
              FormatBytes(bytes) + ", " + route,
          {{"GB/s", gbps(d), gbps(b)},
           {"ops/s", opss(d), opss(b)},
           {"max/min", fair(d), fair(b)},
           {"xfer p99 ms", p99(d, &ConcurrencyRun::transfers, 1e6),
            p99(b, &ConcurrencyRun::transfers, 1e6)},
           {"ops p99 us", p99(d, &ConcurrencyRun::small_ops, 1e3),
            p99(b, &ConcurrencyRun::small_ops, 1e3)}}};
  row.params = {{"sessions", sessions}, {"bytes", static_cast<double>(bytes)}};
  row.tags = {{"route", route}};
  if (d) {
    row.summaries.push_back({"daemon_transfers", Summarize(d->transfers)});
    row.summaries.push_back({"daemon_small_ops", Summarize(d->small_ops)});
  }
  if (b) {
    row.summaries.push_back({"baseline_transfers", Summarize(b->transfers)});
    row.summaries.push_back({"baseline_small_ops", Summarize(b->small_ops)});
  }
  return row;
}

/// What the concurrency scenario measured: per session count counts[i], the baseline's run
/// (empty without --baseline) and each target's on each route.
struct ConcurrencyMeasurements {
  std::vector<int> counts;
  uint64_t bytes = 0;
  int rounds = 0;
  std::vector<ConcurrencyRun> base;
  std::vector<std::vector<std::vector<ConcurrencyRun>>> daemon;  // [target][route][count]
};

/// The route's label in a table: per target, or for all targets pooled ("pending" when
/// any target took the slab route, the notes saying which went inline).
std::string ConcurrencyRouteLabel(const Context& ctx, Route route, int which) {
  if (which >= 0) return RouteLabel(route, ctx.targets[which].target);
  if (route == Route::kBlocking) return std::string("blocking");
  bool all_remote = !ctx.targets.empty();
  for (const auto& t : ctx.targets) all_remote = all_remote && IsRemote(t.target);
  return std::string(all_remote ? "pending-inline" : "pending");
}

/// The rows of the concurrency table of `which`: per route, a row per session count.
std::vector<Row> ConcurrencyRows(const Context& ctx, const ConcurrencyMeasurements& m, int which) {
  std::vector<Row> rows;
  for (size_t r = 0; r < std::size(kRoutes); ++r) {
    for (size_t i = 0; i < m.counts.size(); ++i) {
      ConcurrencyRun d;
      if (which >= 0) d = m.daemon[which][r][i];
      if (which == kAllTargets) {
        for (auto& t : m.daemon) d.Merge(t[r][i]);
      }
      rows.push_back(
          ConcurrencyRow(m.counts[i], m.bytes, ConcurrencyRouteLabel(ctx, kRoutes[r], which),
                         which == kNoTarget ? nullptr : &d, ctx.baseline ? &m.base[i] : nullptr));
    }
  }
  return rows;
}

/// The notes under the concurrency table of `which`, ending with the runs not measured and
/// why.
std::vector<std::string> ConcurrencyNotes(const Context& ctx, const ConcurrencyMeasurements& m,
                                          int which) {
  std::vector<std::string> notes = {
      "each session: " + std::to_string(m.rounds) + " rounds of upload + download of " +
          FormatBytes(m.bytes) + " + " + std::to_string(kSmallOps) +
          " axpy(256) and synchronize(); all start together; one run per route",
      "blocking = upload_bytes/download_bytes from ordinary memory; pending = "
      "upload_pending/download_pending + wait() with one PinnedBuffer per session "
      "reused for every transfer (shared-memory slab on a unix target; bytes inline "
      "on a tcp target: pending-inline); the baseline (registered buffer, "
      "CopyHostToDevice/CopyDeviceToHost) is the same for both routes",
      "GB/s, ops/s: everything all sessions did / wall time; max/min: fastest / "
      "slowest session's bytes per second (1.0 = fair)",
      "xfer p99: one transfer; ops p99: one 8-op submit + synchronize(); under load, all "
      "sessions pooled",
      "daemon: one thread and session each, one Client (one connection); baseline: one "
      "thread and in-process stream each"};
  if (which == kAllTargets) {
    notes.push_back(
        "all targets: work summed over summed wall time (targets ran one "
        "after another), max/min the worst target's, samples pooled");
    for (const auto& t : ctx.targets) {
      if (IsRemote(t.target)) {
        notes.push_back("pending rows: " + t.target + " went inline (pending-inline)");
      }
    }
  }
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    if (which != kAllTargets && which != static_cast<int>(t)) continue;
    for (size_t r = 0; r < std::size(kRoutes); ++r) {
      for (size_t i = 0; i < m.counts.size(); ++i) {
        const std::string& why = m.daemon[t][r][i].skipped;
        if (why.empty()) continue;
        notes.push_back((which == kAllTargets ? ctx.targets[t].target + ": " : "") +
                        std::to_string(m.counts[i]) + " sessions, " +
                        RouteLabel(kRoutes[r], ctx.targets[t].target) + ": not measured: " + why);
      }
    }
  }
  return notes;
}

/// What the open_close scenario measured: the baseline's samples (empty without
/// --baseline) and each target's.
struct OpenCloseMeasurements {
  int iterations = 0;         // sessions opened and closed
  int pinned_iterations = 0;  // first pinned buffers on a kept stream
  Samples base_open, base_close, base_pinned;
  std::vector<Samples> d_open, d_close;  // per target
  // Per target; empty for a remote one (no slabs).
  std::vector<Samples> d_pinned_kept, d_pinned_new;
};

/// The slab the baseline allocates and registers against a session's first pinned buffer.
constexpr uint64_t kBaselineSlab = 64ull << 20;

/// Time creating and destroying an in-process stream (after 5 untimed). Needs ctx.baseline.
void MeasureBaselineOpenClose(Context& ctx, OpenCloseMeasurements& m) {
  ctx.progress->Case("baseline CreateStream / destroy");
  for (int i = -5; i < m.iterations; ++i) {
    auto t0 = Clock::now();
    auto stream = Check(ctx.baseline->device->CreateStream(), "CreateStream");
    auto t1 = Clock::now();
    stream.reset();
    auto t2 = Clock::now();
    if (i < 0) continue;
    m.base_open.Add(std::chrono::duration<double, std::nano>(t1 - t0).count());
    m.base_close.Add(std::chrono::duration<double, std::nano>(t2 - t1).count());
  }
}

/// Time open_session() and close() one after another on one Client of target t (after 5
/// untimed).
void MeasureTargetOpenClose(Context& ctx, size_t t, OpenCloseMeasurements& m) {
  ctx.progress->Case(ctx.targets[t].target + " open_session / close");
  auto client = Check(Connect(ctx.targets[t].target), "connect");
  for (int i = -5; i < m.iterations; ++i) {
    auto t0 = Clock::now();
    auto s = Check(client.open_session(), "open_session");
    auto t1 = Clock::now();
    Check(s.close().status(), "close");
    auto t2 = Clock::now();
    if (i < 0) continue;
    m.d_open[t].Add(std::chrono::duration<double, std::nano>(t1 - t0).count());
    m.d_close[t].Add(std::chrono::duration<double, std::nano>(t2 - t1).count());
  }
}

/// Time allocating and registering kBaselineSlab of host memory, the in-process counterpart
/// of a session's first pinned buffer (at most 50, after 2 untimed). Needs ctx.baseline.
void MeasureBaselinePinned(Context& ctx, OpenCloseMeasurements& m) {
  ctx.progress->Case("baseline allocate + register 64 MiB");
  for (int i = -2; i < std::min(m.pinned_iterations, 50); ++i) {
    auto t0 = Clock::now();
    auto buf = std::make_unique<HostBuffer>(kBaselineSlab);
    Check(ctx.baseline->device->RegisterHostMemory(buf->data(), kBaselineSlab),
          "RegisterHostMemory");
    double ns = NsSince(t0);
    Check(ctx.baseline->device->UnregisterHostMemory(buf->data()), "UnregisterHostMemory");
    if (i >= 0) m.base_pinned.Add(ns);
  }
}

/// Open a session on `client`, time its first pinned_buffer(4 KiB), close it.
double FirstPinnedNs(Client& client) {
  auto s = Check(client.open_session(), "open_session");
  auto t0 = Clock::now();
  auto b = Check(s.pinned_buffer(4096), "pinned_buffer");
  double ns = NsSince(t0);
  b = PinnedBuffer();
  Check(s.close().status(), "close");
  return ns;
}

/// Time a new session's first pinned buffer on local target t: sessions one after another
/// on one Client (kept stream), then each on a Client of its own (after 2 untimed each).
void MeasureTargetFirstPinned(Context& ctx, size_t t, OpenCloseMeasurements& m) {
  ctx.progress->Case(ctx.targets[t].target + " first pinned_buffer, kept stream");
  auto client = Check(Connect(ctx.targets[t].target), "connect");
  for (int i = -2; i < m.pinned_iterations; ++i) {
    const double ns = FirstPinnedNs(client);
    if (i >= 0) m.d_pinned_kept[t].Add(ns);
  }
  ctx.progress->Case(ctx.targets[t].target + " first pinned_buffer, new client");
  for (int i = -2; i < m.pinned_iterations / 4; ++i) {
    auto own = Check(Connect(ctx.targets[t].target), "connect");
    const double ns = FirstPinnedNs(own);
    if (i >= 0) m.d_pinned_new[t].Add(ns);
  }
}

/// The pairwise sums a[i] + b[i] (as many as both have).
Samples PairwiseSum(const Samples& a, const Samples& b) {
  Samples s;
  for (size_t i = 0; i < a.ns.size() && i < b.ns.size(); ++i) s.Add(a.ns[i] + b.ns[i]);
  return s;
}

/// A p50/p99 row of daemon samples `d` (null: none) against baseline samples `b`.
Row OpenCloseRow(const Context& ctx, const std::string& label, const Samples* d, const Samples& b) {
  Summary ds = d ? Summarize(*d) : Summary{}, bs = ctx.baseline ? Summarize(b) : Summary{};
  Row r{label, {{"p50 us", ds.p50 / 1e3, bs.p50 / 1e3}, {"p99 us", ds.p99 / 1e3, bs.p99 / 1e3}}};
  if (d) r.summaries.push_back({"daemon", ds});
  if (ctx.baseline) r.summaries.push_back({"baseline", bs});
  return r;
}

/// The rows of the open_close table of `which`: open, close, both, and the first pinned
/// buffers where some target measured them (or there is no target).
std::vector<Row> OpenCloseRows(const Context& ctx, const OpenCloseMeasurements& m, int which) {
  Samples o, c, both, kept, fresh;
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    if (which == kAllTargets || which == static_cast<int>(t)) {
      o.Append(m.d_open[t]);
      c.Append(m.d_close[t]);
      both.Append(PairwiseSum(m.d_open[t], m.d_close[t]));
      kept.Append(m.d_pinned_kept[t]);
      fresh.Append(m.d_pinned_new[t]);
    }
  }
  bool has = which != kNoTarget;
  const Samples base_both = PairwiseSum(m.base_open, m.base_close);
  std::vector<Row> rows = {OpenCloseRow(ctx, "open_session()", has ? &o : nullptr, m.base_open),
                           OpenCloseRow(ctx, "close()", has ? &c : nullptr, m.base_close),
                           OpenCloseRow(ctx, "open + close", has ? &both : nullptr, base_both)};
  if (!has || !kept.ns.empty()) {
    rows.push_back(OpenCloseRow(ctx, "first pinned_buffer(), kept stream", has ? &kept : nullptr,
                                m.base_pinned));
    rows.push_back(OpenCloseRow(ctx, "first pinned_buffer(), new client", has ? &fresh : nullptr,
                                m.base_pinned));
  }
  return rows;
}

/// The notes under the open_close table of `which`.
std::vector<std::string> OpenCloseNotes(const Context& ctx, const OpenCloseMeasurements& m,
                                        int which) {
  std::vector<std::string> notes = {
      std::to_string(m.iterations) +
          " sessions opened and closed one after another on "
          "one Client; close() waits for the daemon's Closed (each session after the "
          "first opens on the stream the last one kept: docs/protocol.md, \"Kept "
          "streams\")",
      "baseline = in-process Device::CreateStream() / destroying the stream"};
  if (which < 0 || !IsRemote(ctx.targets[which].target)) {
    notes.push_back(
        "first pinned_buffer() (local targets) = a new session's first pinned_buffer(4 "
        "KiB); kept stream: sessions one after another on one Client, each starting with "
        "the slab the last one left unused (docs/protocol.md, \"Kept slabs\"); new "
        "client: each session on a Client of its own, its first buffer a fresh slab from "
        "the pool (made ahead, or by the grant); baseline: allocating, touching and "
        "registering 64 MiB of host memory");
  }
  if (which == kAllTargets) notes.push_back("all targets: samples pooled");
  return notes;
}

}  // namespace

std::vector<Table> RunConcurrency(Context& ctx) {
  ConcurrencyMeasurements m;
  m.counts = ctx.options.sessions.empty() ? std::vector<int>{1, 8, 64} : ctx.options.sessions;
  m.bytes = ctx.options.quick ? (1ull << 20) : (8ull << 20);
  // Enough rounds that the per-session rates measure sharing, not the start-up skew of 64
  // threads (8 rounds at 64 sessions last ~0.2 s).
  m.rounds = ctx.options.quick ? 2 : 32;
  m.base.resize(m.counts.size());
  if (ctx.baseline) {
    for (size_t i = 0; i < m.counts.size(); ++i) {
      ctx.progress->Case("baseline " + std::to_string(m.counts[i]) + " streams");
      m.base[i] = BaselineConcurrency(*ctx.baseline->device, m.counts[i], m.bytes, m.rounds);
    }
  }
  m.daemon.resize(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    const std::string& target = ctx.targets[t].target;
    for (Route route : kRoutes) {
      m.daemon[t].emplace_back();
      for (int n : m.counts) {
        ctx.progress->Case(target + " " + RouteLabel(route, target) + " " + std::to_string(n) +
                           " sessions");
        m.daemon[t].back().push_back(DaemonConcurrency(target, route, n, m.bytes, m.rounds));
      }
    }
  }
  return BuildTables(
      ctx, "concurrency", [&](int which) { return ConcurrencyRows(ctx, m, which); },
      [&](int which) { return ConcurrencyNotes(ctx, m, which); });
}

std::vector<Table> RunOpenClose(Context& ctx) {
  OpenCloseMeasurements m;
  m.iterations = ctx.Iterations(1000, 50);
  m.pinned_iterations = ctx.Iterations(200, 20);
  m.d_open.resize(ctx.targets.size());
  m.d_close.resize(ctx.targets.size());
  m.d_pinned_kept.resize(ctx.targets.size());
  m.d_pinned_new.resize(ctx.targets.size());
  if (ctx.baseline) MeasureBaselineOpenClose(ctx, m);
  for (size_t t = 0; t < ctx.targets.size(); ++t) MeasureTargetOpenClose(ctx, t, m);
  // A session's first pinned_buffer (local targets), and its in-process counterpart.
  if (ctx.baseline) MeasureBaselinePinned(ctx, m);
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    if (!IsRemote(ctx.targets[t].target)) MeasureTargetFirstPinned(ctx, t, m);
  }
  return BuildTables(
      ctx, "open_close", [&](int which) { return OpenCloseRows(ctx, m, which); },
      [&](int which) { return OpenCloseNotes(ctx, m, which); });
}

}  // namespace ferry::bench
