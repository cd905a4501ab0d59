#!/usr/bin/env python3
"""What ferry costs from Python: the figures of ferry-bench's "transfers" (pending route) and
"latency" scenarios, measured through the Python client, to set beside ferry-bench's C++ ones.

  pending 8 MiB / 256 MiB upload and download: PinnedBuffers allocated once and reused as
    the contract intends: each iteration upload_pending(buf, tensor) -> wait() -> both back.
    A size above one slab goes as slab-sized parts (a buffer and a tensor each) issued back
    to back and waited together, as ferry-bench does; the time covers all parts.
  tiny op: fill a 1-element f32 tensor, then synchronize() (and: fill + download of the one
    element), one at a time.

Figures: p50 and p99 of the per-iteration time (us); bandwidth = bytes / p50 (GB/s, 1 GB =
1e9 B). The C++ numbers for the same rows: ferry-bench --target T --scenario transfers,latency
(bench/README.md). Runs against any daemon; on the host backend it only shows that it works.

  PYTHONPATH=build/client/python python3 bench/python_bench.py --target unix:/run/ferry/ferryd-0.sock
  ... --spawn-daemon build/server/ferryd [--backend host]   # start a ferryd of its own
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import ferry

MiB = 1 << 20


def percentiles(samples_ns):
    a = np.sort(np.asarray(samples_ns, dtype=np.float64))
    return float(np.percentile(a, 50)) / 1e3, float(np.percentile(a, 99)) / 1e3


def allocate_parts(s, nbytes):
    """Buffers covering nbytes: one, or slab-sized parts (halved while they do not fit)."""
    slab = s.slab_size
    part = slab if slab and nbytes > slab else nbytes
    while True:
        try:
            bufs = []
            done = 0
            while done < nbytes:
                bufs.append(s.pinned_buffer(min(part, nbytes - done)))
                done += bufs[-1].nbytes
            return bufs, part
        except ferry.QuotaExceeded:
            bufs = None
            if part <= MiB:
                raise
            part = (part // 2 + 255) & ~255


def pending_case(s, nbytes, upload, iterations):
    bufs, part = allocate_parts(s, nbytes)
    for b in bufs:  # touch once, untimed
        b.numpy()[:] = 0x5A
    tensors = [s.tensor(b.nbytes, "uint8") for b in bufs]
    s.synchronize()
    warmup = 1 if nbytes >= 64 * MiB else 2
    samples = []
    for i in range(warmup + iterations):
        t0 = time.perf_counter_ns()
        if upload:
            pending = [s.upload_pending(b, t) for b, t in zip(bufs, tensors)]
        else:
            pending = [s.download_pending(t, b) for b, t in zip(bufs, tensors)]
        for p in pending:
            p.wait()  # both come back into the same objects
        ns = time.perf_counter_ns() - t0
        if i >= warmup:
            samples.append(ns)
    for t in tensors:
        s.free(t)
    s.synchronize()
    return samples, len(bufs), part


def latency_case(s, download, iterations):
    t = s.tensor(1, "float32")
    out = np.empty(1, np.float32)
    s.synchronize()
    samples = []
    for i in range(10 + iterations):
        t0 = time.perf_counter_ns()
        s.fill(t, float(i))
        if download:
            s.download_into(t, out)
        else:
            s.synchronize()
        ns = time.perf_counter_ns() - t0
        if i >= 10:
            samples.append(ns)
    if download and out[0] != float(9 + iterations):
        raise SystemExit(f"wrong element read back: {out[0]}")
    return samples


def spawn_daemon(path, backend):
    d = tempfile.mkdtemp(prefix="ferry-pybench-")
    sock, ready = os.path.join(d, "ferryd.sock"), os.path.join(d, "ready")
    log = open(os.path.join(d, "ferryd.log"), "wb")
    proc = subprocess.Popen([path, "--backend", backend, "--listen", "unix:" + sock,
                             "--ready-file", ready, "--log-level", "warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(2000):
        if os.path.exists(ready) and os.path.getsize(ready) > 0:
            return proc, d, "unix:" + sock
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.kill()
    raise SystemExit(f"ferryd did not start; its log: {os.path.join(d, 'ferryd.log')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="unix:PATH or tcp:HOST:PORT of a running ferryd")
    ap.add_argument("--spawn-daemon", metavar="FERRYD", help="start this ferryd for the run")
    ap.add_argument("--backend", default="auto", help="backend of a spawned ferryd")
    ap.add_argument("--quick", action="store_true", help="few iterations (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON here")
    args = ap.parse_args()
    if bool(args.target) == bool(args.spawn_daemon):
        ap.error("give one of --target and --spawn-daemon")

    proc = tmp = None
    target = args.target
    if args.spawn_daemon:
        proc, tmp, target = spawn_daemon(args.spawn_daemon, args.backend)
    rows = []
    try:
        client = ferry.Client.connect(target, client_name="python_bench")
        with client.session() as s:
            print(f"ferry python_bench: target {target}, backend {s.backend}, "
                  f"slab size {s.slab_size // MiB} MiB, numpy {np.__version__}")
            print(f"{'case':44} {'p50 us':>10} {'p99 us':>10} {'GB/s':>8}  notes")

            def row(name, samples, nbytes=0, note=""):
                p50, p99 = percentiles(samples)
                gbs = nbytes / (p50 * 1e3) if nbytes else None
                rows.append({"case": name, "p50_us": p50, "p99_us": p99, "gb_per_s": gbs,
                             "samples": len(samples), "notes": note})
                print(f"{name:44} {p50:10.1f} {p99:10.1f} "
                      f"{'' if gbs is None else f'{gbs:8.2f}':>8}  {note}", flush=True)

            for nbytes in (8 * MiB, 256 * MiB):
                iterations = (3 if args.quick else 20) if nbytes > 64 * MiB else \
                    (5 if args.quick else 100)
                for upload in (True, False):
                    samples, parts, part = pending_case(s, nbytes, upload, iterations)
                    note = f"{parts} x {part // MiB} MiB parts" if parts > 1 else ""
                    row(f"pending {'upload' if upload else 'download'} {nbytes // MiB} MiB",
                        samples, nbytes, note)
            iterations = 200 if args.quick else 5000
            row("tiny op: fill 1 elt, synchronize()", latency_case(s, False, iterations))
            row("tiny op: fill 1 elt + 1-elt download", latency_case(s, True, iterations))
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(tmp, ignore_errors=True)
    print("C++ figures for the same rows: ferry-bench --target T --scenario transfers,latency")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": target, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
