#!/bin/bash
# Every file the sanitizers' options name (suppressions) is readable by another user: tests
# run some of their processes as other uids (other_user.h), and a sanitizer that cannot read
# its suppressions file reports that as an error, failing the phase. tests/run.sh copies the
# files under /tmp for that; a checkout under root's 0700 home is where the checkout's own
# files are not readable. Exit 77 (skipped, saying why) where no sanitizer options are set
# (the plain build) or where the test cannot act as another user (not root).
set -uo pipefail
files=()
for options in "${ASAN_OPTIONS:-}" "${LSAN_OPTIONS:-}" "${TSAN_OPTIONS:-}" "${UBSAN_OPTIONS:-}"; do
  IFS=':' read -r -a parts <<<"$options"
  for p in "${parts[@]}"; do
    [[ $p == suppressions=* ]] && files+=("${p#suppressions=}")
  done
done
if ((${#files[@]} == 0)); then
  echo "SKIP: no sanitizer options with suppressions in the environment (a plain build)"
  exit 77
fi
if [[ $(id -u) != 0 ]] || ! command -v setpriv >/dev/null; then
  echo "SKIP: needs root and setpriv to read the files as another user"
  exit 77
fi
bad=0
for f in "${files[@]}"; do
  if setpriv --reuid=65534 --regid=65534 --clear-groups cat "$f" >/dev/null 2>&1; then
    echo "readable by uid 65534: $f"
  else
    echo "NOT readable by uid 65534: $f"
    bad=1
  fi
done
exit $bad
