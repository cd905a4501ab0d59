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

  // Whatever ferryd left open without O_CLOEXEC (a socket-activated listener, say) is not
  // the compile's business: only stdin, stdout and stderr stay.
#ifdef __NR_close_range
  if (::syscall(__NR_close_range, 3u, ~0u, 0u) != 0)
#endif
  {
    for (int fd = 3; fd < 65536; ++fd) ::close(fd);
  }

  rlimit none = {0, 0};
  (void)::setrlimit(RLIMIT_CORE, &none);
  (void)::setrlimit(RLIMIT_FSIZE, &none);
  if (memory > 0) {
    rlimit as = {memory, memory};
    if (::setrlimit(RLIMIT_AS, &as) != 0) return Fail(reply::kInternal, "setrlimit(RLIMIT_AS)");
  }
  if (cpu > 0) {
    rlimit t = {cpu, cpu + 1};
    if (::setrlimit(RLIMIT_CPU, &t) != 0) return Fail(reply::kInternal, "setrlimit(RLIMIT_CPU)");
  }
  if (::chdir("/") != 0) return Fail(reply::kInternal, "chdir(/)");

  const std::string version = std::to_string(CUDART_VERSION / 1000);
  const std::string minor_version = std::to_string((CUDART_VERSION % 1000) / 10);
  void* lib = Open("libnvrtc.so." + version);
  if (lib == nullptr)
    return Fail(reply::kUnsupported, std::string("cannot load NVRTC: ") + dlerror());
  // NVRTC loads its builtins library (the built-in headers) on first compile: load it now,
  // while files can still be opened.
  (void)Open("libnvrtc-builtins.so." + version + "." + minor_version);

#define FERRY_NVRTC_FN(name)                                            \
  auto name = reinterpret_cast<decltype(&::name)>(::dlsym(lib, #name)); \
  if (name == nullptr) return Fail(reply::kUnsupported, "NVRTC lacks " #name)
  FERRY_NVRTC_FN(nvrtcGetErrorString);
  FERRY_NVRTC_FN(nvrtcGetNumSupportedArchs);
  FERRY_NVRTC_FN(nvrtcGetSupportedArchs);
  FERRY_NVRTC_FN(nvrtcCreateProgram);
  FERRY_NVRTC_FN(nvrtcDestroyProgram);
  FERRY_NVRTC_FN(nvrtcCompileProgram);
  FERRY_NVRTC_FN(nvrtcGetProgramLogSize);
  FERRY_NVRTC_FN(nvrtcGetProgramLog);
  FERRY_NVRTC_FN(nvrtcGetCUBINSize);
  FERRY_NVRTC_FN(nvrtcGetCUBIN);
  FERRY_NVRTC_FN(nvrtcGetPTXSize);
  FERRY_NVRTC_FN(nvrtcGetPTX);
#undef FERRY_NVRTC_FN

  // The architecture: a CUBIN when NVRTC knows the device's, else PTX for the newest one it
  // knows below it (the driver JIT-compiles it).
  int num_archs = 0;
  if (nvrtcGetNumSupportedArchs(&num_archs) != NVRTC_SUCCESS || num_archs <= 0) {
    return Fail(reply::kInternal, "nvrtcGetNumSupportedArchs failed");
  }
  std::vector<int> archs(static_cast<size_t>(num_archs));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) {
    return Fail(reply::kInternal, "nvrtcGetSupportedArchs failed");
  }
  const int device_arch = major * 10 + minor;
  bool exact = false;
  int arch = 0;
  for (int a : archs) {
    if (a == device_arch) exact = true;
    if (a <= device_arch) arch = std::max(arch, a);
  }
  if (arch == 0) {
    return Fail(reply::kUnsupported, "NVRTC cannot compile for compute capability " +
                                         std::to_string(major) + "." + std::to_string(minor));
  }
  const std::string arch_option =
      std::string("--gpu-architecture=") + (exact ? "sm_" : "compute_") + std::to_string(arch);

  if (!nvrtc_sandbox::InstallCompileFilter()) {
    return Fail(reply::kInternal, "cannot install the seccomp filter");
  }

  std::string source;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Fail(reply::kInternal, "reading the source");
    if (r == 0) break;
    source.append(buf, static_cast<size_t>(r));
    if (source.size() > reply::kMaxSourceBytes) return Fail(reply::kInternal, "source too large");
  }

  nvrtcProgram program = nullptr;
  nvrtcResult r =
      nvrtcCreateProgram(&program, source.c_str(), "ferry_module.cu", 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS) {
    return Fail(reply::kInternal, std::string("nvrtcCreateProgram: ") + nvrtcGetErrorString(r));
  }
  const char* options[] = {arch_option.c_str(), "-default-device", "--std=c++17"};
  const nvrtcResult compiled = nvrtcCompileProgram(program, 3, options);
  std::string log;
  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    log.resize(log_size);
    if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) log.clear();
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  if (compiled == NVRTC_ERROR_COMPILATION) {
    return Fail(reply::kCompileError, "NVRTC compilation failed (" + arch_option + "):\n" + log);
  }
  if (compiled != NVRTC_SUCCESS) {
    return Fail(reply::kInternal, std::string("nvrtcCompileProgram: ") +
                                      nvrtcGetErrorString(compiled) +
                                      (log.empty() ? "" : "\n" + log));
  }
  std::string image;
  size_t size = 0;
  if (exact) {
    if (nvrtcGetCUBINSize(program, &size) != NVRTC_SUCCESS)
      return Fail(reply::kInternal, "CUBIN size");
    image.resize(size);
    if (nvrtcGetCUBIN(program, image.data()) != NVRTC_SUCCESS)
      return Fail(reply::kInternal, "CUBIN");
  } else {
    if (nvrtcGetPTXSize(program, &size) != NVRTC_SUCCESS) return Fail(reply::kInternal, "PTX size");
    image.resize(size);  // includes the terminating NUL
    if (nvrtcGetPTX(program, image.data()) != NVRTC_SUCCESS) return Fail(reply::kInternal, "PTX");
  }
  (void)nvrtcDestroyProgram(&program);
  return Reply(reply::kOk, exact ? reply::kCubin : reply::kPtx, image, log);
}
