// JSON text helpers shared by ferry's tools (ferryctl, ferry-bench). Internal: not installed
// with the client library's headers.
#pragma once

#include <string>
#include <string_view>

namespace ferry {

/// Quote and escape `s` as a JSON string (control characters as \uXXXX, except \n, \r, \t).
std::string JsonString(std::string_view s);

}  // namespace ferry
