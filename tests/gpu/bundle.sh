#!/bin/bash
# Build the CUDA-enabled binaries here (Release) and pack them, with the libraries the GPU
# machine lacks, into .gpu/bundle (git-ignored), for tests/gpu/run.sh on the GPU machine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-gpu"
bash "$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON >/dev/null
targets=(ferryd ferry-nvrtc ferry_conformance_tests ferry_integration_tests ferry_test_client ferry_quickstart)
[[ -f "$root/bench/ferry_bench.cc" ]] && targets+=(ferry-bench)
[[ -d "$root/client/ferryctl" ]] && targets+=(ferryctl)
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)"
rm -rf "$root/.gpu/bundle"
bins=()
for t in "${targets[@]}"; do bins+=("$(find "$build" -type f -name "$t" -perm -u+x | head -1)"); done
bash "$root/../shared/gpu/bundle.sh" "$root/.gpu/bundle" "${bins[@]}"
# The commit the bundle was built from ("-dirty": with uncommitted changes), for the reports.
echo "$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . ':!docs' || echo -dirty)" \
  >"$root/.gpu/bundle/COMMIT"
