#include "output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ferry::ctl {

void Table::AddColumn(std::string header, bool right_align) {
  columns_.push_back({std::move(header), right_align});
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].header.size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string pad(width[c] - cells[c].size(), ' ');
      if (c > 0) out += "  ";
      out += columns_[c].right_align ? pad + cells[c] : cells[c] + pad;
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::vector<std::string> headers;
  for (const auto& col : columns_) headers.push_back(col.header);
  std::string out = line(headers);
  for (const auto& row : rows_) out += line(row);
  return out;
}

std::string RenderKeyValues(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t w = 0;
  for (const auto& [k, v] : rows) w = std::max(w, k.size());
  std::string out;
  for (const auto& [k, v] : rows) out += k + std::string(w - k.size() + 2, ' ') + v + "\n";
  return out;
}

void JsonObject::Key(std::string_view key) {
  if (!body_.empty()) body_ += ",";
  body_ += JsonString(key) + ":";
}

JsonObject& JsonObject::Add(std::string_view key, std::string_view value) {
  Key(key);
  body_ += JsonString(value);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view key, uint64_t value) {
  Key(key);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view key, int64_t value) {
  Key(key);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view key, double value) {
  Key(key);
  if (!std::isfinite(value)) {
    body_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", value);
    body_ += buf;
  }
  return *this;
}

JsonObject& JsonObject::Add(std::string_view key, bool value) {
  Key(key);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::AddRaw(std::string_view key, std::string_view json) {
  Key(key);
  body_ += json;
  return *this;
}

std::string JsonArray(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ",";
    out += items[i];
  }
  return out + "]";
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf),
                v >= 100  ? "%.0f %s"
                : v >= 10 ? "%.1f %s"
                          : "%.2f %s",
                v, kUnits[u]);
  return buf;
}

std::string HumanDuration(uint64_t ms) {
  char buf[48];
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%llu ms", static_cast<unsigned long long>(ms));
  } else if (ms < 60'000) {
    std::snprintf(buf, sizeof(buf), "%.1f s", ms / 1000.0);
  } else if (ms < 3'600'000) {
    std::snprintf(buf, sizeof(buf), "%llum %02llus", static_cast<unsigned long long>(ms / 60'000),
                  static_cast<unsigned long long>(ms / 1000 % 60));
  } else if (ms < 86'400'000) {
    std::snprintf(buf, sizeof(buf), "%lluh %02llum",
                  static_cast<unsigned long long>(ms / 3'600'000),
                  static_cast<unsigned long long>(ms / 60'000 % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llud %02lluh",
                  static_cast<unsigned long long>(ms / 86'400'000),
                  static_cast<unsigned long long>(ms / 3'600'000 % 24));
  }
  return buf;
}

std::string HumanMillis(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), ms < 10 ? "%.2f ms" : ms < 1000 ? "%.1f ms" : "%.0f ms", ms);
  return buf;
}

}  // namespace ferry::ctl
