#!/usr/bin/env python3
"""What ferry costs from Python: the figures of ferry-bench's "transfers" (pending route) and
"latency" scenarios, measured through the Python client, to set beside ferry-bench's C++ ones.

  pending 8 MiB / 256 MiB upload and download: PinnedBuffers allocated once and reused as
    the contract intends: each iteration upload_pending(buf, tensor) -> wait() -> both back.
    A size above one slab goes as slab-sized parts (a buffer and a tensor each) issued back
    to back and waited together, as ferry-bench does; the time covers all parts.
  tiny op: fill a 1-element f32 tensor, then synchronize() (and: fill + download of the one
    element), one at a time.

  sharing (--sharing N): N Python processes at once, each with a session of its own, doing
    ferry-bench's "sharing" pinned round R times: 64 x axpy(256) in one submit, then one
    1 MiB PinnedBuffer through upload_pending + wait() and download_pending + wait().
    ops/s = all processes' axpys / the slowest process's time; max/min = slowest / fastest.
    The C++ figures to set beside it, and the MPS arm (C++ processes as clients of one MPS
    daemon doing the same round): ferry-bench --scenario sharing --baseline --baseline-mps.

Figures: p50 and p99 of the per-iteration time (us); bandwidth = bytes / p50 (GB/s, 1 GB =
1e9 B). The C++ numbers for the same rows: ferry-bench --target T --scenario transfers,latency
(bench/README.md). Runs against any daemon; on the host backend it only shows that it works.

  PYTHONPATH=build/client/python python3 bench/python_bench.py --target unix:/run/ferry/ferryd-0.sock
  ... --spawn-daemon build/server/ferryd [--backend host]   # start a ferryd of its own
  ... --sharing 1 --sharing 8                                  # and the sharing case
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


SHARING_OPS = 64  # axpys per round, as ferry-bench's sharing scenario


def sharing_worker(target, rounds):
    """One process of the sharing case: set up, print "ready", wait for a line on stdin,
    run the rounds, print "result OPS ELAPSED_NS"."""
    client = ferry.Client.connect(target, client_name="python_bench sharing")
    with client.session() as s:
        t = s.tensor(MiB, "uint8")
        x = s.tensor(256, "float32")
        y = s.tensor(256, "float32")
        s.fill(x, 1.0)
        s.fill(y, 0.0)
        buf = s.pinned_buffer(MiB)
        buf.numpy()[:] = 0x5A  # touch once, untimed

        def one_round():
            for _ in range(SHARING_OPS):
                s.axpy(1e-6, x, y)
            s.submit()
            s.upload_pending(buf, t).wait()
            s.download_pending(t, buf).wait()

        one_round()  # warm-up, untimed: the session's first transfer maps its slab
        s.synchronize()
        print("ready", flush=True)
        sys.stdin.readline()
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            one_round()
        s.synchronize()
        elapsed = time.perf_counter_ns() - t0
    print(f"result {rounds * SHARING_OPS} {elapsed}", flush=True)
    return 0


def sharing_case(target, processes, rounds):
    """Start the processes, release them together; (ops/s, max/min of their times)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker-sharing", target,
           "--rounds", str(rounds)]
    workers = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(processes)]
    try:
        for w in workers:
            if w.stdout.readline().strip() != "ready":
                raise SystemExit("a sharing worker failed to set up")
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        ops, times = 0, []
        for w in workers:
            line = w.stdout.readline().split()
            if w.wait(600) != 0 or len(line) != 3 or line[0] != "result":
                raise SystemExit("a sharing worker failed")
            ops += int(line[1])
            times.append(int(line[2]))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    return ops / (max(times) / 1e9), max(times) / min(times)


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
    ap.add_argument("--sharing", metavar="N", type=int, action="append", default=[],
                    help="also run the sharing case with N processes (repeatable)")
    ap.add_argument("--rounds", type=int, default=100, help="rounds of a sharing process")
    ap.add_argument("--worker-sharing", metavar="TARGET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_sharing:
        return sharing_worker(args.worker_sharing, args.rounds)
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
        for n in args.sharing:
            rounds = args.rounds
            ops_per_s, spread = sharing_case(target, n, rounds)
            rows.append({"case": f"sharing, {n} processes, pinned", "ops_per_s": ops_per_s,
                         "max_min": spread, "rounds": rounds})
            print(f"sharing, {n} processes, pinned: {ops_per_s:,.0f} ops/s, max/min "
                  f"{spread:.3f} ({rounds} rounds each)", flush=True)
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
