#!/bin/bash
# Build the CUDA-enabled binaries here (Release) and pack them, with the libraries the GPU
# machine lacks, into .gpu/bundle (git-ignored), for tests/gpu/run.sh on the GPU machine.
#   tests/gpu/bundle.sh          Release, with ferry-bench: .gpu/bundle
#   tests/gpu/bundle.sh asan     ASan+UBSan (RelWithDebInfo), the test binaries and what they
#                                start, no ferry-bench: .gpu/asan (run.sh sees it is sanitized)
# The Release bundle also carries the Python client for the GPU machine's python3 (CPython
# 3.12, numpy 2.x, no gRPC): python/ferry (the package, its module built here for pyenv's
# CPython 3.12), python/src (tests/python and the files its tests read, laid out as in the
# repository) and python/vendor (pytest and what it imports, as pure-Python source, for a
# python3 without pytest). The asan bundle has none: a sanitized extension cannot load.
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
python_module=""
if [[ $variant != asan ]]; then
  # An extension module links no libpython, so one built against pyenv's 3.12 headers loads
  # into any CPython 3.12. The highest 3.12.x pyenv has; PYTHON312=path overrides.
  py312=${PYTHON312:-$( (ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12.*/bin/python3.12 2>/dev/null || true) | sort -V | tail -1)}
  [[ -x $py312 ]] || { echo "bundle.sh: no CPython 3.12 (pyenv install 3.12, or PYTHON312=...)" >&2; exit 1; }
  pybuild="$root/build-gpu-python312"
  cmake -S "$root" -B "$pybuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_PYTHON=ON \
    -DPython3_EXECUTABLE="$py312" -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF >/dev/null
  cmake --build "$pybuild" --target ferry_python -j "$(nproc)"
  python_module=$(find "$pybuild/client/python/ferry" -name "_ferry.cpython-312-*.so" | head -1)
  [[ -n $python_module ]] || { echo "bundle.sh: the 3.12 module was not built" >&2; exit 1; }
  bins+=("$python_module")  # lib/ gets what it links (gRPC, protobuf, ...) as for the binaries
fi
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
if [[ -n $python_module ]]; then
  mkdir -p "$dest/python/ferry" "$dest/python/src/client/python" "$dest/python/src/bench" \
    "$dest/python/src/tests" "$dest/python/vendor"
  mv "$dest/bin/$(basename "$python_module")" "$dest/python/ferry/"
  cp "$pybuild"/client/python/ferry/*.py "$pybuild"/client/python/ferry/*.pyi \
    "$pybuild/client/python/ferry/py.typed" "$dest/python/ferry/"
  cp -r "$root/tests/python" "$dest/python/src/tests/"
  cp -r "$root/client/python/examples" "$dest/python/src/client/python/"
  cp "$root/bench/python_bench.py" "$dest/python/src/bench/"
  cp "$root/README.md" "$dest/python/src/"
  find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
  # pytest for a python3 that lacks it: Debian's python3-pytest is pure Python (pytest 7.2;
  # it runs on 3.12), with the pure-Python packages it imports.
  dist=/usr/lib/python3/dist-packages
  for p in pytest _pytest py.py pluggy iniconfig packaging attr attrs; do
    [[ -e $dist/$p ]] || { echo "bundle.sh: $dist/$p missing (apt-get install python3-pytest)" >&2; exit 1; }
    cp -r "$dist/$p" "$dest/python/vendor/"
  done
  find "$dest/python/vendor" -name __pycache__ -prune -exec rm -rf {} +
  # The module must load into CPython 3.12 (not import numpy: pyenv's may have none).
  (cd / && LD_LIBRARY_PATH="$dest/lib" PYTHONPATH="$dest/python" "$py312" -c \
    'import sys, ferry; assert ferry.Session and ferry.KernelArg; print("bundle: ferry loads into python", sys.version.split()[0])')
fi
# The commit the bundle was built from ("-dirty": with uncommitted changes), for the reports.
echo "$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . ':!docs' || echo -dirty)" \
  >"$dest/COMMIT"
