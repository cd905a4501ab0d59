// ferryctl top: who uses the GPU, live. A refreshing terminal view in the style of
// nvidia-smi and htop: one row per uid and one per open session, with device time, the share
// of the last interval the device spent on them, device memory and transfer rates, sorted by
// device time (keys: t), memory (m) or transfer rate (r); q quits. --once prints one view
// (two samples --interval apart, so rates are filled in) as a table or, with --json, as JSON.
//
// The data is the Admin service's ListSessions (sessions and usage identities); the daemon
// shows a caller that is not an admin only its own uid's.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "ferry/v1/admin.pb.h"
#include "output.h"

namespace ferry::ctl {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

/// One row of the view: a session or a uid, with counters and the rates between samples.
struct Row {
  std::string key;  // session id or uid, to match rows of two samples
  std::string uid = "-", client = "-", pid = "-", age = "-";
  uint64_t session_id = 0;
  uint64_t sessions = 0;
  uint64_t busy_ns = 0, device_bytes = 0, h2d_bytes = 0, d2h_bytes = 0;
  // Over the last interval (0 on the first sample): device time per second, bytes per second.
  double busy_fraction = 0, h2d_rate = 0, d2h_rate = 0;
};

enum class SortKey { kTime, kMemory, kRate };

const char* SortName(SortKey k) {
  switch (k) {
    case SortKey::kMemory:
      return "memory";
    case SortKey::kRate:
      return "transfer rate";
    default:
      return "device time";
  }
}

struct Sample {
  Clock::time_point at;
  std::vector<Row> sessions;
  std::vector<Row> uids;
};

Sample Collect(const v1::ListSessionsReply& reply) {
  Sample s;
  s.at = Clock::now();
  for (const v1::SessionInfo& i : reply.sessions()) {
    Row r;
    r.session_id = i.session_id();
    r.key = std::to_string(i.session_id());
    if (i.has_uid()) r.uid = std::to_string(i.uid());
    if (!i.has_uid()) r.uid = i.identity().empty() ? "remote" : i.identity();
    r.client = i.client_name().empty() ? "-" : i.client_name();
    if (i.has_pid()) r.pid = std::to_string(i.pid());
    r.age = HumanDuration(i.age_ms());
    r.sessions = 1;
    r.busy_ns = i.stats().device_busy_ns();
    r.device_bytes = i.device_bytes();
    r.h2d_bytes = i.stats().h2d_bytes();
    r.d2h_bytes = i.stats().d2h_bytes();
    s.sessions.push_back(std::move(r));
  }
  // A uid's totals: its identities (one per client name), closed sessions included.
  std::map<std::string, Row> by_uid;
  for (const v1::IdentityUsage& u : reply.identities()) {
    Row& r = by_uid[u.uid()];
    r.key = r.uid = u.uid();
    r.sessions += u.sessions_open();
    r.busy_ns += u.device_busy_ns();
    r.device_bytes += u.device_bytes();
    r.h2d_bytes += u.h2d_bytes();
    r.d2h_bytes += u.d2h_bytes();
  }
  for (auto& [uid, r] : by_uid) s.uids.push_back(std::move(r));
  return s;
}

/// Fill in the rates of `now`'s rows from the rows of `before` with the same key.
void Rates(const Sample& before, Sample& now) {
  const double seconds = std::chrono::duration<double>(now.at - before.at).count();
  if (!(seconds > 0)) return;
  auto fill = [seconds](const std::vector<Row>& old, std::vector<Row>& rows) {
    std::map<std::string, const Row*> index;
    for (const Row& r : old) index[r.key] = &r;
    for (Row& r : rows) {
      auto it = index.find(r.key);
      const uint64_t busy0 = it == index.end() ? 0 : it->second->busy_ns;
      const uint64_t up0 = it == index.end() ? 0 : it->second->h2d_bytes;
      const uint64_t down0 = it == index.end() ? 0 : it->second->d2h_bytes;
      if (it == index.end() && r.session_id == 0) continue;  // a uid first seen now
      r.busy_fraction =
          r.busy_ns >= busy0 ? static_cast<double>(r.busy_ns - busy0) / 1e9 / seconds : 0;
      r.h2d_rate = r.h2d_bytes >= up0 ? static_cast<double>(r.h2d_bytes - up0) / seconds : 0;
      r.d2h_rate = r.d2h_bytes >= down0 ? static_cast<double>(r.d2h_bytes - down0) / seconds : 0;
    }
  };
  fill(before.sessions, now.sessions);
  fill(before.uids, now.uids);
}

void Sort(std::vector<Row>& rows, SortKey key) {
  std::stable_sort(rows.begin(), rows.end(), [key](const Row& a, const Row& b) {
    switch (key) {
      case SortKey::kMemory:
        return a.device_bytes > b.device_bytes;
      case SortKey::kRate:
        return a.h2d_rate + a.d2h_rate > b.h2d_rate + b.d2h_rate;
      default:
        return a.busy_ns > b.busy_ns;
    }
  });
}

std::string Seconds(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", static_cast<double>(ns) / 1e9);
  return buf;
}

std::string Percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", fraction * 100);
  return buf;
}

std::string Rate(double bytes_per_second) {
  return HumanBytes(static_cast<uint64_t>(bytes_per_second)) + "/s";
}

std::string RenderTables(const Sample& s) {
  std::ostringstream out;
  Table uids;
  uids.AddColumn("UID");
  uids.AddColumn("SESSIONS", true);
  uids.AddColumn("DEVICE-TIME", true);
  uids.AddColumn("BUSY", true);
  uids.AddColumn("MEMORY", true);
  uids.AddColumn("H2D", true);
  uids.AddColumn("D2H", true);
  for (const Row& r : s.uids) {
    uids.AddRow({r.uid, std::to_string(r.sessions), Seconds(r.busy_ns), Percent(r.busy_fraction),
                 HumanBytes(r.device_bytes), Rate(r.h2d_rate), Rate(r.d2h_rate)});
  }
  out << uids.Render() << "\n";
  if (s.sessions.empty()) {
    out << "no open sessions\n";
    return out.str();
  }
  Table sessions;
  sessions.AddColumn("SESSION", true);
  sessions.AddColumn("UID");
  sessions.AddColumn("CLIENT");
  sessions.AddColumn("PID", true);
  sessions.AddColumn("DEVICE-TIME", true);
  sessions.AddColumn("BUSY", true);
  sessions.AddColumn("MEMORY", true);
  sessions.AddColumn("H2D", true);
  sessions.AddColumn("D2H", true);
  sessions.AddColumn("AGE", true);
  for (const Row& r : s.sessions) {
    sessions.AddRow({std::to_string(r.session_id), r.uid, r.client, r.pid, Seconds(r.busy_ns),
                     Percent(r.busy_fraction), HumanBytes(r.device_bytes), Rate(r.h2d_rate),
                     Rate(r.d2h_rate), r.age});
  }
  out << sessions.Render();
  return out.str();
}

std::string RowJson(const Row& r, bool session) {
  JsonObject o;
  if (session) {
    o.Add("session_id", r.session_id).Add("uid", r.uid).Add("client", r.client);
    if (r.pid != "-") o.Add("pid", static_cast<int64_t>(std::stoll(r.pid)));
  } else {
    o.Add("uid", r.uid).Add("sessions_open", r.sessions);
  }
  return o.Add("device_busy_ns", r.busy_ns)
      .Add("busy_fraction", r.busy_fraction)
      .Add("device_bytes", r.device_bytes)
      .Add("h2d_bytes", r.h2d_bytes)
      .Add("d2h_bytes", r.d2h_bytes)
      .Add("h2d_bytes_per_s", r.h2d_rate)
      .Add("d2h_bytes_per_s", r.d2h_rate)
      .str();
}

/// The terminal in raw mode for the live view; restored (and the screen given back) when
/// destroyed.
class Terminal {
 public:
  Terminal() {
    interactive_ = ::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &saved_) == 0;
    if (interactive_) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      ::tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    std::fputs("\x1b[?1049h\x1b[?25l", stdout);  // alternate screen, no cursor
    std::fflush(stdout);
  }
  ~Terminal() {
    std::fputs("\x1b[?25h\x1b[?1049l", stdout);
    std::fflush(stdout);
    if (interactive_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  /// Wait up to `timeout` for a key; return it, or 0.
  char WaitKey(std::chrono::milliseconds timeout) const {
    if (!interactive_) {
      ::poll(nullptr, 0, static_cast<int>(timeout.count()));
      return 0;
    }
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return 0;
    char c = 0;
    return ::read(STDIN_FILENO, &c, 1) == 1 ? c : 0;
  }

  static std::pair<int, int> Size() {
    winsize w{};
    if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) != 0 || w.ws_col == 0) return {80, 24};
    return {w.ws_col, w.ws_row};
  }

 private:
  bool interactive_ = false;
  termios saved_{};
};

/// Cut `text` to the terminal: at most `cols` columns and `rows` lines.
std::string Fit(const std::string& text, int cols, int rows) {
  std::istringstream in(text);
  std::string out;
  int n = 0;
  for (std::string line; n < rows && std::getline(in, line); ++n) {
    if (static_cast<int>(line.size()) > cols) line.resize(cols);
    out += line + "\x1b[K\n";  // erase what a longer earlier line left
  }
  return out;
}

std::string Now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%H:%M:%S", std::localtime(&t));
  return buf;
}

}  // namespace

int RunTop(const Options& options, std::ostream& out, std::ostream& err) {
  v1::ListSessionsReply reply;
  if (int rc = FetchSessions(options, &reply, err); rc != kExitOk) return rc;
  Sample before = Collect(reply);
  SortKey key = SortKey::kTime;

  if (options.once) {
    ::poll(nullptr, 0, static_cast<int>(options.interval.count()));
    if (int rc = FetchSessions(options, &reply, err); rc != kExitOk) return rc;
    Sample now = Collect(reply);
    Rates(before, now);
    Sort(now.sessions, key);
    Sort(now.uids, key);
    if (options.json) {
      std::vector<std::string> uids, sessions;
      for (const Row& r : now.uids) uids.push_back(RowJson(r, false));
      for (const Row& r : now.sessions) sessions.push_back(RowJson(r, true));
      out << JsonObject()
                 .Add("target", options.target)
                 .Add("interval_ms", static_cast<int64_t>(options.interval.count()))
                 .AddRaw("uids", JsonArray(uids))
                 .AddRaw("sessions", JsonArray(sessions))
                 .str()
          << "\n";
    } else {
      out << RenderTables(now);
    }
    return kExitOk;
  }

  struct sigaction action {};
  action.sa_handler = OnSignal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  Terminal terminal;
  std::string problem;
  for (bool first = true; !g_stop; first = false) {
    Sample now = before;
    if (!first) {
      std::ostringstream errors;
      if (FetchSessions(options, &reply, errors) == kExitOk) {
        now = Collect(reply);
        Rates(before, now);
        before = now;
        problem.clear();
      } else {
        problem = errors.str();  // keep showing the last view, with the problem
      }
    }
    Sort(now.sessions, key);
    Sort(now.uids, key);
    std::ostringstream screen;
    screen << "ferry top - " << options.target << " - " << Now() << " - every "
           << options.interval.count() << " ms - sorted by " << SortName(key)
           << " (t time, m memory, r rate, q quit)\n";
    uint64_t busy_total = 0, memory_total = 0;
    double busy_now = 0;
    for (const Row& r : now.uids) {
      busy_total += r.busy_ns;
      memory_total += r.device_bytes;
      busy_now += r.busy_fraction;
    }
    screen << "sessions " << now.sessions.size() << "   device time " << Seconds(busy_total)
           << "   busy " << Percent(busy_now) << "   memory " << HumanBytes(memory_total) << "\n";
    if (!problem.empty()) screen << "! " << problem;
    screen << "\n" << RenderTables(now);
    const auto [cols, rows] = Terminal::Size();
    std::fputs(("\x1b[H" + Fit(screen.str(), cols, rows) + "\x1b[J").c_str(), stdout);
    std::fflush(stdout);
    const char c = terminal.WaitKey(options.interval);
    if (c == 'q' || c == 'Q') break;
    if (c == 't') key = SortKey::kTime;
    if (c == 'm') key = SortKey::kMemory;
    if (c == 'r') key = SortKey::kRate;
  }
  return kExitOk;
}

}  // namespace ferry::ctl
