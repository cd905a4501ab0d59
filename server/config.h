// ferryd's configuration: flags and the config file, parsed into one struct main.cc composes
// the daemon from. Every setting is declared once, in the table of settings.h (settings.cc),
// from which the parsers, --help and the config dump are made; its default is the initial
// value of its member below (or of the option structs these hold).
//
// The config file holds "name = value" lines with the flags' names (no leading dashes);
// '#' starts a comment (at the start of a line, or after whitespace); blank lines are
// ignored; `listen` may repeat; switches take true/false (also yes/no, on/off, 1/0), in the
// file and, as --switch=VALUE, on the command line (a bare --switch means true). Flags win
// over the file: a flag replaces the file's value, and any --listen replaces every `listen`
// line of the file.
//
// Besides each value's own range, both parsers check the settings that depend on each other
// (pinned-budget at least slab-size; tls-cert and tls-key together; tls-client-ca only with
// both), so --check-config reports what ferryd would fail to start on. Neither opens a file
// a setting names (TLS, token): that is left to start-up.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "daemon.h"
#include "ferry/status.h"

namespace ferry {

/// Where ferryd looks for its config file when --config is not given.
inline constexpr const char* kDefaultConfigPath = "/etc/ferry/ferryd.conf";

/// The endpoint ferryd listens on when no `listen` is given; `<device>` stands for the
/// `device` setting's ordinal.
inline constexpr const char* kDefaultListen = "unix:/run/ferry/ferryd-<device>.sock";

struct DaemonConfig {
  int device = 0;
  std::string backend = "auto";  // host | cuda | auto
  backend::HostDeviceOptions host;
  backend::CudaDeviceOptions cuda;  // nvrtc-timeout, nvrtc-memory
  DaemonOptions daemon;
  std::string log_level = "info";
  std::string ready_file;  // written with the bound endpoints once serving
  std::chrono::milliseconds drain_timeout{10000};
  /// Hardware work queues of the CUDA context (CUDA_DEVICE_MAX_CONNECTIONS, set before the
  /// context exists); 0: leave CUDA's default (8) or the environment's value.
  int cuda_work_queues = 0;
  /// When CUDA loads kernels (CUDA_MODULE_LOADING, set before the context exists): "eager"
  /// (all when the context is made; cuBLAS is opened then too), "lazy" (each on its first launch,
  /// which may wait for the whole device: every session's queued work) or "environment" (leave the
  /// variable; CUDA's default is lazy).
  std::string cuda_module_loading = "environment";
  /// The config file that was read ("" when none).
  std::string config_path;
  /// --check-config: validate, print the effective configuration, exit.
  bool check_config = false;
  bool host_rebuild_fails_for_test = false;    // hidden flag, for the restart-after-fault path
  uint64_t host_fault_after_ops_for_test = 0;  // hidden flag, for fault-recovery tests
  bool show_help = false;
  bool show_version = false;
};

/// Parse ferryd's command line. Flags take "--name value" or "--name=value"; switches take
/// no value (true) or "--name=true|false" (the words the file takes), except the actions
/// --help, --version and --check-config, which take none; sizes accept K, M, G suffixes
/// (powers of 1024). Unknown flags, bad values and inconsistent settings are errors
/// (INVALID_ARGUMENT).
///
/// Settings are read first from the config file: the one named by --config (an error when it
/// cannot be read; "--config=" reads none), else `default_config` when that file exists
/// (main passes kDefaultConfigPath; "" reads none). Flags then override the file.
Result<DaemonConfig> ParseFlags(const std::vector<std::string>& args,
                                const std::string& default_config = "");

/// Parse the text of a config file on its own (defaults for everything it does not set).
/// `origin` names the file in error messages ("PATH:LINE: ...", or "PATH: ..." for settings
/// inconsistent with each other).
Result<DaemonConfig> ParseConfigText(const std::string& text, const std::string& origin = "config");

/// Return `config` as config-file text that ParseConfigText reads back to the same settings:
/// every setting, one per line, defaults included (what --check-config prints). The hidden
/// test-only settings (names ending in -for-test) are printed only when not at their default.
std::string FormatConfig(const DaemonConfig& config);

/// Return the --help text.
std::string FlagsHelp();

/// Parse a byte size such as "4096", "64M" or "2G".
Result<uint64_t> ParseBytes(const std::string& text);

/// Format a byte size the way ParseBytes reads it, with the largest exact suffix ("64M").
std::string FormatBytes(uint64_t bytes);

}  // namespace ferry
