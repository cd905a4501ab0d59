#!/bin/bash
# On the GPU machine: what the tenant-isolation fixes cost, from a bundle made by
# tests/gpu/bundle.sh: new tensors zeroed (transfers: "create + first download" rows against
# "download blocking" of the same size), slabs never re-granted (open_close: "first
# pinned_buffer()", open_session(), close()), over the Unix endpoint and over TCP.
#   tests/gpu/isolation.sh [BUNDLE_DIR]        (outputs in $OUT or /tmp/ferry-isolation)
set -uo pipefail
bundle=$(cd "${1:-.gpu/bundle}" && pwd)
out=${OUT:-/tmp/ferry-isolation}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bench="$bundle/bin/ferry-bench"
ferryd="$bundle/bin/ferryd"
echo "=== unix"
"$bench" --spawn-daemon "$ferryd" --baseline --scenario transfers --scenario open_close \
  --sizes 4K,1M,64M >"$out/isolation-unix.txt" 2>&1
echo "exit $?"
echo "=== tcp"
"$bench" --spawn-daemon "$ferryd" --tcp --baseline \
  --scenario transfers --sizes 4K,1M,64M >"$out/isolation-tcp.txt" 2>&1
echo "exit $?"
grep -E "^== |create|download blocking|pinned_buffer|open_session|close\(\)" \
  "$out/isolation-unix.txt" "$out/isolation-tcp.txt" | head -40
