"""The README's Python example (client/python/examples/quickstart.py) runs against ferryd."""

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "client", "python", "examples",
                       "quickstart.py")


def test_quickstart_example_runs(daemon):
    out = subprocess.run([sys.executable, EXAMPLE, daemon.target], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"sum = {4.5 * (1 << 20):.1f}" in out.stdout, out.stdout
    assert "every element 4.5: True" in out.stdout, out.stdout
    assert "SessionStats(" in out.stdout


def test_readme_shows_the_example():
    """The README's Python block is the example's body, line for line (so it cannot rot)."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0].strip().splitlines()
    with open(EXAMPLE) as f:
        example = f.read().splitlines()
    start = example.index(block[0])
    assert example[start:start + len(block)] == block
