// Small helpers shared by the scenarios: statistics, progress lines, buffers, waiting.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>

#include "bench.h"
#include "process.h"

namespace ferry::bench {

const std::vector<std::string>& AllScenarios() {
  // memory first: it measures the daemon before this run's other work has grown its heap.
  static const std::vector<std::string> kAll = {"memory",     "transfers", "latency",
                                                "throughput", "overlap",   "concurrency",
                                                "open_close", "sharing",   "fault"};
  return kAll;
}

Summary Summarize(const Samples& samples) {
  Summary s;
  if (samples.ns.empty()) return s;
  std::vector<double> v = samples.ns;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  // Nearest rank: the smallest sample with at least q of all samples at or below it.
  auto rank = [&](double q) {
    size_t r = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::clamp<size_t>(r, 1, v.size()) - 1];
  };
  s.min = v.front();
  s.max = v.back();
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  s.p999 = rank(0.999);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

void Progress::Scenario(const std::string& name) {
  if (!initialized_) {
    tty_ = isatty(STDERR_FILENO) != 0;
    initialized_ = true;
  }
  scenario_ = name;
  scenario_start_ = Clock::now();
  std::fprintf(stderr, "[%s] starting\n", name.c_str());
}

void Progress::Case(const std::string& what) {
  double s = NsSince(scenario_start_) / 1e9;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K[%s %5.1fs] %s", scenario_.c_str(), s, what.c_str());
  } else {
    std::fprintf(stderr, "[%s %5.1fs] %s\n", scenario_.c_str(), s, what.c_str());
  }
  std::fflush(stderr);
}

void Progress::Done() {
  double s = NsSince(scenario_start_) / 1e9;
  if (tty_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "[%s] done in %.1f s\n", scenario_.c_str(), s);
}

std::vector<Table> BuildTables(const Context& ctx, const std::string& scenario,
                               const std::function<std::vector<Row>(int which)>& rows,
                               const std::function<std::vector<std::string>(int which)>& notes) {
  std::vector<Table> tables;
  auto make = [&](int which, std::string target) {
    Table t;
    t.scenario = scenario;
    t.target = std::move(target);
    t.rows = rows(which);
    t.notes = notes(which);
    tables.push_back(std::move(t));
  };
  for (size_t i = 0; i < ctx.targets.size(); ++i) {
    make(static_cast<int>(i), ctx.targets[i].target);
  }
  if (ctx.targets.size() > 1) make(kAllTargets, "all targets");
  if (ctx.targets.empty() && ctx.baseline) make(kNoTarget, "");
  return tables;
}

std::optional<double> MpsFigure(const Context& ctx, double v) {
  if (!ctx.mps) return std::nullopt;
  return ctx.mps->available() ? v : kNaN;
}

std::string MpsNote(const Context& ctx, const std::string& what) {
  if (!ctx.mps) return "";
  if (!ctx.mps->available()) return "MPS: n/a: " + ctx.mps->why_not;
  return "MPS = " + what + " as clients of a private MPS control daemon (" + ctx.mps->control +
         " -d, its own pipe and log directories; ferryd and this process are not its clients)";
}

std::vector<std::string> RunMpsWorkers(const Context& ctx, int n,
                                       const std::vector<std::string>& args) {
  std::vector<WorkerOutput> runs =
      RunWorkers(ctx.self_exe, n, args, ctx.mps->daemon->env(), std::chrono::seconds(600));
  std::vector<std::string> out;
  for (const WorkerOutput& w : runs) {
    if (!w.ok()) Die("an MPS worker failed (status " + std::to_string(w.status) + ")");
    out.push_back(w.out);
  }
  return out;
}

Status WaitStream(backend::Stream& stream) {
  // The daemon learns of completion the same way: OnComplete on the backend's completion
  // thread, then a hand-off to another thread. Here the hand-off is a promise.
  std::promise<Status> done;
  auto f = done.get_future();
  stream.OnComplete([&done](Status s) { done.set_value(std::move(s)); });
  return f.get();
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + " " + units[u];
}

std::optional<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str()) return std::nullopt;
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    mult = 1ull << 10;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    mult = 1ull << 20;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    mult = 1ull << 30;
  } else {
    return std::nullopt;
  }
  uint64_t out = 0;
  if (!CheckedMul(n, mult, &out) || out == 0) return std::nullopt;
  return out;
}

HostBuffer::HostBuffer(uint64_t bytes) : size_(bytes) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t rounded = (std::max<uint64_t>(bytes, 1) + page - 1) / page * page;
  data_ = static_cast<uint8_t*>(std::aligned_alloc(page, rounded));
  if (!data_) Die("out of host memory for a " + FormatBytes(bytes) + " buffer");
  // Touch every page now so page faults are not measured as transfer time.
  std::memset(data_, 0x5a, rounded);
}

HostBuffer::~HostBuffer() { std::free(data_); }

Result<Client> Connect(const std::string& target) {
  ClientOptions options;
  if (const char* us = std::getenv(kWaitSpinEnv)) {
    options.wait_spin = std::chrono::microseconds(std::strtoull(us, nullptr, 10));
  }
  return Client::connect(target, options);
}

void Die(const std::string& what) {
  std::cerr << "\nferry-bench: " << what << std::endl;
  std::exit(2);
}

RoundTensors CreateRoundTensors(Session& s, uint64_t bytes, int64_t axpy_elements) {
  RoundTensors r;
  r.t = s.create_tensor<uint8_t>({static_cast<int64_t>(bytes)});
  r.x = s.create_tensor<float>({axpy_elements});
  r.y = s.create_tensor<float>({axpy_elements});
  s.fill(r.x, 1.0);
  s.fill(r.y, 0.0);
  return r;
}

void PendingRoundTrip(Session& s, bool upload, PinnedBuffer& pinned, Tensor& t) {
  PendingTransfer p = upload ? s.upload_pending(std::move(pinned), std::move(t))
                             : s.download_pending(std::move(t), std::move(pinned));
  Transfer done = p.wait();
  Check(done.status, upload ? "upload_pending" : "download_pending");
  pinned = std::move(done.buffer);
  t = std::move(done.tensor);
}

Samples PooledSamples(const std::vector<std::vector<Samples>>& per_target, int which, size_t i) {
  Samples pooled;
  for (size_t t = 0; t < per_target.size(); ++t) {
    if (which == kAllTargets || which == static_cast<int>(t)) pooled.Append(per_target[t][i]);
  }
  return pooled;
}

}  // namespace ferry::bench
