// Scenarios "concurrency" and "open_close".
//
// concurrency: S sessions at once (S = 1, 8, 64; one thread each, all sessions opened from
//   one Client, i.e. one connection, as threads of one program would). After every session
//   is set up, all start together; each runs R rounds of
//     upload X bytes (blocking) | download X bytes (blocking) | 8 axpy(256) + synchronize()
//   with X = 8 MiB (quick: 1 MiB). Figures over the whole run (start signal to last
//   session done = wall):
//     GB/s      all sessions' bytes moved / wall
//     ops/s     all sessions' small ops / wall
//     max/min   per-session fairness: highest / lowest per-session rate (bytes / its own
//               elapsed time); 1.0 is perfectly fair
//     xfer p99  p99 of single transfers (ms), all sessions pooled: latency under load
//     ops p99   p99 of one 8-op submit + synchronize() (us), pooled
//   Baseline: the same S threads in process, each with its own Stream on the one device.
//
// open_close: Client::open_session() and Session::close() (which waits for the daemon's
//   Closed) timed separately, N times on one Client. Baseline: Device::CreateStream() and
//   destroying the stream — what a session costs in process.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

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

  void Merge(const ConcurrencyRun& o) {
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

ConcurrencyRun DaemonConcurrency(const std::string& target, int sessions, uint64_t bytes,
                                 int rounds) {
  auto client = Check(Client::connect(target), "connect " + target);
  StartGate gate(sessions);
  std::vector<SessionRun> runs(sessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < sessions; ++i) {
    threads.emplace_back([&, i] {
      auto s = Check(client.open_session(), "open_session");
      Tensor t = s.create_tensor<uint8_t>({static_cast<int64_t>(bytes)});
      Tensor x = s.create_tensor<float>({kAxpyElements});
      Tensor y = s.create_tensor<float>({kAxpyElements});
      s.fill(x, 1.0);
      s.fill(y, 0.0);
      HostBuffer buf(bytes);
      Check(s.synchronize(), "setup");
      SessionRun& r = runs[i];
      gate.ArriveAndWait();
      for (int round = 0; round < rounds; ++round) {
        auto t0 = Clock::now();
        Check(s.upload_bytes(t, buf.data(), bytes), "upload");
        auto t1 = Clock::now();
        Check(s.download_bytes(t, buf.data(), bytes), "download");
        auto t2 = Clock::now();
        for (int k = 0; k < kSmallOps; ++k) s.axpy(1e-6, x, y);
        Check(s.synchronize(), "small ops");
        auto t3 = Clock::now();
        r.transfers.Add(std::chrono::duration<double, std::nano>(t1 - t0).count());
        r.transfers.Add(std::chrono::duration<double, std::nano>(t2 - t1).count());
        r.small_ops.Add(std::chrono::duration<double, std::nano>(t3 - t2).count());
        r.bytes += 2.0 * static_cast<double>(bytes);
        r.ops += kSmallOps;
      }
      r.end = Clock::now();
      Check(s.close().status(), "close");
    });
  }
  for (auto& t : threads) t.join();
  return Combine(runs, gate.start());
}

ConcurrencyRun BaselineConcurrency(backend::Device& dev, int sessions, uint64_t bytes,
                                   int rounds) {
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
        r.transfers.Add(std::chrono::duration<double, std::nano>(t1 - t0).count());
        r.transfers.Add(std::chrono::duration<double, std::nano>(t2 - t1).count());
        r.small_ops.Add(std::chrono::duration<double, std::nano>(t3 - t2).count());
        r.bytes += 2.0 * static_cast<double>(bytes);
        r.ops += kSmallOps;
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

Row ConcurrencyRow(int sessions, uint64_t bytes, const ConcurrencyRun* d,
                   const ConcurrencyRun* b) {
  auto gbps = [](const ConcurrencyRun* r) { return r ? r->bytes / r->wall_ns : kNaN; };
  auto opss = [](const ConcurrencyRun* r) { return r ? r->ops / (r->wall_ns / 1e9) : kNaN; };
  auto fair = [](const ConcurrencyRun* r) { return r ? r->fairness : kNaN; };
  auto p99 = [](const ConcurrencyRun* r, Samples ConcurrencyRun::*s, double unit) {
    return r ? Summarize(r->*s).p99 / unit : kNaN;
  };
  Row row{std::to_string(sessions) + (sessions == 1 ? " session, " : " sessions, ") +
              FormatBytes(bytes),
          {{"GB/s", gbps(d), gbps(b)},
           {"ops/s", opss(d), opss(b)},
           {"max/min", fair(d), fair(b)},
           {"xfer p99 ms", p99(d, &ConcurrencyRun::transfers, 1e6),
            p99(b, &ConcurrencyRun::transfers, 1e6)},
           {"ops p99 us", p99(d, &ConcurrencyRun::small_ops, 1e3),
            p99(b, &ConcurrencyRun::small_ops, 1e3)}}};
  row.params = {{"sessions", sessions}, {"bytes", static_cast<double>(bytes)}};
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

}  // namespace

std::vector<Table> RunConcurrency(Context& ctx) {
  std::vector<int> counts = ctx.options.sessions.empty() ? std::vector<int>{1, 8, 64}
                                                         : ctx.options.sessions;
  uint64_t bytes = ctx.options.quick ? (1ull << 20) : (8ull << 20);
  int rounds = ctx.options.quick ? 2 : 8;
  std::vector<ConcurrencyRun> base(counts.size());
  if (ctx.baseline) {
    for (size_t i = 0; i < counts.size(); ++i) {
      ctx.progress->Case("baseline " + std::to_string(counts[i]) + " streams");
      base[i] = BaselineConcurrency(*ctx.baseline->device, counts[i], bytes, rounds);
    }
  }
  std::vector<std::vector<ConcurrencyRun>> daemon(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    for (int n : counts) {
      ctx.progress->Case(ctx.targets[t].target + " " + std::to_string(n) + " sessions");
      daemon[t].push_back(DaemonConcurrency(ctx.targets[t].target, n, bytes, rounds));
    }
  }
  return BuildTables(
      ctx, "concurrency",
      [&](int which) {
        std::vector<Row> rows;
        for (size_t i = 0; i < counts.size(); ++i) {
          ConcurrencyRun d;
          if (which >= 0) d = daemon[which][i];
          if (which == kAllTargets) {
            for (auto& t : daemon) d.Merge(t[i]);
          }
          rows.push_back(ConcurrencyRow(counts[i], bytes, which == kNoTarget ? nullptr : &d,
                                        ctx.baseline ? &base[i] : nullptr));
        }
        return rows;
      },
      [&](int which) {
        std::vector<std::string> notes = {
            "each session: " + std::to_string(rounds) + " rounds of upload + download of " +
                FormatBytes(bytes) + " (blocking) + " + std::to_string(kSmallOps) +
                " axpy(256) and synchronize(); all start together",
            "GB/s, ops/s: everything all sessions did / wall time; max/min: fastest / "
            "slowest session's bytes per second (1.0 = fair)",
            "xfer p99: one transfer; ops p99: one 8-op submit + synchronize(); under load, all "
            "sessions pooled",
            "daemon: one thread and session each, one Client (one connection); baseline: one "
            "thread and in-process stream each"};
        if (which == kAllTargets) {
          notes.push_back("all targets: work summed over summed wall time (targets ran one "
                          "after another), max/min the worst target's, samples pooled");
        }
        return notes;
      });
}

std::vector<Table> RunOpenClose(Context& ctx) {
  int iterations = ctx.Iterations(1000, 50);
  Samples base_open, base_close;
  if (ctx.baseline) {
    ctx.progress->Case("baseline CreateStream / destroy");
    for (int i = -5; i < iterations; ++i) {
      auto t0 = Clock::now();
      auto stream = Check(ctx.baseline->device->CreateStream(), "CreateStream");
      auto t1 = Clock::now();
      stream.reset();
      auto t2 = Clock::now();
      if (i < 0) continue;
      base_open.Add(std::chrono::duration<double, std::nano>(t1 - t0).count());
      base_close.Add(std::chrono::duration<double, std::nano>(t2 - t1).count());
    }
  }
  std::vector<Samples> d_open(ctx.targets.size()), d_close(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    ctx.progress->Case(ctx.targets[t].target + " open_session / close");
    auto client = Check(Client::connect(ctx.targets[t].target), "connect");
    for (int i = -5; i < iterations; ++i) {
      auto t0 = Clock::now();
      auto s = Check(client.open_session(), "open_session");
      auto t1 = Clock::now();
      Check(s.close().status(), "close");
      auto t2 = Clock::now();
      if (i < 0) continue;
      d_open[t].Add(std::chrono::duration<double, std::nano>(t1 - t0).count());
      d_close[t].Add(std::chrono::duration<double, std::nano>(t2 - t1).count());
    }
  }
  auto sum = [](const Samples& a, const Samples& b) {
    Samples s;
    for (size_t i = 0; i < a.ns.size() && i < b.ns.size(); ++i) s.Add(a.ns[i] + b.ns[i]);
    return s;
  };
  Samples base_both = sum(base_open, base_close);
  auto row = [&](const std::string& label, const Samples* d, const Samples& b) {
    Summary ds = d ? Summarize(*d) : Summary{}, bs = ctx.baseline ? Summarize(b) : Summary{};
    Row r{label, {{"p50 us", ds.p50 / 1e3, bs.p50 / 1e3}, {"p99 us", ds.p99 / 1e3, bs.p99 / 1e3}}};
    if (d) r.summaries.push_back({"daemon", ds});
    if (ctx.baseline) r.summaries.push_back({"baseline", bs});
    return r;
  };
  return BuildTables(
      ctx, "open_close",
      [&](int which) {
        Samples o, c, both;
        for (size_t t = 0; t < ctx.targets.size(); ++t) {
          if (which == kAllTargets || which == static_cast<int>(t)) {
            o.Append(d_open[t]);
            c.Append(d_close[t]);
            both.Append(sum(d_open[t], d_close[t]));
          }
        }
        bool has = which != kNoTarget;
        return std::vector<Row>{row("open_session()", has ? &o : nullptr, base_open),
                                row("close()", has ? &c : nullptr, base_close),
                                row("open + close", has ? &both : nullptr, base_both)};
      },
      [&](int which) {
        std::vector<std::string> notes = {
            std::to_string(iterations) + " sessions opened and closed one after another on "
            "one Client; close() waits for the daemon's Closed",
            "baseline = in-process Device::CreateStream() / destroying the stream"};
        if (which == kAllTargets) notes.push_back("all targets: samples pooled");
        return notes;
      });
}

}  // namespace ferry::bench
