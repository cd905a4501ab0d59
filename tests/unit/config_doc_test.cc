// Keeps the settings table of docs/operations.md ("## Configuration") honest: one row per
// setting of ferryd's settings table (server/settings.cc, SettingsTable()), in its order,
// each with the default the table declares; and --help and --check-config show the same
// settings as the table. Command-line-only flags (--config, the actions) and hidden test-only
// settings (scope kHiddenForTest, names ending in -for-test) have no row.
//
// The docs table's contract, which this test enforces:
//   | `name` | DEFAULT | meaning |
// where DEFAULT is `VALUE` (the config-file value; text may follow the closing backtick) or
// starts with "none" or "off" (an empty value). `<device>` in a VALUE stands for the device
// ordinal (the default listen endpoint), as in the table. A range "LO..HI" in the meaning of
// a count is the range the table gives it.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "config_lines.h"
#include "settings.h"

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
  std::string meaning;       // the meaning column, trimmed
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
    if (cells.size() > 2) row.meaning = cells[2];
    rows.push_back(std::move(row));
  }
  return rows;
}

// Return the value a default cell documents ("" for none/off); fails the test on a cell that
// follows neither form.
std::string DocumentedValue(const DocRow& row) {
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
  return testing::SettingLines(FormatConfig(config), [](const std::string& line) {
    ADD_FAILURE() << "FormatConfig line without '=': " << line;
  });
}

// The settings the docs table must have, in the settings table's order.
std::vector<const Setting*> DocumentedSettings() {
  std::vector<const Setting*> out;
  for (const Setting& s : SettingsTable()) {
    if (s.scope == SettingScope::kSetting) out.push_back(&s);
  }
  return out;
}

std::vector<std::string> Names(const std::vector<const Setting*>& settings) {
  std::vector<std::string> out;
  for (const Setting* s : settings) out.push_back(s->name);
  return out;
}

// The flags --help documents, in its order.
std::vector<std::string> HelpFlags() {
  std::vector<std::string> flags;
  std::istringstream in(FlagsHelp());
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("  --", 0) != 0) continue;  // continuation lines are indented further
    flags.push_back(line.substr(4, line.find(' ', 4) - 4));
  }
  return flags;
}

TEST(ConfigDocTest, HelpAndCheckConfigShowTheTable) {
  // --help: every row but the hidden ones, in the table's order.
  std::vector<std::string> shown;
  for (const Setting& s : SettingsTable()) {
    if (s.scope != SettingScope::kHiddenForTest) shown.push_back(s.name);
  }
  EXPECT_EQ(HelpFlags(), shown) << FlagsHelp();
  // --check-config of the defaults: every setting the file takes, once each, in that order.
  auto defaults = ParseConfigText("", "empty");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  std::vector<std::string> printed;
  for (const auto& [name, value] : FormattedSettings(*defaults)) {
    if (printed.empty() || printed.back() != name) printed.push_back(name);
  }
  EXPECT_EQ(printed, Names(DocumentedSettings())) << FormatConfig(*defaults);
  for (const Setting& s : SettingsTable()) {
    EXPECT_EQ(s.scope == SettingScope::kHiddenForTest, EndsWith(s.name, kTestOnlySuffix))
        << s.name << ": hidden test-only settings, and only they, end in " << kTestOnlySuffix;
  }
}

TEST(ConfigDocTest, TableHasOneRowPerSettingInTableOrder) {
  std::vector<DocRow> rows = ConfigTableRows(ReadDoc());
  ASSERT_FALSE(rows.empty()) << "no settings table under '## Configuration' in " << kDocPath;

  const std::vector<std::string> settings = Names(DocumentedSettings());
  std::vector<std::string> documented;
  std::set<std::string> seen;
  for (const DocRow& row : rows) {
    const Setting* s = FindSetting(row.name);
    if (s != nullptr && s->scope != SettingScope::kSetting) {
      ADD_FAILURE() << kDocPath << ":" << row.line << ": '" << row.name
                    << "' is a command-line flag or a hidden test-only setting; leave it out "
                       "of the table";
      continue;
    }
    EXPECT_TRUE(seen.insert(row.name).second)
        << kDocPath << ":" << row.line << ": '" << row.name << "' has more than one row";
    EXPECT_NE(s, nullptr) << kDocPath << ":" << row.line << ": '" << row.name
                          << "' is not a ferryd setting (server/settings.cc has no such row)";
    documented.push_back(row.name);
  }
  for (const std::string& name : settings) {
    EXPECT_TRUE(seen.count(name)) << "setting '" << name << "' has no row in the table of "
                                  << kDocPath << " (## Configuration)";
  }
  // Same set: then the order must be the table's (which is --help's).
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

TEST(ConfigDocTest, DefaultsMatchTheTable) {
  std::vector<DocRow> rows = ConfigTableRows(ReadDoc());
  ASSERT_FALSE(rows.empty());
  for (const DocRow& row : rows) {
    const Setting* s = FindSetting(row.name);
    if (s == nullptr) continue;  // reported by TableHasOneRowPerSettingInTableOrder
    EXPECT_EQ(DocumentedValue(row), DocumentedDefault(*s))
        << kDocPath << ":" << row.line << ": the default of '" << row.name << "' is documented as '"
        << row.default_cell << "'; ferryd --help says '" << DocumentedDefault(*s) << "'";
  }
  // What the docs and --help say is what ferryd runs with: --check-config of an empty config
  // prints each setting's documented default (`<device>` standing for the device's ordinal).
  auto defaults = ParseConfigText("", "empty");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  std::map<std::string, std::string> printed;
  for (const auto& [name, value] : FormattedSettings(*defaults)) {
    printed[name] += (printed[name].empty() ? "" : ", ") + value;
  }
  for (const Setting* s : DocumentedSettings()) {
    std::string want = DocumentedDefault(*s);
    if (size_t at = want.find("<device>"); at != std::string::npos) {
      want.replace(at, 8, std::to_string(defaults->device));
    }
    EXPECT_EQ(printed[s->name], want) << s->name;
  }
}

TEST(ConfigDocTest, RangesAreTheTables) {
  // A count's "LO..HI", where the docs or --help name one, is its range in the table.
  const std::regex range("\\b([0-9]+)\\.\\.([0-9]+)\\b");
  auto check = [&](const Setting& s, const std::string& text, const std::string& where) {
    if (!s.bounds) return;
    const std::string want =
        std::to_string(s.bounds->first) + ".." + std::to_string(s.bounds->second);
    for (std::sregex_iterator it(text.begin(), text.end(), range), end; it != end; ++it) {
      EXPECT_EQ(it->str(), want) << where << ": '" << s.name << "' takes " << want;
    }
  };
  for (const DocRow& row : ConfigTableRows(ReadDoc())) {
    if (const Setting* s = FindSetting(row.name)) {
      check(*s, row.meaning, std::string(kDocPath) + ":" + std::to_string(row.line));
    }
  }
  for (const Setting& s : SettingsTable()) check(s, s.help, "server/settings.cc");
}

TEST(ConfigDocTest, DeviceInDefaultListenFollowsTheDevice) {
  // The `<device>` placeholder holds for any ordinal, not just the default one.
  for (const DocRow& row : ConfigTableRows(ReadDoc())) {
    std::string doc_value = DocumentedValue(row);
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
