// Scenario "overlap": does a pending download run while the host computes?
//
// One 8 MiB tensor, one PinnedBuffer (allocated once, moved through every transfer and taken
// back from wait()), and compute-bound host work (a dependent floating-point loop, no memory
// traffic) sized to last as long as the in-process copy of the same 8 MiB: the baseline's
// copy-only p50, measured first. Without --baseline each target's host work is sized to
// that target's own copy-only p50 (round trip included), and the notes say so. Four arms,
// interleaved per iteration so that drift hits all of them alike:
//   copy only    download_pending(tensor, buffer) -> wait()
//   host only    the host work alone
//   serial       download_pending -> wait() -> host work
//   overlapped   download_pending -> host work -> wait()
// Perfect overlap makes "overlapped" as long as the longer of copy and work; no overlap makes
// it as long as "serial". The target is overlapped <= 1.1 x copy only: with the host work
// as long as the in-process copy, that holds when the daemon's copy costs no more than the
// in-process one and hides the work. "x longer arm" = arm p50 / max(copy-only p50, host-only
// p50) shows the overlap itself whichever arm is longer, and the notes give how much of the
// shorter arm was hidden: (copy + host - overlapped) / min(copy, host).
//
// Baseline: the same arms in process, with a registered (pinned) host buffer and
// Stream::CopyDeviceToHost + OnComplete, waited on. Daemon and baseline run the same number
// of host-work iterations.
//
// A remote (tcp) target serves the same API inline (the bytes arrive in DownloadChunk
// messages); the arms are labelled accordingly.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <optional>

#include "bench.h"

namespace ferry::bench {
namespace {

constexpr uint64_t kBytes = 8ull << 20;
enum Arm { kCopy = 0, kHost, kSerial, kOverlapped, kArms };
const char* const kArmLabels[kArms] = {"copy only", "host work only", "serial (wait, then work)",
                                       "overlapped (enqueue, work, wait)"};

volatile double g_sink = 0;

/// Compute-bound host work: `iters` dependent multiply-adds (~1 ns each), no memory traffic.
void HostWork(uint64_t iters) {
  double x = 1.0;
  for (uint64_t i = 0; i < iters; ++i) x = x * 1.0000001 + 1e-9;
  g_sink = x;
}

/// Iterations of HostWork that take about `target_ns` (median of a few trials).
uint64_t CalibrateWork(double target_ns) {
  const uint64_t probe = 200000;
  Samples s;
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    HostWork(probe);
    s.Add(NsSince(t0));
  }
  double per_iter = Summarize(s).p50 / static_cast<double>(probe);
  return std::max<uint64_t>(1, static_cast<uint64_t>(target_ns / per_iter));
}

struct ArmSamples {
  Samples arm[kArms];
  uint64_t work_iters = 0;
  double calibrated_copy_ns = 0;  // this side's copy-only p50 before the arms (4 samples)
  double work_target_ns = 0;      // what the host work was sized to
};

/// Run the four arms with `copy_start()` (begin the copy) and `copy_wait()` (block until
/// its bytes are there). The copy alone is timed first (warm-up, and this side's copy time);
/// the host work runs `work_iters` iterations, or when that is 0, as many as last about
/// this side's copy time.
template <typename Start, typename Wait>
ArmSamples RunArms(int iterations, uint64_t work_iters, double work_target_ns, Start copy_start,
                   Wait copy_wait) {
  ArmSamples out;
  Samples calib;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    copy_start();
    copy_wait();
    if (i >= 1) calib.Add(NsSince(t0));
  }
  out.calibrated_copy_ns = Summarize(calib).p50;
  if (work_iters > 0) {
    out.work_iters = work_iters;
    out.work_target_ns = work_target_ns;
  } else {
    out.work_iters = CalibrateWork(out.calibrated_copy_ns);
    out.work_target_ns = out.calibrated_copy_ns;
  }
  for (int i = 0; i < iterations; ++i) {
    for (int a = 0; a < kArms; ++a) {
      auto t0 = Clock::now();
      switch (a) {
        case kCopy:
          copy_start();
          copy_wait();
          break;
        case kHost:
          HostWork(out.work_iters);
          break;
        case kSerial:
          copy_start();
          copy_wait();
          HostWork(out.work_iters);
          break;
        case kOverlapped:
          copy_start();
          HostWork(out.work_iters);
          copy_wait();
          break;
      }
      out.arm[a].Add(NsSince(t0));
    }
  }
  return out;
}

ArmSamples DaemonOverlap(Session& s, int iterations, uint64_t work_iters, double work_ns) {
  PinnedBuffer buf = Check(s.pinned_buffer(kBytes), "pinned_buffer(8 MiB)");
  std::memset(buf.data(), 0, buf.size());
  Tensor t = s.create_tensor<float>({static_cast<int64_t>(kBytes / sizeof(float))});
  s.fill(t, 1.0);
  Check(s.synchronize(), "overlap setup");
  PendingTransfer pending;
  auto start = [&] { pending = s.download_pending(std::move(t), std::move(buf)); };
  auto wait = [&] {
    Transfer done = pending.wait();
    t = std::move(done.tensor);
    buf = std::move(done.buffer);
    Check(done.status, "overlap download_pending");
  };
  ArmSamples out = RunArms(iterations, work_iters, work_ns, start, wait);
  if (buf.span<float>()[kBytes / sizeof(float) - 1] != 1.0f) Die("overlap: wrong bytes downloaded");
  s.free(std::move(t));
  Check(s.synchronize(), "overlap free");
  return out;
}

ArmSamples BaselineOverlap(backend::Device& dev, int iterations) {
  auto stream = Check(dev.CreateStream(), "CreateStream");
  HostBuffer buf(kBytes);
  std::memset(buf.data(), 0, kBytes);
  Check(dev.RegisterHostMemory(buf.data(), kBytes), "RegisterHostMemory");
  backend::DevicePtr d = Check(stream->Allocate(kBytes), "Allocate");
  Check(stream->Fill(DType::kF32, d, kBytes / sizeof(float), 1.0), "Fill");
  Check(WaitStream(*stream), "setup");
  auto start = [&] { Check(stream->CopyDeviceToHost(buf.data(), d, kBytes), "CopyDeviceToHost"); };
  auto wait = [&] { Check(WaitStream(*stream), "wait"); };
  ArmSamples out = RunArms(iterations, 0, 0, start, wait);
  stream->Free(d);
  Check(WaitStream(*stream), "free");
  Check(dev.UnregisterHostMemory(buf.data()), "UnregisterHostMemory");
  return out;
}

/// What the overlap scenario measured: the baseline's arms (empty without --baseline) and
/// each target's.
struct OverlapMeasurements {
  int iterations = 0;  // samples per arm
  ArmSamples base;
  std::vector<ArmSamples> daemon;  // per target
};

/// Whether table `which` is a remote target's (its pending API moves the bytes inline).
bool RemoteTable(const Context& ctx, int which) {
  return which >= 0 && ctx.targets[which].target.rfind("tcp:", 0) == 0;
}

/// The daemon's samples of each arm that table `which` shows: one target's, or every
/// target's pooled (kAllTargets); none for kNoTarget.
std::array<Samples, kArms> PooledArms(const OverlapMeasurements& m, int which) {
  std::array<Samples, kArms> d;
  for (int a = 0; a < kArms; ++a) {
    if (which >= 0) d[a] = m.daemon[which].arm[a];
    if (which == kAllTargets) {
      for (auto& x : m.daemon) d[a].Append(x.arm[a]);
    }
  }
  return d;
}

/// The rows of the overlap table of `which`: one per arm, against the copy alone and
/// against the longer of the copy and the host work.
std::vector<Row> OverlapRows(const Context& ctx, const OverlapMeasurements& m, int which) {
  const std::array<Samples, kArms> d = PooledArms(m, which);
  const ArmSamples& base = m.base;
  bool has_d = which != kNoTarget;
  double d_copy = has_d ? Summarize(d[kCopy]).p50 : kNaN;
  double b_copy = ctx.baseline ? Summarize(base.arm[kCopy]).p50 : kNaN;
  double d_longer = has_d ? std::max(d_copy, Summarize(d[kHost]).p50) : kNaN;
  double b_longer = ctx.baseline ? std::max(b_copy, Summarize(base.arm[kHost]).p50) : kNaN;
  std::vector<Row> rows;
  for (int a = 0; a < kArms; ++a) {
    Summary ds = has_d ? Summarize(d[a]) : Summary{};
    Summary bs = ctx.baseline ? Summarize(base.arm[a]) : Summary{};
    std::string label = kArmLabels[a];
    if (a == kCopy) {
      label += RemoteTable(ctx, which) ? " (8 MiB pending-inline download)"
                                       : " (8 MiB pending download)";
    }
    Row r{label,
          {{"p50 us", ds.p50 / 1e3, bs.p50 / 1e3},
           {"p99 us", ds.p99 / 1e3, bs.p99 / 1e3},
           {"x copy only", ds.p50 / d_copy, bs.p50 / b_copy},
           {"x longer arm", ds.p50 / d_longer, bs.p50 / b_longer}}};
    r.params = {{"bytes", static_cast<double>(kBytes)}};
    r.tags = {{"arm", a == kCopy     ? "copy"
                      : a == kHost   ? "host"
                      : a == kSerial ? "serial"
                                     : "overlapped"}};
    if (has_d) r.summaries.push_back({"daemon", ds});
    if (ctx.baseline) r.summaries.push_back({"baseline", bs});
    rows.push_back(std::move(r));
  }
  return rows;
}

/// The note on how much host work ran: the baseline's (sized to the in-process copy), or
/// without a baseline target `which`'s own; nothing for a table of several targets.
std::optional<std::string> HostWorkNote(const Context& ctx, const OverlapMeasurements& m,
                                        int which) {
  char buf[256];
  if (ctx.baseline) {
    std::snprintf(buf, sizeof buf,
                  "host work: %llu iterations, sized to the in-process copy-only p50 "
                  "(%.0f us, measured before the arms)",
                  static_cast<unsigned long long>(m.base.work_iters), m.base.work_target_ns / 1e3);
    return buf;
  }
  if (which >= 0) {
    std::snprintf(buf, sizeof buf,
                  "host work here: %llu iterations, sized to this target's copy-only p50 "
                  "(%.0f us, measured before the arms)",
                  static_cast<unsigned long long>(m.daemon[which].work_iters),
                  m.daemon[which].work_target_ns / 1e3);
    return buf;
  }
  return std::nullopt;
}

/// The note on how much of the shorter arm the overlapped arm hid, per side.
std::string HiddenNote(const Context& ctx, const OverlapMeasurements& m, int which) {
  auto hidden = [](const Samples* arm) {
    double c = Summarize(arm[kCopy]).p50, h = Summarize(arm[kHost]).p50,
           o = Summarize(arm[kOverlapped]).p50;
    return 100.0 * (c + h - o) / std::min(c, h);
  };
  char buf[256];
  std::string hid =
      "shorter arm hidden, (copy + host - overlapped) / min(copy, host) at "
      "p50: ";
  if (which != kNoTarget) {
    const std::array<Samples, kArms> d = PooledArms(m, which);
    std::snprintf(buf, sizeof buf, "ferryd %.0f %%", hidden(d.data()));
    hid += buf;
  }
  if (ctx.baseline) {
    std::snprintf(buf, sizeof buf, "%sbaseline %.0f %%", which != kNoTarget ? ", " : "",
                  hidden(m.base.arm));
    hid += buf;
  }
  return hid + " (100 % = fully hidden, 0 % = serial)";
}

/// The notes under the overlap table of `which`.
std::vector<std::string> OverlapNotes(const Context& ctx, const OverlapMeasurements& m, int which) {
  std::vector<std::string> n = {
      std::string("8 MiB device -> host copy against compute-bound host work sized to ") +
          (ctx.baseline ? "the in-process copy (baseline copy-only p50), the same "
                          "iterations for daemon and baseline"
                        : "each target's own copy-only p50, round trip included (no "
                          "baseline ran)") +
          "; arms interleaved, " + std::to_string(m.iterations) + " samples each",
      "x copy only = arm p50 / copy-only p50 (target: overlapped <= 1.1); x longer "
      "arm = arm p50 / max(copy-only p50, host-only p50) (perfect overlap: 1.0); the "
      "ratio column compares the daemon's with the baseline's",
      "daemon: download_pending with one PinnedBuffer moved through every transfer; "
      "baseline: registered host buffer, CopyDeviceToHost + OnComplete"};
  if (auto work = HostWorkNote(ctx, m, which)) n.push_back(std::move(*work));
  n.push_back(HiddenNote(ctx, m, which));
  if (RemoteTable(ctx, which)) n.push_back("remote target: the pending API moves the bytes inline");
  if (which == kAllTargets) n.push_back("all targets: samples pooled");
  return n;
}

}  // namespace

std::vector<Table> RunOverlap(Context& ctx) {
  OverlapMeasurements m;
  m.iterations = ctx.Iterations(50, 8);
  if (ctx.baseline) {
    ctx.progress->Case("baseline overlap arms");
    m.base = BaselineOverlap(*ctx.baseline->device, m.iterations);
  }
  m.daemon.resize(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    ctx.progress->Case(ctx.targets[t].target + " overlap arms");
    auto client = Check(Connect(ctx.targets[t].target), "connect");
    auto session = Check(client.open_session(), "open_session");
    // The host work of the baseline (sized to the in-process copy), or 0: this target's own.
    m.daemon[t] = ctx.baseline ? DaemonOverlap(session, m.iterations, m.base.work_iters,
                                               m.base.work_target_ns)
                               : DaemonOverlap(session, m.iterations, 0, 0);
    Check(session.close().status(), "close");
  }
  return BuildTables(
      ctx, "overlap", [&](int which) { return OverlapRows(ctx, m, which); },
      [&](int which) { return OverlapNotes(ctx, m, which); });
}

}  // namespace ferry::bench
