// ferry-nvrtc: compile one CUDA C++ module with NVRTC for ferryd, in a short-lived process
// that is bounded and cannot open files.
//
//   ferry-nvrtc MAJOR MINOR MEMORY_BYTES CPU_SECONDS  < source  > reply (nvrtc_reply.h)
//
// A client's source is hostile: it may try to make the compiler read the daemon's files, or
// to exhaust its time or memory (template recursion, huge constant tables). ferryd checks the
// source first (backend/cuda_source_check.h) and starts this helper per compile, with a
// wall-clock deadline after which it kills it. Here, before the source is read:
//  * every fd but 0, 1 and 2 closed;
//  * rlimits: address space MEMORY_BYTES, CPU time CPU_SECONDS (SIGXCPU, then SIGKILL one
//    second later), no core files, no files written;
//  * the working directory is /, NVRTC and its builtins library are loaded, and then a
//    seccomp allow-list (sandbox.h) leaves the compile its memory, its three fds and little
//    else: no file can be opened or probed, no process reached or started, no descriptor
//    made, even if the check in ferryd missed a way to name a file.
// Exit status 0 whenever a reply was written (the reply's code says how the compile went).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/nvrtc_helper/nvrtc_reply.h"
#include "backend/cuda/nvrtc_helper/sandbox.h"

namespace {

namespace reply = ferry::backend::nvrtc_reply;
namespace nvrtc_sandbox = ferry::backend::nvrtc_sandbox;

bool WriteAll(const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(STDOUT_FILENO, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

int Reply(uint32_t code, uint32_t kind, const std::string& image, std::string text) {
  if (text.size() > reply::kMaxLogBytes) {
    text.resize(reply::kMaxLogBytes);
    text += "\n[log cut at " + std::to_string(reply::kMaxLogBytes) + " bytes]";
  }
  reply::Header h = {};
  std::memcpy(h.magic, reply::kMagic, sizeof(h.magic));
  h.code = code;
  h.image_kind = kind;
  h.image_bytes = image.size();
  h.text_bytes = text.size();
  const bool ok = WriteAll(reinterpret_cast<const char*>(&h), sizeof(h)) &&
                  WriteAll(image.data(), image.size()) && WriteAll(text.data(), text.size());
  return ok ? 0 : 1;
}

int Fail(uint32_t code, const std::string& what) { return Reply(code, 0, "", what); }

// Why the helper replies without compiling: the reply's code and what went wrong.
struct Failure {
  uint32_t code;
  std::string what;
};
// The outcome of a step before the compile: nothing (go on) or the failure to reply with.
using Step = std::optional<Failure>;

int Fail(const Failure& failure) { return Fail(failure.code, failure.what); }

void* Open(const std::string& soname) {
  void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef FERRY_CUDA_LIBRARY_DIR
  if (h == nullptr) {
    h = ::dlopen((std::string(FERRY_CUDA_LIBRARY_DIR) + "/" + soname).c_str(),
                 RTLD_NOW | RTLD_LOCAL);
  }
#endif
  return h;
}

// Whatever ferryd left open without O_CLOEXEC (a socket-activated listener, say) is not
// the compile's business: only stdin, stdout and stderr stay.
void CloseInheritedFds() {
#ifdef __NR_close_range
  if (::syscall(__NR_close_range, 3u, ~0u, 0u) != 0)
#endif
  {
    for (int fd = 3; fd < 65536; ++fd) ::close(fd);
  }
}

// The rlimits (no core files, no files written, `memory` bytes of address space and `cpu`
// seconds where above 0) and / as the working directory.
Step Confine(unsigned long long memory, unsigned long long cpu) {
  rlimit none = {0, 0};
  (void)::setrlimit(RLIMIT_CORE, &none);
  (void)::setrlimit(RLIMIT_FSIZE, &none);
  if (memory > 0) {
    rlimit as = {memory, memory};
    if (::setrlimit(RLIMIT_AS, &as) != 0) return Failure{reply::kInternal, "setrlimit(RLIMIT_AS)"};
  }
  if (cpu > 0) {
    rlimit t = {cpu, cpu + 1};
    if (::setrlimit(RLIMIT_CPU, &t) != 0) {
      return Failure{reply::kInternal, "setrlimit(RLIMIT_CPU)"};
    }
  }
  if (::chdir("/") != 0) return Failure{reply::kInternal, "chdir(/)"};
  return std::nullopt;
}

// The NVRTC functions the compile calls, each named as NVRTC names it.
#define FERRY_NVRTC_FUNCTIONS(X) \
  X(nvrtcGetErrorString)         \
  X(nvrtcGetNumSupportedArchs)   \
  X(nvrtcGetSupportedArchs)      \
  X(nvrtcCreateProgram)          \
  X(nvrtcDestroyProgram)         \
  X(nvrtcCompileProgram)         \
  X(nvrtcGetProgramLogSize)      \
  X(nvrtcGetProgramLog)          \
  X(nvrtcGetCUBINSize)           \
  X(nvrtcGetCUBIN)               \
  X(nvrtcGetPTXSize)             \
  X(nvrtcGetPTX)

struct Nvrtc {
#define FERRY_NVRTC_MEMBER(name) decltype(&::name) name = nullptr;
  FERRY_NVRTC_FUNCTIONS(FERRY_NVRTC_MEMBER)
#undef FERRY_NVRTC_MEMBER
};

// Load NVRTC and its builtins library and look up its functions, while files can still be
// opened.
Step LoadNvrtc(Nvrtc* nvrtc) {
  const std::string version = std::to_string(CUDART_VERSION / 1000);
  const std::string minor_version = std::to_string((CUDART_VERSION % 1000) / 10);
  void* lib = Open("libnvrtc.so." + version);
  if (lib == nullptr) {
    return Failure{reply::kUnsupported, std::string("cannot load NVRTC: ") + dlerror()};
  }
  // NVRTC loads its builtins library (the built-in headers) on first compile: load it now,
  // while files can still be opened.
  (void)Open("libnvrtc-builtins.so." + version + "." + minor_version);
#define FERRY_NVRTC_LOOKUP(name)                                          \
  nvrtc->name = reinterpret_cast<decltype(&::name)>(::dlsym(lib, #name)); \
  if (nvrtc->name == nullptr) return Failure{reply::kUnsupported, "NVRTC lacks " #name};
  FERRY_NVRTC_FUNCTIONS(FERRY_NVRTC_LOOKUP)
#undef FERRY_NVRTC_LOOKUP
  return std::nullopt;
}

// What the compile targets: a CUBIN when NVRTC knows the device's architecture (`exact`),
// else PTX for the newest one it knows below it (the driver JIT-compiles it).
struct Target {
  std::string option;  // --gpu-architecture=...
  bool exact = false;
};

Step ChooseTarget(const Nvrtc& nvrtc, int major, int minor, Target* target) {
  int num_archs = 0;
  if (nvrtc.nvrtcGetNumSupportedArchs(&num_archs) != NVRTC_SUCCESS || num_archs <= 0) {
    return Failure{reply::kInternal, "nvrtcGetNumSupportedArchs failed"};
  }
  std::vector<int> archs(static_cast<size_t>(num_archs));
  if (nvrtc.nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) {
    return Failure{reply::kInternal, "nvrtcGetSupportedArchs failed"};
  }
  const int device_arch = major * 10 + minor;
  int arch = 0;
  for (int a : archs) {
    if (a == device_arch) target->exact = true;
    if (a <= device_arch) arch = std::max(arch, a);
  }
  if (arch == 0) {
    return Failure{reply::kUnsupported, "NVRTC cannot compile for compute capability " +
                                            std::to_string(major) + "." + std::to_string(minor)};
  }
  target->option = std::string("--gpu-architecture=") + (target->exact ? "sm_" : "compute_") +
                   std::to_string(arch);
  return std::nullopt;
}

// Read the source from stdin, at most reply::kMaxSourceBytes.
Step ReadSource(std::string* source) {
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Failure{reply::kInternal, "reading the source"};
    if (r == 0) break;
    source->append(buf, static_cast<size_t>(r));
    if (source->size() > reply::kMaxSourceBytes) {
      return Failure{reply::kInternal, "source too large"};
    }
  }
  return std::nullopt;
}

// Compile `source` for `target` and reply with the image and NVRTC's log, or why not.
int CompileAndReply(const Nvrtc& nvrtc, const std::string& source, const Target& target) {
  nvrtcProgram program = nullptr;
  nvrtcResult r =
      nvrtc.nvrtcCreateProgram(&program, source.c_str(), "ferry_module.cu", 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS) {
    return Fail(reply::kInternal,
                std::string("nvrtcCreateProgram: ") + nvrtc.nvrtcGetErrorString(r));
  }
  const char* options[] = {target.option.c_str(), "-default-device", "--std=c++17"};
  const nvrtcResult compiled = nvrtc.nvrtcCompileProgram(program, 3, options);
  std::string log;
  size_t log_size = 0;
  if (nvrtc.nvrtcGetProgramLogSize(program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    log.resize(log_size);
    if (nvrtc.nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) log.clear();
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  if (compiled == NVRTC_ERROR_COMPILATION) {
    return Fail(reply::kCompileError, "NVRTC compilation failed (" + target.option + "):\n" + log);
  }
  if (compiled != NVRTC_SUCCESS) {
    return Fail(reply::kInternal, std::string("nvrtcCompileProgram: ") +
                                      nvrtc.nvrtcGetErrorString(compiled) +
                                      (log.empty() ? "" : "\n" + log));
  }
  std::string image;
  size_t size = 0;
  if (target.exact) {
    if (nvrtc.nvrtcGetCUBINSize(program, &size) != NVRTC_SUCCESS) {
      return Fail(reply::kInternal, "CUBIN size");
    }
    image.resize(size);
    if (nvrtc.nvrtcGetCUBIN(program, image.data()) != NVRTC_SUCCESS) {
      return Fail(reply::kInternal, "CUBIN");
    }
  } else {
    if (nvrtc.nvrtcGetPTXSize(program, &size) != NVRTC_SUCCESS) {
      return Fail(reply::kInternal, "PTX size");
    }
    image.resize(size);  // includes the terminating NUL
    if (nvrtc.nvrtcGetPTX(program, image.data()) != NVRTC_SUCCESS) {
      return Fail(reply::kInternal, "PTX");
    }
  }
  (void)nvrtc.nvrtcDestroyProgram(&program);
  return Reply(reply::kOk, target.exact ? reply::kCubin : reply::kPtx, image, log);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MAJOR MINOR MEMORY_BYTES CPU_SECONDS < source\n", argv[0]);
    return 2;
  }
  const int major = std::atoi(argv[1]);
  const int minor = std::atoi(argv[2]);
  const unsigned long long memory = std::strtoull(argv[3], nullptr, 10);
  const unsigned long long cpu = std::strtoull(argv[4], nullptr, 10);

  // In this order: nothing inherited, the limits, NVRTC loaded; then the filter, and only
  // then the client's source is read and compiled.
  CloseInheritedFds();
  if (Step failed = Confine(memory, cpu)) return Fail(*failed);
  Nvrtc nvrtc;
  if (Step failed = LoadNvrtc(&nvrtc)) return Fail(*failed);
  Target target;
  if (Step failed = ChooseTarget(nvrtc, major, minor, &target)) return Fail(*failed);
  if (!nvrtc_sandbox::InstallCompileFilter()) {
    return Fail(reply::kInternal, "cannot install the seccomp filter");
  }
  std::string source;
  if (Step failed = ReadSource(&source)) return Fail(*failed);
  return CompileAndReply(nvrtc, source, target);
}
