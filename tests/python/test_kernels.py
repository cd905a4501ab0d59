"""Raw kernels, prepared graphs, write_bytes and SessionStats from Python.

Raw kernels need the CUDA backend: on the host backend the Python surface is checked (its
argument checks, and the typed error the daemon sends back), on CUDA the kernel runs.
"""

import dataclasses
import os

import numpy as np
import pytest

import ferry
from ferry import KernelArg, ModuleFormat

SCALE_ADD = r"""
extern "C" __global__ void scale_add(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def test_module_formats_mirror_the_cpp_enum():
    assert [(f.name, int(f)) for f in ModuleFormat] == [("PTX", 1), ("CUBIN", 2),
                                                        ("CUDA_SOURCE", 3)]


def test_kernel_args_are_typed_and_range_checked():
    cases = {
        "i32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1),
        "i64": (-2**63, 2**63 - 1), "u64": (0, 2**64 - 1),
    }
    for kind, (lo, hi) in cases.items():
        make = getattr(KernelArg, kind)
        for v in (lo, hi, np.int64(lo // 2) if lo else np.uint8(7)):
            a = make(v)
            assert a.kind == kind and a.value == int(v) and type(a.value) is int
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ferry.InvalidArgument, match="out of range"):
                make(bad)
        for not_int in (1.5, True, "3", None):
            with pytest.raises(ferry.InvalidArgument, match="takes an integer"):
                make(not_int)
    assert KernelArg.f32(0.5).kind == "f32" and KernelArg.f32(0.5).value == 0.5
    assert KernelArg.f64(np.float32(0.25)).value == 0.25
    assert KernelArg.f64(3).value == 3.0  # an int is a number
    assert KernelArg.f32(float("inf")).value == float("inf")  # infinities are floats
    with pytest.raises(ferry.InvalidArgument, match="float32's range"):
        KernelArg.f32(1e39)
    assert KernelArg.f64(1e39).value == 1e39
    for bad in ("1.0", None, True):
        with pytest.raises(ferry.InvalidArgument, match="takes a number"):
            KernelArg.f64(bad)
    with pytest.raises(ferry.InvalidArgument, match="ferry.Tensor"):
        KernelArg.tensor(5)
    assert repr(KernelArg.u32(7)) == "KernelArg.u32(7)"


def test_launch_checks_its_arguments_before_recording(session, client):
    t = session.tensor(16, "float32")
    m = session.load_module(ModuleFormat.CUDA_SOURCE, SCALE_ADD)
    recorded = session.recorded_ops
    good = dict(grid=1, block=(16, 1, 1), args=[t, KernelArg.tensor(t), KernelArg.f32(1.0),
                                                  KernelArg.i32(16)])
    bad = [
        (dict(grid=0), "grid dimension 0 is 0"),
        (dict(grid=(1, 2, 3, 4)), "grid needs 1 to 3 dimensions"),
        (dict(grid=()), "grid needs 1 to 3 dimensions"),
        (dict(grid=2**32), "each must be 1 to 4294967295"),
        (dict(grid=-1), "each must be 1 to 4294967295"),
        (dict(grid=1.5), "grid must be an int"),
        (dict(grid="1"), "grid must be an int"),
        (dict(block=(16, 0)), "block dimension 1 is 0"),
        (dict(block=(True,)), "block dimensions must be ints"),
        (dict(args=[t, 5]), r"kernel argument 1 \(int\)"),
        (dict(args=[1.0]), r"kernel argument 0 \(float\)"),
        (dict(args=5), "args must be a sequence"),
        (dict(args="abc"), "args must be a sequence"),
        (dict(args=[KernelArg.i32(0)] * 257), "257 kernel arguments; at most 256"),
        (dict(shared_bytes=-1), "shared_bytes"),
        (dict(shared_bytes=2**32), "shared_bytes"),
    ]
    for change, message in bad:
        with pytest.raises(ferry.InvalidArgument, match=message):
            session.launch(m, "scale_add", **{**good, **change})
    for name in ("", "k" * 1025):
        with pytest.raises(ferry.InvalidArgument, match="kernel name"):
            session.launch(m, name, **good)
    # Handles: checked against this session when recorded.
    gone = session.tensor(16, "float32")
    session.free(gone)
    with pytest.raises(ferry.InvalidHandle, match="freed"):
        session.launch(m, "scale_add", 1, 1, [gone])
    with client.session() as other:
        foreign_tensor = other.tensor(16, "float32")
        foreign_module = other.load_module(ModuleFormat.PTX, ".version 7.0\n.target sm_50\n")
        with pytest.raises(ferry.InvalidHandle, match="another session"):
            session.launch(m, "scale_add", 1, 1, [foreign_tensor])
        with pytest.raises(ferry.InvalidHandle, match="another session"):
            session.launch(foreign_module, "scale_add", 1, 1, [t])
        other.close()  # (refused: raw kernels are off on this daemon)
    assert session.recorded_ops == recorded + 2  # the create and the free above, nothing else
    session.launch(m, "scale_add", **good)  # well formed: one op
    assert session.recorded_ops == recorded + 3


def test_load_module_checks_its_arguments(session):
    recorded = session.recorded_ops
    for fmt in (0, 4, "PTX", 1.0, True):
        with pytest.raises(ferry.InvalidArgument, match="ModuleFormat"):
            session.load_module(fmt, SCALE_ADD)
    for image in ("", b""):
        with pytest.raises(ferry.InvalidArgument, match="empty module image"):
            session.load_module(ModuleFormat.PTX, image)
    with pytest.raises(ferry.InvalidArgument, match="str .* or bytes"):
        session.load_module(ModuleFormat.PTX, 42)
    assert session.recorded_ops == recorded
    m = session.load_module(2, b"\x7fELF not really")  # an int format, bytes image: recorded
    assert isinstance(m, ferry.Module) and m.handle > 0
    assert session.recorded_ops == recorded + 1


def test_raw_kernels_are_refused_without_permission(client):
    """The suite's default daemon does not list this uid in --raw-kernels."""
    s = client.open_session()
    kept = s.tensor(4, "float32")
    m = s.load_module(ModuleFormat.CUDA_SOURCE, SCALE_ADD)
    with pytest.raises(ferry.PermissionDenied, match="raw-kernels") as info:
        s.synchronize()
    assert info.value.code == ferry.Code.PERMISSION_DENIED
    # The refusal was whole: the tensor recorded in the same submit does not exist.
    with pytest.raises(ferry.InvalidHandle):
        s.download(kept)
    s.close()
    del m


def test_raw_kernel_from_cuda_source(start_daemon):
    d = start_daemon("--raw-kernels", f"uid:{os.getuid()}")  # off by default
    client = ferry.Client.connect(d.target)
    s = client.open_session()
    n = 10000
    x, y = s.tensor(n, "float32"), s.tensor(n, "float32")
    s.fill(x, 2.0)
    s.fill(y, 1.0)
    s.synchronize()
    m = s.load_module(ModuleFormat.CUDA_SOURCE, SCALE_ADD)
    s.launch(m, "scale_add", (n + 255) // 256, 256,
             [y, KernelArg.tensor(x), KernelArg.f32(3.0), KernelArg.i32(n)])
    if s.backend != "cuda":
        # The host backend has no device code: the whole submit comes back UNSUPPORTED,
        # naming the load (op 0), as the typed error.
        with pytest.raises(ferry.Unsupported) as info:
            s.synchronize()
        assert info.value.kind == ferry.ErrorKind.UNSUPPORTED and info.value.op_index == 0
        assert info.value.code == ferry.Code.UNIMPLEMENTED
        ptx = s.load_module(ModuleFormat.PTX, ".version 7.0\n.target sm_50\n")
        with pytest.raises(ferry.Unsupported):
            s.synchronize()
        # The session goes on.
        np.testing.assert_array_equal(s.download(y), np.full(n, 1.0, np.float32))
        s.close()
        del m, ptx  # after close: a module that was never loaded records no unload
        return
    np.testing.assert_array_equal(s.download(y), np.full(n, 7.0, np.float32))
    # The daemon checks the arguments against the kernel: a wrong count fails the submit.
    s.launch(m, "scale_add", 1, 1, [y])
    with pytest.raises(ferry.InvalidArgument):
        s.synchronize()
    # A compile error comes back with the compiler's log.
    broken = s.load_module(ModuleFormat.CUDA_SOURCE, "__global__ void k() { nope; }")
    with pytest.raises(ferry.CompileError, match="nope"):
        s.synchronize()
    # A graph replays a launch; the module may be dropped meanwhile (the graph keeps it).
    g = s.begin_graph()
    s.launch(m, "scale_add", (n + 255) // 256, 256,
             [y, x, KernelArg.f32(1.0), KernelArg.i32(n)])
    s.end_graph()
    s.synchronize()
    del m
    for _ in range(3):
        s.launch_graph(g)
    np.testing.assert_array_equal(s.download(y), np.full(n, 13.0, np.float32))
    stats = s.close()
    assert stats.graph_launches == 3 and stats.kernel_launches >= 2
    del broken, g


def test_graph_recorded_once_replays_with_one_op(session):
    x, y, total = (session.tensor(1000, "float64"), session.tensor(1000, "float64"),
                   session.tensor(1, "float64"))
    session.fill(x, 1.0)
    session.fill(y, 0.0)
    g = session.begin_graph()
    assert isinstance(g, ferry.Graph) and g.handle > 0
    session.axpy(2.0, x, y)  # y += 2
    session.sum(y, total)
    session.end_graph()
    session.synchronize()
    np.testing.assert_array_equal(session.download(y), np.zeros(1000))  # recording ran nothing
    for _ in range(3):
        session.launch_graph(g)
    np.testing.assert_array_equal(session.download(y), np.full(1000, 6.0))
    assert session.download(total)[0] == 6000.0
    stats = session.close()
    assert stats.graph_launches == 3


def test_graph_errors_are_typed(session, client):
    x = session.tensor(16, "float32")
    g = session.begin_graph()
    session.fill(x, 3.0)
    session.end_graph()
    session.synchronize()
    session.free(x)
    session.synchronize()
    session.launch_graph(g)  # replays a fill of a freed tensor
    with pytest.raises(ferry.InvalidHandle):
        session.synchronize()
    # Ops that are not device work cannot be recorded into a graph: refused whole.
    bad = session.begin_graph()
    inside = session.tensor(4, "float32")
    session.end_graph()
    with pytest.raises(ferry.InvalidArgument) as info:
        session.synchronize()
    assert info.value.op_index == 1
    with client.session() as other:
        foreign = other.begin_graph()
        other.fill(other.tensor(4, "float32"), 1.0)
        other.end_graph()
        with pytest.raises(ferry.InvalidHandle, match="another session"):
            session.launch_graph(foreign)
        other.close()
        del foreign
    session.close()
    del bad, inside


def test_a_dropped_graph_is_released(start_daemon):
    d = start_daemon("--session-max-graphs", "1")
    client = ferry.Client.connect(d.target)
    s = client.open_session()
    x = s.tensor(8, "float32")
    for value in range(3):  # each needs the last one released: at most one graph at a time
        g = s.begin_graph()
        s.fill(x, float(value))
        s.end_graph()
        s.launch_graph(g)
        np.testing.assert_array_equal(s.download(x), np.full(8, value, np.float32))
        del g  # records the release into the next submit
    g1 = s.begin_graph()
    s.fill(x, 1.0)
    s.end_graph()
    s.synchronize()
    g2 = s.begin_graph()  # two alive: over the limit
    s.fill(x, 2.0)
    s.end_graph()
    with pytest.raises(ferry.QuotaExceeded, match="graphs"):
        s.synchronize()
    s.close()
    del g1, g2


def test_write_bytes_records_a_write_at_an_offset(session):
    t = session.tensor(8, "float32")
    session.fill(t, 0.0)
    session.write_bytes(t, 8, np.array([1.5, 2.5], np.float32))  # elements 2 and 3
    session.write_bytes(t, 24, np.array([9.0, 0.0, 8.0], np.float32)[::2])  # strided: copied
    session.write_bytes(t, 0, b"\x00\x00\x80\x3f")  # 1.0, little-endian
    np.testing.assert_array_equal(session.download(t),
                                  np.array([1.0, 0, 1.5, 2.5, 0, 0, 9.0, 8.0], np.float32))
    session.write_bytes(t, 30, b"\x00" * 4)  # past the end
    with pytest.raises(ferry.OutOfRange):
        session.synchronize()


def test_session_stats_has_every_field_of_the_cpp_struct(client):
    names = [f.name for f in dataclasses.fields(ferry.SessionStats)]
    assert names == ferry._ferry._session_stats_fields()
    with client.session() as s:
        t = s.tensor(256, "float32")
        s.upload(t, np.ones(256, np.float32))
        g = s.begin_graph()
        s.scale(t, 2.0, t)
        s.end_graph()
        s.launch_graph(g)
        s.download(t)
        del g
    stats = s.stats
    for name in names:
        assert type(getattr(stats, name)) is int, name
    assert stats.tensors_created == 1 and stats.graph_launches == 1
    assert stats.bytes_uploaded == 1024 and stats.bytes_downloaded == 1024
    assert stats.h2d_bytes >= 1024 and stats.d2h_bytes >= 1024
    assert stats.peak_device_bytes >= 1024 and stats.submits >= 3
