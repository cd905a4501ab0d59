#!/bin/bash
# Build the CUDA-enabled binaries here (Release) and pack them, with the libraries the GPU
# machine lacks, into .gpu/bundle (git-ignored), for tests/gpu/run.sh on the GPU machine.
#   tests/gpu/bundle.sh          Release, with ferry-bench: .gpu/bundle
#   tests/gpu/bundle.sh asan     ASan+UBSan (RelWithDebInfo), the test binaries and what they
#                                start, no ferry-bench: .gpu/asan (run.sh sees it is sanitized)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
variant=${1:-release}
bash "$root/deploy/install-deps.sh"
if [[ $variant == asan ]]; then
  build="$root/build-gpu-asan" dest="$root/.gpu/asan"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_CUDA=ON \
    -DFERRY_SANITIZE=address,undefined -DFERRY_BUILD_BENCH=OFF >/dev/null
else
  build="$root/build-gpu" dest="$root/.gpu/bundle"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON >/dev/null
fi
targets=(ferryd ferry_conformance_tests ferry_integration_tests ferry_test_client ferry_quickstart)
# The compile helper runs under RLIMIT_AS (nvrtc-memory), in which ASan's shadow memory does
# not fit (a sanitized helper dies at start): an asan bundle takes it from the Release build.
[[ $variant != asan ]] && targets+=(ferry-nvrtc)
[[ $variant != asan && -f "$root/bench/ferry_bench.cc" ]] && targets+=(ferry-bench)
[[ -d "$root/client/ferryctl" ]] && targets+=(ferryctl)
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)"
rm -rf "$dest"
bins=()
for t in "${targets[@]}"; do bins+=("$(find "$build" -type f -name "$t" -perm -u+x | head -1)"); done
if [[ $variant == asan ]]; then
  # Debug info is most of a sanitized binary; its symbols stay (reports name functions).
  strip_dir=$(mktemp -d)
  for i in "${!bins[@]}"; do
    cp "${bins[$i]}" "$strip_dir/" && strip --strip-debug "$strip_dir/$(basename "${bins[$i]}")"
    bins[$i]="$strip_dir/$(basename "${bins[$i]}")"
  done
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON >/dev/null
  cmake --build "$root/build-gpu" --target ferry-nvrtc
  bins+=("$(find "$root/build-gpu" -type f -name ferry-nvrtc -perm -u+x | head -1)")
fi
bash "$root/../shared/gpu/bundle.sh" "$dest" "${bins[@]}"
[[ $variant == asan ]] && { rm -rf "$strip_dir"; touch "$dest/SANITIZED"; }
# The commit the bundle was built from ("-dirty": with uncommitted changes), for the reports.
echo "$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . ':!docs' || echo -dirty)" \
  >"$dest/COMMIT"
