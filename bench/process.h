// Child processes of ferry-bench: its own workers (re-executed with --worker) and a
// ferryd it spawns for --spawn-daemon.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::bench {

/// A child with optional pipes to its stdin and from its stdout (-1 where not piped).
struct Child {
  pid_t pid = -1;
  int stdin_fd = -1;   // write end, ours
  int stdout_fd = -1;  // read end, ours
};

/// Start `program args...`. stdin/stdout are piped when asked, else inherited; stderr is
/// inherited, or appended to `log_path` (with stdout) when given. `stdin_from_fd` >= 0
/// becomes the child's stdin instead (the socketpair ping-pong uses it).
Child SpawnChild(const std::string& program, const std::vector<std::string>& args, bool pipe_stdin,
                 bool pipe_stdout, const std::string& log_path = "", int stdin_from_fd = -1);

/// Wait up to `timeout` for `pid`; return its wait status, or -1 when it did not exit.
int WaitChild(pid_t pid, std::chrono::milliseconds timeout);

/// Read one '\n'-terminated line from `fd` (without the newline); false on EOF or error.
bool ReadLine(int fd, std::string* line);
/// Read `fd` to EOF.
std::string ReadAll(int fd);
/// Write all of `data` to `fd`; false on error.
bool WriteAll(int fd, const void* data, size_t bytes);

/// Wait until `path` holds at least one line (a --ready-file); return its lines, or an
/// empty vector when `pid` exits first or `timeout` passes.
std::vector<std::string> WaitReadyFile(const std::string& path, pid_t pid,
                                       std::chrono::milliseconds timeout);

/// Return the path of this executable (/proc/self/exe).
std::string SelfExe();

/// A ferryd started by ferry-bench (--spawn-daemon) on a Unix socket in `dir` (and TCP
/// loopback port 0 when `tcp`), --backend auto. Stopped with SIGTERM by Stop() or the
/// destructor.
class SpawnedDaemon {
 public:
  /// Start it and wait for its ready file; false (with the log on stderr) on failure.
  /// `pinned_budget_mib` > 0 passes --pinned-budget (the concurrency scenario's pending
  /// route holds one slab per session); 0 keeps the daemon's default. `extra_args` go last
  /// (the user's --daemon-arg), so they win over the ones above.
  bool Start(const std::string& ferryd, const std::string& dir, bool tcp,
             uint64_t pinned_budget_mib = 0, const std::vector<std::string>& extra_args = {});
  ~SpawnedDaemon() { Stop(); }
  void Stop();
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string log_;
  std::vector<std::string> endpoints_;
};

}  // namespace ferry::bench
