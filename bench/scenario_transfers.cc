// Scenario "transfers": move N bytes host -> device (upload) and device -> host (download),
// one transfer at a time, and time each from the call until the bytes are there.
//
// Daemon side, per route:
//   blocking  Session::upload_bytes / download_bytes: the bytes ride inline in the session
//             stream (in Upload ops / DownloadChunk messages); the call returns once the
//             daemon reports the transfer complete. This is also the only route a remote
//             (TCP) client has.
//   pending   (not yet measurable) upload_pending / download_pending through a PinnedBuffer
//             in shared memory. When the client API has them, add Route::kPending below: fill
//             one PinnedBuffer (reused across iterations, as the contract intends), time
//             upload_pending(std::move(buffer), std::move(tensor)).wait(), take the buffer
//             and tensor back from wait(), and the same for download_pending.
// Baseline: in process, a host buffer registered once with Device::RegisterHostMemory
// (cudaHostRegister on CUDA: pinned), then Stream::CopyHostToDevice / CopyDeviceToHost and
// OnComplete, waited on — what a program owning the GPU itself does at best.
//
// Figures: p50 and p99 of the per-transfer time (us), and bandwidth = bytes / p50 time
// (GB/s, 1 GB = 1e9 B).
#include <algorithm>

#include "bench.h"

namespace ferry::bench {
namespace {

enum class Route { kBlocking };
const char* RouteName(Route r) {
  switch (r) {
    case Route::kBlocking: return "blocking";
  }
  return "?";
}
const Route kRoutes[] = {Route::kBlocking};

enum class Direction { kUpload, kDownload };
const char* DirName(Direction d) { return d == Direction::kUpload ? "upload" : "download"; }

struct Case {
  Route route;
  Direction dir;
  uint64_t bytes;
  int iterations;
  std::string label() const {
    return std::string(DirName(dir)) + " " + RouteName(route) + " " + FormatBytes(bytes);
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

Samples BaselineCase(backend::Device& dev, backend::Stream& stream, const Case& c) {
  HostBuffer buf(c.bytes);
  // Registered once, outside the timed loop: registration is never on the hot path.
  Check(dev.RegisterHostMemory(buf.data(), c.bytes), "RegisterHostMemory");
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
  Check(dev.UnregisterHostMemory(buf.data()), "UnregisterHostMemory");
  return out;
}

Row MakeRow(const Case& c, const Samples* daemon, const Samples* base) {
  Summary d = daemon ? Summarize(*daemon) : Summary{};
  Summary b = base ? Summarize(*base) : Summary{};
  double bytes = static_cast<double>(c.bytes);
  Row r{c.label(),
        {{"p50 us", d.p50 / 1e3, b.p50 / 1e3},
         {"p99 us", d.p99 / 1e3, b.p99 / 1e3},
         {"GB/s", bytes / d.p50, bytes / b.p50}}};
  r.params = {{"bytes", bytes}, {"iterations", static_cast<double>(c.iterations)}};
  r.tags = {{"direction", DirName(c.dir)}, {"route", RouteName(c.route)}};
  if (daemon) r.summaries.push_back({"daemon", d});
  if (base) r.summaries.push_back({"baseline", b});
  return r;
}

}  // namespace

std::vector<Table> RunTransfers(Context& ctx) {
  std::vector<Case> cases;
  for (Route route : kRoutes) {
    for (Direction dir : {Direction::kUpload, Direction::kDownload}) {
      for (uint64_t bytes : Sizes(ctx)) cases.push_back({route, dir, bytes, IterationsFor(ctx, bytes)});
    }
  }

  // Baseline first: one stream on the in-process device.
  std::vector<Samples> base(cases.size());
  if (ctx.baseline) {
    auto stream = Check(ctx.baseline->device->CreateStream(), "baseline CreateStream");
    for (size_t i = 0; i < cases.size(); ++i) {
      ctx.progress->Case("baseline " + cases[i].label());
      base[i] = BaselineCase(*ctx.baseline->device, *stream, cases[i]);
    }
  }

  // Each target in turn, one session for all its cases.
  std::vector<std::vector<Samples>> daemon(ctx.targets.size());
  for (size_t t = 0; t < ctx.targets.size(); ++t) {
    auto client = Check(Client::connect(ctx.targets[t].target), "connect " + ctx.targets[t].target);
    auto session = Check(client.open_session(), "open_session");
    for (const Case& c : cases) {
      ctx.progress->Case(ctx.targets[t].target + " " + c.label());
      daemon[t].push_back(DaemonCase(session, c));
    }
    Check(session.close().status(), "close");
  }

  auto notes = [&](const std::string& target) {
    std::vector<std::string> n = {
        "time = call until the bytes are there, one transfer at a time; GB/s = bytes / p50 "
        "time (1 GB = 1e9 B)",
        "blocking = Session::upload_bytes/download_bytes, bytes inline in the gRPC stream; "
        "baseline = registered (pinned) host buffer, backend copy + OnComplete",
        "pending route (shared-memory PinnedBuffer) not measured: the client API has no "
        "upload_pending/download_pending yet"};
    const TransportFigures& tf = ctx.TransportFor(target);
    if (tf.measured && !target.empty()) {
      n.push_back("'vs gRPC' rows: the same 8 MiB transfer against a bare gRPC 8 MiB message "
                  "(transports table), same socket kind");
    }
    return n;
  };
  // Rows comparing 8 MiB blocking transfers with bare gRPC bulk messages of the same size.
  auto grpc_rows = [&](const std::string& target, const std::vector<Samples>& d,
                       std::vector<Row>* rows) {
    const TransportFigures& tf = ctx.TransportFor(target);
    if (!tf.measured) return;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].bytes != tf.bulk_bytes || cases[i].route != Route::kBlocking) continue;
      const Samples& g = cases[i].dir == Direction::kUpload ? tf.grpc_bulk_up : tf.grpc_bulk_down;
      Row r = MakeRow(cases[i], &d[i], &g);
      r.label += " vs gRPC";
      r.tags.push_back({"baseline", "grpc_bulk"});
      r.summaries.back().first = "grpc_bulk";
      rows->push_back(std::move(r));
    }
  };

  const Samples* no_samples = nullptr;
  return BuildTables(
      ctx, "transfers",
      [&](int which) {
        std::vector<Row> rows;
        for (size_t i = 0; i < cases.size(); ++i) {
          const Samples* b = ctx.baseline ? &base[i] : no_samples;
          if (which >= 0) {
            rows.push_back(MakeRow(cases[i], &daemon[which][i], b));
          } else if (which == kAllTargets) {
            Samples pooled;  // every target's samples of this case
            for (auto& d : daemon) pooled.Append(d[i]);
            rows.push_back(MakeRow(cases[i], &pooled, b));
          } else {
            rows.push_back(MakeRow(cases[i], nullptr, b));
          }
        }
        if (which >= 0) grpc_rows(ctx.targets[which].target, daemon[which], &rows);
        return rows;
      },
      [&](int which) {
        auto n = notes(which >= 0 ? ctx.targets[which].target : "");
        if (which == kAllTargets) n.push_back("all targets: the samples of every target pooled");
        return n;
      });
}

}  // namespace ferry::bench
