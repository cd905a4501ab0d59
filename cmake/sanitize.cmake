# FERRY_SANITIZE and FERRY_FUZZ (top-level CMakeLists.txt): compile and link flags for every
# target of the build. tests/run.sh builds each variant in a build dir of its own
# (tests/README.md).
if(FERRY_SANITIZE STREQUAL "ON")
  set(FERRY_SANITIZE "address,undefined")
endif()
if(FERRY_SANITIZE AND NOT FERRY_SANITIZE STREQUAL "OFF")
  if(NOT FERRY_SANITIZE MATCHES "^(address,undefined|address|undefined|thread)$")
    message(FATAL_ERROR "FERRY_SANITIZE=${FERRY_SANITIZE}: use address,undefined or thread")
  endif()
  # -fno-sanitize-recover: a UBSan finding ends the process (a test fails) instead of being a
  # line in a log nobody reads.
  set(_ferry_san -fsanitize=${FERRY_SANITIZE})
  if(FERRY_SANITIZE MATCHES "undefined")
    list(APPEND _ferry_san -fno-sanitize-recover=undefined)
  endif()
  # C and C++ only: nvcc takes no -fsanitize (a CUDA backend build sanitizes its host code
  # in .cc files; the kernels' .cu file is built as usual).
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_ferry_san};-fno-omit-frame-pointer>")
  add_link_options(${_ferry_san})
  message(STATUS "ferry: sanitizers ${FERRY_SANITIZE}")
endif()

if(FERRY_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "FERRY_FUZZ=ON needs clang (CXX=clang++): libFuzzer is clang's")
  endif()
  # Coverage for libFuzzer in every library the targets link; only the fuzz targets link
  # the fuzzer's main (tests/fuzz/CMakeLists.txt).
  add_compile_options(-fsanitize=fuzzer-no-link)
  message(STATUS "ferry: libFuzzer targets on")
endif()
