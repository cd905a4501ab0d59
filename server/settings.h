// ferryd's settings table: every setting declared once (settings.cc, SettingsTable()), with
// its name, the kind of value it takes and its bounds, where the value lives in DaemonConfig,
// its help text and the values that mean something of their own. The parser (ParseFlags,
// ParseConfigText), --help (FlagsHelp), the config dump (FormatConfig, --check-config) and
// the docs check (tests/unit/config_doc_test.cc) are all made from it. A setting's default is
// the value its DaemonConfig member starts with, so there is one source for it.
//
// A row is built by one of the kinds below (Count, Millis, Size, Bool, Switch, Text, Choice,
// CountOrAuto, Parsed, Repeated, Action), which say how a value is parsed and printed, and
// named modifiers (Help, Arg, Note, ...). Rows are immutable once the table is built; the
// table is safe to read from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config.h"
#include "ferry/status.h"

namespace ferry {

/// Who may give a setting, and who shows it.
enum class SettingScope {
  /// The config file and the command line; --help, the dump and docs/operations.md show it.
  kSetting,
  /// The command line only (--config and the actions --check-config, --help, --version):
  /// --help shows it, the config file refuses it, the dump leaves it out.
  kCommandLine,
  /// A hook for tests, named ...-for-test: the file and the command line take it; --help and
  /// the docs leave it out, and the dump prints it only when it is not at its default.
  kHiddenForTest,
};

/// Values of a setting that mean something of their own ("0": "no limit"): --help says so
/// after the default, and the dump in a comment after such a value.
struct SettingNote {
  std::vector<std::string> values;
  std::string meaning;
};

/// What a setter knows of the parse around it.
struct SetContext {
  /// The values given to this setting earlier from the same source (the file, or the command
  /// line). Empty: this is the source's first, which for a repeated setting replaces the
  /// values of earlier sources.
  const std::vector<std::string>& earlier;
};

/// One row of the table.
struct Setting {
  std::string name;
  /// What --help shows after --NAME ("N", "SIZE", ...); "" for a switch.
  std::string arg;
  /// --help's text; FlagsHelp adds the default (and the notes) to a kSetting's.
  std::string help;
  SettingScope scope = SettingScope::kSetting;
  /// On the command line a bare --NAME means true; --NAME=VALUE takes the file's words.
  bool is_switch = false;
  /// A switch that takes no value at all (--help, --version, --check-config).
  bool is_action = false;
  /// May be given more than once from one source (listen, uid-limits).
  bool repeated = false;
  /// The dump writes its values quoted (ParseValue takes a quoted value whole).
  bool quoted = false;
  /// A count's range, lo..hi.
  std::optional<std::pair<uint64_t, uint64_t>> bounds;
  /// The default --help and the docs show, where it is not a value of the default config but
  /// derived from other settings at the end of the parse (listen's `<device>`).
  std::string derived_default;
  std::vector<SettingNote> notes;
  /// Apply one value (one line of the file, one flag) to `c`. The message of an error names
  /// neither the setting nor the source (the caller does).
  std::function<Status(DaemonConfig& c, const std::string& value, const SetContext& context)> set;
  /// The setting's values in `c` as the file writes them, unquoted (one each; a repeated one's
  /// in order).
  std::function<std::vector<std::string>(const DaemonConfig& c)> get;

  /// Modifiers, for the table: Setting x = Count(...).Help("...").Note("0", "no limit").
  Setting Help(std::string text) &&;
  Setting Arg(std::string text) &&;
  Setting Note(const char* value, std::string meaning) &&;
  Setting Note(std::vector<std::string> values, std::string meaning) &&;
  Setting DerivedDefault(std::string text) &&;
  Setting Quoted() &&;
  Setting CommandLineOnly() &&;
  Setting HiddenForTest() &&;

  /// Return the note that covers `value`, or nullptr.
  const SettingNote* NoteFor(const std::string& value) const;
};

/// Return the table, in --help order: every setting, command-line flag and hidden test hook.
const std::vector<Setting>& SettingsTable();

/// Return the row named `name`, or nullptr.
const Setting* FindSetting(const std::string& name);

/// Return the default config: each member's initial value, before any setting is applied.
const DaemonConfig& DefaultConfig();

/// Return the default that --help and the docs show: the derived default, else the default
/// config's values (a repeated setting's joined by ", "); "" for none.
std::string DocumentedDefault(const Setting& setting);

/// Return `setting`'s --help entry: "  --NAME ARG", its text and (for a kSetting) its default
/// and notes, wrapped to FlagsHelp's columns.
std::string HelpEntry(const Setting& setting);

/// Return `setting`'s lines of the dump for `config` ("name = value  # note\n" each).
std::string DumpLines(const Setting& setting, const DaemonConfig& config);

/// Parse a decimal count ("not a number: ..." otherwise).
Result<uint64_t> ParseUnsigned(const std::string& text);

/// Parse a switch's value: true, yes, on, 1 or false, no, off, 0.
Result<bool> ParseBool(const std::string& text);

// ---- The kinds of value. `field` is a callable that returns the member's reference for a
// DaemonConfig, const or not (settings.cc's FERRY_FIELD). ----

namespace settings_internal {

Setting Declare(std::string name, std::string arg);
Status Invalid(std::string message);
/// `n` parsed from `text` and within lo..hi ("out of range lo..hi" otherwise).
Result<uint64_t> ParseCount(const std::string& text, uint64_t lo, uint64_t hi);
std::string JoinChoices(const std::vector<std::string>& choices);

template <typename Field>
using FieldType =
    std::remove_cvref_t<decltype(std::declval<Field>()(std::declval<DaemonConfig&>()))>;

template <typename T>
struct IsDuration : std::false_type {};
template <typename Rep, typename Period>
struct IsDuration<std::chrono::duration<Rep, Period>> : std::true_type {};

template <typename Field>
Setting Number(std::string name, std::string arg, Field field, uint64_t lo, uint64_t hi) {
  using T = FieldType<Field>;
  Setting s = Declare(std::move(name), std::move(arg));
  s.bounds = std::make_pair(lo, hi);
  s.set = [field, lo, hi](DaemonConfig& c, const std::string& v, const SetContext&) -> Status {
    FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseCount(v, lo, hi));
    if constexpr (IsDuration<T>::value) {
      field(c) = T(static_cast<typename T::rep>(n));
    } else {
      field(c) = static_cast<T>(n);
    }
    return Status::Ok();
  };
  s.get = [field](const DaemonConfig& c) {
    if constexpr (IsDuration<T>::value) {
      return std::vector<std::string>{std::to_string(field(c).count())};
    } else {
      return std::vector<std::string>{std::to_string(field(c))};
    }
  };
  return s;
}

}  // namespace settings_internal

/// A count within lo..hi (an integer member).
template <typename Field>
Setting Count(std::string name, Field field, uint64_t lo, uint64_t hi) {
  return settings_internal::Number(std::move(name), "N", field, lo, hi);
}

/// Milliseconds within lo..hi (a std::chrono::milliseconds or integer member).
template <typename Field>
Setting Millis(std::string name, Field field, uint64_t lo, uint64_t hi) {
  return settings_internal::Number(std::move(name), "MS", field, lo, hi);
}

/// A count within lo..hi, or "auto" (a std::optional member: unset, derived at start).
template <typename Field>
Setting CountOrAuto(std::string name, Field field, uint64_t lo, uint64_t hi) {
  using T = typename settings_internal::FieldType<Field>::value_type;
  Setting s = settings_internal::Declare(std::move(name), "N");
  s.bounds = std::make_pair(lo, hi);
  s.set = [field, lo, hi](DaemonConfig& c, const std::string& v, const SetContext&) -> Status {
    if (v == "auto") {
      field(c).reset();
      return Status::Ok();
    }
    FERRY_ASSIGN_OR_RETURN(uint64_t n, settings_internal::ParseCount(v, lo, hi));
    field(c) = static_cast<T>(n);
    return Status::Ok();
  };
  s.get = [field](const DaemonConfig& c) {
    const auto& v = field(c);
    return std::vector<std::string>{v ? std::to_string(*v) : "auto"};
  };
  return s;
}

/// What a size must be beyond ParseBytes' syntax, and what to say when it is not.
struct SizeRule {
  std::function<bool(uint64_t)> ok;
  std::string expected;
};

/// A byte size, "64M" (a uint64_t member), optionally held to `rule`.
template <typename Field>
Setting Size(std::string name, Field field, SizeRule rule = {}) {
  Setting s = settings_internal::Declare(std::move(name), "SIZE");
  s.set = [field, rule](DaemonConfig& c, const std::string& v, const SetContext&) -> Status {
    FERRY_ASSIGN_OR_RETURN(uint64_t n, ParseBytes(v));
    if (rule.ok && !rule.ok(n)) return settings_internal::Invalid(rule.expected);
    field(c) = n;
    return Status::Ok();
  };
  s.get = [field](const DaemonConfig& c) {
    return std::vector<std::string>{FormatBytes(field(c))};
  };
  return s;
}

/// true or false (a bool member), given a value on the command line too.
template <typename Field>
Setting Bool(std::string name, Field field) {
  Setting s = settings_internal::Declare(std::move(name), "BOOL");
  s.set = [field](DaemonConfig& c, const std::string& v, const SetContext&) -> Status {
    FERRY_ASSIGN_OR_RETURN(field(c), ParseBool(v));
    return Status::Ok();
  };
  s.get = [field](const DaemonConfig& c) {
    return std::vector<std::string>{field(c) ? "true" : "false"};
  };
  return s;
}

/// A bool that a bare --NAME turns on (and --NAME=false off).
template <typename Field>
Setting Switch(std::string name, Field field) {
  Setting s = Bool(std::move(name), field);
  s.arg.clear();
  s.is_switch = true;
  return s;
}

/// A command-line action (--help): a bare --NAME, no value, sets the member to true.
template <typename Field>
Setting Action(std::string name, Field field) {
  Setting s = Switch(std::move(name), field);
  s.is_action = true;
  s.scope = SettingScope::kCommandLine;
  return s;
}

/// Text taken as given (a std::string member: a path, a list), after `check` when there is
/// one; the dump quotes it.
template <typename Field>
Setting Text(std::string name, std::string arg, Field field,
             std::function<Status(const std::string&)> check = nullptr) {
  Setting s = settings_internal::Declare(std::move(name), std::move(arg));
  s.quoted = true;
  s.set = [field, check](DaemonConfig& c, const std::string& v, const SetContext&) -> Status {
    if (check) FERRY_RETURN_IF_ERROR(check(v));
    field(c) = v;
    return Status::Ok();
  };
  s.get = [field](const DaemonConfig& c) { return std::vector<std::string>{field(c)}; };
  return s;
}

/// One of `choices` (a std::string member); --help shows them as its ARG ("a|b|c").
template <typename Field>
Setting Choice(std::string name, Field field, std::vector<std::string> choices) {
  std::string joined = settings_internal::JoinChoices(choices);
  Setting s = settings_internal::Declare(std::move(name), joined);
  s.set = [field, choices, joined](DaemonConfig& c, const std::string& v,
                                   const SetContext&) -> Status {
    for (const std::string& choice : choices) {
      if (v == choice) {
        field(c) = v;
        return Status::Ok();
      }
    }
    return settings_internal::Invalid(joined);
  };
  s.get = [field](const DaemonConfig& c) { return std::vector<std::string>{field(c)}; };
  return s;
}

/// A value `parse` reads into the member and `format` writes back as `parse` reads it; the
/// dump quotes it.
template <typename Field, typename Parse, typename Format>
Setting Parsed(std::string name, std::string arg, Field field, Parse parse, Format format) {
  Setting s = settings_internal::Declare(std::move(name), std::move(arg));
  s.quoted = true;
  s.set = [field, parse](DaemonConfig& c, const std::string& v, const SetContext&) -> Status {
    FERRY_ASSIGN_OR_RETURN(field(c), parse(v));
    return Status::Ok();
  };
  s.get = [field, format](const DaemonConfig& c) {
    return std::vector<std::string>{format(field(c))};
  };
  return s;
}

/// A setting given once per value (a container member). A source's first value replaces what
/// earlier sources gave (the member goes back to its default first); `add(container, value,
/// earlier)` adds one value, knowing those given before from the same source; `format_item`
/// writes one element back as `add` reads it.
template <typename Field, typename Add, typename FormatItem>
Setting Repeated(std::string name, std::string arg, Field field, Add add, FormatItem format_item) {
  Setting s = settings_internal::Declare(std::move(name), std::move(arg));
  s.repeated = true;
  s.set = [field, add](DaemonConfig& c, const std::string& v, const SetContext& context) {
    if (context.earlier.empty()) field(c) = field(DefaultConfig());
    return add(field(c), v, context.earlier);
  };
  s.get = [field, format_item](const DaemonConfig& c) {
    std::vector<std::string> out;
    for (const auto& item : field(c)) out.push_back(format_item(item));
    return out;
  };
  return s;
}

}  // namespace ferry
