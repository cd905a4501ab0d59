#!/bin/bash
# On the GPU machine: run the conformance suite and the integration suite against the CUDA
# backend from a bundle made by tests/gpu/bundle.sh, then print a pass/fail table.
#   tests/gpu/run.sh [BUNDLE_DIR]        (default .gpu/bundle; logs in $OUT or /tmp)
set -uo pipefail
bundle=$(cd "${1:-.gpu/bundle}" && pwd)
out=${OUT:-/tmp/ferry-gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERRY_TEST_BACKEND=cuda
export FERRY_TEST_FERRYD="$bundle/bin/ferryd"
export FERRY_TEST_CLIENT="$bundle/bin/ferry_test_client"
export FERRY_QUICKSTART="$bundle/bin/ferry_quickstart"
export FERRY_TEST_FERRYCTL="$bundle/bin/ferryctl"
export FERRY_TEST_BENCH="$bundle/bin/ferry-bench"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

suite() {  # NAME BINARY [gtest args]
  local name=$1 bin=$2; shift 2
  echo "=== $name"
  "$bundle/bin/$bin" --gtest_output="json:$out/$name.json" "$@" >"$out/$name.log" 2>&1
  echo $? >"$out/$name.rc"
  grep -E "^\[  (FAILED|SKIPPED) |MEASURED" "$out/$name.log" | sort -u | head -40
  # Each failed test's own output, on stdout: the logs may not come back from the machine.
  awk '/^\[ RUN      \]/{buf=""; keep=0} {buf=buf $0 "\n"} /Failure|^\[  FAILED  \] [A-Za-z]/{keep=1}
       /^\[  FAILED  \] [A-Za-z].*\(/{if(keep) printf "%s", buf; buf=""; keep=0}' "$out/$name.log" |
    grep -vE "^\[ RUN|^\[       OK" | head -60
}
suite conformance ferry_conformance_tests
suite integration ferry_integration_tests

python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
print("\n%-14s %6s %6s %6s %6s" % ("suite", "tests", "pass", "fail", "skip"))
for name in ("conformance", "integration"):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        print("%-14s (no report; exit code %s)" % (name, open(os.path.join(out, name + ".rc")).read().strip()))
        continue
    tests = [t for s in json.load(open(path))["testsuites"] for t in s["testsuite"]]
    fail = sum(1 for t in tests if t.get("failures"))
    skip = sum(1 for t in tests if t.get("result") == "SKIPPED")
    print("%-14s %6d %6d %6d %6d" % (name, len(tests), len(tests) - fail - skip, fail, skip))
PY
