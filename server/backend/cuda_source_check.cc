#include "backend/cuda_source_check.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::backend {
namespace {

constexpr std::string_view kIncludeLike[] = {"include", "include_next", "import", "embed",
                                             "include_macros"};
constexpr std::string_view kPlainDirectives[] = {"define", "undef",   "if",       "ifdef", "ifndef",
                                                 "elif",   "elifdef", "elifndef", "else",  "endif",
                                                 "line",   "error",   "warning"};
constexpr std::string_view kPragmas[] = {
    "unroll",           "nounroll",        "once",          "push_macro",      "pop_macro",
    "nv_diag_suppress", "nv_diag_warning", "nv_diag_error", "nv_diag_default", "nv_diag_once"};
// Identifiers that test for or read files, or make pragmas out of strings (which this check
// cannot see into), wherever they appear.
constexpr std::string_view kBannedIdentifiers[] = {"__has_include", "__has_include_next",
                                                   "__has_embed", "_Pragma", "__pragma"};

// Token pasting (`##`, `%:%:`) makes identifiers as macros expand, which this check never sees
// spelled: `CAT(_Pr, agma)` is _Pragma, and so is NVRTC's own _NV_TEST_PAREN2(Pragma) (it
// pastes `_` before its argument), with no `##` in the source. The rule that keeps banned
// names from being made so holds for any nesting of macros and any arguments:
//  * A pasted identifier is the concatenation of two or more tokens, each spelled somewhere:
//    in this source, in the body of one of NVRTC's built-in macros, or in a predefined
//    macro's value. Its first token is a proper prefix of it.
//  * So no paste makes a banned name while no proper prefix of one (`_`, `__`, `_Pr`,
//    `__has_`, ...) can get before tokens of the source. The source may not spell one
//    (CouldBePastedIntoBannedName). Predefined macros expand to numbers, strings and type
//    names. NVRTC 13.0's macros spell one in _NV_TEST_PAREN2, which the source may not name (nor
//    any name starting _NV_: NVRTC's internal macros) and which other macros reach only through
//    _NV_TEST_PAREN1, whose own token comes first; and in __location__ only where _MSC_VER is
//    defined, which NVRTC on Linux is not. cuda_source_check_test.cc reads the installed
//    NVRTC's macros and fails where that no longer holds.
// Directives cannot be made by pasting at all: what a macro expands to is never a directive
// (C++ [cpp.rescan]), so `#include` and `#pragma` are checked where they are spelled.
bool CouldBePastedIntoBannedName(std::string_view word) {
  for (std::string_view banned : kBannedIdentifiers) {
    if (word.size() < banned.size() && banned.substr(0, word.size()) == word) return true;
  }
  return word.substr(0, 4) == "_NV_";
}

template <size_t N>
bool OneOf(std::string_view word, const std::string_view (&set)[N]) {
  return std::find(std::begin(set), std::end(set), word) != std::end(set);
}

// NVRTC takes `$` for no part of a name ("unrecognized token"), and so does this check:
// `$_Pragma` is `$` and then _Pragma.
bool IsIdentStart(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsIdentChar(unsigned char c) { return IsIdentStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\v'; }

enum class Kind { kNewline, kEnd, kIdentifier, kNumber, kLiteral, kHash, kPunct };

struct Token {
  Kind kind = Kind::kEnd;
  size_t begin = 0, end = 0;
  bool after_comment_newline = false;  // a block comment before it crossed a line
};

class Scanner {
 public:
  Scanner(std::string text, std::vector<size_t> splices)
      : text_(std::move(text)), splices_(std::move(splices)) {}

  Status Run() {
    bool line_start = true;
    for (;;) {
      Token t;
      FERRY_RETURN_IF_ERROR(Next(&t));
      if (t.after_comment_newline) line_start = true;
      if (t.kind == Kind::kEnd) return Status::Ok();
      if (t.kind == Kind::kNewline) {
        line_start = true;
        continue;
      }
      if (t.kind == Kind::kHash && line_start) {
        FERRY_RETURN_IF_ERROR(Directive(t));
        line_start = true;  // Directive consumed the line's newline
        continue;
      }
      line_start = false;
    }
  }

 private:
  Status Refuse(size_t pos, const std::string& what) const {
    // The physical line: newlines before pos plus the splices that joined lines before it.
    const size_t newlines = static_cast<size_t>(
        std::count(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
    const size_t joined = static_cast<size_t>(
        std::lower_bound(splices_.begin(), splices_.end(), pos + 1) - splices_.begin());
    return Status(ErrorKind::kCompileError,
                  "CUDA C++ line " + std::to_string(1 + newlines + joined) + ": " + what +
                      " (ferryd compiles without access to any file; see docs/operations.md, "
                      "\"CUDA C++ compiles\")");
  }

  // Skip blanks and comments; stop at a newline or a token.
  Status SkipSpace(bool* crossed_newline) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (IsBlank(c)) {
        ++pos_;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '*') {
        const size_t close = text_.find("*/", pos_ + 2);
        if (close == std::string::npos) return Refuse(pos_, "an unterminated /* comment");
        if (text_.find('\n', pos_) < close) *crossed_newline = true;
        pos_ = close + 2;
      } else {
        break;
      }
    }
    return Status::Ok();
  }

  // A string or character literal (opening quote at pos_); it ends at its closing quote or,
  // unterminated, before the newline: never across a line, so no directive hides in it.
  void Literal(char quote) {
    ++pos_;
    while (pos_ < text_.size() && text_[pos_] != '\n') {
      const char c = text_[pos_++];
      if (c == '\\' && pos_ < text_.size() && text_[pos_] != '\n') {
        ++pos_;
      } else if (c == quote) {
        return;
      }
    }
  }

  // A raw string literal; pos_ at its opening quote.
  Status RawLiteral() {
    const size_t start = pos_;
    const size_t open = text_.find('(', pos_ + 1);
    if (open == std::string::npos || open - pos_ - 1 > 16) {
      return Refuse(start, "a malformed raw string literal");
    }
    const std::string delimiter = text_.substr(pos_ + 1, open - pos_ - 1);
    for (char c : delimiter) {
      if (IsBlank(c) || c == '\n' || c == '\\' || c == ')' || c == '"') {
        return Refuse(start, "a malformed raw string literal");
      }
    }
    const size_t close = text_.find(")" + delimiter + "\"", open + 1);
    if (close == std::string::npos) return Refuse(start, "an unterminated raw string literal");
    pos_ = close + delimiter.size() + 2;
    // A compiler undoes line splices inside a raw string, so its literal may end elsewhere
    // than this one (and a directive hide in what this check took for a literal).
    auto splice = std::upper_bound(splices_.begin(), splices_.end(), start);
    if (splice != splices_.end() && *splice < pos_) {
      return Refuse(start, "a backslash-newline inside a raw string literal");
    }
    return Status::Ok();
  }

  Status Next(Token* t) {
    bool crossed = false;
    FERRY_RETURN_IF_ERROR(SkipSpace(&crossed));
    t->after_comment_newline = crossed;
    t->begin = pos_;
    if (pos_ >= text_.size()) {
      t->kind = Kind::kEnd;
      return Status::Ok();
    }
    const auto c = static_cast<unsigned char>(text_[pos_]);
    auto at = [&](size_t i) -> unsigned char {
      return i < text_.size() ? static_cast<unsigned char>(text_[i]) : 0;
    };
    if (c == '\n') {
      ++pos_;
      t->kind = Kind::kNewline;
    } else if (IsIdentStart(c)) {
      while (pos_ < text_.size() && IsIdentChar(at(pos_))) ++pos_;
      const std::string_view word(text_.data() + t->begin, pos_ - t->begin);
      if (OneOf(word, kBannedIdentifiers)) {
        return Refuse(t->begin, std::string(word) + " is not allowed");
      }
      if (CouldBePastedIntoBannedName(word)) {
        return Refuse(t->begin, "the name " + std::string(word) +
                                    " is not allowed (pasted to other tokens it could make "
                                    "_Pragma or __has_include)");
      }
      const char next = static_cast<char>(at(pos_));
      if (next == '"' &&
          (word == "R" || word == "u8R" || word == "uR" || word == "UR" || word == "LR")) {
        FERRY_RETURN_IF_ERROR(RawLiteral());
        t->kind = Kind::kLiteral;
      } else if ((next == '"' || next == '\'') &&
                 (word == "u8" || word == "u" || word == "U" || word == "L")) {
        Literal(next);
        t->kind = Kind::kLiteral;
      } else {
        t->kind = Kind::kIdentifier;
      }
    } else if (IsDigit(c) || (c == '.' && IsDigit(at(pos_ + 1)))) {
      ++pos_;
      for (;;) {
        const unsigned char d = at(pos_);
        if ((d == '+' || d == '-') && std::string_view("eEpP").find(static_cast<char>(
                                          at(pos_ - 1))) != std::string_view::npos) {
          ++pos_;
        } else if (d == '\'' && IsIdentChar(at(pos_ + 1))) {
          pos_ += 2;  // a digit separator
        } else if (IsIdentChar(d) || d == '.') {
          ++pos_;
        } else {
          break;
        }
      }
      t->kind = Kind::kNumber;
    } else if (c == '"' || c == '\'') {
      Literal(static_cast<char>(c));
      t->kind = Kind::kLiteral;
    } else if (c == '#') {
      pos_ += at(pos_ + 1) == '#' ? 2 : 1;
      t->kind = pos_ - t->begin == 1 ? Kind::kHash : Kind::kPunct;
    } else if (c == '%' && at(pos_ + 1) == ':') {  // the digraph of #
      const bool paste = at(pos_ + 2) == '%' && at(pos_ + 3) == ':';
      pos_ += paste ? 4 : 2;
      t->kind = paste ? Kind::kPunct : Kind::kHash;
    } else if (c >= 0x80) {
      // Outside literals and comments, ASCII only: a byte order mark or a Unicode space a
      // compiler might take for a blank must not hide a directive from this check.
      return Refuse(pos_, "a non-ASCII character outside a literal or comment");
    } else if (c == '\\') {
      // Not a splice (those are gone): a universal character name or a stray backslash,
      // either of which could spell a directive or a banned name another way.
      return Refuse(pos_, "a backslash outside a literal");
    } else {
      ++pos_;
      t->kind = Kind::kPunct;
    }
    t->end = pos_;
    return Status::Ok();
  }

  // Skip to the end of the line (its newline consumed), checking every token on the way.
  Status RestOfLine(Token* last) {
    for (;;) {
      FERRY_RETURN_IF_ERROR(Next(last));
      if (last->kind == Kind::kNewline || last->kind == Kind::kEnd) return Status::Ok();
    }
  }

  Status Directive(const Token& hash) {
    Token name;
    FERRY_RETURN_IF_ERROR(Next(&name));
    Token last = name;
    if (name.kind == Kind::kIdentifier) {
      const std::string_view word(text_.data() + name.begin, name.end - name.begin);
      if (OneOf(word, kIncludeLike)) {
        FERRY_RETURN_IF_ERROR(HeaderName(hash, word));
        FERRY_RETURN_IF_ERROR(Next(&last));
        if (last.kind != Kind::kNewline && last.kind != Kind::kEnd) {
          return Refuse(hash.begin, "#" + std::string(word) + " followed by more than <NAME>");
        }
      } else if (word == "pragma") {
        Token what;
        FERRY_RETURN_IF_ERROR(Next(&what));
        const std::string_view pragma(text_.data() + what.begin, what.end - what.begin);
        if (what.kind != Kind::kIdentifier || !OneOf(pragma, kPragmas)) {
          return Refuse(hash.begin,
                        "#pragma " + std::string(what.kind == Kind::kIdentifier ? pragma : "") +
                            " is not allowed (allowed: unroll, nounroll, once, push_macro, "
                            "pop_macro, nv_diag_*)");
        }
        last = what;
        if (what.kind != Kind::kNewline) FERRY_RETURN_IF_ERROR(RestOfLine(&last));
      } else if (OneOf(word, kPlainDirectives)) {
        FERRY_RETURN_IF_ERROR(RestOfLine(&last));
      } else {
        return Refuse(hash.begin,
                      "the directive #" + std::string(word.substr(0, 32)) + " is not allowed");
      }
    } else if (name.kind == Kind::kNumber) {
      FERRY_RETURN_IF_ERROR(RestOfLine(&last));  // a line marker: `# 12 "name"`
    } else if (name.kind != Kind::kNewline && name.kind != Kind::kEnd) {
      return Refuse(hash.begin, "a malformed directive");
    }
    // A directive continued over a splice: refused rather than reasoned about.
    auto splice = std::upper_bound(splices_.begin(), splices_.end(), hash.begin);
    if (splice != splices_.end() && *splice < last.end) {
      return Refuse(hash.begin, "a directive continued with a backslash-newline");
    }
    return Status::Ok();
  }

  // After an include-like directive's name: exactly `<NAME>` with NAME built in.
  Status HeaderName(const Token& hash, std::string_view directive) {
    bool crossed = false;
    FERRY_RETURN_IF_ERROR(SkipSpace(&crossed));
    const std::string refused =
        "#" + std::string(directive) +
        " of anything but NVRTC's built-in headers (#include <cuda_fp16.h> and the like) is "
        "not allowed";
    if (directive != "include" || crossed || pos_ >= text_.size() || text_[pos_] != '<') {
      return Refuse(hash.begin, refused);
    }
    const size_t close = text_.find_first_of(">\n", pos_ + 1);
    if (close == std::string::npos || text_[close] != '>') return Refuse(hash.begin, refused);
    const std::string_view header(text_.data() + pos_ + 1, close - pos_ - 1);
    if (std::find(kBuiltinHeaders.begin(), kBuiltinHeaders.end(), header) ==
        kBuiltinHeaders.end()) {
      return Refuse(hash.begin, refused);
    }
    pos_ = close + 1;
    return Status::Ok();
  }

  const std::string text_;
  const std::vector<size_t> splices_;  // positions in text_ where a line was joined, sorted
  size_t pos_ = 0;
};

}  // namespace

Status CheckCudaSource(std::string_view source) {
  // Translation phases 1 and 2, refusing whatever compilers read differently.
  std::string text;
  text.reserve(source.size());
  std::vector<size_t> splices;
  size_t line = 1;
  auto refuse = [&](const std::string& what) {
    return Status(ErrorKind::kCompileError,
                  "CUDA C++ line " + std::to_string(line) + ": " + what +
                      " (ferryd compiles without access to any file; see docs/operations.md, "
                      "\"CUDA C++ compiles\")");
  };
  for (size_t i = 0; i < source.size(); ++i) {
    const char c = source[i];
    if (c == '\0') return refuse("a NUL byte");
    if (c == '\r') {
      if (i + 1 < source.size() && source[i + 1] == '\n') continue;  // CRLF: a newline
      return refuse("a carriage return without a line feed");
    }
    if (c == '?' && i + 2 < source.size() && source[i + 1] == '?' &&
        std::string_view("=/'()!<>-").find(source[i + 2]) != std::string_view::npos) {
      return refuse("a trigraph");
    }
    if (c == '\\') {
      size_t j = i + 1;
      while (j < source.size() && IsBlank(source[j])) ++j;
      if (j < source.size() && source[j] == '\r') ++j;
      if (j < source.size() && source[j] == '\n') {
        if (j != i + 1 && !(j == i + 2 && source[i + 1] == '\r')) {
          return refuse("a backslash followed by blanks at the end of a line");
        }
        splices.push_back(text.size());
        ++line;
        i = j;
        continue;
      }
    }
    if (c == '\n') ++line;
    text.push_back(c);
  }
  return Scanner(std::move(text), std::move(splices)).Run();
}

}  // namespace ferry::backend
