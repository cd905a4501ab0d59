#!/bin/bash
# On the GPU machine: what CUDA's number of hardware work queues per context
# (CUDA_DEVICE_MAX_CONNECTIONS; CUDA's default is 8) costs in ferryd's resident memory and
# buys in concurrency. For each count: an idle ferryd's largest mappings, then ferry-bench's
# memory, concurrency and overlap scenarios (daemon and in-process baseline alike).
#   tests/gpu/work_queues.sh [BUNDLE_DIR] [COUNTS...]   (default: 1 2 4 8)
set -u
. "$(dirname "${BASH_SOURCE[0]}")/idle_memory.sh"
b=$(realpath "${1:-.gpu/bundle}"); shift || true
counts=("$@"); [[ ${#counts[@]} -gt 0 ]] || counts=(1 2 4 8)
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for n in "${counts[@]}"; do
  export CUDA_DEVICE_MAX_CONNECTIONS=$n
  echo "###### CUDA_DEVICE_MAX_CONNECTIONS=$n"
  ferryd_idle_memory "$b/bin/ferryd" "VmRSS" 4
  "$b/bin/ferry-bench" --spawn-daemon "$b/bin/ferryd" --baseline --scenario memory \
    --scenario concurrency --scenario overlap 2>/dev/null |
    grep -E "^== |VmRSS, 64|pools excluded|sessions, 8 MiB|copy only|host work|serial|overlapped"
done
