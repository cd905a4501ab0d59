// SysError: a Status for a failed system call, naming it and errno's text.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "ferry/status.h"

namespace ferry {

/// INTERNAL "`what`: strerror(errno)"; call right after the call that set errno.
inline Status SysError(const char* what) {
  return Status(ErrorKind::kInternal, std::string(what) + ": " + std::strerror(errno));
}

}  // namespace ferry
