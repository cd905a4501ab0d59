// Keeps the settings table of docs/operations.md ("## Configuration") honest: one row per
// setting ferryd knows, in --help order, each with the default the code reports.
//
// The code's own lists: FormatConfig (what --check-config prints) writes every setting, defaults
// included, one "name = value" line each; FlagsHelp (--help) lists every documented flag. Hidden
// test-only settings (names ending in -for-test) are in neither (FormatConfig prints
// host-fault-after-ops-for-test only when it is set) and must not be in the table.
//
// The table's contract, which this test enforces:
//   | `name` | DEFAULT | meaning |
// where DEFAULT is `VALUE` (the config-file value; text may follow the closing backtick) or
// starts with "none" or "off" (an empty value). `<device>` in a VALUE stands for the device
// ordinal (the default listen endpoint).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config.h"

#ifndef FERRY_SOURCE_DIR
#error "FERRY_SOURCE_DIR must name the source tree (tests/CMakeLists.txt defines it)"
#endif

namespace ferry {
namespace {

constexpr char kDocPath[] = FERRY_SOURCE_DIR "/docs/operations.md";
constexpr char kTestOnlySuffix[] = "-for-test";

struct DocRow {
  int line = 0;              // 1-based line in operations.md
  std::string name;          // the setting, without backticks
  std::string default_cell;  // the default column, trimmed
};

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Return the text of operations.md; fails the test (empty result) when it cannot be read.
std::string ReadDoc() {
  std::ifstream in(kDocPath);
  EXPECT_TRUE(in.is_open()) << "cannot read " << kDocPath;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Return the table rows of the "## Configuration" section (header and separator rows left out).
std::vector<DocRow> ConfigTableRows(const std::string& doc) {
  std::vector<DocRow> rows;
  std::istringstream in(doc);
  std::string line;
  bool in_section = false;
  bool header_seen = false;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.rfind("## ", 0) == 0) {
      in_section = line == "## Configuration";
      continue;
    }
    if (!in_section || line.rfind("|", 0) != 0) continue;
    // Cells between the outer pipes. No cell of this table holds a '|' of its own.
    std::vector<std::string> cells;
    std::string rest = line.substr(1);
    for (size_t bar; (bar = rest.find('|')) != std::string::npos; rest = rest.substr(bar + 1)) {
      cells.push_back(Trim(rest.substr(0, bar)));
    }
    if (!header_seen) {  // "| setting | default | meaning |", then "|---|---|---|"
      header_seen = true;
      EXPECT_EQ(cells, (std::vector<std::string>{"setting", "default", "meaning"}))
          << kDocPath << ":" << line_no << ": unexpected table header";
      continue;
    }
    if (!cells.empty() && cells[0].find_first_not_of("-:") == std::string::npos) continue;
    EXPECT_EQ(cells.size(), 3u) << kDocPath << ":" << line_no << ": a row needs 3 cells: " << line;
    if (cells.size() < 2) continue;
    DocRow row;
    row.line = line_no;
    row.name = cells[0];
    if (row.name.size() >= 2 && row.name.front() == '`' && row.name.back() == '`') {
      row.name = row.name.substr(1, row.name.size() - 2);
    } else {
      ADD_FAILURE() << kDocPath << ":" << line_no << ": the setting cell must be `name`, got '"
                    << cells[0] << "'";
    }
    row.default_cell = cells[1];
    rows.push_back(std::move(row));
  }
  return rows;
}

// Return the value a default cell documents ("" for none/off); fails the test on a cell that
// follows neither form.
std::string DocumentedDefault(const DocRow& row) {
  const std::string& cell = row.default_cell;
  if (cell.rfind("`", 0) == 0) {
    size_t close = cell.find('`', 1);
    if (close != std::string::npos) return cell.substr(1, close - 1);
  } else if (cell.rfind("none", 0) == 0 || cell.rfind("off", 0) == 0) {
    return "";
  }
  ADD_FAILURE() << kDocPath << ":" << row.line << ": the default of '" << row.name
                << "' must be `VALUE`, none or off, got '" << cell << "'";
  return "";
}

// Parse FormatConfig's output into (name, value) pairs in its order, values unquoted and with
// a trailing "  # note" removed. `listen` appears once per endpoint.
std::vector<std::pair<std::string, std::string>> FormattedSettings(const DaemonConfig& config) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(FormatConfig(config));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    EXPECT_NE(eq, std::string::npos) << "FormatConfig line without '=': " << line;
    if (eq == std::string::npos) continue;
    std::string value = line.substr(eq + 1);
    if (size_t note = value.find("  #"); note != std::string::npos) value.resize(note);
    value = Trim(value);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    out.emplace_back(Trim(line.substr(0, eq)), value);
  }
  return out;
}

// Every setting with its default, as --check-config prints them for an empty config.
std::vector<std::pair<std::string, std::string>> CodeDefaults() {
  auto config = ParseConfigText("", "empty");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  if (!config.ok()) return {};
  return FormattedSettings(*config);
}

// The flags --help documents, in its order ("--version, --help" gives both).
std::vector<std::string> HelpFlags() {
  std::vector<std::string> flags;
  std::istringstream in(FlagsHelp());
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("  --", 0) != 0) continue;  // continuation lines are indented further
    std::string rest = line.substr(2);
    // "--name ARG  text" or "--a, --b": names up to the first space; ", " separates names.
    while (rest.rfind("--", 0) == 0) {
      size_t end = rest.find_first_of(" ,", 2);
      flags.push_back(rest.substr(2, end == std::string::npos ? std::string::npos : end - 2));
      if (end == std::string::npos || rest.compare(end, 2, ", ") != 0) break;
      rest = rest.substr(end + 2);
    }
  }
  return flags;
}

// True when the config file accepts `name` (command-line-only flags are refused there).
bool IsFileSetting(const std::string& name, const std::string& value) {
  auto parsed = ParseConfigText(name + " = " + value, "probe");
  return parsed.ok() || parsed.status().message().find("can only be given on the command line") ==
                            std::string::npos;
}

TEST(ConfigDocTest, CodeListsAgree) {
  // FormatConfig and --help must name the same settings in the same order, or the table's
  // reference order is ambiguous.
  std::vector<std::string> formatted;
  std::map<std::string, std::string> defaults;
  for (const auto& [name, value] : CodeDefaults()) {
    if (std::find(formatted.begin(), formatted.end(), name) == formatted.end()) {
      formatted.push_back(name);
    }
    defaults.emplace(name, value);
  }
  ASSERT_FALSE(formatted.empty());
  std::vector<std::string> help_settings;
  for (const std::string& flag : HelpFlags()) {
    auto it = defaults.find(flag);
    if (IsFileSetting(flag, it == defaults.end() ? "x" : it->second)) help_settings.push_back(flag);
  }
  EXPECT_EQ(help_settings, formatted)
      << "--help lists: " << Join(help_settings) << "\n--check-config prints: " << Join(formatted);
}

TEST(ConfigDocTest, TableHasOneRowPerSettingInHelpOrder) {
  std::vector<DocRow> rows = ConfigTableRows(ReadDoc());
  ASSERT_FALSE(rows.empty()) << "no settings table under '## Configuration' in " << kDocPath;

  std::vector<std::string> settings;  // every setting ferryd knows, in --help order
  for (const auto& [name, value] : CodeDefaults()) {
    if (std::find(settings.begin(), settings.end(), name) == settings.end()) {
      settings.push_back(name);
    }
  }
  std::vector<std::string> documented;
  std::set<std::string> seen;
  for (const DocRow& row : rows) {
    if (EndsWith(row.name, kTestOnlySuffix)) {
      ADD_FAILURE() << kDocPath << ":" << row.line << ": '" << row.name
                    << "' is a hidden test-only flag; leave it out of the table";
      continue;
    }
    EXPECT_TRUE(seen.insert(row.name).second)
        << kDocPath << ":" << row.line << ": '" << row.name << "' has more than one row";
    bool known = std::find(settings.begin(), settings.end(), row.name) != settings.end();
    EXPECT_TRUE(known) << kDocPath << ":" << row.line << ": '" << row.name
                       << "' is not a ferryd setting (--check-config does not print it)";
    documented.push_back(row.name);
  }
  for (const std::string& name : settings) {
    EXPECT_TRUE(seen.count(name)) << "setting '" << name << "' has no row in the table of "
                                  << kDocPath << " (## Configuration)";
  }
  // Same set: then the order must be --help's.
  std::vector<std::string> sorted_doc = documented, sorted_code = settings;
  std::sort(sorted_doc.begin(), sorted_doc.end());
  std::sort(sorted_code.begin(), sorted_code.end());
  if (sorted_doc != sorted_code) return;
  auto [doc_at, code_at] = std::mismatch(documented.begin(), documented.end(), settings.begin());
  if (doc_at != documented.end()) {
    const DocRow& row = rows[doc_at - documented.begin()];
    ADD_FAILURE() << kDocPath << ":" << row.line << ": the table's rows are not in --help order: '"
                  << row.name << "' is where --help has '" << *code_at
                  << "'\n  table:  " << Join(documented) << "\n  --help: " << Join(settings);
  }
}

TEST(ConfigDocTest, DefaultsMatchTheCode) {
  std::vector<DocRow> rows = ConfigTableRows(ReadDoc());
  ASSERT_FALSE(rows.empty());
  auto defaults = CodeDefaults();
  auto code_default = [&](const std::string& name) -> const std::string* {
    for (const auto& [n, v] : defaults) {
      if (n == name) return &v;
    }
    return nullptr;
  };
  const std::string* device = code_default("device");
  ASSERT_NE(device, nullptr);
  for (const DocRow& row : rows) {
    const std::string* want = code_default(row.name);
    if (want == nullptr) continue;  // reported by TableHasOneRowPerSettingInHelpOrder
    std::string doc_value = DocumentedDefault(row);
    std::string expanded = doc_value;
    if (size_t at = expanded.find("<device>"); at != std::string::npos) {
      expanded.replace(at, 8, *device);
    }
    EXPECT_EQ(expanded, *want) << kDocPath << ":" << row.line << ": the default of '" << row.name
                               << "' is documented as '" << row.default_cell
                               << "'; ferryd --check-config prints '" << *want << "'";
  }
}

TEST(ConfigDocTest, DeviceInDefaultListenFollowsTheDevice) {
  // The `<device>` placeholder holds for any ordinal, not just the default one.
  for (const DocRow& row : ConfigTableRows(ReadDoc())) {
    std::string doc_value = DocumentedDefault(row);
    size_t at = doc_value.find("<device>");
    if (at == std::string::npos) continue;
    auto config = ParseConfigText("device = 3", "probe");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    std::string value = doc_value;
    value.replace(at, 8, "3");
    bool found = false;
    for (const auto& [name, v] : FormattedSettings(*config))
      found |= name == row.name && v == value;
    EXPECT_TRUE(found) << kDocPath << ":" << row.line << ": with device = 3, '" << row.name
                       << "' is not " << value << ":\n"
                       << FormatConfig(*config);
  }
}

}  // namespace
}  // namespace ferry
