#!/bin/bash
# On the GPU machine: compare two ferryd builds in one call, the same ferry-bench against
# each, interleaved twice (runs on the VM vary by tens of percent from call to call, so
# only figures from the same call compare).
#   tests/gpu/ab.sh OLD_FERRYD NEW_FERRYD [BUNDLE_DIR]
# The bundle (default .gpu/bundle) provides ferry-bench and the libraries; build the old
# ferryd from a worktree of the old commit (cmake -DFERRY_CUDA=ON, target ferryd).
set -u
old=$(realpath "$1"); new=$(realpath "$2"); b=$(realpath "${3:-.gpu/bundle}")
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for round in 1 2; do
  for d in "$old" "$new"; do
    echo "### round $round: $d"
    "$b/bin/ferry-bench" --spawn-daemon "$d" --scenario latency --scenario throughput \
      --scenario transfers --sizes 8M --baseline 2>/dev/null |
      grep -E "^fill|axpy 256 f32, (1|8|64|512) ops|gRPC echo 16 B|(pending|streamed) 8 MiB  "
  done
done
