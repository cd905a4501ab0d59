#!/bin/bash
# Build everything and run the whole test suite (unit, conformance, integration).
# Installs the Debian packages it needs. On a machine without a GPU the CUDA conformance
# tests are skipped, each printing why.
#
#   bash tests/run.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-test"

bash "$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$(nproc)"
cd "$build"
# Skipped tests print their reason in the log; --output-on-failure shows failures whole.
ctest --output-on-failure --timeout 600 -j "$(nproc)"
