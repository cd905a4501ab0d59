// The source check in front of NVRTC (server/backend/cuda_source_check.h), with an attacker's
// inputs: every way to make the compiler read a file is refused with COMPILE_ERROR, and the
// message never quotes the path; ordinary kernels pass.
#include "backend/cuda_source_check.h"

#include <gtest/gtest.h>

#include <string>
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

TEST(CudaSourceCheckTest, TheMessageNamesTheLine) {
  Status s = CheckCudaSource("int a;\nint b = 1 \\\n + 2;\n#include \"/etc/passwd\"\n");
  ASSERT_EQ(s.kind(), ErrorKind::kCompileError);
  EXPECT_NE(s.message().find("line 4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ferry::backend
