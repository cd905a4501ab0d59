// Child processes of ferry-bench: its own workers (re-executed with --worker) and a
// ferryd it spawns for --spawn-daemon.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ferry::bench {

/// Changes to this process's environment for one child: `unset` removed, then `set` added
/// (replacing a value inherited). This process's own environment is never changed, so its
/// own CUDA context (the in-process baseline) is created without what a child gets here.
struct EnvChanges {
  std::vector<std::pair<std::string, std::string>> set;
  std::vector<std::string> unset;
};

/// The variables that make a CUDA process an MPS client of a given control daemon. They are
/// set for the MPS arm's workers only, and removed from every other child (ferryd under test,
/// the own-context workers) so that nothing else becomes an MPS client by inheritance.
inline const std::vector<std::string> kMpsEnvVars = {"CUDA_MPS_PIPE_DIRECTORY",
                                                     "CUDA_MPS_LOG_DIRECTORY"};
/// EnvChanges that remove kMpsEnvVars.
EnvChanges WithoutMps();

/// A child with optional pipes to its stdin and from its stdout (-1 where not piped).
struct Child {
  pid_t pid = -1;
  int stdin_fd = -1;   // write end, ours
  int stdout_fd = -1;  // read end, ours
};

/// Start `program args...`. stdin/stdout are piped when asked, else inherited; stderr is
/// inherited, or appended to `log_path` (with stdout) when given. `stdin_from_fd` >= 0
/// becomes the child's stdin instead (the socketpair ping-pong uses it). The child's
/// environment is this process's with `env` applied.
Child SpawnChild(const std::string& program, const std::vector<std::string>& args, bool pipe_stdin,
                 bool pipe_stdout, const std::string& log_path = "", int stdin_from_fd = -1,
                 const EnvChanges& env = {});

/// What one worker process left behind: its wait status (-1: killed at the timeout) and
/// everything it printed on stdout after "ready".
struct WorkerOutput {
  int status = -1;
  std::string out;
  bool ok() const;  // exited 0
};

/// Run `n` ferry-bench worker processes (`self_exe args...`, environment changed by `env`) to
/// their end. Each prints "ready" on stdout once set up and then waits for a go byte on stdin;
/// all get it together, once every one is ready (one that fails to set up is not waited for:
/// its output is empty, its status says how it ended). A worker still running `timeout`
/// after the go is killed. The one way ferry-bench starts its measuring workers: the sharing
/// scenario's processes and the in-process baselines run as MPS clients.
std::vector<WorkerOutput> RunWorkers(const std::string& self_exe, int n,
                                     const std::vector<std::string>& args, const EnvChanges& env,
                                     std::chrono::seconds timeout);

/// For a worker: print "ready" and wait for the parent's go byte on stdin (exit 3 on EOF).
void AwaitGo();

/// Wait up to `timeout` for `pid`; return its wait status, or -1 when it did not exit.
int WaitChild(pid_t pid, std::chrono::milliseconds timeout);

/// Read one '\n'-terminated line from `fd` (without the newline); false on EOF or error.
bool ReadLine(int fd, std::string* line);
/// ReadLine, giving up (false) at `deadline`.
bool ReadLineUntil(int fd, std::string* line, std::chrono::steady_clock::time_point deadline);
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
  /// Start it and wait for its ready file; false (with the log on stderr) on failure. Its
  /// environment is this process's without kMpsEnvVars: the daemon under test is never an
  /// MPS client.
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

/// A private MPS control daemon for the MPS baseline (`nvidia-cuda-mps-control -d`, its
/// pipe and log directories made with mkdtemp). Clients reach it through env(). Stop() (or
/// the destructor) sends "quit" through the same pipe directory, waits for the daemon to
/// exit and removes the directories. Not thread-safe; owned by the driver's main thread.
class MpsDaemon {
 public:
  /// Find nvidia-cuda-mps-control: `override_path` when given, else PATH, else
  /// /usr/local/nvidia/bin. Empty when not found.
  static std::string FindControl(const std::string& override_path);

  /// Start the control daemon; false with *why on failure (nothing left running).
  bool Start(const std::string& control, std::string* why);
  ~MpsDaemon() { Stop(); }
  void Stop();
  bool running() const { return !pipe_dir_.empty(); }
  /// The environment of an MPS client of this daemon.
  EnvChanges env() const;
  /// The control daemon's process id when known (its pid file), else -1; for the signal
  /// handler, which can only kill it.
  pid_t pid() const { return pid_; }
  /// The last lines of the daemon's logs (control.log, server.log), for a failure message.
  std::string LogTail() const;

 private:
  std::string control_;
  std::string pipe_dir_, log_dir_;
  pid_t pid_ = -1;
};

}  // namespace ferry::bench
