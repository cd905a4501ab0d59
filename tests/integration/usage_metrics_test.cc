// Device time and transfers per uid and client, as a real ferryd exports them: the
// per-identity Prometheus series after work from two sessions, the bound on identities, and
// the exposition's format (a strict checker here, and promtool where it is installed).
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferryd_process.h"
#include "metrics_scrape.h"

namespace ferry {
namespace {

// GET /metrics; return the body ("" when the exchange failed).
std::string Scrape(const std::string& host_port) {
  return testing::ResponseBody(testing::Scrape(host_port));
}

// The value of the sample `name{...}` whose labels contain every one of `labels`; -1 when
// there is none.
double Value(const std::string& body, const std::string& name,
             const std::vector<std::string>& labels) {
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

std::vector<std::string> Who(const std::string& uid, const std::string& client) {
  return {"uid=\"" + uid + "\"", "client=\"" + client + "\""};
}

std::vector<std::string> Plus(std::vector<std::string> v, const std::string& more) {
  v.push_back(more);
  return v;
}

Result<Client> ConnectAs(const testing::FerrydProcess& daemon, const std::string& name) {
  ClientOptions options;
  options.client_name = name;
  return Client::connect(daemon.unix_target(), options);
}

TEST(UsageMetricsTest, PerUidAndClientValuesAfterWorkFromTwoSessions) {
  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ep = MetricsEndpoint(daemon);
  ASSERT_FALSE(ep.empty());
  const std::string me = std::to_string(getuid());

  auto alpha = ConnectAs(daemon, "alpha");
  auto beta = ConnectAs(daemon, "beta");
  ASSERT_TRUE(alpha.ok() && beta.ok());
  auto a = alpha->open_session();
  auto b = beta->open_session();
  ASSERT_TRUE(a.ok() && b.ok());
  // alpha: 64 KiB up and back down; beta: 16 KiB up only.
  std::vector<float> big(16384, 1.0f), small(4096, 2.0f);
  Tensor ta = a->create_tensor<float>({16384});
  ASSERT_TRUE(a->upload(ta, big).ok());
  auto back = a->download<float>(ta);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  Tensor tb = b->create_tensor<float>({4096});
  ASSERT_TRUE(b->upload(tb, small).ok());
  ASSERT_TRUE(b->synchronize().ok());

  std::string during = Scrape(ep);
  const auto wa = Who(me, "alpha"), wb = Who(me, "beta");
  EXPECT_EQ(Value(during, "ferry_transfer_bytes_total", Plus(wa, "direction=\"upload\"")),
            16384 * 4)
      << during;
  EXPECT_EQ(Value(during, "ferry_transfer_bytes_total", Plus(wa, "direction=\"download\"")),
            16384 * 4)
      << during;
  EXPECT_EQ(Value(during, "ferry_transfer_bytes_total", Plus(wb, "direction=\"upload\"")), 4096 * 4)
      << during;
  EXPECT_EQ(Value(during, "ferry_transfer_bytes_total", Plus(wb, "direction=\"download\"")), 0)
      << during;
  EXPECT_EQ(Value(during, "ferry_device_memory_bytes", wa), 16384 * 4) << during;
  EXPECT_EQ(Value(during, "ferry_device_memory_bytes", wb), 4096 * 4) << during;
  const double alpha_seconds = Value(during, "ferry_device_seconds_total", wa);
  const double beta_seconds = Value(during, "ferry_device_seconds_total", wb);
  EXPECT_GT(alpha_seconds, 0) << during;
  EXPECT_GT(beta_seconds, 0) << during;
  // Copies are part of the device time (each series is whole nanoseconds turned into seconds
  // on its own: their sum may round a nanosecond above the total).
  EXPECT_LE(Value(during, "ferry_transfer_seconds_total", Plus(wa, "direction=\"upload\"")) +
                Value(during, "ferry_transfer_seconds_total", Plus(wa, "direction=\"download\"")),
            alpha_seconds + 1e-9)
      << during;
  // The UUID label, as on every series.
  EXPECT_TRUE(std::regex_search(
      during, std::regex(R"(ferry_device_seconds_total\{gpu="0",UUID="[^"]+",uid=")")))
      << during;

  // The session's own counters say the same (SessionStats).
  auto stats_a = a->close();
  ASSERT_TRUE(stats_a.ok()) << stats_a.status().ToString();
  EXPECT_EQ(stats_a->h2d_bytes, 16384u * 4);
  EXPECT_EQ(stats_a->d2h_bytes, 16384u * 4);
  EXPECT_GT(stats_a->device_busy_ns, 0u);
  EXPECT_LE(stats_a->h2d_ns + stats_a->d2h_ns, stats_a->device_busy_ns);
  ASSERT_TRUE(b->close().ok());
  daemon.WaitIdle();

  // Kept after the sessions closed; the memory they held is gone.
  std::string after = Scrape(ep);
  EXPECT_EQ(Value(after, "ferry_transfer_bytes_total", Plus(wa, "direction=\"upload\"")), 16384 * 4)
      << after;
  EXPECT_EQ(Value(after, "ferry_transfer_bytes_total", Plus(wb, "direction=\"upload\"")), 4096 * 4)
      << after;
  EXPECT_GE(Value(after, "ferry_device_seconds_total", wa), alpha_seconds) << after;
  EXPECT_NEAR(Value(after, "ferry_device_seconds_total", wa),
              static_cast<double>(stats_a->device_busy_ns) / 1e9, 1e-6)
      << after;
  EXPECT_GE(Value(after, "ferry_device_seconds_total", wb), beta_seconds) << after;
  EXPECT_EQ(Value(after, "ferry_device_memory_bytes", wa), 0) << after;
  EXPECT_EQ(Value(after, "ferry_device_memory_bytes", wb), 0) << after;
}

TEST(UsageMetricsTest, IdentitiesPastTheBoundFoldIntoOther) {
  testing::FerrydProcess daemon(
      {"--metrics-listen", "127.0.0.1:0", "--metrics-max-identities", "1"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ep = MetricsEndpoint(daemon);
  const std::string me = std::to_string(getuid());
  for (const char* name : {"first", "second", "third"}) {
    auto client = ConnectAs(daemon, name);
    ASSERT_TRUE(client.ok());
    auto s = client->open_session();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Tensor t = s->create_tensor<float>({256});
    std::vector<float> x(256, 1.0f);
    ASSERT_TRUE(s->upload(t, x).ok());
    ASSERT_TRUE(s->close().ok());
  }
  daemon.WaitIdle();
  std::string body = Scrape(ep);
  EXPECT_EQ(
      Value(body, "ferry_transfer_bytes_total", Plus(Who(me, "first"), "direction=\"upload\"")),
      1024)
      << body;
  EXPECT_EQ(Value(body, "ferry_device_seconds_total", Who(me, "second")), -1)
      << "past the bound: no series of its own\n"
      << body;
  EXPECT_EQ(Value(body, "ferry_transfer_bytes_total",
                  Plus(Who("other", "other"), "direction=\"upload\"")),
            2048)
      << body;
  EXPECT_EQ(Value(body, "ferry_usage_identities_folded_total", {}), 2) << body;
}

// An identity none of whose sessions has been open for metrics-identity-idle-timeout expires:
// its series go, its place under metrics-max-identities is free (the next identity is named,
// not "other"), and the daemon's totals keep what it used.
TEST(UsageMetricsTest, IdleIdentitiesExpireAndFreeTheirPlace) {
  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0", "--metrics-max-identities", "1",
                                 "--metrics-identity-idle-timeout", "300"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ep = MetricsEndpoint(daemon);
  const std::string me = std::to_string(getuid());
  auto upload_1k = [](Session& s) {
    Tensor t = s.create_tensor<float>({256});
    std::vector<float> x(256, 1.0f);
    return s.upload(t, x);
  };
  {
    auto client = ConnectAs(daemon, "first");
    ASSERT_TRUE(client.ok());
    auto s = client->open_session();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(upload_1k(*s).ok());
    ASSERT_TRUE(s->close().ok());
  }
  daemon.WaitIdle();
  const std::string before = Scrape(ep);
  EXPECT_EQ(
      Value(before, "ferry_transfer_bytes_total", Plus(Who(me, "first"), "direction=\"upload\"")),
      1024)
      << before;
  // The session has closed (WaitIdle): after the timeout "first" has expired.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  auto client = ConnectAs(daemon, "second");
  ASSERT_TRUE(client.ok());
  auto s = client->open_session();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(upload_1k(*s).ok());
  ASSERT_TRUE(s->synchronize().ok());
  // Scraped while its session is open: "second" cannot have expired.
  const std::string body = Scrape(ep);
  EXPECT_EQ(
      Value(body, "ferry_transfer_bytes_total", Plus(Who(me, "second"), "direction=\"upload\"")),
      1024)
      << "named, not folded into other\n"
      << body;
  EXPECT_EQ(Value(body, "ferry_transfer_bytes_total", Who(me, "first")), -1) << body;
  EXPECT_EQ(Value(body, "ferry_transfer_bytes_total", Who("other", "other")), -1) << body;
  EXPECT_EQ(Value(body, "ferry_usage_identities_folded_total", {}), 0) << body;
  EXPECT_EQ(Value(body, "ferry_usage_identities_expired_total", {}), 1) << body;
  EXPECT_EQ(Value(body, "ferry_usage_identities", {}), 1) << body;
  // The daemon's totals still count the expired identity's upload.
  EXPECT_EQ(Value(body, "ferry_daemon_transfer_bytes_total", {"direction=\"upload\""}), 2048)
      << body;
  EXPECT_GE(Value(body, "ferry_daemon_device_seconds_total", {}),
            Value(before, "ferry_daemon_device_seconds_total", {}))
      << body;
  ASSERT_TRUE(s->close().ok());
}

// --- the text exposition format 0.0.4, checked strictly ------------------------------------

// Return what is wrong with `body` as Prometheus text format 0.0.4 ("" when nothing):
// every line a HELP, a TYPE or a sample; each family's HELP and TYPE once, before its
// samples; metric and label names well formed; label values quoted with only \\, \" and \n
// escapes; no label repeated in a series and no series twice; values that parse as floats;
// histogram samples only as _bucket (with le), _sum and _count; a newline at the end.
std::string FormatProblems(const std::string& body) {
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex kLabelName("[a-zA-Z_][a-zA-Z0-9_]*");
  static const std::regex kValue(R"([-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|[-+]?Inf|NaN)");
  if (body.empty() || body.back() != '\n') return "the body does not end with a newline";
  std::map<std::string, std::string> types;
  std::set<std::string> helps, series, sampled;
  std::istringstream in(body);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const std::string where = "line " + std::to_string(n) + " '" + line + "': ";
    if (line.empty()) return where + "empty line";
    if (line[0] == '#') {
      std::istringstream words(line);
      std::string hash, kind, name;
      words >> hash >> kind >> name;
      if (hash != "#" || (kind != "HELP" && kind != "TYPE")) return where + "unknown comment";
      if (!std::regex_match(name, kName)) return where + "bad metric name";
      if (sampled.count(name)) return where + kind + " after the family's samples";
      if (kind == "HELP") {
        if (!helps.insert(name).second) return where + "second HELP";
        continue;
      }
      std::string type, extra;
      words >> type >> extra;
      if (!extra.empty()) return where + "text after the type";
      if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" &&
          type != "untyped") {
        return where + "unknown type";
      }
      if (!types.emplace(name, type).second) return where + "second TYPE";
      continue;
    }
    // name{labels} value
    size_t brace = line.find('{');
    size_t space = line.find(' ');
    std::string name = line.substr(0, std::min(brace, space));
    if (!std::regex_match(name, kName)) return where + "bad metric name";
    std::string family = name;
    auto it = types.find(family);
    std::string suffix;
    if (it == types.end()) {
      for (const char* s : {"_bucket", "_sum", "_count"}) {
        const std::string sfx = s;
        if (name.size() > sfx.size() &&
            name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0 &&
            types.count(name.substr(0, name.size() - sfx.size()))) {
          family = name.substr(0, name.size() - sfx.size());
          suffix = sfx;
        }
      }
      it = types.find(family);
    }
    if (it == types.end()) return where + "sample of a family with no TYPE";
    if (it->second == "histogram" && suffix.empty()) return where + "histogram without suffix";
    if (it->second != "histogram" && it->second != "summary" && !suffix.empty()) {
      return where + "suffix on a " + it->second;
    }
    if (!helps.count(family)) return where + "family without HELP";
    sampled.insert(family);
    std::set<std::string> label_names;
    size_t pos = name.size();
    if (pos < line.size() && line[pos] == '{') {
      ++pos;
      while (pos < line.size() && line[pos] != '}') {
        size_t eq = line.find('=', pos);
        if (eq == std::string::npos) return where + "label without '='";
        std::string label = line.substr(pos, eq - pos);
        if (!std::regex_match(label, kLabelName)) return where + "bad label name '" + label + "'";
        if (!label_names.insert(label).second) return where + "label '" + label + "' repeated";
        pos = eq + 1;
        if (pos >= line.size() || line[pos] != '"') return where + "unquoted label value";
        ++pos;
        for (;;) {
          if (pos >= line.size()) return where + "unterminated label value";
          const char ch = line[pos];
          if (ch == '"') break;
          if (static_cast<unsigned char>(ch) < 0x20) return where + "control byte in a value";
          if (ch == '\\') {
            if (pos + 1 >= line.size()) return where + "dangling escape";
            const char e = line[pos + 1];
            if (e != '\\' && e != '"' && e != 'n') return where + "bad escape";
            ++pos;
          }
          ++pos;
        }
        ++pos;  // the closing quote
        if (pos < line.size() && line[pos] == ',') ++pos;
      }
      if (pos >= line.size()) return where + "unterminated label set";
      ++pos;  // '}'
    }
    if (suffix == "_bucket" && !label_names.count("le")) return where + "bucket without le";
    if (pos >= line.size() || line[pos] != ' ') return where + "no space before the value";
    const std::string value = line.substr(pos + 1);
    if (!std::regex_match(value, kValue)) return where + "bad value '" + value + "'";
    if (!series.insert(line.substr(0, pos)).second) return where + "series repeated";
  }
  return "";
}

TEST(UsageMetricsTest, FormatCheckerRejectsWhatPrometheusWould) {
  // The checker itself: each of these breaks one rule.
  const std::string help = "# HELP m h\n# TYPE m counter\n";
  EXPECT_EQ(FormatProblems(help + "m{a=\"1\"} 2\n"), "");
  EXPECT_NE(FormatProblems(help + "m{a=\"1\"} 2"), "");                    // no final newline
  EXPECT_NE(FormatProblems("m 1\n"), "");                                  // no TYPE
  EXPECT_NE(FormatProblems(help + "m{a=\"1\",a=\"2\"} 2\n"), "");          // label repeated
  EXPECT_NE(FormatProblems(help + "m{a=\"1\"} 2\nm{a=\"1\"} 3\n"), "");    // series repeated
  EXPECT_NE(FormatProblems(help + "m{a=\"x\\q\"} 2\n"), "");               // bad escape
  EXPECT_NE(FormatProblems(help + "m{a=\"x\ny\"} 2\n"), "");               // raw newline
  EXPECT_NE(FormatProblems(help + "m{1a=\"x\"} 2\n"), "");                 // label name
  EXPECT_NE(FormatProblems(help + "m{a=\"x\"} two\n"), "");                // value
  EXPECT_NE(FormatProblems(help + "m 1\n# TYPE m counter\n"), "");         // TYPE twice
  EXPECT_NE(FormatProblems("# HELP h x\n# TYPE h histogram\nh 1\n"), "");  // bare histogram
}

TEST(UsageMetricsTest, ExpositionFollowsTheTextFormat) {
  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string ep = MetricsEndpoint(daemon);
  // A client name that needs escaping, and work, so every family has samples.
  auto client = ConnectAs(daemon, "odd \"name\" \\ with\nnewline");
  ASSERT_TRUE(client.ok());
  auto s = client->open_session();
  ASSERT_TRUE(s.ok());
  Tensor t = s->create_tensor<float>({1024});
  std::vector<float> x(1024, 1.0f);
  ASSERT_TRUE(s->upload(t, x).ok());
  ASSERT_TRUE(s->download<float>(t).ok());
  const std::string body = Scrape(ep);
  ASSERT_FALSE(body.empty());
  EXPECT_EQ(FormatProblems(body), "") << body;
  EXPECT_NE(body.find("client=\"odd \\\"name\\\" \\\\ with_newline\""), std::string::npos)
      << "quotes and backslashes escaped, control bytes replaced\n"
      << body;

  // promtool, where installed (Debian's prometheus package; deploy/install-deps.sh).
  const char* candidates[] = {"/usr/bin/promtool", "/usr/local/bin/promtool"};
  std::string promtool;
  for (const char* c : candidates) {
    if (::access(c, X_OK) == 0) promtool = c;
  }
  if (promtool.empty()) {
    std::printf("[  NOTE    ] promtool is not installed: only the strict checker above ran\n");
    return;
  }
  const std::string path = ::testing::TempDir() + "/ferry_metrics.prom";
  {
    std::ofstream out(path);
    out << body;
  }
  const std::string log = ::testing::TempDir() + "/ferry_promtool.log";
  const std::string cmd = promtool + " check metrics < " + path + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::string said((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(rc, 0) << cmd << "\n" << said;
}

#ifdef FERRY_SOURCE_DIR
TEST(UsageMetricsTest, GrafanaDashboardQueriesOnlySeriesFerrydExports) {
  const std::string source = FERRY_SOURCE_DIR;
  if (!std::filesystem::is_directory(source + "/deploy")) {
    GTEST_SKIP() << "the source tree " << source << " is not on this machine (a test bundle)";
  }
  std::ifstream in(source + "/deploy/grafana-ferry.json");
  ASSERT_TRUE(in.good()) << "deploy/grafana-ferry.json is missing";
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  google::protobuf::Struct dashboard;
  auto parsed = google::protobuf::util::JsonStringToMessage(json, &dashboard);
  ASSERT_TRUE(parsed.ok()) << "not JSON: " << parsed.ToString();
  ASSERT_TRUE(dashboard.fields().count("panels"));
  EXPECT_GT(dashboard.fields().at("panels").list_value().values_size(), 0);

  testing::FerrydProcess daemon({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  const std::string body = Scrape(MetricsEndpoint(daemon));
  std::set<std::string> families;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) families.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  const std::regex name(R"(ferry_[a-z_]+)");
  int used = 0;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), name); it != std::sregex_iterator();
       ++it) {
    ++used;
    EXPECT_TRUE(families.count(it->str())) << it->str() << " is not a family ferryd exports";
  }
  EXPECT_GT(used, 5);
}
#endif

}  // namespace
}  // namespace ferry
