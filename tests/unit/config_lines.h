// Reading config text back as a test sees it (the config file's format, docs/configuration.md):
// for the tests of FormatConfig's output and of the docs' settings table.
#pragma once

#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace ferry::testing {

/// Split config `text` into its "name = value" lines, in order: blank lines and comments
/// skipped, a trailing "  # note" dropped, names and values trimmed of blanks (and \r), values
/// unquoted. A line without '=' is skipped, and passed to `malformed` when one is given.
inline std::vector<std::pair<std::string, std::string>> SettingLines(
    const std::string& text, const std::function<void(const std::string&)>& malformed = nullptr) {
  auto trim = [](const std::string& v) {
    size_t b = v.find_first_not_of(" \t\r");
    return b == std::string::npos ? std::string()
                                  : v.substr(b, v.find_last_not_of(" \t\r") - b + 1);
  };
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      if (malformed) malformed(line);
      continue;
    }
    std::string value = line.substr(eq + 1);
    if (size_t note = value.find("  #"); note != std::string::npos) value.resize(note);
    value = trim(value);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    out.emplace_back(trim(line.substr(0, eq)), value);
  }
  return out;
}

}  // namespace ferry::testing
