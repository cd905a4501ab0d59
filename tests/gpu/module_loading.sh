#!/bin/bash
# On the GPU machine: CUDA module loading, lazy against eager (ferryd --cuda-module-loading),
# from a bundle made by tests/gpu/bundle.sh:
#   tests/gpu/module_loading.sh [BUNDLE_DIR [ROUNDS]]
# - ferryd's start (until its ready file), its device memory (nvidia-smi) and RSS, idle and
#   after the quickstart example's session and a first GEMM (its time is printed: lazy, it
#   opens cuBLAS and loads its kernels; eager, ferryd did so at start);
# - ConcurrencyTest.ASessionsFirstKernelsWaitForNoOtherSessionsWork, ROUNDS times (default 3).
set -uo pipefail
bundle=$(cd "${1:-.gpu/bundle}" && pwd)
rounds=${2:-3}
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:/usr/local/nvidia/bin"
work=$(mktemp -d /tmp/ferry-loading-XXXXXX)
for mode in lazy eager; do
  # The tests start ferryd through this, with the mode added last: of a flag given twice the
  # last wins, so it overrides the test's own --cuda-module-loading.
  printf '#!/bin/sh\nexec "%s" "$@" --cuda-module-loading %s\n' "$bundle/bin/ferryd" "$mode" \
    >"$work/ferryd-$mode" && chmod +x "$work/ferryd-$mode"
done
for mode in lazy eager; do
  rm -f "$work/ready"
  start=$(date +%s.%N)
  "$work/ferryd-$mode" --backend cuda --listen "unix:$work/sock" --ready-file "$work/ready" \
    --log-level warn >"$work/ferryd-$mode.log" 2>&1 &
  pid=$!
  while [[ ! -s $work/ready ]] && kill -0 $pid 2>/dev/null; do sleep 0.01; done
  ready=$(date +%s.%N)
  sleep 1
  dev=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
    awk -F', ' -v p=$pid '$1==p{print $2}')
  rss=$(awk '/VmRSS/{print int($2/1024)}' /proc/$pid/status)
  "$bundle/bin/ferry_quickstart" "unix:$work/sock" >/dev/null 2>&1
  gemm=$("$bundle/bin/ferry_test_client" "unix:$work/sock" gemm 2>&1)
  dev2=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
    awk -F', ' -v p=$pid '$1==p{print $2}')
  rss2=$(awk '/VmRSS/{print int($2/1024)}' /proc/$pid/status)
  kill $pid; wait $pid 2>/dev/null
  printf 'MEASURED loading=%s start_s=%.2f device_MiB=%s rss_MiB=%s after_quickstart_and_gemm: device_MiB=%s rss_MiB=%s (%s)\n' \
    "$mode" "$(awk "BEGIN{print $ready - $start}")" "$dev" "$rss" "$dev2" "$rss2" "$gemm"
done
for round in $(seq "$rounds"); do
  for mode in lazy eager; do
    log="$work/test-$mode-$round.log"
    FERRY_TEST_BACKEND=cuda FERRY_TEST_FERRYD="$work/ferryd-$mode" \
      "$bundle/bin/ferry_integration_tests" \
      --gtest_filter='ConcurrencyTest.ASessionsFirstKernelsWaitForNoOtherSessionsWork' >"$log" 2>&1
    rc=$?
    echo "MEASURED loading=$mode round=$round first-kernels test rc=$rc ($(grep -c 'Failure' "$log") failures)"
    [[ $rc != 0 ]] && grep -A3 Failure "$log" | head -12
  done
done
rm -rf "$work"
