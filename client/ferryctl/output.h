// ferryctl's output: aligned tables for people, JSON for scripts, human units.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/json.h"

namespace ferry::ctl {

/// A table printed with aligned columns. Numeric columns (added with right_align) line up
/// on the right. Not thread-safe.
class Table {
 public:
  /// Add a column; `right_align` for numbers.
  void AddColumn(std::string header, bool right_align = false);
  /// Add a row: one cell per column.
  void AddRow(std::vector<std::string> cells);
  /// Return the table, header first, two spaces between columns, no trailing spaces.
  std::string Render() const;

 private:
  struct Column {
    std::string header;
    bool right_align;
  };
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

/// Render "key  value" lines with the keys padded to one width.
std::string RenderKeyValues(const std::vector<std::pair<std::string, std::string>>& rows);

/// Builds one JSON object, field by field, in insertion order.
class JsonObject {
 public:
  JsonObject& Add(std::string_view key, std::string_view value);
  JsonObject& Add(std::string_view key, const char* value) {
    return Add(key, std::string_view(value));
  }
  JsonObject& Add(std::string_view key, uint64_t value);
  JsonObject& Add(std::string_view key, int64_t value);
  JsonObject& Add(std::string_view key, int value) { return Add(key, int64_t{value}); }
  JsonObject& Add(std::string_view key, uint32_t value) { return Add(key, uint64_t{value}); }
  JsonObject& Add(std::string_view key, double value);
  JsonObject& Add(std::string_view key, bool value);
  /// Add already-encoded JSON (an object or array built elsewhere).
  JsonObject& AddRaw(std::string_view key, std::string_view json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void Key(std::string_view key);
  std::string body_;
};

/// Return `items` (each already JSON) as a JSON array.
std::string JsonArray(const std::vector<std::string>& items);

/// Quote and escape a string for JSON (ferry/json.h, shared with ferry-bench).
using ::ferry::JsonString;

/// "0 B", "512 B", "1.5 KiB", "7.94 GiB": three significant digits.
std::string HumanBytes(uint64_t bytes);

/// "850 ms", "12.3 s", "5m 06s", "3h 02m", "4d 07h".
std::string HumanDuration(uint64_t ms);

/// "12.345 ms" style, for measured latencies.
std::string HumanMillis(double ms);

}  // namespace ferry::ctl
