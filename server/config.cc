#include "config.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "settings.h"

namespace ferry {
namespace {

// Where a setting came from; a later source overrides an earlier one.
enum class Source { kDefault, kFile, kFlags };

Status Invalid(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The config being built from the sources, in order, through the settings table.
class ConfigBuilder {
 public:
  /// Apply one value of `setting` from `source` (an action's is "true"); the message of an
  /// error does not name the setting (the caller knows how it was spelled).
  Status Set(const Setting& setting, const std::string& value, Source source) {
    if (source != current_) {
      given_.clear();
      current_ = source;
    }
    // A value is one line of the config file, and --check-config prints it as one: a flag's
    // value with a line break would print as settings of its own.
    if (value.find_first_of("\r\n") != std::string::npos) {
      return Invalid("a value may not contain a line break");
    }
    std::vector<std::string>& earlier = given_[setting.name];
    FERRY_RETURN_IF_ERROR(setting.set(c_, value, SetContext{earlier}));
    earlier.push_back(value);
    return Status::Ok();
  }

  /// Return the config built, after the checks that span settings (those ferryd would
  /// otherwise fail at start on). Opens no file: an unreadable TLS, token or metrics token
  /// file is found at start.
  Result<DaemonConfig> Finish() {
    if (c_.daemon.listen.empty()) {
      std::string listen = kDefaultListen;
      listen.replace(listen.find("<device>"), 8, std::to_string(c_.device));
      c_.daemon.listen = {listen};
    }
    const auto& pool = c_.daemon.slab_pool;
    if (pool.budget < pool.slab_size) {
      return Invalid("pinned-budget (" + FormatBytes(pool.budget) + ") is below slab-size (" +
                     FormatBytes(pool.slab_size) + "): the pool could not hold one slab");
    }
    const auto& tls = c_.daemon.tls;
    if (!tls.cert.empty() && tls.key.empty()) return Invalid("tls-cert needs tls-key");
    if (tls.cert.empty() && !tls.key.empty()) return Invalid("tls-key needs tls-cert");
    if (!tls.client_ca.empty() && tls.cert.empty()) {
      return Invalid("tls-client-ca needs tls-cert and tls-key");
    }
    return c_;
  }

 private:
  DaemonConfig c_;
  Source current_ = Source::kDefault;
  // The values each setting was given from the current source.
  std::map<std::string, std::vector<std::string>> given_;
};

// `text` without a trailing comment: from a '#' after whitespace on, trimmed.
std::string StripComment(const std::string& text) {
  for (size_t i = 1; i < text.size(); ++i) {
    if (text[i] == '#' && (text[i - 1] == ' ' || text[i - 1] == '\t')) {
      return Trim(text.substr(0, i));
    }
  }
  return Trim(text);
}

// The value after a line's '=': "quoted" (taken as it is, '#' and blanks included, with \"
// and \\ for a quote and a backslash; only a comment may follow the closing quote), or bare
// (up to a trailing comment, trimmed). FormatConfig writes what this reads back.
Result<std::string> ParseValue(const std::string& text) {
  const std::string rest = Trim(text);
  if (rest.empty() || rest.front() != '"') return StripComment(rest);
  std::string value;
  for (size_t i = 1; i < rest.size(); ++i) {
    if (rest[i] == '\\' && i + 1 < rest.size()) {
      value += rest[++i];
    } else if (rest[i] == '"') {
      const std::string after = Trim(rest.substr(i + 1));
      if (!after.empty() && after.front() != '#') {
        return Invalid("text after the closing quote: '" + after + "'");
      }
      return value;
    } else {
      value += rest[i];
    }
  }
  return Invalid("a quoted value without its closing quote");
}

// Apply a config file's text to `builder`; errors say "ORIGIN:LINE: ...".
Status ApplyConfigText(const std::string& text, const std::string& origin, ConfigBuilder& builder) {
  std::istringstream in(text);
  std::string raw;
  std::map<std::string, int> seen;  // setting -> line it was set on
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    std::string where = origin + ":" + std::to_string(line_no) + ": ";
    std::string line = Trim(raw);
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return Invalid(where + "expected 'name = value', got '" + StripComment(line) + "'");
    }
    std::string name = Trim(line.substr(0, eq));
    auto value = ParseValue(line.substr(eq + 1));
    if (!value.ok()) return Invalid(where + name + ": " + value.status().message());
    if (name.rfind("--", 0) == 0) name = name.substr(2);
    const Setting* setting = FindSetting(name);
    if (setting == nullptr) return Invalid(where + "unknown setting '" + name + "'");
    if (setting->scope == SettingScope::kCommandLine) {
      return Invalid(where + "'" + name + "' can only be given on the command line");
    }
    if (!setting->repeated) {
      auto [it, fresh] = seen.emplace(name, line_no);
      if (!fresh) {
        return Invalid(where + "'" + name + "' is already set on line " +
                       std::to_string(it->second));
      }
    }
    Status s = builder.Set(*setting, *value, Source::kFile);
    if (!s.ok()) return Invalid(where + name + ": " + s.message());
  }
  return Status::Ok();
}

Result<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Invalid(path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Invalid("cannot read config file " + path);
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return Invalid("cannot read config file " + path);
  return out.str();
}

}  // namespace

Result<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return Invalid("empty size");
  uint64_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      mult = 1ull << 10;
      digits.pop_back();
      break;
    case 'M':
    case 'm':
      mult = 1ull << 20;
      digits.pop_back();
      break;
    case 'G':
    case 'g':
      mult = 1ull << 30;
      digits.pop_back();
      break;
    default:
      break;
  }
  FERRY_ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(digits));
  uint64_t out = 0;
  if (!CheckedMul(v, mult, &out)) return Invalid("size overflows");
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes != 0) {
    if (bytes % (1ull << 30) == 0) return std::to_string(bytes >> 30) + "G";
    if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + "M";
    if (bytes % (1ull << 10) == 0) return std::to_string(bytes >> 10) + "K";
  }
  return std::to_string(bytes);
}

std::string FlagsHelp() {
  std::string switches;
  for (const Setting& s : SettingsTable()) {
    if (s.is_switch && !s.is_action && s.scope == SettingScope::kSetting) {
      switches += (switches.empty() ? "--" : " and --") + s.name;
    }
  }
  std::string out =
      "ferryd: the ferry GPU daemon (one process per GPU)\n\n"
      "Flags take \"--name VALUE\" or \"--name=VALUE\". A switch (a flag shown without VALUE) "
      "alone\nmeans true; " +
      switches + " also take =true or =false.\n\n";
  for (const Setting& s : SettingsTable()) {
    if (s.scope != SettingScope::kHiddenForTest) out += HelpEntry(s);
  }
  return out;
}

Result<DaemonConfig> ParseFlags(const std::vector<std::string>& args,
                                const std::string& default_config) {
  // Pass 1: split the command line into (name, value) pairs, so --config is known before
  // anything else is applied.
  ConfigBuilder builder;
  std::vector<std::pair<const Setting*, std::string>> flags;
  std::optional<std::string> config_flag;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) return Invalid("unexpected argument: " + a);
    std::string name = a.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Setting* setting = FindSetting(name);
    if (setting == nullptr) return Invalid("unknown flag --" + name);
    if (setting->is_switch) {
      // A bare switch never takes the next argument as its value.
      if (has_value && setting->is_action) return Invalid("--" + name + " takes no value");
      flags.emplace_back(setting, has_value ? value : "true");
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return Invalid("--" + name + " needs a value");
      value = args[++i];
    }
    if (name == "config") {
      if (config_flag) return Invalid("--config given twice");
      config_flag = value;
    } else {
      flags.emplace_back(setting, value);
    }
  }

  // Pass 2: the file, then the flags over it.
  std::string config_path;
  if (config_flag) {
    config_path = *config_flag;
  } else if (!default_config.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(default_config, ec)) config_path = default_config;
  }
  if (!config_path.empty()) {
    FERRY_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    FERRY_RETURN_IF_ERROR(ApplyConfigText(text, config_path, builder));
  }
  for (const auto& [setting, value] : flags) {
    Status s = builder.Set(*setting, value, Source::kFlags);
    if (!s.ok()) return Invalid("--" + setting->name + ": " + s.message());
  }
  FERRY_ASSIGN_OR_RETURN(DaemonConfig c, builder.Finish());
  c.config_path = config_path;
  return c;
}

Result<DaemonConfig> ParseConfigText(const std::string& text, const std::string& origin) {
  ConfigBuilder builder;
  FERRY_RETURN_IF_ERROR(ApplyConfigText(text, origin, builder));
  auto c = builder.Finish();
  if (!c.ok()) return Invalid(origin + ": " + c.status().message());
  return c;
}

std::string FormatConfig(const DaemonConfig& c) {
  std::string out = "# ferryd effective configuration";
  if (!c.config_path.empty()) out += " (flags over " + c.config_path + ")";
  out += "\n";
  for (const Setting& s : SettingsTable()) {
    if (s.scope == SettingScope::kCommandLine) continue;
    // Hidden test-only settings only when set (--help and the docs leave them out).
    if (s.scope == SettingScope::kHiddenForTest && s.get(c) == s.get(DefaultConfig())) continue;
    out += DumpLines(s, c);
  }
  return out;
}

}  // namespace ferry
