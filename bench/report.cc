// ferry-bench output: aligned text tables, JSON and SVG, all written by hand (no deps).
#include "report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "ferry/json.h"
#include "ferry/version.h"

namespace ferry::bench {
namespace {

// --- text tables --------------------------------------------------------------------------

std::string FormatValue(double v) {
  if (std::isnan(v)) return "-";
  char buf[64];
  double a = std::fabs(v);
  if (a == 0) {
    std::snprintf(buf, sizeof buf, "0");
  } else if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  } else if (a >= 1000) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (a >= 100) {
    std::snprintf(buf, sizeof buf, "%.1f", v);
  } else if (a >= 10) {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  } else if (a >= 0.01) {
    std::snprintf(buf, sizeof buf, "%.3f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.2e", v);
  }
  return buf;
}

std::string FormatRatio(double r) {
  if (std::isnan(r)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 100 ? "%.0fx" : "%.2fx", r);
  return buf;
}

std::string Pad(const std::string& s, size_t width, bool right) {
  if (s.size() >= width) return s;
  std::string fill(width - s.size(), ' ');
  return right ? fill + s : s + fill;
}

std::string DescribeBaseline(const Context& ctx) {
  if (!ctx.baseline) return "no baseline (pass --baseline)";
  std::string s = "in process, " + ctx.baseline->backend + " backend";
  if (ctx.baseline->device) s += " (" + ctx.baseline->device->info().name + ")";
  if (ctx.baseline->backend == "host") s += ", no GPU visible";
  return s;
}

std::string DescribeTarget(const Context& ctx, const std::string& target) {
  for (const auto& t : ctx.targets) {
    if (t.target == target) {
      return t.target + " (ferryd " + t.version + ", " + t.backend + " backend, " + t.device_name +
             ")";
    }
  }
  return target;
}

// --- JSON ---------------------------------------------------------------------------------

std::string JsonNumber(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string JsonSummary(const Summary& s) {
  std::ostringstream o;
  o << "{\"n\": " << s.n << ", \"min_ns\": " << JsonNumber(s.min)
    << ", \"p50_ns\": " << JsonNumber(s.p50) << ", \"p99_ns\": " << JsonNumber(s.p99)
    << ", \"p999_ns\": " << JsonNumber(s.p999) << ", \"mean_ns\": " << JsonNumber(s.mean)
    << ", \"max_ns\": " << JsonNumber(s.max) << "}";
  return o.str();
}

std::string IsoDate() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string HostName() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// --- text table layout ----------------------------------------------------------------------

/// One column of a printed table: its metric group (set on a group's first column only), its
/// header and one cell per row.
struct Column {
  std::string group, header;
  std::vector<std::string> cells;
  bool right = true;
};

/// Which figures some row of a table has for one metric.
struct Has {
  bool daemon = false, baseline = false, comparable = false, mps = false, mps_measured = false;
};

/// The sub-columns a metric may have.
enum Which { kDaemon, kBaseline, kRatio, kMps, kMpsRatio };

/// The label column, then a table's text columns (none for a table of figures).
std::vector<Column> LabelAndTextColumns(const Table& table) {
  std::vector<Column> cols;
  Column label{"", "case", {}, false};
  for (const Row& r : table.rows) label.cells.push_back(r.label);
  cols.push_back(label);
  if (!table.text_columns.empty()) {
    for (size_t i = 0; i < table.text_columns.size(); ++i) {
      Column c{"", table.text_columns[i], {}, false};
      for (const Row& r : table.rows) c.cells.push_back(i < r.cells.size() ? r.cells[i] : "");
      cols.push_back(c);
    }
  }
  return cols;
}

/// The metrics of a table's figures in order of first appearance, and which figures each has.
std::map<std::string, Has> MetricsOf(const Table& table, std::vector<std::string>* metrics) {
  std::map<std::string, Has> has;
  for (const Row& r : table.rows) {
    for (const Figure& f : r.figures) {
      if (!has.count(f.metric)) metrics->push_back(f.metric);
      Has& h = has[f.metric];
      h.daemon |= !std::isnan(f.daemon);
      h.baseline |= !std::isnan(f.baseline);
      h.comparable |= f.comparable;
      h.mps |= f.mps.has_value();
      h.mps_measured |= f.mps.has_value() && !std::isnan(*f.mps);
    }
  }
  return has;
}

/// Row r's cell in metric m's sub-column `which`; "" when r has no figure for m.
std::string FigureCell(const Row& r, const std::string& m, Which which) {
  for (const Figure& f : r.figures) {
    if (f.metric != m) continue;
    switch (which) {
      case kDaemon:
        return FormatValue(f.daemon);
      case kBaseline:
        return FormatValue(f.baseline);
      case kRatio:
        return FormatRatio(f.ratio());
      case kMps:
        if (!f.mps) return std::string("-");
        return std::isnan(*f.mps) ? std::string("n/a") : FormatValue(*f.mps);
      case kMpsRatio:
        return FormatRatio(f.mps && f.comparable && *f.mps != 0 ? f.daemon / *f.mps : kNaN);
    }
  }
  return std::string();
}

/// Whether metric sub-column `which` is shown: some row filled it (a ratio: both sides, and
/// the figures are comparable).
bool Shown(const Has& h, Which which) {
  switch (which) {
    case kDaemon:
      return h.daemon;
    case kBaseline:
      return h.baseline;
    case kRatio:
      return h.daemon && h.baseline && h.comparable;
    case kMps:
      return h.mps;
    case kMpsRatio:
      return h.daemon && h.mps_measured && h.comparable;
  }
  return false;
}

/// Append, per metric (in order of first appearance), the daemon figure, the baseline figure
/// and daemon/baseline, and with an MPS arm the MPS figure and daemon/MPS; a sub-column
/// nobody filled is left out.
void AppendMetricColumns(const Table& table, std::vector<Column>* cols) {
  std::vector<std::string> metrics;
  const std::map<std::string, Has> has = MetricsOf(table, &metrics);
  for (const std::string& m : metrics) {
    bool first = true;
    for (Which which : {kDaemon, kBaseline, kRatio, kMps, kMpsRatio}) {
      if (!Shown(has.at(m), which)) continue;
      Column c;
      c.group = first ? m : "";
      first = false;
      c.header = which == kDaemon     ? table.daemon_label
                 : which == kBaseline ? table.baseline_label
                 : which == kRatio    ? "ratio"
                 : which == kMps      ? "MPS"
                                      : "vs MPS";
      for (const Row& r : table.rows) c.cells.push_back(FigureCell(r, m, which));
      cols->push_back(c);
    }
  }
}

/// Each column's width: its widest header or cell, the first column of a metric group widened
/// when the metric's name is longer than the group's columns.
std::vector<size_t> ColumnWidths(const std::vector<Column>& cols) {
  std::vector<size_t> width;
  for (const Column& c : cols) {
    size_t w = c.header.size();
    for (const auto& s : c.cells) w = std::max(w, s.size());
    width.push_back(w);
  }
  for (size_t i = 0; i < cols.size(); ++i) {
    if (cols[i].group.empty()) continue;
    size_t span = width[i], j = i + 1;
    while (j < cols.size() && cols[j].group.empty()) span += 2 + width[j++];
    if (cols[i].group.size() > span) width[i] += cols[i].group.size() - span;
  }
  return width;
}

std::string RightTrimmed(std::string line) {
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

/// Print the columns: each metric's name over its sub-columns (none for a text table), the
/// sub-column headers, then one line per row.
void PrintColumns(std::ostream& out, const std::vector<Column>& cols, size_t rows) {
  const std::vector<size_t> width = ColumnWidths(cols);
  auto sep = [&](size_t i) { return i == 0 ? "" : (cols[i].group.empty() ? "  " : "   "); };
  std::string line1 = std::string(width[0], ' ');
  for (size_t i = 1; i < cols.size();) {
    size_t span = width[i], j = i + 1;
    while (j < cols.size() && cols[j].group.empty()) span += 2 + width[j++];
    line1 += sep(i) + Pad(cols[i].group, span, false);
    i = j;
  }
  std::string header;
  for (size_t i = 0; i < cols.size(); ++i) {
    header += sep(i) + Pad(cols[i].header, width[i], cols[i].right);
  }
  if (!RightTrimmed(line1).empty()) out << RightTrimmed(line1) << "\n";
  out << RightTrimmed(header) << "\n";
  for (size_t r = 0; r < rows; ++r) {
    std::string row;
    for (size_t i = 0; i < cols.size(); ++i) {
      row += sep(i) + Pad(cols[i].cells[r], width[i], cols[i].right);
    }
    out << RightTrimmed(row) << "\n";
  }
}

// --- JSON and SVG files -------------------------------------------------------------------

/// Write `text` to `path`; false, saying so on stderr, when it cannot be written.
bool WriteFileOrSay(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) {
    std::cerr << "ferry-bench: cannot write " << path << "\n";
    return false;
  }
  return true;
}

/// The "machine" object: this host, ferry's version, the device the figures are about (the
/// first daemon's, else the baseline's), the baseline and the targets. Ends with "},\n".
void WriteMachineJson(std::ostream& o, const Context& ctx) {
  struct utsname u {};
  uname(&u);
  o << "  \"machine\": {\n";
  o << "    \"hostname\": " << JsonString(HostName()) << ",\n";
  o << "    \"cores\": " << std::thread::hardware_concurrency() << ",\n";
  o << "    \"os\": " << JsonString(std::string(u.sysname) + " " + u.release + " " + u.machine)
    << ",\n";
  o << "    \"date\": " << JsonString(IsoDate()) << ",\n";
  o << "    \"ferry_version\": " << JsonString(kVersion) << ",\n";
  o << "    \"ferry_commit\": " << JsonString(kGitCommit) << ",\n";
  std::string dev_name, dev_backend;
  if (!ctx.targets.empty()) {
    dev_name = ctx.targets[0].device_name;
    dev_backend = ctx.targets[0].backend;
  } else if (ctx.baseline && ctx.baseline->device) {
    dev_name = ctx.baseline->device->info().name;
    dev_backend = ctx.baseline->backend;
  }
  o << "    \"device\": {\"name\": " << JsonString(dev_name)
    << ", \"backend\": " << JsonString(dev_backend) << "},\n";
  o << "    \"baseline\": ";
  if (ctx.baseline && ctx.baseline->device) {
    o << "{\"backend\": " << JsonString(ctx.baseline->backend)
      << ", \"device_name\": " << JsonString(ctx.baseline->device->info().name)
      << ", \"why\": " << JsonString(ctx.baseline->why) << "},\n";
  } else {
    o << "null,\n";
  }
  o << "    \"targets\": [";
  for (size_t i = 0; i < ctx.targets.size(); ++i) {
    const auto& t = ctx.targets[i];
    o << (i ? ", " : "") << "{\"target\": " << JsonString(t.target)
      << ", \"backend\": " << JsonString(t.backend)
      << ", \"device_name\": " << JsonString(t.device_name)
      << ", \"ferryd_version\": " << JsonString(t.version) << "}";
  }
  o << "]\n  },\n";
}

/// The "command", "options" and "mps" members (the MPS arm: whether it ran, and why not).
void WriteRunJson(std::ostream& o, const Context& ctx) {
  o << "  \"command\": " << JsonString(ctx.options.command_line) << ",\n";
  o << "  \"options\": {\"quick\": " << (ctx.options.quick ? "true" : "false")
    << ", \"baseline\": " << (ctx.options.baseline ? "true" : "false")
    << ", \"iterations\": " << ctx.options.iterations
    << ", \"baseline_mps\": " << (ctx.options.baseline_mps ? "true" : "false") << "},\n";
  o << "  \"mps\": ";
  if (ctx.mps) {
    o << "{\"available\": " << (ctx.mps->available() ? "true" : "false")
      << ", \"control\": " << JsonString(ctx.mps->control)
      << ", \"why_not\": " << JsonString(ctx.mps->why_not) << "},\n";
  } else {
    o << "null,\n";
  }
}

/// One row's object: its case, params and tags, figures, text cells and sample summaries.
void WriteRowJson(std::ostream& o, const Row& r) {
  o << "\n        {\"case\": " << JsonString(r.label);
  for (const auto& [k, v] : r.params) o << ", " << JsonString(k) << ": " << JsonNumber(v);
  for (const auto& [k, v] : r.tags) o << ", " << JsonString(k) << ": " << JsonString(v);
  o << ",\n         \"figures\": [";
  for (size_t fi = 0; fi < r.figures.size(); ++fi) {
    const Figure& f = r.figures[fi];
    o << (fi ? ", " : "") << "{\"metric\": " << JsonString(f.metric)
      << ", \"daemon\": " << JsonNumber(f.daemon) << ", \"baseline\": " << JsonNumber(f.baseline)
      << ", \"ratio\": " << JsonNumber(f.ratio());
    // "mps": null where the arm could not run; left out where there is none.
    if (f.mps) o << ", \"mps\": " << JsonNumber(*f.mps);
    o << "}";
  }
  o << "],\n         \"cells\": [";
  for (size_t ci = 0; ci < r.cells.size(); ++ci) o << (ci ? ", " : "") << JsonString(r.cells[ci]);
  o << "],\n         \"samples\": {";
  for (size_t k = 0; k < r.summaries.size(); ++k) {
    o << (k ? ", " : "") << JsonString(r.summaries[k].first) << ": "
      << JsonSummary(r.summaries[k].second);
  }
  o << "}}";
}

/// One table's object: its target, labels, text columns, notes and rows.
void WriteTableJson(std::ostream& o, const Table& t) {
  o << "\n      {\"target\": " << JsonString(t.target)
    << ", \"daemon_label\": " << JsonString(t.daemon_label)
    << ", \"baseline_label\": " << JsonString(t.baseline_label) << ", \"columns\": [";
  for (size_t c = 0; c < t.text_columns.size(); ++c) {
    o << (c ? ", " : "") << JsonString(t.text_columns[c]);
  }
  o << "], \"notes\": [";
  for (size_t n = 0; n < t.notes.size(); ++n) o << (n ? ", " : "") << JsonString(t.notes[n]);
  o << "],\n       \"rows\": [";
  for (size_t ri = 0; ri < t.rows.size(); ++ri) {
    o << (ri ? "," : "");
    WriteRowJson(o, t.rows[ri]);
  }
  o << "]}";
}

/// The "scenarios" member: scenario name -> list of its tables (one per target, "all
/// targets", ...), scenarios in order of first appearance.
void WriteScenariosJson(std::ostream& o, const std::vector<Table>& tables) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Table*>> by_scenario;
  for (const Table& t : tables) {
    if (!by_scenario.count(t.scenario)) order.push_back(t.scenario);
    by_scenario[t.scenario].push_back(&t);
  }
  o << "  \"scenarios\": {";
  for (size_t si = 0; si < order.size(); ++si) {
    o << (si ? "," : "") << "\n    " << JsonString(order[si]) << ": [";
    const auto& list = by_scenario[order[si]];
    for (size_t ti = 0; ti < list.size(); ++ti) {
      o << (ti ? "," : "");
      WriteTableJson(o, *list[ti]);
    }
    o << "]";
  }
  o << "\n  }\n}\n";
}

// --- SVG chart ----------------------------------------------------------------------------

struct Point {
  double bytes, gbps;
};
/// One line of the chart: who (a daemon target or the baseline), route and direction.
struct Series {
  std::string name, color;
  bool dashed = false;
  std::vector<Point> points;
};

/// Add a point to the series `name` (made on first use); a point without a positive
/// bandwidth is dropped, and so is a second point of the same size (the baseline appears in
/// the rows of every route).
void AddPoint(std::vector<Series>& series, const std::string& name, const std::string& color,
              bool dashed, double bytes, double gbps) {
  if (std::isnan(gbps) || gbps <= 0) return;
  for (Series& s : series) {
    if (s.name == name) {
      for (const Point& p : s.points) {
        if (p.bytes == bytes) return;
      }
      s.points.push_back({bytes, gbps});
      return;
    }
  }
  series.push_back({name, color, dashed, {{bytes, gbps}}});
}

/// The GB/s series of the transfers tables of each target. Colour says the direction (and,
/// with several targets, which one); the baseline (from the first target's table) is dashed.
std::vector<Series> TransferSeries(const Context& ctx, const std::vector<Table>& tables) {
  std::vector<Series> series;
  // Upload colours (blues/greens), download colours (reds/oranges); entry 3 * target + route
  // (mod 4), route 0 = pending, 1 = blocking, 2 = streamed. The baselines are dashed, in greys.
  const char* up_colors[] = {"#1f77b4", "#2ca02c", "#9467bd", "#17becf"};
  const char* down_colors[] = {"#d62728", "#ff7f0e", "#8c564b", "#e377c2"};
  bool several = ctx.targets.size() > 1;
  bool baseline_done = false;
  int target_index = 0;
  for (const Table& t : tables) {
    if (t.scenario != "transfers" || t.target == "all targets") continue;
    for (const Row& r : t.rows) {
      double bytes = kNaN;
      std::string dir, route;
      bool other_baseline = false;  // rows against another baseline (gRPC bulk)
      for (const auto& [k, v] : r.params) {
        if (k == "bytes") bytes = v;
      }
      for (const auto& [k, v] : r.tags) {
        if (k == "direction") dir = v;
        if (k == "route") route = v;
        if (k == "baseline") other_baseline = true;
      }
      if (std::isnan(bytes) || dir.empty() || other_baseline) continue;
      bool up = dir == "upload";
      for (const Figure& f : r.figures) {
        if (f.metric != "GB/s") continue;
        std::string who = several ? "ferryd " + std::to_string(target_index + 1) + " " : "ferryd ";
        bool streamed = route.rfind("streamed", 0) == 0;
        int route_index = route.rfind("pending", 0) == 0 ? 0 : streamed ? 2 : 1;
        AddPoint(series, who + dir + " (" + route + ")",
                 (up ? up_colors : down_colors)[(3 * target_index + route_index) % 4], false, bytes,
                 f.daemon);
        if (!baseline_done) {
          AddPoint(
              series,
              "in process " + dir + (streamed ? " (pinned copies back to back)" : " (pinned copy)"),
              up ? (streamed ? "#555555" : "#222222") : (streamed ? "#bbbbbb" : "#999999"), true,
              bytes, f.baseline);
        }
      }
    }
    baseline_done = true;
    ++target_index;
  }
  return series;
}

std::string SvgEscape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

/// The chart's geometry: the plot area inside the picture and its log-scale axes, sized to
/// whole powers of two (x, bytes) and decades (y, GB/s) around the points.
struct ChartFrame {
  static constexpr double W = 960, H = 580, L = 80, R = 260, T = 80, B = 60;
  static constexpr double pw = W - L - R, ph = H - T - B;
  double lx0, lx1, ly0, ly1;

  explicit ChartFrame(const std::vector<Series>& series) {
    double xmin = 1e300, xmax = 0, ymin = 1e300, ymax = 0;
    for (const Series& se : series) {
      for (const Point& p : se.points) {
        xmin = std::min(xmin, p.bytes);
        xmax = std::max(xmax, p.bytes);
        ymin = std::min(ymin, p.gbps);
        ymax = std::max(ymax, p.gbps);
      }
    }
    lx0 = std::floor(std::log2(xmin)), lx1 = std::ceil(std::log2(xmax));
    if (lx1 <= lx0) lx1 = lx0 + 1;
    ly0 = std::floor(std::log10(ymin)), ly1 = std::ceil(std::log10(ymax));
    if (ly1 <= ly0) ly1 = ly0 + 1;
  }
  double X(double bytes) const { return L + (std::log2(bytes) - lx0) / (lx1 - lx0) * pw; }
  double Y(double gbps) const { return T + ph - (std::log10(gbps) - ly0) / (ly1 - ly0) * ph; }
};

/// The chart's title and the two subtitle lines: the targets and the baseline.
void WriteSvgTitle(std::ostream& s, const Context& ctx) {
  const double L = ChartFrame::L;
  bool several = ctx.targets.size() > 1;
  std::string subtitle;
  for (size_t i = 0; i < ctx.targets.size(); ++i) {
    const auto& t = ctx.targets[i];
    subtitle += (i ? "; " : "") + std::string("ferryd") +
                (several ? " " + std::to_string(i + 1) : std::string()) + ": " + t.target + " (" +
                t.backend + ", " + t.device_name + ")";
  }
  std::string subtitle2 = "dashed: " + DescribeBaseline(ctx);
  s << "<text x=\"" << L
    << "\" y=\"26\" font-size=\"16\">ferry-bench transfers: bandwidth vs "
       "size (ferry "
    << kVersion << " " << kGitCommit << ", " << IsoDate() << ")</text>\n";
  s << "<text x=\"" << L << "\" y=\"46\" font-size=\"11\" fill=\"#555\">" << SvgEscape(subtitle)
    << "</text>\n";
  s << "<text x=\"" << L << "\" y=\"60\" font-size=\"11\" fill=\"#555\">" << SvgEscape(subtitle2)
    << "</text>\n";
}

/// The grid (a vertical line per power of two, labelled every other one when crowded; a
/// horizontal line per decade), the plot's frame and the axis titles.
void WriteSvgAxes(std::ostream& s, const ChartFrame& c) {
  const double H = ChartFrame::H, L = ChartFrame::L, T = ChartFrame::T;
  const double pw = ChartFrame::pw, ph = ChartFrame::ph;
  for (double lx = c.lx0; lx <= c.lx1; lx += 1) {
    double x = c.X(std::pow(2.0, lx));
    s << "<line x1=\"" << x << "\" y1=\"" << T << "\" x2=\"" << x << "\" y2=\"" << T + ph
      << "\" stroke=\"#eee\"/>\n";
    if (c.lx1 - c.lx0 <= 10 || static_cast<int>(lx - c.lx0) % 2 == 0) {
      s << "<text x=\"" << x << "\" y=\"" << T + ph + 18 << "\" text-anchor=\"middle\">"
        << FormatBytes(static_cast<uint64_t>(std::pow(2.0, lx))) << "</text>\n";
    }
  }
  for (double ly = c.ly0; ly <= c.ly1; ly += 1) {
    double y = c.Y(std::pow(10.0, ly));
    char label[32];
    std::snprintf(label, sizeof label, "%g", std::pow(10.0, ly));
    s << "<line x1=\"" << L << "\" y1=\"" << y << "\" x2=\"" << L + pw << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/>\n";
    s << "<text x=\"" << L - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << label
      << "</text>\n";
  }
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#444\"/>\n";
  s << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 18
    << "\" text-anchor=\"middle\">transfer size (log scale)</text>\n";
  s << "<text transform=\"translate(22," << T + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">GB/s = bytes / median time (log scale)</text>\n";
}

/// Series i: its line (points sorted by size), a dot with a tooltip per point, and its legend
/// entry, the i-th down the right margin.
void WriteSvgSeries(std::ostream& s, const ChartFrame& c, Series& se, size_t i) {
  const double L = ChartFrame::L, T = ChartFrame::T, pw = ChartFrame::pw;
  std::sort(se.points.begin(), se.points.end(),
            [](const Point& a, const Point& b) { return a.bytes < b.bytes; });
  std::string dash = se.dashed ? " stroke-dasharray=\"6,4\"" : "";
  s << "<polyline fill=\"none\" stroke=\"" << se.color << "\" stroke-width=\"2\"" << dash
    << " points=\"";
  for (const Point& p : se.points) s << c.X(p.bytes) << "," << c.Y(p.gbps) << " ";
  s << "\"/>\n";
  for (const Point& p : se.points) {
    s << "<circle cx=\"" << c.X(p.bytes) << "\" cy=\"" << c.Y(p.gbps) << "\" r=\"3\" fill=\""
      << se.color << "\"><title>" << SvgEscape(se.name) << " "
      << FormatBytes(static_cast<uint64_t>(p.bytes)) << ": " << FormatValue(p.gbps)
      << " GB/s</title></circle>\n";
  }
  double ly = T + 10 + 20 * static_cast<double>(i);
  s << "<line x1=\"" << L + pw + 16 << "\" y1=\"" << ly << "\" x2=\"" << L + pw + 46 << "\" y2=\""
    << ly << "\" stroke=\"" << se.color << "\" stroke-width=\"2\"" << dash << "/>\n";
  s << "<text x=\"" << L + pw + 52 << "\" y=\"" << ly + 4 << "\" font-size=\"11\">"
    << SvgEscape(se.name) << "</text>\n";
}

}  // namespace

void PrintTable(std::ostream& out, const Context& ctx, const Table& table) {
  // Columns: the case label, a text table's own columns, then the metrics' sub-columns.
  std::vector<Column> cols = LabelAndTextColumns(table);
  AppendMetricColumns(table, &cols);
  out << "\n== " << table.scenario;
  if (!table.target.empty()) out << " | ferryd: " << DescribeTarget(ctx, table.target);
  out << "\n   baseline: "
      << (table.baseline_description.empty() ? DescribeBaseline(ctx) : table.baseline_description)
      << "\n";
  PrintColumns(out, cols, table.rows.size());
  for (const std::string& n : table.notes) out << "   * " << n << "\n";
}

bool WriteJson(const std::string& path, const Context& ctx, const std::vector<Table>& tables) {
  std::ostringstream o;
  o << "{\n  \"tool\": \"ferry-bench\",\n";
  WriteMachineJson(o, ctx);
  WriteRunJson(o, ctx);
  WriteScenariosJson(o, tables);
  return WriteFileOrSay(path, o.str());
}

bool WriteSvg(const std::string& path, const Context& ctx, const std::vector<Table>& tables) {
  std::vector<Series> series = TransferSeries(ctx, tables);
  if (series.empty()) {
    std::cerr << "ferry-bench: no transfers figures to chart; " << path << " not written\n";
    return false;
  }
  const ChartFrame frame(series);
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << ChartFrame::W << "\" height=\""
    << ChartFrame::H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  WriteSvgTitle(s, ctx);
  WriteSvgAxes(s, frame);
  for (size_t i = 0; i < series.size(); ++i) WriteSvgSeries(s, frame, series[i], i);
  s << "</svg>\n";
  return WriteFileOrSay(path, s.str());
}

}  // namespace ferry::bench
