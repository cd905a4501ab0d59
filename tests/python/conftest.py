"""Fixtures for the Python client's tests: real ferryd processes on unix sockets in temp dirs.

The daemon is $FERRY_TEST_FERRYD (ctest sets it to the build's ferryd), run with the backend
$FERRY_TEST_BACKEND (default host) and the flags the C++ integration tests pass
(tests/integration/ferryd_process.h). $FERRY_TEST_FERRYCTL, when set, reads the daemon's
Admin status (`ferryctl status --json`) for tests that check what the daemon still holds.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy
import pytest

import ferry


def pytest_terminal_summary(terminalreporter):
    """Say which interpreter and numpy ran the suite (the module must behave alike under
    all), also under -q, which drops the header."""
    terminalreporter.write_line(f"ferry: python {sys.version.split()[0]}, numpy "
                                f"{numpy.__version__}, module {ferry._ferry.__file__}")


def _required_program(env_name):
    path = os.environ.get(env_name, "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"${env_name} does not name a program ({path!r}); ctest sets it")
    return path


class Daemon:
    """A ferryd child process; stop() (SIGTERM, then SIGKILL after 30 s) ends it."""

    def __init__(self, *extra_args):
        ferryd = _required_program("FERRY_TEST_FERRYD")
        self.dir = tempfile.mkdtemp(prefix="ferry-pytest-")
        self.socket = os.path.join(self.dir, "ferryd.sock")
        self.target = "unix:" + self.socket
        ready = os.path.join(self.dir, "ready")
        backend = os.environ.get("FERRY_TEST_BACKEND") or "host"
        args = [ferryd, "--backend", backend, "--listen", self.target, "--ready-file", ready,
                "--log-level", "info", *extra_args]
        self.log_path = os.path.join(self.dir, "ferryd.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if os.path.exists(ready) and os.path.getsize(ready) > 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        log = self.log()
        self.stop()
        raise RuntimeError(f"ferryd did not start: {args}\n{log}")

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def status(self):
        """The daemon's Admin status, as `ferryctl status --json` prints it."""
        ferryctl = _required_program("FERRY_TEST_FERRYCTL")
        out = subprocess.run([ferryctl, "--target", self.target, "status", "--json"],
                             capture_output=True, text=True, timeout=30, check=True)
        return json.loads(out.stdout)

    def wait_for(self, predicate, timeout=20):
        """Poll status() until predicate(status) holds; return the last status seen."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            if predicate(s) or time.monotonic() > deadline:
                return s
            time.sleep(0.02)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return ferry.Client.connect(daemon.target)


@pytest.fixture
def session(client):
    s = client.open_session()
    yield s
    if not s.closed:
        try:
            s.close()
        except ferry.Error:
            pass


@pytest.fixture
def start_daemon():
    """Start daemons with extra flags; each is stopped after the test."""
    started = []

    def start(*args):
        d = Daemon(*args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
