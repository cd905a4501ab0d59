#!/bin/bash
# Build ferry, start ferryd (the CUDA backend where a GPU is visible, the host backend
# otherwise), and show it working by running the example client against it.
#
#   bash deploy/quickstart.sh            # daemon keeps running in the background
#   FERRY_SOCKET=/path/x.sock bash deploy/quickstart.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-release"
sock=${FERRY_SOCKET:-/tmp/ferry/ferryd-0.sock}
rundir=$(dirname "$sock")

bash "$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target ferryd ferry_quickstart ferryctl

# The run directory holds the pid file, the log, the ready file and the socket, all of which
# this script and ferryd trust: it must be this user's own, a real directory, and writable by
# nobody else (another local user who made /tmp/ferry first could otherwise plant links in it,
# or a pid for this script to kill).
mkdir -p -m 0755 "$rundir"
if [[ -L "$rundir" || ! -d "$rundir" || ! -O "$rundir" ]] || ((8#$(stat -c %a "$rundir") & 8#022)); then
  echo "quickstart: $rundir is not a directory of $(id -un)'s that only it may write;" \
    "remove it, or set FERRY_SOCKET to a path in a directory of your own" >&2
  exit 1
fi
if [[ -f "$rundir/ferryd.pid" ]] && kill -0 "$(cat "$rundir/ferryd.pid")" 2>/dev/null; then
  echo "stopping the ferryd started earlier (pid $(cat "$rundir/ferryd.pid"))"
  kill "$(cat "$rundir/ferryd.pid")"
  sleep 1
fi
rm -f "$rundir/ready"
nohup "$build/server/ferryd" --backend auto --listen "unix:$sock" --ready-file "$rundir/ready" \
  >"$rundir/ferryd.log" 2>&1 &
echo $! >"$rundir/ferryd.pid"
for _ in $(seq 100); do [[ -s "$rundir/ready" ]] && break; sleep 0.1; done
[[ -s "$rundir/ready" ]] || { cat "$rundir/ferryd.log"; echo "ferryd did not start"; exit 1; }
head -n 3 "$rundir/ferryd.log"

echo "--- example client (client/examples/quickstart.cc):"
"$build/client/ferry_quickstart" "unix:$sock"
echo "--- ferryctl status:"
"$build/client/ferryctl" --target "unix:$sock" status
echo "--- ferryd is running: pid $(cat "$rundir/ferryd.pid"), socket unix:$sock, log $rundir/ferryd.log"
echo "    stop it with: kill $(cat "$rundir/ferryd.pid")"
