// The source check in front of NVRTC (server/backend/cuda_source_check.h), with an attacker's
// inputs: every way to make the compiler read a file is refused with COMPILE_ERROR, and the
// message never quotes the path; ordinary kernels pass.
#include "backend/cuda_source_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::backend {
namespace {

constexpr char kKernel[] = R"(
// A comment with #include "/etc/passwd" in it is only a comment.
#define N 256
#pragma once
extern "C" __global__ void axpb(float* out, const float* in, float a, float b, int n) {
  const char* s = "#include \"/etc/passwd\"";  /* and a string is only a string */
  const char* r = R"x(
#include "/etc/shadow"
)x";
  int big = 1'000'000;
  char q = '\'';
  #pragma unroll 4
  for (int i = 0; i < 4; ++i) { }
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b + (s[0] + r[0] + big + q) * 0;
}
)";

TEST(CudaSourceCheckTest, OrdinaryKernelsPass) {
  EXPECT_TRUE(CheckCudaSource(kKernel).ok()) << CheckCudaSource(kKernel).ToString();
  EXPECT_TRUE(CheckCudaSource("").ok());
  EXPECT_TRUE(CheckCudaSource("#include <cuda_fp16.h>\n__global__ void f(__half* h) {}").ok());
  EXPECT_TRUE(CheckCudaSource("#include <cuda_bf16.h>").ok());
  EXPECT_TRUE(CheckCudaSource("# include\t<cuda_fp16.h> // half\r\n").ok());
  EXPECT_TRUE(CheckCudaSource("#if defined(X) && X > 1\n#error no\n#endif\n#\n").ok());
  EXPECT_TRUE(CheckCudaSource("#define CAT(a, b) a##b\n#define STR(a) #a\n").ok());
  EXPECT_TRUE(CheckCudaSource("#line 10 \"kernel.cu\"\n# 12 \"k.cu\"\n").ok());
  EXPECT_TRUE(CheckCudaSource("int a = 1 \\\n + 2;").ok()) << "a splice outside a directive";
  // Pasting, and names that start like CUDA's intrinsics, stay allowed.
  const std::string pasting = R"(
#define CAT(a, b) a##b
#define KERNEL(T) extern "C" __global__ void CAT(scale_, T)(T* p, T s) { p[threadIdx.x] *= s; }
KERNEL(float)
KERNEL(double)
__device__ __half h(__half a, __half b) { return __hadd(__habs(a), __hmul(a, b)); }
__device__ int pc(unsigned x) { return __popc(x) + __prmt(x, x, 0); }
__global__ void t(int* o) { NV_IF_TARGET(NV_IS_DEVICE, (o[0] = 1;)) }
)";
  EXPECT_TRUE(CheckCudaSource(pasting).ok()) << CheckCudaSource(pasting).ToString();
}

TEST(CudaSourceCheckTest, EveryWayToIncludeAFileIsRefused) {
  const std::vector<std::string> attacks = {
      "#include \"/etc/passwd\"",
      "#include </etc/passwd>",
      "#include <cuda_fp16.h/../../../../etc/passwd>",
      "#include \"cuda_fp16.h\"",  // quoted: searched in the file system first
      "#include <stdio.h>",
      "  #  include \"/etc/passwd\"",
      "\t#\tinclude\t\"/etc/passwd\"",
      "/**/#/**/include/**/\"/etc/passwd\"",
      "/* a comment\n over lines */ #include \"/etc/passwd\"",
      "%:include \"/etc/passwd\"",
      "%: include </etc/passwd>",
      "#define F \"/etc/passwd\"\n#include F",
      "#define F </etc/passwd>\n#include F",
      "#include_next \"/etc/passwd\"",
      "#import \"/etc/passwd\"",
      "#embed \"/etc/passwd\"",
      "#inc\\\nlude \"/etc/passwd\"",
      "#include \\\n \"/etc/passwd\"",
      "#\\\ninclude <cuda_fp16.h>",
      "\\\n#include \"/etc/passwd\"",
      "#include <cuda_fp16.h> \"/etc/passwd\"",
      "#include <cuda_fp16.h>\\\n\"/etc/passwd\"",
      "int a; \\ \n#include \"/etc/passwd\"",  // backslash, blank, newline: splice or not?
      "?\?=include \"/etc/passwd\"",
      "int a;\r#include \"/etc/passwd\"",
      "\xEF\xBB\xBF#include \"/etc/passwd\"",  // a byte order mark
      "\xC2\xA0#include \"/etc/passwd\"",      // a no-break space
      "#\\u0069nclude \"/etc/passwd\"",
      "char c = 'x\n#include \"/etc/passwd\"\n';",  // an unterminated literal ends at the line
      "const char* s = \"abc\n#include \"/etc/passwd\"\n\";",
      "int x = 1'0;\n#include \"/etc/passwd\"\nchar c = '\\'';",
      "#if __has_include(\"/etc/passwd\")\n#endif",
      "#if __has_include_next(<x>)\n#endif",
      "#define H __has_include\n",
      "_Pragma(\"GCC dependency \\\"/etc/passwd\\\"\")",
      "#pragma GCC dependency \"/etc/passwd\"",
      "#pragma include_alias(\"a\", \"/etc/passwd\")",
      "#pragma",
      "#ident \"x\"",
      "#assert machine(x)",
      "/* unterminated",
      "const char* r = R\"x(never closed",
      std::string("#include \"/etc/passwd\"\0", 23),
      std::string("int a;\0\n#include \"/etc/passwd\"", 30),
      "FOOR\"(\n#include \"/etc/passwd\"\n)\"",  // not a raw string: FOOR is an identifier
  };
  for (const std::string& source : attacks) {
    Status s = CheckCudaSource(source);
    EXPECT_EQ(s.kind(), ErrorKind::kCompileError) << "accepted:\n" << source;
    EXPECT_EQ(s.message().find("passwd"), std::string::npos)
        << "the message quotes the path: " << s.message();
  }
}

// Token pasting makes identifiers the check never sees spelled: each of these makes _Pragma
// (NVRTC 13.0 ran the pragma), __pragma, __has_include or __has_embed as the source is
// preprocessed, and passed the check before it refused names that could start one. NVRTC's
// own macros paste too: _NV_TEST_PAREN2(x) is `_` pasted before x, _NV_CONCAT_EVAL(a, b)
// is a##b, and neither needs a ## in the source.
TEST(CudaSourceCheckTest, NoPasteCanMakeABannedName) {
  const std::string pragma = "(\"GCC dependency \\\"/etc/passwd\\\"\")";
  const std::vector<std::string> attacks = {
      "#define CAT(a, b) a##b\nCAT(_Pr, agma)" + pragma,
      "#define CAT(a, b) a %:%: b\nCAT(_Pr, agma)" + pragma,
      "%:define CAT(a, b) a%:%:b\nCAT(_Pr, agma)" + pragma,
      "#define CAT(a, b) a/**/##/**/b\nCAT(_Pr, agma)" + pragma,
      "#define CAT(a, b) a##b\n#define XCAT(a, b) CAT(a, b)\nXCAT(XCAT(_, Pr), agma)" + pragma,
      "#define CAT(a, b, c) a##b##c\nCAT(_Pr, , agma)" + pragma,
      "#define CAT(a, ...) a##__VA_ARGS__\nCAT(_Pra, gma)" + pragma,
      "#define P(x) _Pr##x\nP(agma)" + pragma,
      "#define P(x) x##ragma\nP(_P)" + pragma,
      "#define CAT(a, b) a##b\nCAT(_Pr,\n agma)" + pragma,    // arguments over two lines
      "#define CAT(a, b) a##b\nCAT(_Pr, \\\nagma)" + pragma,  // ... and over a splice
      "#define CAT(a, b) a##b\nCAT(__, pragma)(message(\"x\"))",
      "#define CAT(a, b) a##b\n#if CAT(__has_, include)(\"/etc/passwd\")\n#endif",
      "#define CAT(a, b) a##b\n#if CAT(__has_include_, next)(\"/etc/passwd\")\n#endif",
      "#define CAT(a, b) a##b\n#if CAT(__has_, embed)(\"/etc/passwd\")\n#endif",
      "#define CAT(a, b) a##b\n#pragma unroll CAT(_Pr, agma)" + pragma,
      "_NV_TEST_PAREN2(Pragma" + pragma + ")",
      "#define NV _NV_TEST_PAREN2\nNV(Pragma" + pragma + ")",
      "_NV_CONCAT_EVAL(_NV_CONCAT_EVAL(_Pr, ag), ma)" + pragma,
  };
  for (const std::string& source : attacks) {
    Status s = CheckCudaSource(source);
    EXPECT_EQ(s.kind(), ErrorKind::kCompileError) << "accepted:\n" << source;
    EXPECT_EQ(s.message().find("passwd"), std::string::npos) << s.message();
  }
}

// Where the check read the text otherwise than NVRTC, a banned name or a directive hid from
// it: NVRTC takes `$` for no part of a name, and undoes a line splice inside a raw string.
TEST(CudaSourceCheckTest, NothingHidesWhereNvrtcReadsOtherwise) {
  const std::vector<std::string> attacks = {
      "int x = 1 $_Pragma(\"GCC dependency \\\"/etc/passwd\\\"\");",
      "#define D $_Pragma(\"GCC dependency \\\"/etc/passwd\\\"\")",
      // The check took R"x()x" for the whole first literal and R"y(...)y" for a second one
      // around the #include; NVRTC reads one literal up to )x" and then the directive.
      "const char* a = R\"x()\\\nx\" R\"y(\n)x\";\n#include \"/etc/passwd\"\n)y\";",
  };
  for (const std::string& source : attacks) {
    Status s = CheckCudaSource(source);
    EXPECT_EQ(s.kind(), ErrorKind::kCompileError) << "accepted:\n" << source;
    EXPECT_EQ(s.message().find("passwd"), std::string::npos) << s.message();
  }
}

/// The macros of NVRTC's built-in headers: name, and the identifiers of its body outside
/// literals that are not its parameters (those NVRTC spells itself).
struct BuiltinMacro {
  std::string name;
  std::set<std::string> spelled;
};

/// Read the `#define` lines of the built-in headers stored, as text, in libnvrtc-builtins.
std::vector<BuiltinMacro> ReadBuiltinMacros(const std::string& library) {
  std::ifstream in(library, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string text;  // the headers' lines, spliced; NULs between them end lines too
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] == '\\' && i + 1 < bytes.size() && bytes[i + 1] == '\n') {
      ++i;
    } else {
      text.push_back(bytes[i] == '\0' ? '\n' : bytes[i]);
    }
  }
  auto is_ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  std::vector<BuiltinMacro> macros;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // `# define NAME body` or `# define NAME(PARAMS) body`
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] != '#') continue;
    i = line.find_first_not_of(" \t", i + 1);
    if (i == std::string::npos || line.compare(i, 7, "define ") != 0) continue;
    i = line.find_first_not_of(" \t", i + 7);
    size_t end = i;
    while (end < line.size() && is_ident(line[end])) ++end;
    if (i == std::string::npos || end == i) continue;
    BuiltinMacro macro;
    macro.name = line.substr(i, end - i);
    std::set<std::string> params;
    i = end;
    if (i < line.size() && line[i] == '(') {
      const size_t close = line.find(')', i);
      if (close == std::string::npos) continue;
      for (size_t p = i + 1; p < close;) {
        size_t q = p;
        while (q < close && is_ident(line[q])) ++q;
        if (q > p) params.insert(line.substr(p, q - p));
        p = q + 1;
      }
      i = close + 1;
    }
    while (i < line.size()) {
      const char c = line[i];
      if (c == '"' || c == '\'') {
        for (++i; i < line.size() && line[i] != c; ++i) {
          if (line[i] == '\\') ++i;
        }
        ++i;
      } else if (is_digit(c)) {
        while (i < line.size() && (is_ident(line[i]) || line[i] == '.')) ++i;
      } else if (is_ident(c)) {
        size_t q = i;
        while (q < line.size() && is_ident(line[q])) ++q;
        std::string word = line.substr(i, q - i);
        if (params.count(word) == 0) macro.spelled.insert(std::move(word));
        i = q;
      } else {
        ++i;
      }
    }
    macros.push_back(std::move(macro));
  }
  return macros;
}

// The rule against pasting (cuda_source_check.cc) counts on NVRTC's own macros too: a macro
// that spells a proper prefix of a banned name (`_`, `__`, `_Pr`, `__has_`, ...) could paste
// it before a source's tokens, so a source may not name it, and the macros that use it must
// be ones reviewed to paste it only before tokens of their own. This reads the built-in
// headers the installed NVRTC compiles with, so that a new NVRTC whose macros break the rule
// fails here.
TEST(CudaSourceCheckTest, NvrtcsOwnMacrosPasteNoPrefixBeforeASourcesTokens) {
#ifndef FERRY_NVRTC_BUILTINS_PATH
  GTEST_SKIP() << "built without the CUDA toolkit: no NVRTC built-in headers to read";
#else
  if (!std::ifstream(FERRY_NVRTC_BUILTINS_PATH)) {
    GTEST_SKIP() << "cannot read " << FERRY_NVRTC_BUILTINS_PATH;
  }
  const std::vector<BuiltinMacro> macros = ReadBuiltinMacros(FERRY_NVRTC_BUILTINS_PATH);
  ASSERT_GT(macros.size(), 100u) << "no macro definitions found in " FERRY_NVRTC_BUILTINS_PATH
                                    ": its headers are no longer text; check the rule another way";
  const std::string_view banned[] = {"__has_include", "__has_include_next", "__has_embed",
                                     "_Pragma", "__pragma"};
  auto starts_banned = [&](const std::string& word) {
    for (std::string_view b : banned) {
      if (word.size() < b.size() && b.substr(0, word.size()) == word) return true;
    }
    return false;
  };
  // Reviewed (NVRTC 13.0): __location__ pastes `__` only where _MSC_VER is defined, which
  // NVRTC on Linux is not (its headers are read before a source could define it);
  // _NV_TEST_PAREN1 calls _NV_TEST_PAREN2 with _NV_TEST_PAREN_DUMMY first, so its `_` is
  // pasted before that.
  const std::set<std::string> msvc_only = {"__location__"};
  const std::set<std::string> fixed_first_token = {"_NV_TEST_PAREN1"};
  for (const BuiltinMacro& m : macros) {
    const bool spells_prefix = std::any_of(m.spelled.begin(), m.spelled.end(), starts_banned);
    if (!spells_prefix || msvc_only.count(m.name) != 0) continue;
    EXPECT_FALSE(CheckCudaSource(m.name).ok()) << "a source may name " << m.name;
    for (const BuiltinMacro& user : macros) {
      if (user.spelled.count(m.name) != 0) {
        EXPECT_EQ(fixed_first_token.count(user.name), 1u)
            << user.name << " uses " << m.name << " and a source may reach it";
      }
    }
  }
#endif
}

TEST(CudaSourceCheckTest, TheMessageNamesTheLine) {
  Status s = CheckCudaSource("int a;\nint b = 1 \\\n + 2;\n#include \"/etc/passwd\"\n");
  ASSERT_EQ(s.kind(), ErrorKind::kCompileError);
  EXPECT_NE(s.message().find("line 4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ferry::backend
