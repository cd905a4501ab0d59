#!/usr/bin/env python3
"""Where a submit's time goes: reads the trace files of a client and of a ferryd built with
FERRY_TRACE_POINTS=ON (common/include/ferry/trace_points.h) and prints, per stage, the p50, p90
and mean over the submits that passed every point (bench/README.md, "Timelines").

  FERRY_TRACE_FILE=/tmp/t/trace ferry-bench --spawn-daemon ferryd --scenario transfers ...
  bench/trace_timeline.py /tmp/t/trace      # reads /tmp/t/trace.<pid> of both processes

Submit ids are per session: run one session's work (the transfers scenario opens one).
"""
import bisect
import collections
import glob
import statistics
import struct
import sys

POINTS = ["Issue", "Wait0", "Wait1", "Take", "Submit0", "Submit1", "Seq", "Watch", "Seen",
          "Complete0", "Complete1", "Post", "Run0", "Run1", "RunFail", "Step"]
P = {name: i + 1 for i, name in enumerate(POINTS)}  # as trace::Point numbers them
EVENT = struct.Struct("<QQQII")  # ns, a, b, tid, point: trace::Event


def load(path):
    data = open(path, "rb").read()
    return [EVENT.unpack_from(data, i) for i in range(0, len(data) - EVENT.size + 1, EVENT.size)]


def print_steps(events, who):
    """Per kStep number: the time from the previous point on the same thread."""
    last = {}  # tid -> (ns, label) of its previous point
    steps = collections.defaultdict(list)  # (previous label, step) -> ns
    for ns, a, b, tid, point in sorted(events):
        label = "step %d" % a if point == P["Step"] else POINTS[point - 1]
        if point == P["Step"] and tid in last:
            steps[(last[tid][1], label)].append(ns - last[tid][0])
        last[tid] = (ns, label)
    if not steps:
        return
    print("%s steps (us, from the previous point on the thread)    count       p50      mean" % who)
    for (before, label), v in sorted(steps.items(), key=lambda kv: (int(kv[0][1].split()[1]), -len(kv[1]))):
        if len(v) * 20 < max(len(x) for x in steps.values()):
            continue  # rare paths
        v.sort()
        print("  %-20s -> %-20s %12d %9.2f %9.2f" % (before, label, len(v), v[len(v) // 2] / 1000,
                                                      statistics.mean(v) / 1000))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    events = {path: load(path) for path in sorted(glob.glob(sys.argv[1] + ".*"))}
    daemons = [p for p, ev in events.items() if any(e[4] == P["Take"] for e in ev)]
    clients = [p for p, ev in events.items() if p not in daemons and
               any(e[4] == P["Issue"] for e in ev)]
    if not daemons or not clients:
        # No submit went through (an open/close run, say): only the steps can be told.
        for path, ev in events.items():
            print_steps(ev, path)
        if not any(e[4] == P["Step"] for ev in events.values() for e in ev):
            sys.exit("need the trace files of a client and of a ferryd (found: %s)" % list(events))
        return
    daemon, client = events[daemons[0]], events[clients[0]]
    by_id = collections.defaultdict(dict)  # submit id -> point -> (ns, b, tid)
    for ns, a, b, tid, point in client:
        if point in (P["Issue"], P["Wait1"]):
            by_id[a].setdefault(POINTS[point - 1], (ns, b, tid))
    for ns, a, b, tid, point in daemon:
        if point in (P["Take"], P["Submit0"], P["Submit1"], P["Seq"], P["Post"]):
            by_id[a].setdefault(POINTS[point - 1], (ns, b, tid))
    by_through = collections.defaultdict(dict)  # sequence number a completion covers -> ...
    for ns, a, b, tid, point in daemon:
        if point in (P["Watch"], P["Seen"], P["Complete0"], P["Complete1"]):
            by_through[a].setdefault(POINTS[point - 1], (ns, tid))
    throughs = sorted(t for t, m in by_through.items() if "Seen" in m and "Complete0" in m)
    poller = collections.Counter(e[3] for e in daemon if e[4] == P["Take"]).most_common(1)[0][0]
    watcher = collections.Counter(e[3] for e in daemon if e[4] == P["Seen"]).most_common(1)[0][0]

    stages = collections.defaultdict(list)
    handled_on = collections.Counter()
    needed = ("Issue", "Take", "Submit0", "Submit1", "Seq", "Post", "Wait1")
    for submit_id, m in by_id.items():
        if not all(k in m for k in needed):
            continue
        j = bisect.bisect_left(throughs, m["Seq"][1])  # the first completion that covers it
        if j == len(throughs):
            continue
        c = by_through[throughs[j]]
        watch = c["Watch"][0] if "Watch" in c else m["Submit1"][0]
        stages["1 issue -> taken by the ring poller"].append(m["Take"][0] - m["Issue"][0])
        stages["2 taken -> Session::Submit starts"].append(m["Submit0"][0] - m["Take"][0])
        stages["3 Session::Submit"].append(m["Submit1"][0] - m["Submit0"][0])
        stages["4 submitted -> completion asked for"].append(max(0, watch - m["Submit1"][0]))
        stages["5 asked -> seen done (device, watcher)"].append(c["Seen"][0] - watch)
        stages["6 seen -> handling starts"].append(c["Complete0"][0] - c["Seen"][0])
        stages["7 handling starts -> board post"].append(m["Post"][0] - c["Complete0"][0])
        stages["8 board post -> client's wait returns"].append(m["Wait1"][0] - m["Post"][0])
        stages["= issue -> wait returns"].append(m["Wait1"][0] - m["Issue"][0])
        tid = c["Complete0"][1]
        handled_on["ring poller" if tid == poller else "watcher" if tid == watcher else "other"] += 1

    def pct(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))] / 1000

    n = len(stages["= issue -> wait returns"])
    print_steps(daemon, "ferryd")
    print_steps(client, "client")
    if n == 0:
        print("no submit passed every point (one session's submits are needed)")
        return
    print("submits with every point: %d; completions handled on: %s" % (n, dict(handled_on)))
    print("%-42s %9s %9s %9s" % ("stage (us)", "p50", "p90", "mean"))
    for name in sorted(stages):
        v = stages[name]
        print("%-42s %9.2f %9.2f %9.2f" % (name, pct(v, .5), pct(v, .9), statistics.mean(v) / 1000))
    runs = sum(1 for e in daemon if e[4] == P["Run0"])
    fails = sum(1 for e in daemon if e[4] == P["RunFail"])
    taken = sum(1 for e in daemon if e[4] == P["Take"])
    print("ring poller: %d records taken in %d hand-overs; %d tries found the session's executor busy"
          % (taken, runs, fails))


if __name__ == "__main__":
    main()
