// Test harness: run the test client (ferry_test_client) as another local user, for tests of
// what one uid may see or do to another's sessions. Needs root (to create users and switch
// to them); callers skip with the printed reason otherwise.
//
// The other user must be able to execute the program: a checkout under a 0700 home (root's
// /root/ferry) is not reachable for it. So the client is copied once per test process into a
// world-readable temp dir and run from there. It links libferry statically and needs only
// system libraries (no RUNPATH into the build tree), so the one file is all it needs;
// CannotRunAs checks that by running the copy as the other user before a test relies on it.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ferryd_process.h"

namespace ferry::testing {

/// Make `user` a system user (no home) unless it exists; false when that fails.
inline bool EnsureUser(const std::string& user) {
  if (getpwnam(user.c_str())) return true;
  std::string cmd = "useradd -M -r " + user + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 && getpwnam(user.c_str());
}

/// Make `group` a system group unless it exists and add `user` to it (supplementary).
inline bool EnsureUserInGroup(const std::string& user, const std::string& group) {
  if (!getgrnam(group.c_str())) {
    std::string cmd = "groupadd -r " + group + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0 || !getgrnam(group.c_str())) return false;
  }
  std::string cmd = "usermod -a -G " + group + " " + user + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

/// The uid of `user`, or -1.
inline uid_t UidOf(const std::string& user) {
  struct passwd* pw = getpwnam(user.c_str());
  return pw ? pw->pw_uid : static_cast<uid_t>(-1);
}

/// A copy of the test client that every user can execute, made once per process and removed
/// at exit. path() is "" when it could not be made; why() then says what failed.
class OtherUserProgram {
 public:
  static const OtherUserProgram& Get() {
    static OtherUserProgram program;
    return program;
  }
  const std::string& path() const { return path_; }
  const std::string& why() const { return why_; }

  ~OtherUserProgram() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

 private:
  OtherUserProgram() {
    const std::string source = ProgramPath("FERRY_TEST_CLIENT", FERRY_TEST_CLIENT_PATH);
    char tmpl[] = "/tmp/ferry-other-user-XXXXXX";
    if (!mkdtemp(tmpl)) {
      why_ = "cannot make a temp dir in /tmp for the test client";
      return;
    }
    dir_ = tmpl;
    std::string copy = dir_ + "/ferry_test_client";
    std::error_code ec;
    std::filesystem::copy_file(source, copy, ec);
    if (ec) {
      why_ = "cannot copy " + source + " to " + copy + ": " + ec.message();
      return;
    }
    if (chmod(dir_.c_str(), 0755) != 0 || chmod(copy.c_str(), 0755) != 0) {
      why_ = "cannot make " + copy + " world-executable";
      return;
    }
    path_ = copy;
  }

  std::string dir_;
  std::string path_;
  std::string why_;
};

/// Run the test client as `user` with `args` (fork, setgroups to the user's groups, setgid,
/// setuid, execv; only async-signal-safe calls in the child). Its stdout and stderr go to
/// `output_path` when given. Return its wait status, or -1 (no such user, no program, fork
/// failed, or it ran past 60 s). Exit 120: switching users failed; 121: exec failed.
inline int RunAs(const std::string& user, const std::vector<std::string>& args,
                 const std::string& output_path = "") {
  struct passwd* pw = getpwnam(user.c_str());
  if (!pw) return -1;
  const std::string program = OtherUserProgram::Get().path();
  if (program.empty()) return -1;
  uid_t uid = pw->pw_uid;
  gid_t gid = pw->pw_gid;
  // The user's supplementary groups, looked up before fork (getgrouplist is not
  // async-signal-safe), so group-based settings (raw-kernels gid:..) see them.
  std::vector<gid_t> groups(256);
  int ngroups = static_cast<int>(groups.size());
  if (getgrouplist(pw->pw_name, gid, groups.data(), &ngroups) < 0) ngroups = 0;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    if (!output_path.empty()) {
      int fd = open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
      if (fd < 0) _exit(122);
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    if (setgroups(static_cast<size_t>(ngroups), groups.data()) != 0 || setgid(gid) != 0 ||
        setuid(uid) != 0) {
      _exit(120);
    }
    execv(program.c_str(), argv.data());
    _exit(121);
  }
  if (pid < 0) return -1;
  return WaitExit(pid, std::chrono::seconds(60));
}

/// Why the test client cannot be run as `user`, or "" when it can: the copy could not be
/// made, or it does not start as that user (a library it needs, e.g. from a bundle's
/// LD_LIBRARY_PATH, is out of that user's reach). Tests skip with this reason.
inline std::string CannotRunAs(const std::string& user) {
  if (OtherUserProgram::Get().path().empty()) return OtherUserProgram::Get().why();
  // With no arguments the client prints its usage and exits 2: it ran.
  int status = RunAs(user, {});
  if (status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 2) return "";
  return "the test client copied to " + OtherUserProgram::Get().path() + " did not start as " +
         user + " (wait status " + std::to_string(status) +
         "; 120: could not switch users, 121: exec failed, 127: a library is unreachable)";
}

/// Let every user reach `daemon`'s Unix socket and slab socket (the daemon's temp dir is
/// 0700 and its socket 0660). False when a chmod failed.
inline bool OpenSocketsToEveryone(const FerrydProcess& daemon) {
  std::string sock = daemon.unix_target().substr(5);
  std::string dir = sock.substr(0, sock.rfind('/'));
  return chmod(dir.c_str(), 0755) == 0 && chmod(sock.c_str(), 0666) == 0 &&
         chmod((sock + ".slabs").c_str(), 0666) == 0;
}

}  // namespace ferry::testing
