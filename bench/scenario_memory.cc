// Scenario "memory": what ferryd's resident memory is with 64 sessions open, its pinned
// shared-memory pool excluded.
//
// For each target whose process id is known — a daemon started with --spawn-daemon, or a
// unix:PATH target (the id comes from SO_PEERCRED on a connection to the socket) — read
// VmRSS (and RssShmem) from /proc/PID/status with no session of ours open, then open 64
// sessions from one Client, each holding one small tensor (256 f32, filled, synchronized),
// and read them again, with the Admin Status reply's slab_bytes (every slab of the pool,
// free or held). "Pools excluded" = VmRSS - slab_bytes. A target whose process id is unknown
// (tcp:HOST:PORT not spawned here) or whose /proc entry cannot be read is skipped, and the
// table says why.
//
// It runs first of all scenarios (AllScenarios): memory the daemon freed after other work
// of this run (on the host backend, "device" memory is the daemon's own heap) would stay in
// its RSS and hide what 64 sessions cost.
//
// There is no in-process equivalent; the "target" column is ferry's bound on the daemon's
// memory (64 MiB with 64 sessions, pools excluded), and the ratio is figure / target.
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench.h"
#include "ferry/v1/admin.grpc.pb.h"

namespace ferry::bench {
namespace {

constexpr int kSessions = 64;
constexpr double kTargetMiB = 64;
constexpr double kMiB = 1024.0 * 1024.0;

/// The pid of the process listening on a unix socket, by SO_PEERCRED; -1 when unknown.
int PeerPid(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    close(fd);
    return -1;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  int pid = -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) pid = cred.pid;
  }
  close(fd);
  return pid;
}

/// A field of /proc/PID/status in bytes ("VmRSS", "RssShmem"); -1 when unreadable.
double ProcStatusBytes(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(field.size() + 1));
    double kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024.0;
  }
  return -1;
}

bool AdminStatus(const std::string& target, v1::StatusReply* reply) {
  std::string grpc_target = target.rfind("tcp:", 0) == 0 ? target.substr(4) : target;
  auto stub =
      v1::Admin::NewStub(grpc::CreateChannel(grpc_target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub->Status(&ctx, v1::StatusRequest(), reply).ok();
}

struct MemoryRun {
  bool measured = false;
  std::string why_not;
  int pid = -1;
  double idle_rss = kNaN, rss = kNaN, shmem = kNaN, slab_bytes = kNaN, idle_slab_bytes = kNaN;
  uint32_t sessions_open = 0;
  double excluded() const { return rss - slab_bytes; }
  double idle_excluded() const { return idle_rss - idle_slab_bytes; }
};

MemoryRun MeasureTarget(const TargetInfo& target) {
  MemoryRun m;
  m.pid = target.pid;
  if (m.pid <= 0 && target.target.rfind("unix:", 0) == 0) m.pid = PeerPid(target.target.substr(5));
  if (m.pid <= 0) {
    m.why_not = "process id of " + target.target +
                " unknown (not spawned by ferry-bench, not a unix socket)";
    return m;
  }
  v1::StatusReply st;
  m.idle_rss = ProcStatusBytes(m.pid, "VmRSS");
  if (m.idle_rss < 0) {
    m.why_not = "cannot read /proc/" + std::to_string(m.pid) + "/status";
    return m;
  }
  if (!AdminStatus(target.target, &st)) {
    m.why_not = "Admin Status of " + target.target + " failed";
    return m;
  }
  m.idle_slab_bytes = static_cast<double>(st.slab_bytes());
  {
    auto client = Check(Connect(target.target), "connect");
    std::vector<Session> sessions;
    std::vector<Tensor> tensors;
    for (int i = 0; i < kSessions; ++i) {
      sessions.push_back(Check(client.open_session(), "open_session " + std::to_string(i)));
      tensors.push_back(sessions.back().create_tensor<float>({256}));
      sessions.back().fill(tensors.back(), 1.0);
      Check(sessions.back().synchronize(), "memory: session setup");
    }
    m.rss = ProcStatusBytes(m.pid, "VmRSS");
    m.shmem = ProcStatusBytes(m.pid, "RssShmem");
    if (!AdminStatus(target.target, &st)) Die("memory: Admin Status of " + target.target);
    m.slab_bytes = static_cast<double>(st.slab_bytes());
    m.sessions_open = st.sessions_open();
    for (size_t i = 0; i < sessions.size(); ++i) {
      sessions[i].free(std::move(tensors[i]));
      Check(sessions[i].close().status(), "close");
    }
  }
  m.measured = m.rss >= 0;
  if (!m.measured) m.why_not = "cannot read /proc/" + std::to_string(m.pid) + "/status";
  return m;
}

}  // namespace

std::vector<Table> RunMemory(Context& ctx) {
  if (ctx.targets.empty()) {
    std::cerr << "ferry-bench: memory: no daemon target, nothing to measure (no in-process "
                 "equivalent)\n";
    return {};
  }
  std::vector<MemoryRun> runs;
  for (const TargetInfo& t : ctx.targets) {
    ctx.progress->Case(t.target + " " + std::to_string(kSessions) + " sessions");
    runs.push_back(MeasureTarget(t));
    if (!runs.back().measured) {
      std::cerr << "ferry-bench: memory: skipping " << t.target << ": " << runs.back().why_not
                << "\n";
    }
  }
  auto tables = BuildTables(
      ctx, "memory",
      [&](int which) {
        std::vector<Row> rows;
        if (which == kNoTarget) return rows;
        // One target's figures, or the largest of every target's.
        MemoryRun m;
        for (size_t i = 0; i < runs.size(); ++i) {
          if ((which >= 0 && static_cast<int>(i) != which) || !runs[i].measured) continue;
          auto mx = [](double a, double b) { return std::isnan(a) ? b : std::max(a, b); };
          m.measured = true;
          m.idle_rss = mx(m.idle_rss, runs[i].idle_rss);
          m.rss = mx(m.rss, runs[i].rss);
          m.shmem = mx(m.shmem, runs[i].shmem);
          m.slab_bytes = mx(m.slab_bytes, runs[i].slab_bytes);
          m.idle_slab_bytes = mx(m.idle_slab_bytes, runs[i].idle_slab_bytes);
        }
        if (!m.measured) return rows;
        std::string n = std::to_string(kSessions) + " sessions";
        rows.push_back(Row{"VmRSS, no bench session", {{"MiB", m.idle_rss / kMiB, kNaN}}});
        rows.push_back(Row{"VmRSS, " + n, {{"MiB", m.rss / kMiB, kNaN}}});
        rows.push_back(Row{"  of which RssShmem", {{"MiB", m.shmem / kMiB, kNaN}}});
        rows.push_back(Row{"slab pool (Admin slab_bytes)", {{"MiB", m.slab_bytes / kMiB, kNaN}}});
        rows.push_back(
            Row{"no bench session, pools excluded", {{"MiB", m.idle_excluded() / kMiB, kNaN}}});
        Row r{n + ", pools excluded", {{"MiB", m.excluded() / kMiB, kTargetMiB}}};
        r.tags = {{"target", "rss_pools_excluded"}};
        rows.push_back(std::move(r));
        rows.push_back(Row{"per session ((" + n + " - none) / " + std::to_string(kSessions) + ")",
                           {{"MiB", (m.excluded() - m.idle_excluded()) / kSessions / kMiB, kNaN}}});
        return rows;
      },
      [&](int which) {
        std::vector<std::string> notes;
        if (which == kNoTarget) {
          notes.push_back(
              "no daemon target: nothing to measure (there is no in-process "
              "equivalent)");
          return notes;
        }
        notes.push_back("ferryd's /proc/PID/status with " + std::to_string(kSessions) +
                        " sessions open (one Client), each holding a 256 f32 tensor; pools "
                        "excluded = VmRSS - Admin slab_bytes (every slab, free or held)");
        notes.push_back("target column: the bound, <= 64 MiB; ratio = figure / target");
        notes.push_back(
            "VmRSS includes what the daemon served before (other clients, earlier "
            "scenarios when not run first; host backend: device memory is heap)");
        for (size_t i = 0; i < runs.size(); ++i) {
          if (which >= 0 && static_cast<int>(i) != which) continue;
          if (runs[i].measured) {
            if (which >= 0) notes.push_back("pid " + std::to_string(runs[i].pid));
          } else {
            notes.push_back("skipped " + ctx.targets[i].target + ": " + runs[i].why_not);
          }
        }
        if (which == kAllTargets) notes.push_back("all targets: the largest of each figure");
        return notes;
      });
  for (Table& t : tables) {
    t.baseline_label = "target";
    t.baseline_description = "none in process; 'target' = the bound, <= 64 MiB";
  }
  return tables;
}

}  // namespace ferry::bench
