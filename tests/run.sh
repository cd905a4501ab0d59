#!/bin/bash
# Build everything and run the whole test suite, then the same code under sanitizers and
# fuzzers. Installs the Debian packages it needs. On a machine without a GPU the CUDA
# conformance tests are skipped, each printing why. tests/README.md describes each phase and
# how to run one on its own.
#
#   bash tests/run.sh
#
# Phases, in this order. By default only plain runs (a few minutes on 2 cores); CI (CI=true)
# and FERRY_TEST_PHASES=all run every phase (about 40 minutes on 2 cores), and
# FERRY_TEST_PHASES picks some, e.g. FERRY_TEST_PHASES="plain fuzz":
#   plain  build-test/: the RelWithDebInfo build; unit, conformance and integration tests
#          (the soak included: FERRY_SOAK_SECONDS, default 120)
#   asan   build-asan/: clang, ASan+UBSan (and libFuzzer coverage); unit, conformance (host)
#          and integration tests but the soak
#   fuzz   build-asan/'s fuzz targets, each for FERRY_FUZZ_SECONDS (default 60) from the seed
#          corpus in tests/fuzz/corpus/; a crash, leak or slow input fails it
#   tsan   build-tsan/: clang, TSan; unit tests and the concurrency subset of the integration
#          tests ($tsan_integration below)
#   tsa    build-tsa/: clang's thread-safety analysis (-Werror=thread-safety) over the daemon
#          (its CUDA backend included where the CUDA toolkit is), libferry and ferryctl:
#          ABSL_GUARDED_BY and friends (common/include/ferry/mutex.h) are checked; it only
#          compiles, no test runs
# Every phase runs even when an earlier one failed (a failed plain build stops the run); the
# exit status is non-zero when any failed. The output ends with a summary: each phase's time
# and result, each ctest run's result lines (the plain suite's last), the head of the first
# sanitizer report of a phase that left any, and the phases that failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
all_phases="plain asan fuzz tsan tsa"
if [[ ${FERRY_TEST_PHASES:-} == all || (-z ${FERRY_TEST_PHASES:-} && ${CI:-} == true) ]]; then
  phases=" $all_phases "
else
  phases=" ${FERRY_TEST_PHASES:-plain} "
fi
jobs=$(nproc)
fuzz_seconds=${FERRY_FUZZ_SECONDS:-60}
# Where races would live: the executors, the ring poller, the completion watcher, the slab
# broker, drain, the device rebuild thread. (TSan runs ferryd about 5-15x slower; the whole integration suite would not
# fit CI's hour on 2 cores.)
tsan_integration='^(ConcurrencyTest|SubmitRingTest|PendingTest|DrainTest|SlabBadInputTest|RebuildPaths/DeviceFaultTest)\.'
# The sanitizer builds need no CUDA backend (no GPU in CI), no benchmark, no install test.
san_cmake=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_CUDA=OFF -DFERRY_BUILD_BENCH=OFF
           -DFERRY_INSTALL_TEST=OFF)

bash "$root/deploy/install-deps.sh" --tests || exit 1

failed=()
summary=()
ctest_logs=()
logs="$root/build-test-logs"
rm -rf "$logs"
mkdir -p "$logs"
# Sanitizer reports go to files here: under /tmp and world-writable, because tests run the
# test client as another user (PendingTest.AnotherUserNeverSeesBytesOneUserWrote), who may not
# reach the checkout.
reports_root=$(mktemp -d /tmp/ferry-sanitizer-reports-XXXXXX)
chmod 1777 "$reports_root"
# And the sanitizers' suppressions, copied where those users can read them: a checkout under
# root's 0700 home is not (a sanitizer that cannot read its suppressions file fails the
# process). tests/deploy/sanitizer_options_test.sh checks it in each sanitizer phase.
options_dir=$(mktemp -d /tmp/ferry-sanitizer-options-XXXXXX)
chmod 755 "$options_dir"
for f in lsan.supp tsan.supp; do
  install -m 644 "$root/tests/$f" "$options_dir/$f"
done

# CPU seconds (user + system) of every child process this script has waited for so far
# (cutime and cstime of /proc/PID/stat; the fields after the name, which is in parentheses).
clock_ticks=$(getconf CLK_TCK)
cpu_seconds() {
  local stat
  stat=$(<"/proc/$$/stat")
  read -r -a f <<<"${stat##*) }"
  echo $(((f[13] + f[14]) / clock_ticks))
}

# phase NAME COMMAND...: run it, time it (wall and CPU), record its result.
phase() {
  local name=$1 start=$SECONDS cpu_start result=ok
  cpu_start=$(cpu_seconds)
  shift
  echo "=== tests/run.sh: $name ==="
  "$@" || { result=FAILED; failed+=("$name"); }
  local line
  line=$(printf '%-16s %5d s wall %6d s CPU  %s' "$name" $((SECONDS - start)) \
    $(($(cpu_seconds) - cpu_start)) "$result")
  summary+=("$line")
  echo "=== tests/run.sh: $line ==="
  [[ $result == ok ]]
}

# run_ctest TAG BUILD_DIR CTEST_ARGS...: ctest with its output kept for the summary.
run_ctest() {
  local tag=$1 dir=$2
  shift 2
  local log="$logs/ctest-$tag.log"
  ctest_logs+=("$tag:$log")
  (cd "$dir" && ctest --output-on-failure --timeout 600 -j "$jobs" "$@") 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}

# sanitizer_reports DIR: fail (printing them) when any process left a report in DIR: a
# ferryd child's report counts though the test that started it may have passed.
# The first report's head is kept for the end of the output too (sanitizer_digest): a CI that
# keeps only the log's tail still shows what failed.
sanitizer_digest=()
# Files that hold nothing but TSan's "Symbolizer buffer too small" warning are not reports:
# TSan symbolizes a race's stacks before it checks the suppressions, and clang 14's TSan
# writes that warning to the log file when one address's inlined frames do not fit its
# buffer; the race itself was suppressed (tests/tsan.supp) and nothing else is written.
# They are counted apart.
sanitizer_reports() {
  local dir=$1 f warnings=0 reports=()
  local only_warning='^==[0-9]+==WARNING: Symbolizer buffer too small$'
  while IFS= read -r -d '' f; do
    if grep -qE "$only_warning" "$f" && ! grep -qvE "$only_warning" "$f"; then
      warnings=$((warnings + 1))
    else
      reports+=("$f")
    fi
  done < <(find "$dir" -type f -print0 | sort -z)
  ((warnings)) && echo "sanitizer: $warnings file(s) held only TSan's 'Symbolizer buffer too small' (a suppressed report's symbolization); not counted"
  ((${#reports[@]} == 0)) && return 0
  echo "sanitizer reports: ${#reports[@]} (in $dir); the first ones:"
  for f in "${reports[@]:0:5}"; do
    echo "--- $f"
    head -80 "$f"
  done
  sanitizer_digest+=("--- sanitizer reports: ${#reports[@]} in $dir; their summaries:"
    "$(grep -h '^SUMMARY' "${reports[@]}" | sort | uniq -c | head -10)"
    "--- the head of ${reports[0]}:" "$(head -40 "${reports[0]}")")
  return 1
}

plain_build() {
  cmake -S "$root" -B "$root/build-test" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build "$root/build-test" -j "$jobs"
}
plain_tests() {
  # Skipped tests print their reason in the log; --output-on-failure shows failures whole.
  run_ctest plain "$root/build-test"
}

asan_build() {
  CC=clang CXX=clang++ cmake -S "$root" -B "$root/build-asan" "${san_cmake[@]}" \
    -DFERRY_SANITIZE=address,undefined -DFERRY_FUZZ=ON &&
    cmake --build "$root/build-asan" -j "$jobs"
}
asan_tests() {
  local reports="$reports_root/asan" rc=0
  mkdir -p "$reports" && chmod 1777 "$reports"
  # HostBackendTest.LeakedAllocationsAreReleasedWithTheDevice relies on LeakSanitizer: it
  # must be among what runs here.
  (cd "$root/build-asan" && ctest -N -R '^HostBackendTest\.LeakedAllocationsAreReleasedWithTheDevice$' |
    grep -q 'Total Tests: 1') || { echo "asan: the leak test is missing"; return 1; }
  ASAN_OPTIONS="detect_leaks=1:log_path=$reports/asan:print_summary=1" \
    LSAN_OPTIONS="suppressions=$options_dir/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan" \
    run_ctest asan "$root/build-asan" -L 'unit|conformance|integration' \
    -E '^(SoakTest|StyleTest|DeployTest)\.' || rc=1
  sanitizer_reports "$reports" || rc=1
  return $rc
}

fuzz_one() {
  local target=$1 bin="$root/build-asan/tests/fuzz/$1" work="$logs/fuzz/$1"
  mkdir -p "$work/corpus" "$work/artifacts"
  "$bin" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" "$root/tests/fuzz/corpus/$target" \
    >"$work/log" 2>&1
  local rc=$?
  if ((rc != 0)); then
    echo "fuzz: $target FAILED (exit $rc); its log ends:"
    tail -60 "$work/log"
    ls -la "$work/artifacts"
    # For the end of the output too: what failed, and the input (libFuzzer's Base64 line).
    { echo "--- fuzz: $target FAILED (exit $rc):"
      grep -E "^($target:|==[0-9]+== ERROR|SUMMARY|Base64:|MS:|artifact_prefix)" "$work/log" | tail -8
    } >>"$logs/fuzz-digest"
  else
    echo "fuzz: $target ok: $(grep -E '^stat::number_of_executed_units' "$work/log")"
  fi
  return $rc
}
fuzz_all() {
  local targets=(submit_ring_fuzz slab_request_fuzz submit_admission_fuzz config_fuzz wire_scan_fuzz
                 module_footprint_fuzz)
  local pids=() rc=0 i
  # Two at a time (or one per core): each takes one core for fuzz_seconds.
  for ((i = 0; i < ${#targets[@]}; i += jobs)); do
    pids=()
    for t in "${targets[@]:i:jobs}"; do
      fuzz_one "$t" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
  done
  return $rc
}

tsan_build() {
  CC=clang CXX=clang++ cmake -S "$root" -B "$root/build-tsan" "${san_cmake[@]}" \
    -DFERRY_SANITIZE=thread &&
    cmake --build "$root/build-tsan" -j "$jobs" --target ferry_unit_tests ferry_integration_tests
}
tsan_tests() {
  local reports="$reports_root/tsan" rc=0
  mkdir -p "$reports" && chmod 1777 "$reports"
  export TSAN_OPTIONS="log_path=$reports/tsan:second_deadlock_stack=1:suppressions=$options_dir/tsan.supp"
  run_ctest tsan-unit "$root/build-tsan" -L unit -E '^(StyleTest|FuzzCorpus)\.' || rc=1
  run_ctest tsan-integration "$root/build-tsan" -L integration -R "$tsan_integration" || rc=1
  unset TSAN_OPTIONS
  sanitizer_reports "$reports" || rc=1
  return $rc
}

# The thread-safety analysis: a clang build of what runs threads (the daemon, libferry,
# ferryctl); a lock annotation broken anywhere fails the build. Where the CUDA toolkit is, the
# daemon is built with its CUDA backend (FERRY_CUDA=ON overrides san_cmake's OFF): clang
# compiles the backend's .cc files under the analysis, and nvcc its .cu kernels, which hold
# no locks (nvcc cannot run the analysis). Without the toolkit the phase says so.
tsa_build() {
  local cuda=ON
  if [[ ! -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
    cuda=OFF
    echo "tsa: no CUDA toolkit (nvcc) here: the CUDA backend's files are not analysed"
  fi
  CC=clang CXX=clang++ cmake -S "$root" -B "$root/build-tsa" "${san_cmake[@]}" \
    -DFERRY_CUDA="$cuda" -DFERRY_BUILD_TESTS=OFF \
    "-DCMAKE_CXX_FLAGS=-Wthread-safety -Werror=thread-safety" &&
    cmake --build "$root/build-tsa" -j "$jobs" --target ferryd ferry_client ferryctl
}

total_start=$SECONDS
echo "tests/run.sh: phases:$phases(all: FERRY_TEST_PHASES=all; CI=true runs all)"
if [[ $phases == *" plain "* ]]; then
  phase plain-build plain_build || { echo "the plain build failed"; exit 1; }
  phase plain-tests plain_tests
fi
if [[ $phases == *" asan "* || $phases == *" fuzz "* ]]; then
  if phase asan-build asan_build; then
    [[ $phases == *" asan "* ]] && phase asan-tests asan_tests
    [[ $phases == *" fuzz "* ]] && phase fuzz fuzz_all
  fi
fi
if [[ $phases == *" tsan "* ]]; then
  phase tsan-build tsan_build && phase tsan-tests tsan_tests
fi
if [[ $phases == *" tsa "* ]]; then
  phase tsa-build tsa_build
fi

echo
echo "=== tests/run.sh summary: $((SECONDS - total_start)) s in all ==="
printf '%s\n' "${summary[@]}"
# ctest_results LOG: a ctest run's result lines; its list of skipped tests (each printed its
# reason above) is counted, not repeated.
ctest_results() {
  sed -n '/tests passed, /,$p' "$1" | awk '
    /^The following tests did not run:/ {skipping = 1; next}
    skipping && /\(Skipped\)$/ {skipped++; next}
    {skipping = 0; print}
    END {if (skipped) printf "(%d tests skipped, each with its reason in the log above)\n", skipped}'
}
# Each ctest run's result lines, the plain suite's last, then what failed and the sanitizer
# reports' digest: what ends the log is what a reader of its tail needs.
for entry in "${ctest_logs[@]}"; do
  tag=${entry%%:*} log=${entry#*:}
  [[ $tag == plain ]] && continue
  echo "--- ctest ($tag):"
  ctest_results "$log"
done
for entry in "${ctest_logs[@]}"; do
  tag=${entry%%:*} log=${entry#*:}
  [[ $tag == plain ]] || continue
  echo "--- ctest ($tag):"
  ctest_results "$log"
done
((${#sanitizer_digest[@]})) && printf '%s\n' "${sanitizer_digest[@]}"
[[ -s $logs/fuzz-digest ]] && cat "$logs/fuzz-digest"
((${#failed[@]})) && echo "tests/run.sh: FAILED: ${failed[*]}"
((${#failed[@]} == 0))
