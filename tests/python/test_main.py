"""python3 -m ferry status prints what `ferryctl status --json` does."""

import json
import os
import subprocess
import sys

import pytest


def run_main(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ferry", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_status_mirrors_ferryctl(daemon, client):
    ferryctl = os.environ.get("FERRY_TEST_FERRYCTL")
    if not ferryctl:
        pytest.skip("$FERRY_TEST_FERRYCTL is not set; ctest sets it")
    with client.session():
        out = run_main("status", "--target", daemon.target, "--ferryctl", ferryctl)
        assert out.returncode == 0, out.stderr
        mine = json.loads(out.stdout)
        theirs = daemon.status()
    assert set(mine) == set(theirs)
    for key in ("target", "version", "backend", "slab_size", "device_total_bytes"):
        assert mine[key] == theirs[key], key
    assert mine["sessions_open"] == 1


def test_status_of_no_daemon_exits_2(tmp_path):
    ferryctl = os.environ.get("FERRY_TEST_FERRYCTL")
    if not ferryctl:
        pytest.skip("$FERRY_TEST_FERRYCTL is not set; ctest sets it")
    out = run_main("status", "--target", "unix:" + str(tmp_path / "none.sock"), "--ferryctl",
                   ferryctl, "--timeout", "0.5")
    assert out.returncode == 2
    assert "ferryctl status failed" in out.stderr
