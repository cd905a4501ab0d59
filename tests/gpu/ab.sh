#!/bin/bash
# On the GPU machine: compare ferryd builds in one call, the same ferry-bench against each,
# interleaved twice (runs on the VM vary by tens of percent from call to call, so only
# figures from the same call compare).
#   tests/gpu/ab.sh FERRYD FERRYD... (the bundle: $BUNDLE, default .gpu/bundle)
# The bundle provides ferry-bench and the libraries; build an old ferryd from a worktree of
# the old commit (cmake -DFERRY_CUDA=ON, target ferryd).
set -u
b=$(realpath "${BUNDLE:-.gpu/bundle}")
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "ferry-bench $(cat "$b/COMMIT" 2>/dev/null); $(date -u +%FT%TZ)"
for round in 1 2; do
  for d in "$@"; do
    echo "### round $round: $d"
    "$b/bin/ferry-bench" --spawn-daemon "$(realpath "$d")" --scenario latency \
      --scenario throughput --scenario transfers --sizes 8M --baseline 2>/dev/null |
      grep -E "^fill|axpy 256 f32, (1|8|64|512) ops|gRPC echo 16 B|(pending|streamed) 8 MiB  "
  done
done
