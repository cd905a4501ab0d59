#!/bin/bash
# On the GPU machine: what CUDA's number of hardware work queues per context
# (CUDA_DEVICE_MAX_CONNECTIONS; CUDA's default is 8) costs in ferryd's resident memory and
# buys in concurrency. For each count: an idle ferryd's largest mappings, then ferry-bench's
# memory, concurrency and overlap scenarios (daemon and in-process baseline alike).
#   tests/gpu/work_queues.sh [BUNDLE_DIR] [COUNTS...]   (default: 1 2 4 8)
set -u
b=$(realpath "${1:-.gpu/bundle}"); shift || true
counts=("$@"); [[ ${#counts[@]} -gt 0 ]] || counts=(1 2 4 8)
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for n in "${counts[@]}"; do
  export CUDA_DEVICE_MAX_CONNECTIONS=$n
  echo "###### CUDA_DEVICE_MAX_CONNECTIONS=$n"
  sock=$(mktemp -d)/ferryd.sock
  "$b/bin/ferryd" --listen "unix:$sock" --ready-file "$sock.ready" --log-level warn &
  pid=$!
  for _ in $(seq 200); do [[ -s "$sock.ready" ]] && break; sleep 0.1; done
  grep -E "VmRSS" /proc/$pid/status
  awk '/^[0-9a-f]+-[0-9a-f]+ /{name=($6==""?"[anon]":$6)} /^Rss:/{rss[name]+=$2}
       END{for(n in rss) printf "%8.1f MiB  %s\n", rss[n]/1024, n}' /proc/$pid/smaps |
    sort -rn | head -4
  kill $pid; wait $pid
  "$b/bin/ferry-bench" --spawn-daemon "$b/bin/ferryd" --baseline --scenario memory \
    --scenario concurrency --scenario overlap 2>/dev/null |
    grep -E "^== |VmRSS, 64|pools excluded|sessions, 8 MiB|copy only|host work|serial|overlapped"
done
