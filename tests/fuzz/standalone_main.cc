// A main for the fuzz targets where libFuzzer is not linked (FERRY_FUZZ=OFF, or gcc): runs
// each file named on the command line, or every file of each directory named, through
// LLVMFuzzerTestOneInput once. The normal test suite replays the seed corpus with it, so
// every build checks the parsers on those inputs; tests/run.sh's fuzz phase explores beyond.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
void RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}
}  // namespace

int main(int argc, char** argv) {
  size_t runs = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) {
          RunFile(e.path());
          ++runs;
        }
      }
    } else {
      RunFile(p);
      ++runs;
    }
  }
  std::printf("%zu inputs ran\n", runs);
  return runs > 0 ? 0 : 1;  // an empty corpus is a broken test, not a pass
}
