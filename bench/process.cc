#include "process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

extern char** environ;

namespace ferry::bench {

namespace {

/// This process's environment with `env` applied, as "NAME=value" strings.
std::vector<std::string> ChildEnvironment(const EnvChanges& env) {
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = name_of(entry);
    bool drop = std::find(env.unset.begin(), env.unset.end(), name) != env.unset.end();
    for (const auto& [k, v] : env.set) drop = drop || k == name;
    if (!drop) out.push_back(std::move(entry));
  }
  for (const auto& [k, v] : env.set) out.push_back(k + "=" + v);
  return out;
}

}  // namespace

EnvChanges WithoutMps() { return EnvChanges{{}, kMpsEnvVars}; }

Child SpawnChild(const std::string& program, const std::vector<std::string>& args, bool pipe_stdin,
                 bool pipe_stdout, const std::string& log_path, int stdin_from_fd,
                 const EnvChanges& env) {
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
  std::vector<std::string> env_strings = ChildEnvironment(env);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
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

bool ReadLineUntil(int fd, std::string* line, std::chrono::steady_clock::time_point deadline) {
  line->clear();
  char c;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) return false;
    if (r <= 0) continue;
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

bool WorkerOutput::ok() const {
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::vector<WorkerOutput> RunWorkers(const std::string& self_exe, int n,
                                     const std::vector<std::string>& args, const EnvChanges& env,
                                     std::chrono::seconds timeout) {
  std::vector<Child> children;
  for (int i = 0; i < n; ++i)
    children.push_back(SpawnChild(self_exe, args, true, true, "", -1, env));
  // Setting up (a CUDA context, a session) gets the same bound as the run.
  auto setup_deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> ready(children.size(), false);
  for (size_t i = 0; i < children.size(); ++i) {
    std::string line;
    ready[i] = children[i].pid > 0 && ReadLineUntil(children[i].stdout_fd, &line, setup_deadline) &&
               line == "ready";
  }
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i].pid <= 0) continue;
    if (ready[i]) WriteAll(children[i].stdin_fd, "g", 1);
    close(children[i].stdin_fd);  // a worker that is not ready exits on EOF
  }
  // Read every worker's stdout at once (poll), so that none blocks on a full pipe while
  // another is read.
  std::vector<WorkerOutput> out(children.size());
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> open(children.size());
  for (size_t i = 0; i < children.size(); ++i) open[i] = children[i].pid > 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i) {
      if (!open[i]) continue;
      fds.push_back({children[i].stdout_fd, POLLIN, 0});
      which.push_back(i);
    }
    if (fds.empty()) break;
    if (poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      char buf[65536];
      ssize_t r = read(fds[k].fd, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        open[which[k]] = false;
      } else if (ready[which[k]]) {
        out[which[k]].out.append(buf, static_cast<size_t>(r));
      }
    }
  }
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i].pid <= 0) continue;
    close(children[i].stdout_fd);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    out[i].status = WaitChild(children[i].pid, std::max(left, std::chrono::milliseconds(1000)));
    if (out[i].status == -1) {
      kill(children[i].pid, SIGKILL);
      WaitChild(children[i].pid, std::chrono::seconds(5));
    }
  }
  return out;
}

void AwaitGo() {
  std::printf("ready\n");
  std::fflush(stdout);
  char go;
  if (read(0, &go, 1) != 1) std::exit(3);
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
  Child c = SpawnChild(ferryd, args, false, false, log_, -1, WithoutMps());
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

// --- MPS ----------------------------------------------------------------------------------

namespace {

constexpr const char* kMpsControlName = "nvidia-cuda-mps-control";

bool IsExecutable(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

/// Processes whose environment names `pipe_dir` as their MPS pipe directory: the control
/// daemon this run started and the server it launched (both inherit it). Only processes of
/// this user can be read, which are the only ones that can hold it.
std::vector<pid_t> ProcessesOfPipeDir(const std::string& pipe_dir) {
  std::vector<pid_t> out;
  const std::string want = std::string(kMpsEnvVars[0]) + "=" + pipe_dir;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == getpid()) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/environ", std::ios::binary);
    std::string entry;
    while (std::getline(in, entry, '\0')) {
      if (entry == want) {
        out.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  return out;
}

std::string Tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) all.push_back(line);
  }
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += (out.empty() ? "" : " | ") + all[i];
  }
  return out;
}

}  // namespace

std::string MpsDaemon::FindControl(const std::string& override_path) {
  if (!override_path.empty()) return IsExecutable(override_path) ? override_path : "";
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream in(path);
    std::string dir;
    while (std::getline(in, dir, ':')) {
      if (!dir.empty()) dirs.push_back(dir);
    }
  }
  dirs.push_back("/usr/local/nvidia/bin");
  for (const auto& dir : dirs) {
    std::string candidate = dir + "/" + kMpsControlName;
    if (IsExecutable(candidate)) return candidate;
  }
  return "";
}

EnvChanges MpsDaemon::env() const {
  return EnvChanges{{{kMpsEnvVars[0], pipe_dir_}, {kMpsEnvVars[1], log_dir_}}, {}};
}

std::string MpsDaemon::LogTail() const {
  std::string control = Tail(log_dir_ + "/control.log", 3);
  std::string server = Tail(log_dir_ + "/server.log", 3);
  std::string out;
  if (!control.empty()) out += "control.log: " + control;
  if (!server.empty()) out += (out.empty() ? "" : "; ") + std::string("server.log: ") + server;
  return out.empty() ? "(its logs are empty)" : out;
}

bool MpsDaemon::Start(const std::string& control, std::string* why) {
  control_ = control;
  char pipe_tmpl[] = "/tmp/ferry-mps-pipe-XXXXXX";
  char log_tmpl[] = "/tmp/ferry-mps-log-XXXXXX";
  if (!mkdtemp(pipe_tmpl)) {
    *why = std::string("mkdtemp: ") + std::strerror(errno);
    return false;
  }
  if (!mkdtemp(log_tmpl)) {
    *why = std::string("mkdtemp: ") + std::strerror(errno);
    rmdir(pipe_tmpl);
    return false;
  }
  pipe_dir_ = pipe_tmpl;
  log_dir_ = log_tmpl;
  // -d forks the daemon and returns: the child we wait for is only the launcher.
  Child c = SpawnChild(control_, {"-d"}, false, false, log_dir_ + "/launch.log", -1, env());
  int status = c.pid > 0 ? WaitChild(c.pid, std::chrono::seconds(30)) : -1;
  if (c.pid > 0 && status == -1) {
    kill(c.pid, SIGKILL);
    WaitChild(c.pid, std::chrono::seconds(5));
  }
  if (c.pid <= 0 || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *why = control_ + " -d " +
           (c.pid <= 0 ? std::string("could not be started")
                       : "failed (status " + std::to_string(status) +
                             "): " + Tail(log_dir_ + "/launch.log", 3) + " " + LogTail());
    Stop();
    return false;
  }
  // Ready once its control pipe exists.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (access((pipe_dir_ + "/control").c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() >= until) {
      *why = "the MPS control daemon made no control pipe in " + pipe_dir_ + " within 10 s; " +
             LogTail();
      Stop();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream pid_file(pipe_dir_ + "/nvidia-cuda-mps-control.pid");
  long pid = -1;
  if (!(pid_file >> pid)) {
    auto found = ProcessesOfPipeDir(pipe_dir_);
    if (!found.empty()) pid = *std::min_element(found.begin(), found.end());
  }
  pid_ = static_cast<pid_t>(pid);
  return true;
}

void MpsDaemon::Stop() {
  if (pipe_dir_.empty()) return;
  // "quit" through the control pipe: the daemon stops its server and exits.
  if (access((pipe_dir_ + "/control").c_str(), F_OK) == 0) {
    Child q = SpawnChild(control_, {}, true, false, log_dir_ + "/quit.log", -1, env());
    if (q.pid > 0) {
      WriteAll(q.stdin_fd, "quit\n", 5);
      close(q.stdin_fd);
      if (WaitChild(q.pid, std::chrono::seconds(30)) == -1) {
        kill(q.pid, SIGKILL);
        WaitChild(q.pid, std::chrono::seconds(5));
      }
    }
  }
  // Wait for the daemon (and its server) to be gone before removing their directories.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::vector<pid_t> left = ProcessesOfPipeDir(pipe_dir_);
  while (!left.empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    left = ProcessesOfPipeDir(pipe_dir_);
  }
  for (pid_t p : left) {
    std::cerr << "ferry-bench: MPS process " << p << " did not exit after quit; killing it\n";
    kill(p, SIGKILL);
  }
  std::error_code ec;
  std::filesystem::remove_all(pipe_dir_, ec);
  std::filesystem::remove_all(log_dir_, ec);
  pipe_dir_.clear();
  log_dir_.clear();
  pid_ = -1;
}

}  // namespace ferry::bench
