// Scenario "transfers": move N bytes host -> device (upload) and device -> host (download),
// one transfer at a time, and time each from the call until the bytes are there.
//
// Daemon side, per route:
//   blocking  Session::upload_bytes / download_bytes from/to ordinary host memory; the call
//             returns once the daemon reports the transfer complete (local sessions: the
//             library stages through its shared-memory slabs; remote: bytes inline).
//   pending   Session::upload_pending / download_pending through PinnedBuffers, reused
//             across iterations as the contract intends: allocated once per size, then each
//             iteration upload_pending(std::move(buffer), std::move(tensor)) -> wait() ->
//             take both back. For a local (unix) target the buffer lives in a shared-memory
//             slab the daemon DMAs from; for a remote (tcp) target the same API sends the
//             bytes inline, and the route is labelled "pending-inline". A size above one
//             slab (Opened's slab_size, default 64 MiB; or a QUOTA_EXCEEDED from
//             pinned_buffer) is split into slab-sized parts (a buffer and a tensor each),
//             issued back to back and waited together; the time covers all parts.
//   streamed  the pending route kept `depth` transfers deep (--stream-depth, default 4), as
//             a program streaming data through the GPU uses it: `depth` PinnedBuffers and
//             tensors; each round issues StreamRound(bytes) transfers, waiting for the
//             oldest before issuing into its buffer again. Sizes from 64 KiB up to 8 MiB
//             (above that one pending transfer already is split into parts issued back to
//             back). Time = round time / transfers in it. Baseline: the same number of
//             copies enqueued back to back on one stream from one registered buffer, one wait.
// Baseline: in process, a host buffer registered once with Device::RegisterHostMemory
// (cudaHostRegister on CUDA: pinned), then Stream::CopyHostToDevice / CopyDeviceToHost and
// OnComplete, waited on — what a program owning the GPU itself does at best. Both routes
// are compared with the same baseline samples.
//
// Figures: p50 and p99 of the per-transfer time (us), and bandwidth = bytes / p50 time
// (GB/s, 1 GB = 1e9 B).
//
// "vs in-process pageable" row: the blocking upload of 256 MiB (or the largest size measured,
// when 256 MiB is not) against an in-process copy from ordinary, unregistered memory
// (Stream::CopyHostToDevice of a pageable buffer: cudaMemcpyAsync stages it through the
// driver's own pinned buffers on CUDA), waited on — what a program that neither pins its
// memory nor uses a daemon gets, beside what ferryd's blocking route gives it.
//
// "create + first download" rows (4 KiB, 1 MiB, 64 MiB): a new tensor created and at once
// downloaded, nothing written (blocking route), a new tensor each time. A new tensor is
// zeroed before anything can read it (the pool's memory may hold another session's bytes):
// compared with the "download blocking" row of the same size (an existing tensor), this
// is what creating and zeroing costs. Baseline: Stream::Allocate (which zeroes the same
// way) + CopyDeviceToHost into a registered buffer, waited on, then Free.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <tuple>

#include "bench.h"

namespace ferry::bench {
namespace {

enum class Route { kBlocking, kPending, kStreamed };
const char* RouteName(Route r) {
  switch (r) {
    case Route::kBlocking:
      return "blocking";
    case Route::kPending:
      return "pending";
    case Route::kStreamed:
      return "streamed";
  }
  return "?";
}
const Route kRoutes[] = {Route::kPending, Route::kStreamed, Route::kBlocking};

/// The sizes the streamed route runs at.
bool Streams(uint64_t bytes) { return bytes >= (64ull << 10) && bytes <= (8ull << 20); }
/// Transfers per streamed round: at least 16, about 512 MiB per round, at most 256.
int StreamRound(uint64_t bytes) {
  return static_cast<int>(std::clamp<uint64_t>((512ull << 20) / bytes, 16, 256));
}

/// The route as measured on `target`: the pending API goes inline for a remote session.
std::string RouteLabel(Route r, const std::string& target) {
  if (r == Route::kPending && IsRemote(target)) return "pending-inline";
  if (r == Route::kStreamed && IsRemote(target)) return "streamed-inline";
  return RouteName(r);
}

enum class Direction { kUpload, kDownload };
const char* DirName(Direction d) { return d == Direction::kUpload ? "upload" : "download"; }

struct Case {
  Route route;
  Direction dir;
  uint64_t bytes;
  int iterations;
  std::string label(const std::string& route_label = "") const {
    std::string route_name = route_label.empty() ? RouteName(route) : route_label;
    return std::string(DirName(dir)) + " " + route_name + " " + FormatBytes(bytes);
  }
};

std::vector<uint64_t> Sizes(const Context& ctx) {
  if (!ctx.options.sizes.empty()) return ctx.options.sizes;
  if (ctx.options.quick) return {16, 64ull << 10, 1ull << 20, 8ull << 20};
  return {16, 64ull << 10, 1ull << 20, 8ull << 20, 64ull << 20, 256ull << 20};
}

/// Samples per size: the small-case count, fewer for large sizes so that each case moves at
/// most `budget` bytes, but never fewer than a floor.
int IterationsFor(const Context& ctx, uint64_t bytes) {
  int n = ctx.Iterations(200, 20);
  uint64_t budget = ctx.options.quick ? (48ull << 20) : (4ull << 30);
  int floor = ctx.options.quick ? 3 : 10;
  uint64_t by_budget = budget / bytes;
  return static_cast<int>(std::max<uint64_t>(floor, std::min<uint64_t>(n, by_budget)));
}

Samples DaemonCase(Session& s, const Case& c) {
  Tensor t = s.create_tensor<uint8_t>({static_cast<int64_t>(c.bytes)});
  HostBuffer buf(c.bytes);
  Check(s.synchronize(), "creating a " + FormatBytes(c.bytes) + " tensor");
  Samples out;
  int warmup = c.bytes >= (64ull << 20) ? 1 : 2;
  for (int i = 0; i < warmup + c.iterations; ++i) {
    auto t0 = Clock::now();
    Status st = c.dir == Direction::kUpload ? s.upload_bytes(t, buf.data(), c.bytes)
                                            : s.download_bytes(t, buf.data(), c.bytes);
    double ns = NsSince(t0);
    Check(st, c.label());
    if (i >= warmup) out.Add(ns);
  }
  s.free(std::move(t));
  Check(s.synchronize(), "freeing a tensor");
  return out;
}

/// What a pending case did besides its samples: into how many parts it was split.
struct PendingInfo {
  int parts = 1;
  uint64_t part_bytes = 0;
};

/// The pending route: PinnedBuffers allocated once, moved into each transfer and taken back
/// from wait(). Sizes above one slab go as slab-sized parts issued back to back.
Samples DaemonPendingCase(Session& s, const Case& c, PendingInfo* info) {
  uint64_t slab = s.slab_size();  // 0: remote, ordinary memory, no per-buffer limit
  uint64_t part = slab > 0 && c.bytes > slab ? slab : c.bytes;
  std::vector<PinnedBuffer> bufs;
  auto allocate = [&](uint64_t part_bytes) -> Status {
    bufs.clear();
    for (uint64_t done = 0; done < c.bytes; done += part_bytes) {
      uint64_t n = std::min(part_bytes, c.bytes - done);
      auto b = s.pinned_buffer(n);
      if (!b.ok()) return b.status();
      bufs.push_back(std::move(b).value());
    }
    return Status::Ok();
  };
  Status st = allocate(part);
  // A buffer of `part` bytes does not fit (a slab's bookkeeping, another buffer in it):
  // halve the parts until it does.
  while (!st.ok() && st.kind() == ErrorKind::kQuotaExceeded && part > (1ull << 20)) {
    part = (part / 2 + 255) & ~uint64_t{255};
    st = allocate(part);
  }
  Check(st, "pinned_buffer for " + c.label());
  for (auto& b : bufs) std::memset(b.data(), 0x5a, b.size());  // touch once, untimed
  std::vector<Tensor> tensors;
  for (auto& b : bufs) {
    tensors.push_back(s.create_tensor<uint8_t>({static_cast<int64_t>(b.size())}));
  }
  Check(s.synchronize(), "creating " + FormatBytes(c.bytes) + " of tensors");
  info->parts = static_cast<int>(bufs.size());
  info->part_bytes = part;

  Samples out;
  std::vector<PendingTransfer> pending(bufs.size());
  int warmup = c.bytes >= (64ull << 20) ? 1 : 2;
  for (int i = 0; i < warmup + c.iterations; ++i) {
    auto t0 = Clock::now();
    for (size_t k = 0; k < bufs.size(); ++k) {
      pending[k] = c.dir == Direction::kUpload
                       ? s.upload_pending(std::move(bufs[k]), std::move(tensors[k]))
                       : s.download_pending(std::move(tensors[k]), std::move(bufs[k]));
    }
    Status first;
    for (size_t k = 0; k < bufs.size(); ++k) {
      Transfer done = pending[k].wait();
      if (first.ok() && !done.status.ok()) first = done.status;
      bufs[k] = std::move(done.buffer);
      tensors[k] = std::move(done.tensor);
    }
    double ns = NsSince(t0);
    Check(first, c.label());
    if (i >= warmup) out.Add(ns);
  }
  for (auto& t : tensors) s.free(std::move(t));
  Check(s.synchronize(), "freeing tensors");
  return out;
}

/// The streamed route: `depth` pending transfers in flight, each buffer reissued as soon
/// as its transfer is waited for. One sample per round: round time / transfers in it.
Samples DaemonStreamedCase(Session& s, const Case& c, int depth) {
  std::vector<PinnedBuffer> bufs;
  std::vector<Tensor> tensors;
  for (int k = 0; k < depth; ++k) {
    bufs.push_back(Check(s.pinned_buffer(c.bytes), "pinned_buffer for " + c.label()));
    std::memset(bufs.back().data(), 0x5a, c.bytes);  // touch once, untimed
    tensors.push_back(s.create_tensor<uint8_t>({static_cast<int64_t>(c.bytes)}));
  }
  Check(s.synchronize(), "creating tensors for " + c.label());
  std::vector<PendingTransfer> pending(depth);
  auto issue = [&](int k) {
    pending[k] = c.dir == Direction::kUpload
                     ? s.upload_pending(std::move(bufs[k]), std::move(tensors[k]))
                     : s.download_pending(std::move(tensors[k]), std::move(bufs[k]));
  };
  auto reap = [&](int k) {
    Transfer done = pending[k].wait();
    Check(done.status, c.label());
    bufs[k] = std::move(done.buffer);
    tensors[k] = std::move(done.tensor);
  };
  const int per_round = StreamRound(c.bytes);
  Samples out;
  for (int round = 0; round < 1 + c.iterations; ++round) {  // the first warms up
    auto t0 = Clock::now();
    for (int i = 0; i < per_round; ++i) {
      int k = i % depth;
      if (i >= depth) reap(k);
      issue(k);
    }
    for (int i = per_round; i < per_round + depth; ++i) {
      if (i - depth >= 0) reap(i % depth);
    }
    double ns = NsSince(t0) / per_round;
    if (round > 0) out.Add(ns);
  }
  for (auto& t : tensors) s.free(std::move(t));
  Check(s.synchronize(), "freeing tensors");
  return out;
}

/// In-process counterpart of the streamed route: a round's copies enqueued back to back.
Samples BaselineStreamedCase(backend::Device& dev, backend::Stream& stream, const Case& c) {
  HostBuffer buf(c.bytes);
  Check(dev.RegisterHostMemory(buf.data(), c.bytes), "RegisterHostMemory");
  backend::DevicePtr d = Check(stream.Allocate(c.bytes), "Allocate");
  const int per_round = StreamRound(c.bytes);
  Samples out;
  for (int round = 0; round < 1 + c.iterations; ++round) {
    auto t0 = Clock::now();
    for (int i = 0; i < per_round; ++i) {
      Status st = c.dir == Direction::kUpload ? stream.CopyHostToDevice(d, buf.data(), c.bytes)
                                              : stream.CopyDeviceToHost(buf.data(), d, c.bytes);
      Check(st, "baseline " + c.label());
    }
    Check(WaitStream(stream), "baseline " + c.label());
    double ns = NsSince(t0) / per_round;
    if (round > 0) out.Add(ns);
  }
  stream.Free(d);
  Check(WaitStream(stream), "baseline free");
  Check(dev.UnregisterHostMemory(buf.data()), "UnregisterHostMemory");
  return out;
}

/// `registered`: the host buffer registered (pinned) first; else ordinary pageable memory.
Samples BaselineCase(backend::Device& dev, backend::Stream& stream, const Case& c,
                     bool registered = true) {
  HostBuffer buf(c.bytes);
  // Registered once, outside the timed loop: registration is never on the hot path.
  if (registered) Check(dev.RegisterHostMemory(buf.data(), c.bytes), "RegisterHostMemory");
  backend::DevicePtr d = Check(stream.Allocate(c.bytes), "Allocate");
  Samples out;
  int warmup = c.bytes >= (64ull << 20) ? 1 : 2;
  for (int i = 0; i < warmup + c.iterations; ++i) {
    auto t0 = Clock::now();
    Status st = c.dir == Direction::kUpload ? stream.CopyHostToDevice(d, buf.data(), c.bytes)
                                            : stream.CopyDeviceToHost(buf.data(), d, c.bytes);
    Check(st, "baseline " + c.label());
    Check(WaitStream(stream), "baseline " + c.label());
    double ns = NsSince(t0);
    if (i >= warmup) out.Add(ns);
  }
  stream.Free(d);
  Check(WaitStream(stream), "baseline free");
  if (registered) Check(dev.UnregisterHostMemory(buf.data()), "UnregisterHostMemory");
  return out;
}

/// The blocking upload compared with an in-process pageable copy: 256 MiB, or the largest
/// size of this run when it has no 256 MiB case.
const Case* PageableCase(const std::vector<Case>& cases) {
  const Case* best = nullptr;
  for (const Case& c : cases) {
    if (c.route != Route::kBlocking || c.dir != Direction::kUpload) continue;
    if (c.bytes == (256ull << 20)) return &c;
    if (!best || c.bytes > best->bytes) best = &c;
  }
  return best;
}

const uint64_t kFirstDownloadSizes[] = {4ull << 10, 1ull << 20, 64ull << 20};

/// A new tensor, downloaded before anything was written to it; timed from the create.
Samples DaemonFirstDownload(Session& s, uint64_t bytes, int iterations) {
  HostBuffer buf(bytes);
  Samples out;
  for (int i = 0; i < 1 + iterations; ++i) {  // the first warms up
    auto t0 = Clock::now();
    Tensor t = s.create_tensor<uint8_t>({static_cast<int64_t>(bytes)});
    Check(s.download_bytes(t, buf.data(), bytes), "create + first download");
    double ns = NsSince(t0);
    s.free(std::move(t));
    Check(s.synchronize(), "freeing a tensor");
    if (i > 0) out.Add(ns);
  }
  return out;
}

Samples BaselineFirstDownload(backend::Device& dev, backend::Stream& stream, uint64_t bytes,
                              int iterations) {
  HostBuffer buf(bytes);
  Check(dev.RegisterHostMemory(buf.data(), bytes), "RegisterHostMemory");
  Samples out;
  for (int i = 0; i < 1 + iterations; ++i) {
    auto t0 = Clock::now();
    backend::DevicePtr d = Check(stream.Allocate(bytes), "Allocate");
    Check(stream.CopyDeviceToHost(buf.data(), d, bytes), "baseline first download");
    Check(WaitStream(stream), "baseline first download");
    double ns = NsSince(t0);
    stream.Free(d);
    Check(WaitStream(stream), "baseline free");
    if (i > 0) out.Add(ns);
  }
  Check(dev.UnregisterHostMemory(buf.data()), "UnregisterHostMemory");
  return out;
}

Row FirstDownloadRow(uint64_t bytes, int iterations, const Samples* daemon, const Samples* base) {
  Summary d = daemon ? Summarize(*daemon) : Summary{};
  Summary b = base ? Summarize(*base) : Summary{};
  const double n = static_cast<double>(bytes);
  Row r{"create + first download " + FormatBytes(bytes),
        {{"p50 us", d.p50 / 1e3, b.p50 / 1e3},
         {"p99 us", d.p99 / 1e3, b.p99 / 1e3},
         {"GB/s", n / d.p50, n / b.p50}}};
  r.params = {{"bytes", n}, {"iterations", static_cast<double>(iterations)}};
  r.tags = {{"direction", "download"}, {"route", "create+first"}};
  if (daemon) r.summaries.push_back({"daemon", d});
  if (base) r.summaries.push_back({"baseline", b});
  return r;
}

/// `route_label`: the route as measured (RouteLabel), or "" for the plain route name.
Row MakeRow(const Case& c, const Samples* daemon, const Samples* base,
            const std::string& route_label = "") {
  Summary d = daemon ? Summarize(*daemon) : Summary{};
  Summary b = base ? Summarize(*base) : Summary{};
  double bytes = static_cast<double>(c.bytes);
  std::string route = route_label.empty() ? RouteName(c.route) : route_label;
  Row r{c.label(route),
        {{"p50 us", d.p50 / 1e3, b.p50 / 1e3},
         {"p99 us", d.p99 / 1e3, b.p99 / 1e3},
         {"GB/s", bytes / d.p50, bytes / b.p50}}};
  r.params = {{"bytes", bytes}, {"iterations", static_cast<double>(c.iterations)}};
  r.tags = {{"direction", DirName(c.dir)}, {"route", route}};
  if (daemon) r.summaries.push_back({"daemon", d});
  if (base) r.summaries.push_back({"baseline", b});
  return r;
}

/// Every upload and download case, route by route: each size of the run for the blocking and
/// pending routes, the sizes that stream for the streamed route.
std::vector<Case> TransferCases(const Context& ctx) {
  std::vector<Case> cases;
  for (Route route : kRoutes) {
    for (Direction dir : {Direction::kUpload, Direction::kDownload}) {
      for (uint64_t bytes : Sizes(ctx)) {
        if (route == Route::kStreamed) {
          if (Streams(bytes)) cases.push_back({route, dir, bytes, ctx.Iterations(10, 3)});
          continue;
        }
        cases.push_back({route, dir, bytes, IterationsFor(ctx, bytes)});
      }
    }
  }
  return cases;
}

/// What the transfers scenario measured: the in-process baseline (empty without --baseline)
/// and, per target, one Samples per case and per first-download size.
struct TransferMeasurements {
  std::vector<Case> cases;
  std::vector<int> first_iterations;  // per kFirstDownloadSizes entry
  // Baseline: one measurement per direction and size, shared by both routes' rows.
  // Key: direction, size, streamed.
  std::map<std::tuple<Direction, uint64_t, bool>, Samples> base;
  std::vector<Samples> base_first;      // per kFirstDownloadSizes entry
  const Case* pageable_case = nullptr;  // the blocking upload compared with a pageable copy
  Samples base_pageable;
  std::vector<std::vector<Samples>> daemon;        // [target][case]
  std::vector<std::vector<Samples>> daemon_first;  // [target][first-download size]
  // Split pending transfers, per target: "256 MiB as 4 x 64 MiB".
  std::vector<std::vector<std::string>> splits;
  std::vector<uint64_t> slab_sizes;  // per target; 0 when remote

  static std::tuple<Direction, uint64_t, bool> BaseKey(const Case& c) {
    return std::make_tuple(c.dir, c.bytes, c.route == Route::kStreamed);
  }
  /// The baseline samples of `c`'s direction and size, or null without a baseline.
  const Samples* BaseOf(const Case& c) const {
    auto it = base.find(BaseKey(c));
    return it == base.end() ? nullptr : &it->second;
  }
};

/// Measure the in-process baseline, one stream on the device per kind of measurement: every
/// case's direction and size, the first downloads, and the pageable upload. Needs
/// ctx.baseline.
void MeasureTransferBaseline(Context& ctx, TransferMeasurements& m) {
  {
    auto stream = Check(ctx.baseline->device->CreateStream(), "baseline CreateStream");
    for (const Case& c : m.cases) {
      if (m.base.count(m.BaseKey(c))) continue;
      ctx.progress->Case("baseline " + std::string(DirName(c.dir)) + " " +
                         (c.route == Route::kStreamed ? "streamed " : "") + FormatBytes(c.bytes));
      m.base[m.BaseKey(c)] = c.route == Route::kStreamed
                                 ? BaselineStreamedCase(*ctx.baseline->device, *stream, c)
                                 : BaselineCase(*ctx.baseline->device, *stream, c);
    }
  }
  {
    auto stream = Check(ctx.baseline->device->CreateStream(), "baseline CreateStream");
    for (size_t i = 0; i < std::size(kFirstDownloadSizes); ++i) {
      ctx.progress->Case("baseline create + first download " + FormatBytes(kFirstDownloadSizes[i]));
      m.base_first[i] = BaselineFirstDownload(*ctx.baseline->device, *stream,
                                              kFirstDownloadSizes[i], m.first_iterations[i]);
    }
  }
  if (m.pageable_case) {
    auto stream = Check(ctx.baseline->device->CreateStream(), "baseline CreateStream");
    ctx.progress->Case("baseline pageable upload " + FormatBytes(m.pageable_case->bytes));
    m.base_pageable = BaselineCase(*ctx.baseline->device, *stream, *m.pageable_case, false);
  }
}

/// Measure every case and first download on target `t`, one session for all of them.
void MeasureTransferTarget(Context& ctx, size_t t, TransferMeasurements& m) {
  const std::string& target = ctx.targets[t].target;
  auto client = Check(Connect(target), "connect " + target);
  auto session = Check(client.open_session(), "open_session");
  m.slab_sizes[t] = session.slab_size();
  for (const Case& c : m.cases) {
    ctx.progress->Case(target + " " + c.label(RouteLabel(c.route, target)));
    if (c.route == Route::kStreamed) {
      m.daemon[t].push_back(DaemonStreamedCase(session, c, ctx.options.stream_depth));
    } else if (c.route == Route::kPending) {
      PendingInfo info;
      m.daemon[t].push_back(DaemonPendingCase(session, c, &info));
      std::string split = FormatBytes(c.bytes) + " as " + std::to_string(info.parts) + " x " +
                          FormatBytes(info.part_bytes);
      if (info.parts > 1 && c.dir == Direction::kUpload) m.splits[t].push_back(split);
    } else {
      m.daemon[t].push_back(DaemonCase(session, c));
    }
  }
  for (size_t i = 0; i < std::size(kFirstDownloadSizes); ++i) {
    ctx.progress->Case(target + " create + first download " + FormatBytes(kFirstDownloadSizes[i]));
    m.daemon_first[t].push_back(
        DaemonFirstDownload(session, kFirstDownloadSizes[i], m.first_iterations[i]));
  }
  Check(session.close().status(), "close");
}

/// The note on target `which`'s slab size and how pending transfers were split to fit it
/// (or that a remote target has none); empty for a local target without a slab.
std::optional<std::string> SlabNote(const Context& ctx, const TransferMeasurements& m, int which) {
  if (m.slab_sizes[which] > 0) {
    std::string s = "slab size " + FormatBytes(m.slab_sizes[which]) + "; ";
    if (m.splits[which].empty()) {
      s += "every pending transfer fit one pinned buffer";
    } else {
      s += "pending transfers above it go as slab-sized parts issued back to back and "
           "waited together (the time covers all parts):";
      for (const auto& x : m.splits[which]) s += " " + x + ";";
      s.pop_back();
    }
    return s;
  }
  if (IsRemote(ctx.targets[which].target)) {
    return "remote target: no slabs; pending buffers are ordinary memory";
  }
  return std::nullopt;
}

/// The notes under the transfers table of `which` (a target, kAllTargets or kNoTarget).
std::vector<std::string> TransferNotes(const Context& ctx, const TransferMeasurements& m,
                                       int which) {
  std::string target = which >= 0 ? ctx.targets[which].target : "";
  std::vector<std::string> n = {
      "time = call until the bytes are there, one transfer at a time (streamed: see below); "
      "GB/s = bytes / p50 time (1 GB = 1e9 B)",
      "pending = upload_pending/download_pending with PinnedBuffers allocated once per size "
      "and moved through every transfer (buffer and tensor taken back from wait()); "
      "through a shared-memory slab on a unix target, bytes inline on a tcp target "
      "(pending-inline)",
      "streamed = the pending route kept " + std::to_string(ctx.options.stream_depth) +
          " transfers deep (the oldest waited for, its buffer reissued); time = round time "
          "/ transfers; baseline: the same copies enqueued back to back on one stream, one "
          "wait",
      "blocking = Session::upload_bytes/download_bytes from ordinary host memory",
      "baseline = registered (pinned) host buffer, backend copy + OnComplete, waited on; the "
      "same baseline samples for both routes",
      "'vs in-process pageable' row: the blocking upload against an in-process copy from "
      "ordinary, unregistered (pageable) memory, waited on",
      "create + first download = a new tensor downloaded before anything was written to it, "
      "timed from the create: new tensors are zeroed, so against 'download "
      "blocking' of the same size this is the cost of creating and zeroing; baseline: "
      "Stream::Allocate (zeroing too) + copy + wait"};
  if (which >= 0) {
    if (auto slab = SlabNote(ctx, m, which)) n.push_back(std::move(*slab));
  }
  const TransportFigures& tf = ctx.TransportFor(target);
  bool has_bulk_size = std::any_of(m.cases.begin(), m.cases.end(),
                                   [&](const Case& c) { return c.bytes == tf.bulk_bytes; });
  if (tf.measured && !target.empty() && has_bulk_size) {
    n.push_back(
        "'vs gRPC' rows: the same 8 MiB transfer against a bare gRPC 8 MiB message "
        "(transports table), same socket kind");
  }
  if (which == kAllTargets) n.push_back("all targets: the samples of every target pooled");
  return n;
}

/// Append the rows comparing target's 8 MiB transfers `d` (one Samples per case) with bare
/// gRPC bulk messages of the same size; none when the transports were not measured.
void AppendGrpcRows(const Context& ctx, const TransferMeasurements& m, const std::string& target,
                    const std::vector<Samples>& d, std::vector<Row>* rows) {
  const TransportFigures& tf = ctx.TransportFor(target);
  if (!tf.measured) return;
  for (size_t i = 0; i < m.cases.size(); ++i) {
    if (m.cases[i].bytes != tf.bulk_bytes) continue;
    const Samples& g = m.cases[i].dir == Direction::kUpload ? tf.grpc_bulk_up : tf.grpc_bulk_down;
    Row r = MakeRow(m.cases[i], &d[i], &g, RouteLabel(m.cases[i].route, target));
    r.label += " vs gRPC";
    r.tags.push_back({"baseline", "grpc_bulk"});
    r.summaries.back().first = "grpc_bulk";
    rows->push_back(std::move(r));
  }
}

/// One row per case for the transfers table of `which` (a target, kAllTargets or
/// kNoTarget, where only the baseline shows, once per kind).
std::vector<Row> TransferCaseRows(const Context& ctx, const TransferMeasurements& m, int which) {
  std::vector<Row> rows;
  for (size_t i = 0; i < m.cases.size(); ++i) {
    const Case& c = m.cases[i];
    const Samples* b = m.BaseOf(c);
    if (which >= 0) {
      rows.push_back(
          MakeRow(c, &m.daemon[which][i], b, RouteLabel(c.route, ctx.targets[which].target)));
    } else if (which == kAllTargets) {
      Samples pooled = PooledSamples(m.daemon, kAllTargets, i);
      rows.push_back(MakeRow(c, &pooled, b));
    } else if (c.route != Route::kPending) {  // baseline only: once per kind
      Row r = MakeRow(c, nullptr, b);
      r.label = std::string(DirName(c.dir)) + " " +
                (c.route == Route::kStreamed ? "streamed " : "") + FormatBytes(c.bytes);
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

/// Every row of the transfers table of `which` (a target, kAllTargets or kNoTarget).
std::vector<Row> TransferRows(const Context& ctx, const TransferMeasurements& m, int which) {
  std::vector<Row> rows = TransferCaseRows(ctx, m, which);
  if (which >= 0) AppendGrpcRows(ctx, m, ctx.targets[which].target, m.daemon[which], &rows);
  // The blocking upload against the in-process pageable copy.
  if (ctx.baseline && m.pageable_case && which != kNoTarget) {
    size_t i = static_cast<size_t>(m.pageable_case - m.cases.data());
    Samples pooled = PooledSamples(m.daemon, which, i);
    Row r = MakeRow(*m.pageable_case, &pooled, &m.base_pageable);
    r.label += " vs in-process pageable";
    r.tags.push_back({"baseline", "pageable"});
    r.summaries.back().first = "pageable";
    rows.push_back(std::move(r));
  }
  for (size_t i = 0; i < std::size(kFirstDownloadSizes); ++i) {
    const Samples* b = ctx.baseline ? &m.base_first[i] : nullptr;
    Samples pooled = PooledSamples(m.daemon_first, which, i);
    rows.push_back(FirstDownloadRow(kFirstDownloadSizes[i], m.first_iterations[i],
                                    which == kNoTarget ? nullptr : &pooled, b));
  }
  return rows;
}

}  // namespace

std::vector<Table> RunTransfers(Context& ctx) {
  TransferMeasurements m;
  m.cases = TransferCases(ctx);
  for (uint64_t bytes : kFirstDownloadSizes)
    m.first_iterations.push_back(IterationsFor(ctx, bytes));
  m.base_first.resize(std::size(kFirstDownloadSizes));
  m.pageable_case = PageableCase(m.cases);
  // Baseline first, then each target in turn.
  if (ctx.baseline) MeasureTransferBaseline(ctx, m);
  m.daemon.resize(ctx.targets.size());
  m.daemon_first.resize(ctx.targets.size());
  m.splits.resize(ctx.targets.size());
  m.slab_sizes.assign(ctx.targets.size(), 0);
  for (size_t t = 0; t < ctx.targets.size(); ++t) MeasureTransferTarget(ctx, t, m);
  return BuildTables(
      ctx, "transfers", [&](int which) { return TransferRows(ctx, m, which); },
      [&](int which) { return TransferNotes(ctx, m, which); });
}

}  // namespace ferry::bench
