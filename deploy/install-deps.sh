#!/bin/bash
# Install the Debian 12 packages ferry builds and tests with. Idempotent; run as root.
#   deploy/install-deps.sh [--tests]   --tests: also what only the test suite needs
# The CUDA toolkit is not a Debian package here: where /usr/local/cuda/bin/nvcc exists the
# CUDA backend is built, otherwise the build has the host backend only.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  grpc-proto  # grpc/health/v1/health.proto: its descriptor lets reflection describe health
  libspdlog-dev libfmt-dev libboost-dev libboost-system-dev
  libgtest-dev libgmock-dev
  openssl  # the TLS tests make a test CA at test time
  clang-format  # tests/deploy/format_test.sh: the sources follow .clang-format
  # the Python client (client/python) and its tests (tests/python)
  pybind11-dev python3-dev python3-numpy python3-pytest
  # tests/run.sh's sanitizer and fuzz phases: clang, its sanitizer and libFuzzer runtimes,
  # and llvm-symbolizer for readable reports
  clang libclang-rt-14-dev llvm
)
if [[ "${1:-}" == --tests ]]; then
  packages+=(
    tmux  # ferryctl top's test drives it in a real terminal
    prometheus  # its promtool checks ferryd's metrics exposition (tests/integration)
    python3-mypy  # tests/python/test_stubs.py type-checks a program against ferry's stubs
  )
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # Debian's prometheus package starts a Prometheus server; the tests want only its promtool.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [[ -d /run/systemd/system ]]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
