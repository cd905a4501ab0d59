"""bench/python_bench.py runs (--quick) and reports every row, on whatever backend the
daemon has (host here; its figures mean nothing, that it runs does)."""

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python_bench.py")


def test_python_bench_runs_quick(daemon, tmp_path):
    out_json = tmp_path / "rows.json"
    out = subprocess.run([sys.executable, BENCH, "--target", daemon.target, "--quick",
                          "--json", str(out_json)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {r["case"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert set(rows) == {
        "pending upload 8 MiB", "pending download 8 MiB", "pending upload 256 MiB",
        "pending download 256 MiB", "tiny op: fill 1 elt, synchronize()",
        "tiny op: fill 1 elt + 1-elt download"}
    for name, r in rows.items():
        assert r["samples"] > 0 and 0 < r["p50_us"] <= r["p99_us"], (name, r)
        assert (r["gb_per_s"] is not None) == name.startswith("pending"), name
    assert "MiB parts" in rows["pending upload 256 MiB"]["notes"]  # above one slab: split


def test_python_bench_sharing_case_runs_its_processes_together(daemon, tmp_path):
    out_json = tmp_path / "rows.json"
    out = subprocess.run([sys.executable, BENCH, "--target", daemon.target, "--quick",
                          "--sharing", "2", "--rounds", "3", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {r["case"]: r for r in json.loads(out_json.read_text())["rows"]}
    r = rows["sharing, 2 processes, pinned"]
    assert r["rounds"] == 3 and r["ops_per_s"] > 0 and r["max_min"] >= 1.0, r
