// The bound on a module's device memory (server/backend/module_footprint.h): PTX declarations
// of every shape counted, comments and strings neither counted nor hiding one, sizes that
// overflow or cannot be read refused; hand-built CUBINs (ELF64) and fatbins counted by their
// sections and entries, and truncated, lying or compressed ones refused.
#include "backend/module_footprint.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::backend {
namespace {

constexpr char kPtxHead[] = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// The bytes the variables of `body` (after a PTX header) take: the bound less the text.
uint64_t VariableBytes(const std::string& body) {
  const std::string ptx = kPtxHead + body;
  Result<uint64_t> bound = ModuleFootprint(ModuleFormat::kPtx, ptx);
  EXPECT_TRUE(bound.ok()) << bound.status().ToString() << "\n" << body;
  if (!bound.ok()) return 0;
  EXPECT_GE(*bound, ptx.size());
  return *bound - ptx.size();
}

Status PtxRefusal(const std::string& body) {
  Result<uint64_t> bound = ModuleFootprint(ModuleFormat::kPtx, kPtxHead + body);
  EXPECT_FALSE(bound.ok()) << "counted " << (bound.ok() ? *bound : 0) << " for\n" << body;
  return bound.ok() ? Status::Ok() : bound.status();
}

// Each variable counts its bytes plus its alignment less one (the padding in front of it).
TEST(ModuleFootprintTest, PtxScalarsArraysAndVectors) {
  EXPECT_EQ(VariableBytes(""), 0u);
  EXPECT_EQ(VariableBytes(".global .u32 x;\n"), 4u + 3);
  EXPECT_EQ(VariableBytes(".visible .global .f64 d = 1.5;\n"), 8u + 7);
  EXPECT_EQ(VariableBytes(".global .align 8 .b8 buf[100];\n"), 100u + 7);
  EXPECT_EQ(VariableBytes(".global .v4 .f32 v[2];\n"), 32u + 15);
  EXPECT_EQ(VariableBytes(".global .align 16 .v2 .u64 w;\n"), 16u + 15);
  EXPECT_EQ(VariableBytes(".global .f64 m[3][4];\n"), 96u + 7);
  EXPECT_EQ(VariableBytes(".global .b8 hex[0x10], oct[010], bin[0b100], u[2U];\n"),
            16u + 8 + 4 + 2);
  EXPECT_EQ(VariableBytes(".const .align 4 .b8 c[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};\n"),
            10u + 3);
  EXPECT_EQ(VariableBytes(".global .b32 one, two;\n.const .b16 three;\n"), 7u + 7 + 3);
}

TEST(ModuleFootprintTest, PtxSeveralNamesInOneDeclaration) {
  EXPECT_EQ(VariableBytes(".global .u32 a[4], b[8];\n"), (16u + 3) + (32u + 3));
  EXPECT_EQ(VariableBytes(".global .u32 a[2] = {1, 2}, b = 3, c[3][2] = {{1,2},{3,4},{5,6}};\n"),
            (8u + 3) + (4u + 3) + (24u + 3));
  EXPECT_EQ(VariableBytes(".global .u64 p = generic(q), q;\n"), 2 * (8u + 7));
}

TEST(ModuleFootprintTest, PtxUnsizedArraysCountTheirInitialiser) {
  EXPECT_EQ(VariableBytes(".global .u32 u[] = {1, 2, 3};\n"), 12u + 3);
  EXPECT_EQ(VariableBytes(".global .u32 u[][2] = {{1, 2}, {3, 4}, {5, 6}};\n"), 24u + 3);
  EXPECT_EQ(VariableBytes(".global .b8 none[] = {};\n"), 0u);
  EXPECT_GE(VariableBytes(".global .b8 text[] = \"hello\";\n"), 6u)
      << "a string initialiser counts at least its bytes and NUL";
  Status s = PtxRefusal(".global .u32 u[];\n");
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(s.message().find("'u'"), std::string::npos) << s.ToString();
}

TEST(ModuleFootprintTest, PtxExternDeclarationsTakeNothing) {
  EXPECT_EQ(VariableBytes(".extern .global .b8 e[];\n.extern .global .u32 y;\n"), 0u);
  EXPECT_EQ(VariableBytes(".extern .const .align 8 .b8 c[1024];\n.global .u32 z;\n"), 7u)
      << "an .extern applies to its own declaration only";
}

TEST(ModuleFootprintTest, PtxCommentsAndStringsNeitherCountNorHide) {
  EXPECT_EQ(VariableBytes("// .global .b8 big[1000];\n/* .global .b8 big2[1000]; */\n"), 0u);
  EXPECT_EQ(VariableBytes("/* a\n.global .b8 big[1000];\nb */ .global .b8 seen[10];\n"), 10u);
  EXPECT_EQ(VariableBytes(".global /* hidden? */ .b8 seen[1000];\n"), 1000u);
  EXPECT_EQ(VariableBytes(".global .b8 /* x */ a[10] // trailing\n;\n"), 10u);
  EXPECT_EQ(VariableBytes(".global//\n.b8\n//\nsplit[64];\n"), 64u);
  EXPECT_EQ(VariableBytes(".pragma \"nounroll /*\";\n.global .b8 after[64];\n"), 64u)
      << "a comment opener inside a string opens nothing";
  EXPECT_EQ(VariableBytes(".file 1 \".global .b8 s[1000];\"\n"), 0u);
  EXPECT_EQ(VariableBytes(".file 1 \"a\\\"b // c\"\n.global .b8 x[8];\n"), 8u);
  EXPECT_EQ(PtxRefusal("/* .global .b8 hidden[100];\n").kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(PtxRefusal(".file 1 \"never ends\n").kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(PtxRefusal("#define G .global\nG .b8 big[8589934592];\n").kind(),
            ErrorKind::kInvalidArgument);
}

TEST(ModuleFootprintTest, PtxInstructionsAreNotDeclarations) {
  const std::string kernel = R"(
.global .align 4 .u32 counter;

.visible .entry bump(
	.param .u64 .ptr.global .align 4 bump_param_0
)
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<3>;
	.local .align 8 .b8 	__local_depot0[16];
	.shared .align 4 .b8 tile[1024];

	ld.param.u64 	%rd1, [bump_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	ld.global.u32 	%r1, [%rd2];
	ld.const.u32 	%r2, [%rd2];
	atom.global.add.u32 	%r2, [counter], 1;
	st.global.u32 	[%rd2], %r1;
	ret;
}
)";
  EXPECT_EQ(VariableBytes(kernel), 4u + 3);
}

TEST(ModuleFootprintTest, PtxTextAfterANulIsNotRead) {
  std::string ptx = std::string(kPtxHead) + ".global .u32 x;\n";
  const size_t before = ptx.size();
  ptx += std::string(1, '\0') + "/* .global .b8 big[1000]; never ends";
  Result<uint64_t> bound = ModuleFootprint(ModuleFormat::kPtx, ptx);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, ptx.size() + 7) << "the whole image counts; variables only up to the NUL";
  EXPECT_GT(ptx.size(), before);
}

TEST(ModuleFootprintTest, PtxEightGibibyteGlobalIsCounted) {
  // 100 bytes of PTX, 8 GiB of device memory.
  const std::string ptx =
      ".version 8.0\n.target sm_80\n.address_size 64\n.global .align 8 .b8 big[8589934592];\n";
  Result<uint64_t> bound = ModuleFootprint(ModuleFormat::kPtx, ptx);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_GE(*bound, 8ull << 30);
  EXPECT_EQ(*bound, ptx.size() + (8ull << 30) + 7);
}

TEST(ModuleFootprintTest, PtxOverflowsAndUnreadableSizesAreRefused) {
  auto refused_naming = [](const std::string& body, const std::string& named) {
    Status s = PtxRefusal(body);
    EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument) << body;
    EXPECT_NE(s.message().find(named), std::string::npos) << s.ToString();
  };
  refused_naming(".global .b64 o[4294967296][4294967296];\n", "'o'");
  refused_naming(".global .b8 z[99999999999999999999];\n", "'99999999999999999999'");
  refused_naming(".global .b8 n[N];\n", "'N'");
  refused_naming(".global .b8 e[4*2];\n", "'e'");
}

TEST(ModuleFootprintTest, PtxSumsThatOverflowAreRefused) {
  // Each fits; together they do not.
  Status s = PtxRefusal(".global .b8 a[0x8000000000000000];\n.global .b8 b[0x8000000000000000];\n");
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(s.message().find("overflow"), std::string::npos) << s.ToString();
  // Padding past the top.
  EXPECT_EQ(PtxRefusal(".global .align 16 .b8 c[0xFFFFFFFFFFFFFFFF];\n").kind(),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(PtxRefusal(".global .u32 x[] = {1, 2}, y[0xFFFFFFFFFFFFFFFF][] = {1};\n").kind(),
            ErrorKind::kInvalidArgument);
}

TEST(ModuleFootprintTest, PtxMalformedDeclarationsAreRefused) {
  for (const char* body :
       {".global .u32 x\n", ".global x;\n", ".global .u32;\n", ".global .u32 x[4;\n",
        ".global .weird .u32 x;\n", ".global .u32 x = {1, 2;\n", ".global .u32 x<4>;\n",
        ".global .align 0 .u32 x;\n", ".global .u32 x y;\n"}) {
    EXPECT_EQ(PtxRefusal(body).kind(), ErrorKind::kInvalidArgument) << body;
  }
}

// --- ELF ------------------------------------------------------------------------------------

void Put(std::string* out, uint64_t at, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) (*out)[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

struct Section {
  uint32_t type = 0;
  uint64_t flags = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

constexpr uint32_t kProgbits = 1, kSymtab = 2, kNobits = 8;
constexpr uint64_t kAlloc = 0x2, kExec = 0x4, kWrite = 0x1;

/// An ELF64 image: its header, 64 bytes of code at offset 64, then the section headers (a
/// null section first) and, when given, one PT_LOAD program header of `load_memsz`.
std::string BuildElf(const std::vector<Section>& sections, uint64_t load_memsz = 0) {
  std::string elf(64 + 64, '\0');
  elf[0] = '\x7f';
  elf[1] = 'E';
  elf[2] = 'L';
  elf[3] = 'F';
  elf[4] = 2;  // 64-bit
  elf[5] = 1;  // little-endian
  elf[6] = 1;
  Put(&elf, 0x10, 2, 2);    // ET_EXEC
  Put(&elf, 0x12, 190, 2);  // EM_CUDA
  for (size_t i = 64; i < 128; ++i) elf[i] = static_cast<char>(i);
  const uint64_t shoff = elf.size();
  elf.resize(shoff + 64 * (sections.size() + 1), '\0');
  for (size_t i = 0; i < sections.size(); ++i) {
    const uint64_t at = shoff + 64 * (i + 1);
    Put(&elf, at + 0x04, sections[i].type, 4);
    Put(&elf, at + 0x08, sections[i].flags, 8);
    Put(&elf, at + 0x18, sections[i].offset, 8);
    Put(&elf, at + 0x20, sections[i].size, 8);
  }
  Put(&elf, 0x28, shoff, 8);
  Put(&elf, 0x34, 64, 2);
  Put(&elf, 0x3A, 64, 2);
  Put(&elf, 0x3C, sections.size() + 1, 2);
  if (load_memsz > 0) {
    const uint64_t phoff = elf.size();
    elf.resize(phoff + 56, '\0');
    Put(&elf, phoff, 1, 4);  // PT_LOAD
    Put(&elf, phoff + 0x08, 64, 8);
    Put(&elf, phoff + 0x20, 64, 8);
    Put(&elf, phoff + 0x28, load_memsz, 8);
    Put(&elf, 0x20, phoff, 8);
    Put(&elf, 0x36, 56, 2);
    Put(&elf, 0x38, 1, 2);
  }
  return elf;
}

/// A small CUBIN: 16 bytes of code, 1 MiB of .nv.global (NOBITS), a symbol table (not
/// loaded) and 8 bytes of constant bank.
std::string SmallCubin() {
  return BuildElf({{kProgbits, kAlloc | kExec, 64, 16},
                   {kNobits, kAlloc | kWrite, 0, 1u << 20},
                   {kSymtab, 0, 80, 24},
                   {kProgbits, kAlloc, 104, 8}});
}
constexpr uint64_t kSmallCubinBytes = 16 + (1u << 20) + 8;

Result<uint64_t> CubinFootprint(const std::string& elf) {
  return ModuleFootprint(ModuleFormat::kCubin, elf);
}

TEST(ModuleFootprintTest, ElfAllocatedSectionsAreCounted) {
  Result<uint64_t> bound = CubinFootprint(SmallCubin());
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, kSmallCubinBytes);
  // The loadable image of CUDA C++ is NVRTC's CUBIN: the same rule.
  Result<uint64_t> compiled = ModuleFootprint(ModuleFormat::kCudaSource, SmallCubin());
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  EXPECT_EQ(*compiled, kSmallCubinBytes);
}

TEST(ModuleFootprintTest, ElfNobitsSectionsCountWhateverTheirFlags) {
  Result<uint64_t> bound = CubinFootprint(BuildElf({{kNobits, 0, 0, 8ull << 30}}));
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, 8ull << 30);
}

TEST(ModuleFootprintTest, ElfLoadSegmentsCountWhenLarger) {
  Result<uint64_t> bound = CubinFootprint(BuildElf({{kProgbits, kAlloc, 64, 16}}, 4096));
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, 4096u);
  bound = CubinFootprint(BuildElf({{kNobits, kAlloc, 0, 1u << 20}}, 4096));
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, 1u << 20);
}

TEST(ModuleFootprintTest, ElfTruncatedOrLyingHeadersAreRefused) {
  const std::string good = SmallCubin();
  auto refused = [](const std::string& elf, const std::string& why) {
    Result<uint64_t> bound = CubinFootprint(elf);
    EXPECT_FALSE(bound.ok()) << why << ": counted " << (bound.ok() ? *bound : 0);
    if (!bound.ok()) {
      EXPECT_EQ(bound.status().kind(), ErrorKind::kInvalidArgument) << why;
    }
  };
  refused(good.substr(0, 40), "a header cut short");
  refused(good.substr(0, good.size() - 1), "section headers cut short");
  std::string elf = good;
  Put(&elf, 0x28, good.size() - 64, 8);  // shoff: the table runs past the end
  refused(elf, "a section table past the end");
  elf = good;
  Put(&elf, 0x28, ~uint64_t{0} - 8, 8);
  refused(elf, "a section table offset that overflows");
  elf = good;
  Put(&elf, 0x3C, 0xffff, 2);
  refused(elf, "a section count that lies");
  elf = good;
  Put(&elf, 0x3A, 16, 2);
  refused(elf, "section headers smaller than ELF64's");
  elf = BuildElf({{kProgbits, kAlloc | kExec, 64, 1u << 20}});
  refused(elf, "a section whose bytes run past the end");
  elf = BuildElf({{kProgbits, kAlloc, ~uint64_t{0}, 16}});
  refused(elf, "a section offset that overflows");
  elf = BuildElf({{kNobits, kAlloc, 0, ~uint64_t{0}}, {kNobits, kAlloc, 0, 2}});
  refused(elf, "sections whose sizes overflow together");
  elf = BuildElf({{kProgbits, kAlloc, 64, 16}}, 4096);
  Put(&elf, 0x20, elf.size() - 8, 8);  // phoff: the header runs past the end
  refused(elf, "a program header past the end");
  elf = good;
  elf[4] = 1;
  refused(elf, "a 32-bit ELF");
  elf = good;
  elf[5] = 2;
  refused(elf, "a big-endian ELF");
  refused(std::string("\x7f"
                      "ELF",
                      4),
          "the magic alone");
  refused("not an ELF at all", "no magic");
}

TEST(ModuleFootprintTest, ElfExtendedSectionCountIsBoundsChecked) {
  std::string elf = SmallCubin();
  const uint64_t shoff = 128;     // BuildElf's section headers follow the code
  Put(&elf, 0x3C, 0, 2);          // e_shnum 0: section 0's sh_size holds the count
  Put(&elf, shoff + 0x20, 5, 8);  // the true count
  Result<uint64_t> bound = CubinFootprint(elf);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, kSmallCubinBytes);
  Put(&elf, shoff + 0x20, uint64_t{1} << 60, 8);  // a count that lies
  EXPECT_FALSE(CubinFootprint(elf).ok());
}

// --- fatbin ---------------------------------------------------------------------------------

constexpr uint16_t kEntryPtx = 1, kEntryElf = 2;

struct Entry {
  uint16_t kind = kEntryElf;
  std::string payload;
  uint64_t flags = 0x11;  // 64-bit, Linux
};

/// A fatbin container: the 16-byte header, then each entry's 64-byte header and payload.
std::string BuildFatbin(const std::vector<Entry>& entries) {
  std::string body;
  for (const Entry& e : entries) {
    std::string header(64, '\0');
    Put(&header, 0, e.kind, 2);
    Put(&header, 2, 0x0101, 2);
    Put(&header, 4, 64, 4);
    Put(&header, 8, e.payload.size(), 8);
    Put(&header, 28, 80, 4);  // sm_80
    Put(&header, 40, e.flags, 8);
    body += header + e.payload;
  }
  std::string fatbin(16, '\0');
  Put(&fatbin, 0, 0xBA55ED50u, 4);
  Put(&fatbin, 4, 1, 2);
  Put(&fatbin, 6, 16, 2);
  Put(&fatbin, 8, body.size(), 8);
  return fatbin + body;
}

TEST(ModuleFootprintTest, FatbinCountsItsLargestEntry) {
  Result<uint64_t> bound = CubinFootprint(BuildFatbin({{kEntryElf, SmallCubin()}}));
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, kSmallCubinBytes);

  const std::string ptx = std::string(kPtxHead) + ".global .b8 big[4194304];\n";
  std::string padded_ptx = ptx + std::string(8 - ptx.size() % 8, '\0');
  bound = CubinFootprint(BuildFatbin({{kEntryElf, SmallCubin()}, {kEntryPtx, padded_ptx}}));
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, padded_ptx.size() + (4u << 20)) << "the PTX entry is the larger";

  // Two containers back to back, and zero padding after them.
  bound = CubinFootprint(BuildFatbin({{kEntryPtx, padded_ptx}}) +
                         BuildFatbin({{kEntryElf, SmallCubin()}}) + std::string(8, '\0'));
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_EQ(*bound, padded_ptx.size() + (4u << 20));
}

TEST(ModuleFootprintTest, FatbinCompressedEntriesAreRefused) {
  for (uint64_t flag : {uint64_t{0x2000}, uint64_t{0x8000}}) {
    Result<uint64_t> bound = CubinFootprint(BuildFatbin({{kEntryElf, SmallCubin(), 0x11 | flag}}));
    ASSERT_FALSE(bound.ok());
    EXPECT_EQ(bound.status().kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(bound.status().message().find("compressed"), std::string::npos)
        << bound.status().ToString();
    EXPECT_NE(bound.status().message().find("load a CUBIN, PTX or an uncompressed fatbin"),
              std::string::npos)
        << bound.status().ToString();
  }
  // Compressed bytes that the flags do not own up to are not text, and not an ELF.
  const std::string zstd("\x28\xb5\x2f\xfd\x00\x58\x01\x02", 8);
  EXPECT_FALSE(CubinFootprint(BuildFatbin({{kEntryPtx, zstd}})).ok());
  EXPECT_FALSE(CubinFootprint(BuildFatbin({{kEntryElf, zstd}})).ok());
}

TEST(ModuleFootprintTest, FatbinTruncatedOrLyingEntriesAreRefused) {
  const std::string good = BuildFatbin({{kEntryElf, SmallCubin()}});
  auto refused = [](const std::string& fatbin, const std::string& why) {
    Result<uint64_t> bound = CubinFootprint(fatbin);
    EXPECT_FALSE(bound.ok()) << why << ": counted " << (bound.ok() ? *bound : 0);
    if (!bound.ok()) {
      EXPECT_EQ(bound.status().kind(), ErrorKind::kInvalidArgument) << why;
    }
  };
  refused(good.substr(0, good.size() - 1), "a container cut short");
  refused(good.substr(0, 12), "a header cut short");
  std::string f = good;
  Put(&f, 16 + 8, ~uint64_t{0}, 8);  // the entry's payload size
  refused(f, "a payload size that overflows");
  f = good;
  Put(&f, 16 + 4, 8, 4);  // the entry's header size, below 64
  refused(f, "an entry header that is too small");
  f = good;
  Put(&f, 16 + 4, 0xffffffffu, 4);
  refused(f, "an entry header past the end");
  f = good;
  Put(&f, 16, 0x40, 2);
  refused(f, "an entry of a kind that cannot be bounded");
  refused(BuildFatbin({}), "no entries at all");
  refused(good + "junk", "bytes after the container");
  std::string lying_elf = SmallCubin();
  Put(&lying_elf, 0x28, ~uint64_t{0} - 8, 8);
  refused(BuildFatbin({{kEntryElf, lying_elf}}), "an embedded ELF that lies");
}

}  // namespace
}  // namespace ferry::backend
