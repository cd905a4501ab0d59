#!/bin/bash
# On the GPU machine: run the conformance suite, the integration suite and the Python
# client's suite (tests/python, under this machine's python3) against the CUDA backend from a
# bundle made by tests/gpu/bundle.sh, then print a pass/fail table.
#   tests/gpu/run.sh [BUNDLE_DIR [FILTER]]   (default .gpu/bundle; logs in $OUT or /tmp)
# FILTER: a gtest filter for the integration suite (e.g. -BoundedSessionTest.*).
# A sanitized bundle (tests/gpu/bundle.sh asan) runs with ASan's and UBSan's reports written
# to files, every process's (ferryd's too), gathered into sanitizer-reports.txt at the end.
set -uo pipefail
bundle=$(cd "${1:-.gpu/bundle}" && pwd)
filter=${2:-}
out=${OUT:-/tmp/ferry-gpu}
mkdir -p "$out"
reports=""
if [[ -f "$bundle/SANITIZED" ]]; then
  reports=$(mktemp -d /tmp/ferry-gpu-sanitizer-XXXXXX) && chmod 1777 "$reports"
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  # protect_shadow_gap=0: the CUDA driver maps memory where ASan would otherwise protect.
  export ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=1:log_path=$reports/asan:print_summary=1"
  # LSAN_OPTIONS takes one file: CI's suppressions and the CUDA libraries' together (outside
  # $reports, which holds only reports; readable by the tests' second uid).
  supp=$(mktemp /tmp/ferry-gpu-lsan-XXXXXX) && chmod 644 "$supp"
  cat "$here/../lsan.supp" "$here/lsan-cuda.supp" >"$supp"
  export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
fi
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
suite integration ferry_integration_tests ${filter:+--gtest_filter="$filter"}
# The Python suite: the bundle's module was built for CPython 3.12; pytest comes from the
# bundle's vendor/ where python3 has none. Its tests start the bundle's CUDA ferryd.
python_suite() {
  local py=$bundle/python
  if [[ ! -d $py/ferry ]]; then
    echo "=== python: not in this bundle (a sanitized bundle has no module)"
    return
  fi
  echo "=== python"
  local want have
  want=$(ls "$py"/ferry/_ferry.cpython-*.so | sed -E 's/.*cpython-([0-9])([0-9]+)-.*/\1.\2/')
  have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
  if [[ $want != "$have" ]]; then
    echo "python: skipped: python3 is ${have:-missing}, the bundle's module is for $want"
    echo "skipped" >"$out/python.rc"
    return
  fi
  local path=$py
  python3 -c 'import pytest' 2>/dev/null || path="$path:$py/vendor"
  # -W: pytest 7.2's assertion rewriting uses ast names that 3.12 deprecates (ast.Str, ...,
  # and their attributes); only those warnings are dropped.
  (cd "$py/src" && PYTHONPATH="$path" PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -rfEs \
    -p no:cacheprovider -W "ignore:ast.:DeprecationWarning" \
    -W "ignore:Attribute s is deprecated:DeprecationWarning" --junitxml="$out/python.xml" \
    tests/python) >"$out/python.log" 2>&1
  echo $? >"$out/python.rc"
  grep -E "^ferry: python" "$out/python.log"
  # The failures' tracebacks (their end) and short lines, on stdout: the log may not come back.
  sed -n '/^=* \(FAILURES\|ERRORS\) =*$/,/^=* short test summary/p' "$out/python.log" | tail -120
  grep -E "^(FAILED|ERROR) " "$out/python.log" | head -40
  python3 - "$out/python.xml" "$(python3 -c 'import numpy; print(numpy.__version__)' 2>&1)" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as e:
    print(f"python: no report ({e})")
    sys.exit(0)
suites = [root] if root.tag == "testsuite" else list(root)
n = lambda key: sum(int(s.get(key, 0)) for s in suites)
failed = n("failures") + n("errors")
print(f"python (python {sys.version.split()[0]}, numpy {sys.argv[2]}): "
      f"{n('tests') - failed - n('skipped')} passed, {failed} failed, {n('skipped')} skipped")
PY
}
python_suite

if [[ -n $reports ]]; then
  for f in "$reports"/*; do [[ -f $f ]] && { echo "=== $f"; cat "$f"; }; done >"$out/sanitizer-reports.txt"
  echo "=== sanitizer reports: $(find "$reports" -type f | wc -l) files"
  grep -hE "^SUMMARY|ERROR: [A-Za-z]+Sanitizer|runtime error" "$out/sanitizer-reports.txt" | sort | uniq -c | head -20
fi

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
path = os.path.join(out, "python.xml")
if os.path.exists(path):
    import xml.etree.ElementTree as ET
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    n = lambda key: sum(int(s.get(key, 0)) for s in suites)
    tests, fail, skip = n("tests"), n("failures") + n("errors"), n("skipped")
    print("%-14s %6d %6d %6d %6d" % ("python", tests, tests - fail - skip, fail, skip))
elif os.path.exists(os.path.join(out, "python.rc")):
    print("%-14s (no report; %s)" % ("python", open(os.path.join(out, "python.rc")).read().strip()))
PY
