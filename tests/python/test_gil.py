"""Calls release the GIL before they wait: other Python threads run while one waits on the
daemon, or on a session that another thread's blocking call holds."""

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest


def all_threads_stopped(pid):
    """True once every thread of `pid` is in the stopped state. SIGSTOP stops a process's
    threads one by one, after kill() has returned: until then the daemon may still answer."""
    task = f"/proc/{pid}/task"
    for tid in os.listdir(task):
        try:
            with open(f"{task}/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:  # a thread that ended
            continue
        if state != "T":
            return False
    return True


def stop_daemon(daemon):
    """SIGSTOP the daemon and wait until every thread of it is stopped."""
    daemon.proc.send_signal(signal.SIGSTOP)
    for _ in range(10000):
        if all_threads_stopped(daemon.proc.pid):
            break
        time.sleep(0.001)
    assert all_threads_stopped(daemon.proc.pid)


def runs_while_blocked(daemon, call):
    """Stop the daemon, run call() on a thread (it blocks on the daemon's answer), and report
    whether this thread ran Python code while that call was still inside. A safety net
    resumes the daemon after 10 s, so a call that held the GIL ends too (and fails here)."""
    pid = daemon.proc.pid
    net = subprocess.Popen(["sh", "-c", f"sleep 10; kill -CONT {pid}"])
    entering = threading.Event()
    done = threading.Event()
    errors = []

    def body():
        entering.set()
        try:
            call()
        except Exception as e:  # reported below
            errors.append(e)
        done.set()

    try:
        stop_daemon(daemon)
        t = threading.Thread(target=body)
        t.start()
        assert entering.wait(30)
        time.sleep(0.3)  # let it get into the C++ call; not a timing assertion
        ran_while_inside = not done.is_set()
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
        net.kill()
        net.wait()
    t.join(60)
    assert not t.is_alive()
    assert not errors, errors
    return ran_while_inside


def test_synchronize_and_wait_release_the_gil(start_daemon):
    d = start_daemon()
    import ferry

    client = ferry.Client.connect(d.target)
    with client.session() as s:
        t = s.tensor(1 << 16, "float32")
        s.synchronize()
        s.fill(t, 1.0)
        assert runs_while_blocked(d, s.synchronize)

        buf = s.pinned_buffer(t.nbytes)
        s.fill(t, 2.0)
        s.synchronize()
        # Issued while the daemon is stopped: the thread blocks in wait().
        assert runs_while_blocked(d, lambda: s.download_pending(t, buf).wait())
        assert (buf.numpy(np.float32) == 2.0).all()

        s.fill(t, 3.0)
        host = np.empty(1 << 16, np.float32)
        assert runs_while_blocked(d, lambda: s.download_into(t, host))
        assert (host == 3.0).all()


def test_a_second_thread_cannot_wait_for_the_same_transfer(start_daemon):
    import ferry

    d = start_daemon()
    client = ferry.Client.connect(d.target)
    s = client.open_session()
    t = s.tensor(1024, "float32")
    buf = s.pinned_buffer(t.nbytes)
    s.synchronize()
    pid = d.proc.pid
    net = subprocess.Popen(["sh", "-c", f"sleep 10; kill -CONT {pid}"])
    results = []
    try:
        stop_daemon(d)
        p = s.download_pending(t, buf)
        waiter = threading.Thread(target=lambda: results.append(p.wait()))
        waiter.start()
        refused = None
        for _ in range(3000):  # until the waiter is inside wait(); is_ready() never blocks
            try:
                p.is_ready()
            except ferry.InvalidArgument as e:
                refused = e
                break
            time.sleep(0.01)
        assert refused is not None and "another thread" in str(refused)
        with pytest.raises(ferry.InvalidArgument, match="another thread"):
            p.wait()
    finally:
        d.proc.send_signal(signal.SIGCONT)
        net.kill()
        net.wait()
    waiter.join(60)
    assert results and results[0][0] is t and results[0][1] is buf
    s.close()


def test_a_recording_call_waiting_for_the_session_lets_other_threads_run(start_daemon):
    """Regression: a call that only records (fill) took the session's lock with the GIL held,
    so while another thread's synchronize() held that lock waiting on a slow daemon, every
    Python thread stopped for as long. The recording thread still waits for the
    session (a ferry::Session has one owner), but with the GIL released."""
    import ferry

    d = start_daemon()
    client = ferry.Client.connect(d.target)
    s = client.open_session()
    t = s.tensor(1 << 16, "float32")
    s.synchronize()
    s.fill(t, 1.0)  # recorded: synchronize() below submits it and waits for the daemon
    pid = d.proc.pid
    # The safety net resumes the daemon after 15 s, so that a thread that holds the GIL
    # ends too (and the test fails on the timing below, instead of hanging).
    net = subprocess.Popen(["sh", "-c", f"sleep 15; kill -CONT {pid}"])
    done = {"synchronize": threading.Event(), "fill": threading.Event()}
    errors = []

    def run(name, call):
        try:
            call()
        except Exception as e:  # reported below
            errors.append((name, e))
        done[name].set()

    syncer = threading.Thread(target=run, args=("synchronize", s.synchronize))
    recorder = threading.Thread(target=run, args=("fill", lambda: s.fill(t, 2.0)))
    try:
        stop_daemon(d)
        syncer.start()
        time.sleep(0.3)  # into synchronize(), waiting on the stopped daemon; not a timing assertion
        # This thread runs Python while both wait: a sleep that lets fill() get into its
        # wait for the session, then 20 short ones, each needing the GIL back.
        started = time.monotonic()
        recorder.start()
        time.sleep(0.3)
        for _ in range(20):
            time.sleep(0.01)
        ran_for = time.monotonic() - started
        synchronize_was_waiting = not done["synchronize"].is_set()
        fill_was_waiting = not done["fill"].is_set()
    finally:
        d.proc.send_signal(signal.SIGCONT)
        net.kill()
        net.wait()
    syncer.join(60)
    recorder.join(60)
    assert not syncer.is_alive() and not recorder.is_alive()
    assert not errors, errors
    assert ran_for < 5, f"the interpreter stopped for {ran_for:.1f} s behind a recording call"
    assert synchronize_was_waiting, "synchronize() returned while the daemon was stopped"
    # What the test is about: the fill was inside the module, waiting for the session.
    assert fill_was_waiting, "fill() returned before synchronize(): nothing waited"
    # The fill recorded behind synchronize() is in the next submit.
    np.testing.assert_array_equal(s.download(t), np.full(1 << 16, 2.0, np.float32))
    s.close()
