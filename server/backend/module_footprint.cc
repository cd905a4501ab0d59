#include "backend/module_footprint.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/dtype.h"

namespace ferry::backend {
namespace {

Status Refuse(std::string why) { return Status(ErrorKind::kInvalidArgument, std::move(why)); }

/// `text` quoted for a message, cut short if long.
std::string Quoted(std::string_view text) {
  constexpr size_t kMax = 40;
  std::string out = "'" + std::string(text.substr(0, kMax));
  if (text.size() > kMax) out += "...";
  return out + "'";
}

// --- PTX ----------------------------------------------------------------------------------------

struct Token {
  enum class Kind { kEnd, kWord, kPunct, kString } kind = Kind::kEnd;
  std::string_view text;

  bool Is(char c) const { return kind == Kind::kPunct && text[0] == c; }
  bool IsWord(std::string_view w) const { return kind == Kind::kWord && text == w; }
};

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '$' || c == '%';
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/// PTX's tokens, comments and whitespace skipped, up to the first NUL (where the driver stops
/// reading). A word is a run of identifier characters and dots: an instruction such as
/// `ld.global.u32` is one word, so only a state-space directive is the word `.global`.
class PtxLexer {
 public:
  explicit PtxLexer(std::string_view text) : text_(text.substr(0, text.find('\0'))) {}

  /// The next token (kEnd at the end or on an error; then status() says which).
  Token Next() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (IsSpace(c)) {
        ++pos_;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/') {
        const size_t eol = text_.find('\n', pos_);
        pos_ = eol == std::string_view::npos ? text_.size() : eol + 1;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '*') {
        const size_t close = text_.find("*/", pos_ + 2);
        if (close == std::string_view::npos) return Fail("a /* comment never ends");
        pos_ = close + 2;
      } else if (c == '"') {
        size_t j = pos_ + 1;
        while (j < text_.size() && text_[j] != '"') j += text_[j] == '\\' ? 2 : 1;
        if (j >= text_.size()) return Fail("a string never ends");
        Token t{Token::Kind::kString, text_.substr(pos_, j + 1 - pos_)};
        pos_ = j + 1;
        return t;
      } else if (c == '#') {
        // A preprocessor line could define what a later declaration's words mean.
        return Fail("PTX with preprocessor directives ('#') is not accepted");
      } else if (IsWordChar(c)) {
        size_t j = pos_;
        while (j < text_.size() && IsWordChar(text_[j])) ++j;
        Token t{Token::Kind::kWord, text_.substr(pos_, j - pos_)};
        pos_ = j;
        return t;
      } else {
        return Token{Token::Kind::kPunct, text_.substr(pos_++, 1)};
      }
    }
    return Token{};
  }

  const Status& status() const { return status_; }

 private:
  Token Fail(std::string why) {
    status_ = Refuse(std::move(why));
    pos_ = text_.size();
    return Token{};
  }

  const std::string_view text_;
  size_t pos_ = 0;
  Status status_;
};

/// The bytes of one element of a PTX type (0: not a type).
uint64_t PtxTypeBytes(std::string_view type) {
  struct Entry {
    std::string_view name;
    uint64_t bytes;
  };
  // clang-format off
  static constexpr Entry kTypes[] = {
      {".b8", 1},   {".u8", 1},   {".s8", 1},   {".e4m3", 1},  {".e5m2", 1},
      {".b16", 2},  {".u16", 2},  {".s16", 2},  {".f16", 2},   {".bf16", 2},
      {".e4m3x2", 2}, {".e5m2x2", 2},
      {".b32", 4},  {".u32", 4},  {".s32", 4},  {".f32", 4},   {".f16x2", 4},
      {".bf16x2", 4}, {".tf32", 4}, {".pred", 4},
      {".b64", 8},  {".u64", 8},  {".s64", 8},  {".f64", 8},   {".b128", 16},
      // Opaque handles: their layout is the driver's; 128 bytes is well above any of them.
      {".texref", 128}, {".samplerref", 128}, {".surfref", 128},
  };
  // clang-format on
  for (const Entry& e : kTypes) {
    if (e.name == type) return e.bytes;
  }
  return 0;
}

/// Parse a PTX integer literal (decimal, 0x hex, 0b binary, 0 octal, optional U suffix).
bool ParsePtxInteger(std::string_view text, uint64_t* out) {
  if (!text.empty() && (text.back() == 'U' || text.back() == 'u')) text.remove_suffix(1);
  if (text.empty()) return false;
  uint64_t base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  } else if (text.size() > 2 && text[0] == '0' && (text[1] == 'b' || text[1] == 'B')) {
    base = 2;
    text.remove_prefix(2);
  } else if (text.size() > 1 && text[0] == '0') {
    base = 8;
    text.remove_prefix(1);
  }
  uint64_t value = 0;
  for (char c : text) {
    uint64_t digit = 0;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint64_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      digit = static_cast<uint64_t>(c - 'A' + 10);
    } else {
      return false;
    }
    if (digit >= base) return false;
    if (!CheckedMul(value, base, &value) || !CheckedAdd(value, digit, &value)) return false;
  }
  *out = value;
  return true;
}

/// Reads the declarations of `.global` and `.const` variables out of PTX text.
class PtxDeclarations {
 public:
  explicit PtxDeclarations(std::string_view text) : lexer_(text) {}

  /// Return the bytes every `.global` and `.const` variable takes.
  Result<uint64_t> Sum() {
    uint64_t total = 0;
    bool is_extern = false;  // the statement so far carries .extern
    for (Token t = lexer_.Next(); t.kind != Token::Kind::kEnd; t = lexer_.Next()) {
      if (t.Is(';') || t.Is('{') || t.Is('}')) {
        is_extern = false;
      } else if (t.IsWord(".extern")) {
        is_extern = true;
      } else if (t.IsWord(".global") || t.IsWord(".const")) {
        FERRY_ASSIGN_OR_RETURN(uint64_t bytes, Declaration(t.text, is_extern));
        if (!CheckedAdd(total, bytes, &total)) {
          return Refuse("the module's .global and .const variables overflow 64 bits");
        }
        is_extern = false;  // the declaration was read through its ';'
      }
    }
    FERRY_RETURN_IF_ERROR(lexer_.status());
    return total;
  }

 private:
  Token Next() { return lexer_.Next(); }
  Status Ended(std::string_view space) {
    FERRY_RETURN_IF_ERROR(lexer_.status());
    return Refuse("a " + std::string(space) + " declaration does not end with ';'");
  }

  /// Read one declaration after its state space (`.global` or `.const`) through its ';';
  /// return the bytes its variables take (none when `is_extern`).
  Result<uint64_t> Declaration(std::string_view space, bool is_extern) {
    uint64_t element = 0, vector = 1, align = 1;
    Token t = Next();
    for (; t.kind == Token::Kind::kWord && t.text[0] == '.'; t = Next()) {
      if (t.text == ".align") {
        Token n = Next();
        if (n.kind != Token::Kind::kWord || !ParsePtxInteger(n.text, &align) || align == 0) {
          if (n.kind == Token::Kind::kEnd) return Ended(space);
          return Refuse("cannot read the alignment " + Quoted(n.text) + " of a " +
                        std::string(space) + " variable");
        }
      } else if (t.text == ".v2" || t.text == ".v4" || t.text == ".v8") {
        vector = static_cast<uint64_t>(t.text[2] - '0');
      } else if (t.text == ".attribute") {
        FERRY_RETURN_IF_ERROR(SkipParenthesised(space));
      } else if (uint64_t bytes = PtxTypeBytes(t.text); bytes > 0) {
        element = bytes;
      } else {
        return Refuse("unknown " + Quoted(t.text) + " in a " + std::string(space) + " declaration");
      }
    }
    if (t.kind == Token::Kind::kEnd) return Ended(space);
    if (element == 0) {
      return Refuse("a " + std::string(space) + " declaration without a type before " +
                    Quoted(t.text));
    }
    uint64_t element_bytes = element * vector;  // at most 128 x 8
    const uint64_t padding = std::max(align, element_bytes) - 1;
    uint64_t total = 0;
    while (true) {  // one variable per turn: name [dims] [= initialiser] then ',' or ';'
      if (t.kind != Token::Kind::kWord || t.text[0] == '.' ||
          (t.text[0] >= '0' && t.text[0] <= '9')) {
        if (t.kind == Token::Kind::kEnd) return Ended(space);
        return Refuse("expected a variable name in a " + std::string(space) +
                      " declaration, found " + Quoted(t.text));
      }
      const std::string_view name = t.text;
      uint64_t bytes = element_bytes;
      bool unsized = false;
      t = Next();
      FERRY_RETURN_IF_ERROR(Dimensions(space, name, &t, &bytes, &unsized));
      if (t.Is('<')) {
        return Refuse("parameterised names (" + Quoted(name) + ") are not accepted for " +
                      std::string(space) + " variables");
      }
      uint64_t initialised = 0;  // elements of the initialiser's outermost level
      bool has_initialiser = false;
      if (t.Is('=')) {
        has_initialiser = true;
        FERRY_ASSIGN_OR_RETURN(initialised, SkipInitialiser(space, &t));
      }
      if (unsized) {
        if (!has_initialiser) {
          if (!is_extern) {
            return Refuse(Quoted(name) + "[] has no size and no initialiser to count");
          }
        } else if (!CheckedMul(bytes, initialised, &bytes)) {
          return Refuse("the size of " + Quoted(name) + " overflows 64 bits");
        }
      }
      if (!is_extern &&
          (!CheckedAdd(bytes, padding, &bytes) || !CheckedAdd(total, bytes, &total))) {
        return Refuse("the size of " + Quoted(name) + " overflows 64 bits");
      }
      if (t.Is(';')) return total;
      if (!t.Is(',')) {
        if (t.kind == Token::Kind::kEnd) return Ended(space);
        return Refuse("unexpected " + Quoted(t.text) + " after " + Quoted(name) + " in a " +
                      std::string(space) + " declaration");
      }
      t = Next();
    }
  }

  /// Read a variable's dimensions (`[N]...`, the first may be `[]`) from `*t` on, multiplying
  /// `*bytes` by each; `*unsized` when the first is `[]` (sized by its initialiser). Leaves
  /// `*t` at the token after them.
  Status Dimensions(std::string_view space, std::string_view name, Token* t, uint64_t* bytes,
                    bool* unsized) {
    for (bool first = true; t->Is('['); first = false) {
      Token n = Next();
      if (n.Is(']') && first) {
        *unsized = true;
      } else {
        uint64_t dim = 0;
        if (n.kind != Token::Kind::kWord || !ParsePtxInteger(n.text, &dim)) {
          if (n.kind == Token::Kind::kEnd) return Ended(space);
          return Refuse("cannot read the dimension " + Quoted(n.text) + " of " + Quoted(name));
        }
        if (!CheckedMul(*bytes, dim, bytes)) {
          return Refuse("the size of " + Quoted(name) + " overflows 64 bits");
        }
        n = Next();
        if (!n.Is(']')) {
          if (n.kind == Token::Kind::kEnd) return Ended(space);
          return Refuse("expected ']' after a dimension of " + Quoted(name) + ", found " +
                        Quoted(n.text));
        }
      }
      *t = Next();
    }
    return Status::Ok();
  }

  /// Skip `( ... )` after an .attribute.
  Status SkipParenthesised(std::string_view space) {
    Token t = Next();
    if (!t.Is('(')) {
      if (t.kind == Token::Kind::kEnd) return Ended(space);
      return Refuse(".attribute without '(' in a " + std::string(space) + " declaration");
    }
    for (int depth = 1; depth > 0;) {
      t = Next();
      if (t.kind == Token::Kind::kEnd) return Ended(space);
      if (t.Is('(')) ++depth;
      if (t.Is(')')) --depth;
      if (t.Is(';')) return Refuse("an .attribute never closes");
    }
    return Status::Ok();
  }

  /// Skip an initialiser (after its '=') up to the ',' or ';' that ends it, left in `*end`;
  /// return how many elements its outermost level has (a scalar: 1; `{a, {b, c}}`: 2; a
  /// count that is never below the true one: a string counts its every byte too).
  Result<uint64_t> SkipInitialiser(std::string_view space, Token* end) {
    uint64_t depth = 0, commas = 0, string_bytes = 0;
    bool braced = false, content = false;
    for (Token t = Next();; t = Next()) {
      if (t.kind == Token::Kind::kEnd) return Ended(space);
      if (depth == 0 && (t.Is(',') || t.Is(';'))) {
        *end = t;
        break;
      }
      if (t.Is('{') || t.Is('(')) {
        if (depth == 0 && t.Is('{')) braced = true;
        if (depth == 1) content = true;
        ++depth;
      } else if (t.Is('}') || t.Is(')')) {
        if (depth == 0) return Refuse("an initialiser closes more than it opens");
        --depth;
      } else if (t.Is(';')) {
        return Refuse("an initialiser never closes");
      } else if (depth == 1 && t.Is(',')) {
        ++commas;
      } else if (depth >= 1) {
        content = true;
      }
      if (t.kind == Token::Kind::kString) string_bytes += t.text.size();
    }
    // At most one per byte of the image: no overflow.
    if (!braced) return 1 + string_bytes;
    return (content ? commas + 1 : commas) + string_bytes;
  }

  PtxLexer lexer_;
};

Result<uint64_t> PtxFootprint(std::string_view text) {
  FERRY_ASSIGN_OR_RETURN(uint64_t variables, PtxDeclarations(text).Sum());
  uint64_t total = 0;
  if (!CheckedAdd(text.size(), variables, &total)) {
    return Refuse("the module's size overflows 64 bits");
  }
  return total;
}

// --- ELF (CUBIN) --------------------------------------------------------------------------------

uint64_t LoadLittle(std::string_view bytes, uint64_t at, int width) {
  uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<uint8_t>(bytes[at + static_cast<uint64_t>(i)]);
  }
  return v;
}

/// Whether [offset, offset + length) lies inside `size` bytes.
bool Inside(uint64_t offset, uint64_t length, uint64_t size) {
  uint64_t end = 0;
  return CheckedAdd(offset, length, &end) && end <= size;
}

// Whether a header table of `count` entries of `entry_bytes` (each at least `min_entry_bytes`)
// at `offset` lies inside an image of `size` bytes. An empty table always does.
bool TableInside(uint64_t offset, uint64_t count, uint64_t entry_bytes, uint64_t min_entry_bytes,
                 uint64_t size) {
  uint64_t table = 0;
  return count == 0 || (entry_bytes >= min_entry_bytes && CheckedMul(count, entry_bytes, &table) &&
                        Inside(offset, table, size));
}

constexpr char kElfMagic[] = {'\x7f', 'E', 'L', 'F'};
constexpr char kFatbinMagic[] = {'\x50', '\xed', '\x55', '\xba'};  // 0xBA55ED50, little-endian

bool StartsWith(std::string_view bytes, const char (&magic)[4]) {
  return bytes.size() >= 4 && std::memcmp(bytes.data(), magic, 4) == 0;
}

Result<uint64_t> ElfFootprint(std::string_view elf) {
  constexpr uint64_t kEhdrBytes = 64, kShdrBytes = 64, kPhdrBytes = 56;
  constexpr uint32_t kShtNull = 0, kShtNobits = 8;
  constexpr uint64_t kShfAlloc = 0x2, kShfExecInstr = 0x4;
  constexpr uint32_t kPtLoad = 1;
  const uint64_t size = elf.size();
  if (!StartsWith(elf, kElfMagic)) return Refuse("the CUBIN is not an ELF image");
  if (size < kEhdrBytes) return Refuse("the CUBIN's ELF header is truncated");
  if (elf[4] != 2) return Refuse("the CUBIN is not a 64-bit ELF");
  if (elf[5] != 1) return Refuse("the CUBIN is not a little-endian ELF");
  const uint64_t phoff = LoadLittle(elf, 0x20, 8);
  const uint64_t shoff = LoadLittle(elf, 0x28, 8);
  const uint64_t phentsize = LoadLittle(elf, 0x36, 2);
  uint64_t phnum = LoadLittle(elf, 0x38, 2);
  const uint64_t shentsize = LoadLittle(elf, 0x3A, 2);
  uint64_t shnum = LoadLittle(elf, 0x3C, 2);

  // Sections. More than 0xff00 of them: e_shnum is 0 and section 0's sh_size holds the count.
  if (shnum == 0 && shoff != 0) {
    if (shentsize < kShdrBytes || !Inside(shoff, kShdrBytes, size)) {
      return Refuse("the CUBIN's section headers lie outside the image");
    }
    shnum = LoadLittle(elf, shoff + 0x20, 8);
  }
  if (!TableInside(shoff, shnum, shentsize, kShdrBytes, size)) {
    return Refuse("the CUBIN's section headers lie outside the image");
  }
  uint64_t sections = 0;
  for (uint64_t i = 0; i < shnum; ++i) {
    const uint64_t at = shoff + i * shentsize;
    const auto type = static_cast<uint32_t>(LoadLittle(elf, at + 0x04, 4));
    const uint64_t flags = LoadLittle(elf, at + 0x08, 8);
    const uint64_t offset = LoadLittle(elf, at + 0x18, 8);
    const uint64_t bytes = LoadLittle(elf, at + 0x20, 8);
    if (type == kShtNull && i == 0) continue;  // section 0 (it may hold the count)
    if (type != kShtNobits && type != kShtNull && !Inside(offset, bytes, size)) {
      return Refuse("the CUBIN's section " + std::to_string(i) + " lies outside the image");
    }
    // NOBITS sections take memory but no file bytes: counted whatever their flags say.
    if ((flags & (kShfAlloc | kShfExecInstr)) != 0 || type == kShtNobits) {
      if (!CheckedAdd(sections, bytes, &sections)) {
        return Refuse("the CUBIN's sections overflow 64 bits");
      }
    }
  }

  // Loadable segments, in case the loader goes by them.
  if (phnum == 0xFFFF) return Refuse("the CUBIN has too many program headers");
  if (!TableInside(phoff, phnum, phentsize, kPhdrBytes, size)) {
    return Refuse("the CUBIN's program headers lie outside the image");
  }
  uint64_t segments = 0;
  for (uint64_t i = 0; i < phnum; ++i) {
    const uint64_t at = phoff + i * phentsize;
    if (static_cast<uint32_t>(LoadLittle(elf, at, 4)) != kPtLoad) continue;
    const uint64_t offset = LoadLittle(elf, at + 0x08, 8);
    const uint64_t filesz = LoadLittle(elf, at + 0x20, 8);
    const uint64_t memsz = LoadLittle(elf, at + 0x28, 8);
    if (!Inside(offset, filesz, size)) {
      return Refuse("the CUBIN's segment " + std::to_string(i) + " lies outside the image");
    }
    if (!CheckedAdd(segments, memsz, &segments)) {
      return Refuse("the CUBIN's segments overflow 64 bits");
    }
  }
  return std::max(sections, segments);
}

// --- fatbin -------------------------------------------------------------------------------------

/// A PTX entry of a fatbin must be text (up to NUL padding): compressed bytes, whatever the
/// flags say, never are.
bool IsPtxText(std::string_view payload) {
  const size_t nul = std::min(payload.find('\0'), payload.size());
  for (size_t i = 0; i < payload.size(); ++i) {
    const auto c = static_cast<unsigned char>(payload[i]);
    if (i >= nul ? c != 0 : (c < 0x20 && !IsSpace(static_cast<char>(c)))) return false;
  }
  return true;
}

Result<uint64_t> FatbinFootprint(std::string_view image) {
  // Layouts: the container header {u32 magic, u16 version, u16 header size, u64 bytes of
  // entries}; each entry {u16 kind, u16, u32 header size, u64 payload bytes, u32, u32, u16,
  // u16, u32 arch, u32, u32, u64 flags, ...} followed by its payload.
  constexpr uint64_t kContainerBytes = 16, kEntryBytes = 64;
  constexpr uint64_t kKindPtx = 1, kKindElf = 2, kKindElfAlt = 0x10;
  // LZ4 (older toolkits) and ZSTD (newer ones) compressed payloads.
  constexpr uint64_t kCompressedFlags = 0x2000 | 0x8000;
  const std::string kAdvice = "; load a CUBIN, PTX or an uncompressed fatbin instead";
  const uint64_t size = image.size();
  uint64_t largest = 0, entries = 0;
  for (uint64_t pos = 0; pos < size;) {
    if (std::all_of(image.begin() + static_cast<ptrdiff_t>(pos), image.end(),
                    [](char c) { return c == 0; })) {
      break;  // padding after the last container
    }
    if (!Inside(pos, kContainerBytes, size) || !StartsWith(image.substr(pos), kFatbinMagic)) {
      return Refuse("the fatbin holds bytes that are not a container at offset " +
                    std::to_string(pos) + kAdvice);
    }
    const uint64_t header = LoadLittle(image, pos + 6, 2);
    const uint64_t body = LoadLittle(image, pos + 8, 8);
    uint64_t start = 0, end = 0;
    if (header < kContainerBytes || !CheckedAdd(pos, header, &start) ||
        !CheckedAdd(start, body, &end) || end > size) {
      return Refuse("the fatbin's container at offset " + std::to_string(pos) +
                    " lies outside the image" + kAdvice);
    }
    for (uint64_t at = start; at < end;) {
      const std::string where = "the fatbin's entry at offset " + std::to_string(at);
      if (!Inside(at, kEntryBytes, end)) return Refuse(where + " is truncated" + kAdvice);
      const uint64_t kind = LoadLittle(image, at, 2);
      const uint64_t entry_header = LoadLittle(image, at + 4, 4);
      const uint64_t payload_bytes = LoadLittle(image, at + 8, 8);
      const uint64_t flags = LoadLittle(image, at + 40, 8);
      uint64_t payload = 0;
      if (entry_header < kEntryBytes || !CheckedAdd(at, entry_header, &payload) ||
          !Inside(payload, payload_bytes, end)) {
        return Refuse(where + " lies outside its container" + kAdvice);
      }
      if ((flags & kCompressedFlags) != 0) {
        return Refuse(where + " is compressed, so its memory cannot be bounded" + kAdvice);
      }
      const std::string_view code = image.substr(payload, payload_bytes);
      Result<uint64_t> bound = Refuse(where + " is of kind " + std::to_string(kind) +
                                      ", which cannot be bounded" + kAdvice);
      if (kind == kKindPtx) {
        if (!IsPtxText(code)) {
          return Refuse(where + " is not PTX text (compressed?)" + kAdvice);
        }
        bound = PtxFootprint(code);
      } else if (kind == kKindElf || kind == kKindElfAlt) {
        bound = ElfFootprint(code);
      }
      if (!bound.ok()) return Refuse(where + ": " + bound.status().message() + kAdvice);
      largest = std::max(largest, *bound);
      ++entries;
      at = payload + payload_bytes;
    }
    pos = end;
  }
  if (entries == 0) return Refuse("the fatbin holds no code");
  return largest;
}

}  // namespace

Result<uint64_t> ModuleFootprint(ModuleFormat format, std::string_view loadable_image) {
  Result<uint64_t> bound =
      Refuse("unknown module format " + std::to_string(static_cast<int>(format)));
  switch (format) {
    case ModuleFormat::kPtx:
      bound = PtxFootprint(loadable_image);
      break;
    case ModuleFormat::kCubin:
    case ModuleFormat::kCudaSource:  // its loadable image is the CUBIN NVRTC made
      if (StartsWith(loadable_image, kElfMagic)) {
        bound = ElfFootprint(loadable_image);
      } else if (StartsWith(loadable_image, kFatbinMagic)) {
        bound = FatbinFootprint(loadable_image);
      } else {
        bound = Refuse("the image is not a CUBIN or fatbin");
      }
      break;
  }
  if (!bound.ok()) return bound.status().WithContext("LoadModule: the module's device memory");
  return bound;
}

}  // namespace ferry::backend
