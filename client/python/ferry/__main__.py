"""python3 -m ferry status [--target T] [--ferryctl PATH]: the daemon's status as JSON.

The same JSON as `ferryctl status --json`, which it runs: libferry's public API has no call
for the daemon's Admin service yet (ferryctl speaks it itself), so this is a front for it
rather than a second implementation. ferryctl is $FERRYCTL, else `ferryctl` on PATH.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys


def daemon_status(target, ferryctl=None, timeout=3.0):
    """Return the daemon's Admin status as a dict (the fields of `ferryctl status --json`)."""
    exe = ferryctl or os.environ.get("FERRYCTL") or shutil.which("ferryctl")
    if not exe:
        raise FileNotFoundError("ferryctl not found (set $FERRYCTL or put it on PATH)")
    out = subprocess.run([exe, "--target", target, "--timeout", str(timeout), "status",
                          "--json"], capture_output=True, text=True, timeout=timeout + 30)
    if out.returncode != 0:
        raise RuntimeError(f"ferryctl status failed ({out.returncode}): "
                           f"{(out.stderr or out.stdout).strip()}")
    return json.loads(out.stdout)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ferry", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="the daemon: device, memory, sessions, totals (JSON)")
    st.add_argument("--target", default="unix:/run/ferry/ferryd-0.sock")
    st.add_argument("--ferryctl", help="the ferryctl to run (default: $FERRYCTL, PATH)")
    st.add_argument("--timeout", type=float, default=3.0)
    args = ap.parse_args(argv)
    try:
        status = daemon_status(args.target, args.ferryctl, args.timeout)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"python3 -m ferry status: {e}", file=sys.stderr)
        return 2  # ferryctl's "critical or unreachable"
    json.dump(status, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
