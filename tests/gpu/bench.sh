#!/bin/bash
# On the GPU machine: the full ferry-bench run that docs/performance.md reports, plus the
# measurements behind its notes, from a bundle made by tests/gpu/bundle.sh.
#   tests/gpu/bench.sh [BUNDLE_DIR] [quick]     (outputs in $OUT or /tmp/ferry-bench-out)
#  1. ferry-bench --spawn-daemon --baseline, every scenario (the fault scenario last), --json
#     and --svg; with --baseline-mps where nvidia-cuda-mps-control is found (PATH or
#     /usr/local/nvidia/bin): the MPS column of sharing, latency and throughput, and the
#     fault scenario's MPS arm (without it those read "n/a" with the reason);
#  2. the concurrency scenario again with ferryd's copy turns off (--copy-turns=0: CUDA
#     orders the sessions' copies), the comparison for the turns' fairness;
#  2b. latency, single transfers, throughput and concurrency with submit rings off
#     (--submit-ring=0: every message through gRPC), the comparison for the rings;
#  2c. throughput with kernel batches off (--kernel-batch=0: every kernel op launched on
#     its own), the comparison for the batches;
#  4. (below 3.) the remote inline route over TCP loopback against bare gRPC on TCP;
#  3. where an idle ferryd's resident memory is: the largest mappings of /proc/PID/smaps,
#     with CUDA's default work queues and with 32.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/idle_memory.sh"
bundle=$(cd "${1:-.gpu/bundle}" && pwd)
quick=${2:-}
out=${OUT:-/tmp/ferry-bench-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bench="$bundle/bin/ferry-bench"
ferryd="$bundle/bin/ferryd"
commit=$(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)
# The card in the file names: "h100", "h200" (from nvidia-smi's name), else "gpu".
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
  grep -oiE '\b[A-Z][0-9]{2,3}\b' | head -1 | tr 'A-Z' 'a-z')
stamp="$(date -u +%Y-%m-%d)-${card:-gpu}-$commit"

mps=""
if command -v nvidia-cuda-mps-control >/dev/null || [[ -x /usr/local/nvidia/bin/nvidia-cuda-mps-control ]]; then
  mps=--baseline-mps
fi
echo "=== 1. full run ($stamp)${mps:+ with $mps}"
"$bench" --spawn-daemon "$ferryd" --baseline $mps ${quick:+--quick} \
  --json "$out/$stamp.json" --svg "$out/$stamp.svg" >"$out/$stamp.txt" 2>"$out/$stamp.err"
echo "exit $?"

echo "=== 2. concurrency with copy turns off"
"$bench" --spawn-daemon "$ferryd" --daemon-arg --copy-turns=0 --baseline ${quick:+--quick} \
  --scenario concurrency >"$out/$stamp-copy-turns-off.txt" 2>&1
echo "exit $?"

echo "=== 2b. submit rings off"
"$bench" --spawn-daemon "$ferryd" --daemon-arg --submit-ring=0 ${quick:+--quick} \
  --scenario latency --scenario transfers --sizes 16,64K,8M --scenario throughput \
  --scenario concurrency >"$out/$stamp-submit-ring-off.txt" 2>&1
echo "exit $?"

echo "=== 2c. kernel batches off"
"$bench" --spawn-daemon "$ferryd" --daemon-arg --kernel-batch=0 --baseline ${quick:+--quick} \
  --scenario throughput >"$out/$stamp-kernel-batch-off.txt" 2>&1
echo "exit $?"

idle_rss() {  # LABEL [ENV=VALUE]: start ferryd, print its memory by mapping, stop it
  echo "--- $1"
  ferryd_idle_memory "$ferryd" "VmRSS|RssAnon|RssFile|RssShmem" 8 "${2:-}"
}
echo "=== 3. idle ferryd: resident memory by mapping"
{ idle_rss "CUDA default work queues"; idle_rss "CUDA_DEVICE_MAX_CONNECTIONS=32" \
    CUDA_DEVICE_MAX_CONNECTIONS=32; } 2>&1 | tee "$out/$stamp-rss.txt"

echo "=== 4. remote inline route over TCP loopback"
"$bench" --spawn-daemon "$ferryd" --tcp --baseline --scenario transfers --sizes 8M,256M \
  >"$out/$stamp-tcp.txt" 2>&1
echo "exit $?"

echo "=== summary"

awk '/^== /{print} /(pending|streamed) (8 MiB|256 MiB)( |$)|tiny op|floor|64 ops|graph|overlap|64 sessions|memory|RSS/' \
  "$out/$stamp.txt" | head -60
grep -E "MPS arm|vs in-process pageable|processes, (blocking|pinned)" "$out/$stamp.txt"
sed -n '/^== fault/,/^$/p' "$out/$stamp.txt"
grep -E "64 sessions" "$out/$stamp-copy-turns-off.txt"
echo "--- submit rings off"
awk '/^== /{print} /pending (16 B|8 MiB)( |$)|tiny op|fill|floor|ops\/submit|64 sessions/' \
  "$out/$stamp-submit-ring-off.txt" | head -30
echo "--- kernel batches off"
grep -E "ops/submit" "$out/$stamp-kernel-batch-off.txt"
grep -E "^== transfers|inline|bulk" "$out/$stamp-tcp.txt"
