"""`cmake --install` puts the package where Debian's python3 finds it, and it works from there."""

import os
import subprocess
import sys
import sysconfig

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "client", "python", "examples",
                       "quickstart.py")


def test_installed_package_runs_the_example(daemon, tmp_path):
    build, cmake = os.environ.get("FERRY_TEST_BUILD_DIR"), os.environ.get("FERRY_TEST_CMAKE")
    if not build or not cmake:
        pytest.skip("$FERRY_TEST_BUILD_DIR / $FERRY_TEST_CMAKE are not set; ctest sets them")
    prefix = tmp_path / "prefix"
    subprocess.run([cmake, "--install", build, "--component", "python", "--prefix", str(prefix)],
                   check=True, capture_output=True, timeout=120)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = prefix / "lib" / version / "dist-packages"
    assert (site / "ferry" / "__init__.py").is_file()
    for typed in ("py.typed", "_ferry.pyi", "_types.pyi"):  # editors and mypy see the API
        assert (site / "ferry" / typed).is_file(), typed
    if sys.prefix == "/usr":  # Debian's python3: the default prefix /usr/local is its platlib
        assert sysconfig.get_path("platlib") == f"/usr/local/lib/{version}/dist-packages"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    where = subprocess.run([sys.executable, "-c", "import ferry; print(ferry.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert where.stdout.strip() == str(site / "ferry" / "__init__.py"), where.stderr
    out = subprocess.run([sys.executable, EXAMPLE, daemon.target], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every element 4.5: True" in out.stdout
