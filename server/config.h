// ferryd's configuration: flags, parsed into one struct main.cc composes the daemon from.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ferry/status.h"
#include "rpc/daemon.h"

namespace ferry {

struct DaemonConfig {
  int device = 0;
  std::string backend = "auto";  // host | cuda | auto
  backend::HostDeviceOptions host;
  rpc::DaemonOptions daemon;
  std::string log_level = "info";
  std::string ready_file;  // written with the bound endpoints once serving
  std::chrono::milliseconds drain_timeout{10000};
  bool show_help = false;
  bool show_version = false;
};

/// Parse ferryd's command line. Flags take "--name value" or "--name=value"; sizes accept
/// K, M, G suffixes (powers of 1024). Unknown flags and bad values are errors.
Result<DaemonConfig> ParseFlags(const std::vector<std::string>& args);

/// Return the --help text.
std::string FlagsHelp();

/// Parse a byte size such as "4096", "64M" or "2G".
Result<uint64_t> ParseBytes(const std::string& text);

}  // namespace ferry
