#include "process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <fstream>
#include <iostream>
#include <thread>

extern char** environ;

namespace ferry::bench {

Child SpawnChild(const std::string& program, const std::vector<std::string>& args, bool pipe_stdin,
                 bool pipe_stdout, const std::string& log_path, int stdin_from_fd) {
  Child c;
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (pipe_stdin && pipe2(in, O_CLOEXEC) != 0) return c;
  if (pipe_stdout && pipe2(out, O_CLOEXEC) != 0) return c;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears FD_CLOEXEC on the copy, so only these ends reach the child.
  if (pipe_stdin) posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  if (stdin_from_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdin_from_fd, 0);
  if (pipe_stdout) posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    if (!pipe_stdout) posix_spawn_file_actions_adddup2(&actions, 2, 1);
  }
  pid_t pid = -1;
  int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (pipe_stdin) close(in[0]);
  if (pipe_stdout) close(out[1]);
  if (rc != 0) {
    if (pipe_stdin) close(in[1]);
    if (pipe_stdout) close(out[0]);
    return c;
  }
  c.pid = pid;
  c.stdin_fd = pipe_stdin ? in[1] : -1;
  c.stdout_fd = pipe_stdout ? out[0] : -1;
  return c;
}

int WaitChild(pid_t pid, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool ReadLine(int fd, std::string* line) {
  line->clear();
  char c;
  while (true) {
    ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

std::vector<std::string> WaitReadyFile(const std::string& path, pid_t pid,
                                       std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) lines.push_back(line);
    }
    if (!lines.empty()) return lines;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

std::string SelfExe() {
  char buf[PATH_MAX + 1] = {};
  ssize_t n = readlink("/proc/self/exe", buf, PATH_MAX);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool SpawnedDaemon::Start(const std::string& ferryd, const std::string& dir, bool tcp,
                          uint64_t pinned_budget_mib, const std::vector<std::string>& extra_args) {
  log_ = dir + "/ferryd.log";
  std::vector<std::string> args = {"--backend",    "auto",
                                   "--listen",     "unix:" + dir + "/ferryd.sock",
                                   "--ready-file", dir + "/ferryd.ready",
                                   "--log-level",  "warn"};
  if (tcp) {
    args.push_back("--listen");
    args.push_back("tcp:127.0.0.1:0");
    // A loopback endpoint without a token: ferryd needs to be told that is meant.
    args.push_back("--allow-insecure-remote");
  }
  if (pinned_budget_mib > 0) {
    args.push_back("--pinned-budget");
    args.push_back(std::to_string(pinned_budget_mib) + "M");
  }
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Child c = SpawnChild(ferryd, args, false, false, log_);
  if (c.pid <= 0) {
    std::cerr << "ferry-bench: cannot start " << ferryd << "\n";
    return false;
  }
  pid_ = c.pid;
  endpoints_ = WaitReadyFile(dir + "/ferryd.ready", pid_, std::chrono::seconds(60));
  if (endpoints_.empty()) {
    std::ifstream in(log_);
    std::cerr << "ferry-bench: " << ferryd << " did not become ready; its log:\n"
              << in.rdbuf() << "\n";
    Stop();
    return false;
  }
  return true;
}

void SpawnedDaemon::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  if (WaitChild(pid_, std::chrono::seconds(30)) == -1) {
    kill(pid_, SIGKILL);
    WaitChild(pid_, std::chrono::seconds(5));
  }
  pid_ = -1;
}

}  // namespace ferry::bench
