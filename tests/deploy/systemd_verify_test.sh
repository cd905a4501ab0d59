#!/bin/bash
# `systemd-analyze verify` on deploy/systemd's units, as the instance ferryd@0 (the template's
# %i filled in), with ExecStart pointed at the built ferryd: verify reports an ExecStart binary
# that does not exist, and /usr/bin/ferryd is not installed here.
#   systemd_verify_test.sh BUILD_DIR SOURCE_DIR
# Exit: 0 when verify says nothing about the units; 1 when it reports a problem (printed);
# 77 (skipped) when systemd-analyze is not installed.
set -euo pipefail
build=$1 src=$2

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not found"
  exit 77
fi
ferryd="$build/server/ferryd"
if [[ ! -x "$ferryd" ]]; then
  echo "FAIL: $ferryd is not built (ninja ferryd)"
  exit 1
fi
ferryd=$(realpath "$ferryd")  # ExecStart needs an absolute path
if [[ "$ferryd" =~ [[:space:]\|] ]]; then
  echo "FAIL: the ferryd path '$ferryd' holds whitespace or '|'; ExecStart cannot name it as is"
  exit 1
fi

# The temporary directory's name must not contain "ferryd" (see the filter below).
tmp=$(mktemp -d /tmp/ferry-units-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
units="$src/deploy/systemd"
sed "s|^ExecStart=/usr/bin/ferryd |ExecStart=$ferryd |" "$units/ferryd@.service" \
  >"$tmp/ferryd@0.service"
cp "$units/ferryd@.socket" "$tmp/ferryd@0.socket"
if ! grep -qF "ExecStart=$ferryd " "$tmp/ferryd@0.service"; then
  echo "FAIL: ferryd@.service's ExecStart no longer starts with /usr/bin/ferryd; update this test"
  grep -n '^ExecStart' "$units/ferryd@.service" || true
  exit 1
fi

# Only our units' own problems count: --recursive-errors=no (systemd >= 250) keeps problems
# of the units they reference (network.target, sockets.target, ...) out of the exit status.
recursive=()
if systemd-analyze --help 2>&1 | grep -q -- '--recursive-errors'; then
  recursive=(--recursive-errors=no)
fi

# Print verify's output about the units in $1.. and return 0 when there is none and verify
# exited 0. verify may also warn about other unit files installed on this machine (a vendor
# unit with an obsolete key, say), which are not ours to fix: only lines that mention ferryd
# (our units' paths and names: "PATH/ferryd@0.service:12: ...", "ferryd@0.service: ...")
# count. A non-zero exit with no such line is still a failure, printed in full.
verify() {
  local out rc=0
  out=$(systemd-analyze verify "${recursive[@]}" "$@" 2>&1) || rc=$?
  local ours
  ours=$(grep -i 'ferryd' <<<"$out" || true)
  if [[ -n "$ours" ]]; then
    echo "$ours"
    return 1
  fi
  if ((rc != 0)); then
    echo "systemd-analyze verify exited $rc:"
    echo "$out"
    return 1
  fi
  return 0
}

# Canary: a unit with a known problem must be reported, or a clean result below means nothing
# (a systemd-analyze that checks nothing, or a filter that drops every line).
mkdir "$tmp/canary"
sed 's/^\[Service\]$/[Service]\nNoSuchKeyForTheCanary=1/' "$tmp/ferryd@0.service" \
  >"$tmp/canary/ferryd@0.service"
if verify "$tmp/canary/ferryd@0.service" >/dev/null; then
  echo "FAIL: systemd-analyze verify did not report an unknown key in a canary unit"
  exit 1
fi

if ! verify "$tmp/ferryd@0.service" "$tmp/ferryd@0.socket"; then
  echo "FAIL: systemd-analyze verify reports problems in deploy/systemd/ferryd@.service or" \
    "ferryd@.socket (checked as ferryd@0, ExecStart=$ferryd)"
  exit 1
fi
echo "systemd-analyze verify: ferryd@0.service and ferryd@0.socket are clean"
