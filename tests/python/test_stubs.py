"""The type stubs (ferry/*.pyi, py.typed) describe the package as it is, and every public
name has a docstring: what editors and mypy see is what runs."""

import ast
import enum
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

import ferry

PACKAGE = os.path.dirname(ferry.__file__)


def stub_classes(name):
    """{class name: set of member names} of a stub file, and its module-level functions."""
    with open(os.path.join(PACKAGE, name)) as f:
        tree = ast.parse(f.read())
    classes, functions = {}, set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    members.update(t.id for t in item.targets if isinstance(t, ast.Name))
            classes[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            functions.add(node.name)
    return classes, functions


def public_members(cls):
    """The names a user calls on a class of the C++ module: its own public attributes and the
    protocol methods it defines (pybind11 adds some dunders to every class; not those)."""
    kept_dunders = {"__enter__", "__exit__", "__dlpack__", "__dlpack_device__"}
    names = set()
    for name, _ in vars(cls).items():
        if name in kept_dunders or not name.startswith("_"):
            names.add(name)
    return names


def test_the_package_ships_stubs_and_the_typed_marker():
    for name in ("py.typed", "_ferry.pyi", "_types.pyi"):
        assert os.path.isfile(os.path.join(PACKAGE, name)), name


def test_the_module_stub_lists_every_class_and_member():
    classes, functions = stub_classes("_ferry.pyi")
    runtime = {name: obj for name, obj in vars(ferry._ferry).items()
               if isinstance(obj, type) and not name.startswith("_")}
    assert set(runtime) == set(classes)
    for name, cls in runtime.items():
        assert public_members(cls) == classes[name], name
    runtime_functions = {name for name, obj in vars(ferry._ferry).items()
                         if callable(obj) and not isinstance(obj, type)
                         and not name.startswith("__")}
    assert runtime_functions == functions


def test_the_types_stub_spells_out_the_enums_the_build_made():
    classes, functions = stub_classes("_types.pyi")
    for enum_type in (ferry.Code, ferry.ErrorKind, ferry.ModuleFormat):
        assert {m.name for m in enum_type} == classes[enum_type.__name__], enum_type
    with open(os.path.join(PACKAGE, "_types.pyi")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:  # the values too
        if isinstance(node, ast.ClassDef) and node.name in ("Code", "ErrorKind", "ModuleFormat"):
            enum_type = getattr(ferry, node.name)
            for item in node.body:
                assert enum_type[item.targets[0].id] == item.value.value, item.targets[0].id
    for name in ferry.__all__:
        obj = getattr(ferry, name)
        if isinstance(obj, type) and issubclass(obj, ferry.Error):
            assert name in classes, name
    assert "error_class" in functions
    assert set(classes["SessionStats"]) >= set(ferry._ferry._session_stats_fields())


def docstring_text(obj):
    """A docstring without pybind11's signature lines ("name(self: ...) -> ...")."""
    doc = inspect.getdoc(obj) or ""
    lines = [line for line in doc.splitlines()
             if not (line.startswith(getattr(obj, "__name__", "\0") + "(") and ") ->" in line)]
    return "\n".join(lines).strip()


def test_every_public_name_has_a_docstring():
    assert docstring_text(ferry)
    missing = []
    for name in ferry.__all__:
        obj = getattr(ferry, name)
        if not docstring_text(obj):
            missing.append(name)
        if not isinstance(obj, type) or issubclass(obj, (ferry.Error, enum.Enum)):
            continue
        for member in public_members(obj) if obj.__module__ == "ferry._ferry" else ():
            attr = vars(obj)[member]
            target = attr.fget if isinstance(attr, property) else attr
            if not docstring_text(target) and not (isinstance(attr, property) and attr.__doc__):
                missing.append(f"{name}.{member}")
    assert not missing, missing


def test_mypy_sees_the_api(tmp_path):
    """mypy checks a program against the stubs: the right calls pass, wrong ones are named."""
    try:
        import mypy  # noqa: F401  (Debian: python3-mypy)
    except ImportError:
        pytest.skip("mypy is not installed for this python (python3-mypy)")
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent("""
        import numpy as np
        import ferry

        def run(target: str) -> int:
            client: ferry.Client = ferry.Client.connect(target, connect_timeout=1.0)
            with client.session() as s:
                t: ferry.Tensor = s.tensor((4, 4), np.float32)
                s.fill(t, 1.0)
                m: ferry.Module = s.load_module(ferry.ModuleFormat.PTX, ".version 7.0")
                s.launch(m, "k", (1, 1), 32, [t, ferry.KernelArg.i32(4)])
                g: ferry.Graph = s.begin_graph()
                s.scale(t, 2.0, t)
                s.end_graph()
                s.launch_graph(g)
                buf = s.pinned_buffer(t.nbytes)
                t, buf = s.download_pending(t, buf).wait()
                view = buf.numpy(np.float32, (4, 4))
                stats: ferry.SessionStats = s.close()
                kind: ferry.ErrorKind = ferry.ErrorKind.BUSY
                return stats.h2d_bytes + int(view.sum()) + int(kind)
    """))
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent("""
        import ferry

        def run(s: ferry.Session) -> None:
            s.fill("not a tensor", 1.0)
            s.launch_graph(s.load_module(ferry.ModuleFormat.PTX, "x"))
            n: str = s.recorded_ops
    """))
    env = dict(os.environ, MYPYPATH=os.path.dirname(PACKAGE))
    args = [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "c"),
            "--strict", "--ignore-missing-imports", "--python-version",
            f"{sys.version_info.major}.{sys.version_info.minor}"]
    ok = subprocess.run(args + [str(good)], capture_output=True, text=True, env=env,
                        cwd=tmp_path, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = subprocess.run(args + [str(bad)], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert wrong.stdout.count("error:") == 3, wrong.stdout
    assert 'Argument 1 to "fill" of "Session"' in wrong.stdout
    assert 'Argument 1 to "launch_graph" of "Session"' in wrong.stdout
