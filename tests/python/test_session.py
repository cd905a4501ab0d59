"""Sessions, ops and blocking transfers from Python, against a real ferryd."""

import dataclasses

import numpy as np
import pytest

import ferry


def test_scoped_session_closes_and_reports_its_counters(client, daemon):
    n = 1000
    with client.session() as s:
        assert not s.closed
        assert s.backend in ("host", "cuda")
        x = s.tensor((n,), "float32")
        y = s.tensor((n,), "float32")
        s.upload(x, np.full(n, 2.0, np.float32))
        s.scale(x, 3.0, y)
        np.testing.assert_array_equal(s.download(y), np.full(n, 6.0, np.float32))
    assert s.closed
    stats = s.stats
    assert isinstance(stats, ferry.SessionStats)
    assert stats.tensors_created == 2
    assert stats.bytes_uploaded == 4 * n
    assert stats.bytes_downloaded == 4 * n
    assert stats.ops >= 3  # two creates and the scale (and the transfers' own ops)
    assert stats.failed_submits == 0
    # The copies by direction, as ferry::SessionStats counts them (both backends count the
    # transfers' bytes; docs/operations.md, "Device time and usage").
    assert stats.h2d_bytes >= 4 * n and stats.d2h_bytes >= 4 * n
    # Closed means gone from the daemon too.
    st = daemon.wait_for(lambda st: st["sessions_open"] == 0 and st["live_tensors"] == 0)
    assert st["sessions_open"] == 0 and st["live_tensors"] == 0


def test_scoped_session_closes_when_the_block_raises(client, daemon):
    with pytest.raises(RuntimeError, match="the body failed"):
        with client.session() as s:
            s.tensor((16,), "float64")
            s.synchronize()
            raise RuntimeError("the body failed")
    assert s.closed
    assert s.stats is not None and s.stats.tensors_created == 1
    st = daemon.wait_for(lambda st: st["sessions_open"] == 0)
    assert st["sessions_open"] == 0


def test_close_returns_stats_as_a_dataclass(client):
    s = client.open_session()
    t = s.tensor(8, "float32")
    s.fill(t, 1.0)
    stats = s.close()
    assert dataclasses.is_dataclass(stats)
    assert stats is s.stats
    assert stats.submits >= 1 and stats.ops == 2 and stats.kernel_launches == 1
    assert set(dataclasses.asdict(stats)) >= {"submits", "ops", "bytes_uploaded",
                                              "peak_device_bytes", "kernel_batches"}


def test_tensor_describes_itself(session):
    t = session.tensor((3, 4), np.float64)
    assert t.shape == (3, 4)
    assert t.dtype == np.float64
    assert t.size == 12 and t.nbytes == 96
    assert t.handle > 0 and t.valid
    assert session.tensor(5, "uint8").shape == (5,)
    assert session.tensor((), "int32").size == 1  # rank 0: one element


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elementwise_ops_match_numpy(session, dtype):
    n = 257
    rng = np.random.default_rng(7)
    a_host = rng.uniform(1, 2, n).astype(dtype)
    b_host = rng.uniform(1, 2, n).astype(dtype)
    a, b = session.tensor(n, dtype), session.tensor(n, dtype)
    outs = {name: session.tensor(n, dtype) for name in
            ("add", "sub", "mul", "div", "copy", "scale", "axpy", "fill")}
    total = session.tensor(1, dtype)
    session.upload(a, a_host)
    session.upload(b, b_host)
    session.add(a, b, outs["add"])
    session.sub(a, b, outs["sub"])
    session.mul(a, b, outs["mul"])
    session.div(a, b, outs["div"])
    session.copy(a, outs["copy"])
    session.scale(a, 2.5, outs["scale"])
    session.copy(b, outs["axpy"])
    session.axpy(-0.5, a, outs["axpy"])
    session.fill(outs["fill"], 4.25)
    session.sum(a, total)
    expected = {
        "add": a_host + b_host, "sub": a_host - b_host, "mul": a_host * b_host,
        "div": a_host / b_host, "copy": a_host, "scale": dtype(2.5) * a_host,
        "axpy": b_host + dtype(-0.5) * a_host, "fill": np.full(n, 4.25, dtype),
    }
    for name, want in expected.items():
        got = session.download(outs[name])
        assert got.dtype == dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-14,
                                   err_msg=name)
    np.testing.assert_allclose(session.download(total)[0], a_host.sum(dtype=np.float64),
                               rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_matches_numpy_in_place_and_into_another_tensor(session, dtype):
    x_host = np.random.default_rng(11).uniform(-1, 1, (3, 67)).astype(dtype)
    x, out = session.tensor((3, 67), dtype), session.tensor((3, 67), dtype)
    session.upload(x, x_host)
    session.relu(x, out)
    want = np.maximum(x_host, dtype(0))
    np.testing.assert_array_equal(session.download(out), want)
    session.relu(x, x)  # in place
    np.testing.assert_array_equal(session.download(x), want)
    # An integer tensor, or an output of another dtype or shape, refuses the submit.
    for bad_x, bad_out, error in [(session.tensor(4, "int32"), None, ferry.DtypeMismatch),
                                  (x, session.tensor((3, 67), "uint8"), ferry.DtypeMismatch),
                                  (x, session.tensor((67, 3), dtype), ferry.ShapeMismatch)]:
        session.synchronize()
        session.relu(bad_x, bad_x if bad_out is None else bad_out)
        with pytest.raises(error) as info:
            session.synchronize()
        assert info.value.op_index == 0


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta",
                         [(False, False, 1.0, 0.0), (True, False, 2.0, 0.0),
                          (False, True, 1.0, 0.5), (True, True, -1.5, 2.0)])
def test_gemm_matches_numpy(session, trans_a, trans_b, alpha, beta):
    m, k, n = 5, 7, 3
    rng = np.random.default_rng(11)
    a_host = rng.standard_normal((k, m) if trans_a else (m, k))
    b_host = rng.standard_normal((n, k) if trans_b else (k, n))
    c_host = rng.standard_normal((m, n))
    a = session.tensor(a_host.shape, "float64")
    b = session.tensor(b_host.shape, "float64")
    c = session.tensor(c_host.shape, "float64")
    session.upload(a, a_host)
    session.upload(b, b_host)
    session.upload(c, c_host)
    session.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    op_a = a_host.T if trans_a else a_host
    op_b = b_host.T if trans_b else b_host
    np.testing.assert_allclose(session.download(c), alpha * op_a @ op_b + beta * c_host,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
def test_upload_download_round_trip_every_dtype(session, dtype):
    rng = np.random.default_rng(3)
    host = rng.integers(0, 200, size=(4, 33)).astype(dtype)
    t = session.tensor(host.shape, dtype)
    session.upload(t, host)
    got = session.download(t)
    assert got.shape == (4, 33) and got.dtype == dtype
    np.testing.assert_array_equal(got, host)
    out = np.zeros_like(host)
    session.download_into(t, out)
    np.testing.assert_array_equal(out, host)
    # A non-contiguous array uploads as its elements in row-major order.
    session.upload(t, np.asfortranarray(host))
    np.testing.assert_array_equal(session.download(t), host)


def test_work_is_recorded_until_submit(session):
    t = session.tensor(64, "float32")
    session.fill(t, 1.0)
    session.fill(t, 2.0)
    assert session.recorded_ops == 3
    session.submit()
    assert session.recorded_ops == 0
    session.synchronize()
    np.testing.assert_array_equal(session.download(t), np.full(64, 2.0, np.float32))


def test_a_large_upload_goes_through_the_staging_halves(session):
    # 24 MiB of f32: more than the 16 MiB staging buffer (two halves of 8 MiB, as the slab
    # holds it), so the transfer takes turns between them. Every byte goes through it, both
    # ways, as the client counts (none inline), and the daemon moved as many.
    assert session.slab_size >= 16 << 20, session.slab_size
    n = 6 << 20
    host = np.arange(n, dtype=np.float32)
    t = session.tensor(n, "float32")
    session.upload(t, host)
    np.testing.assert_array_equal(session.download(t), host)
    stats = session.close()
    assert stats.staged_upload_bytes == host.nbytes, stats
    assert stats.staged_download_bytes == host.nbytes, stats
    assert stats.bytes_uploaded == host.nbytes and stats.bytes_downloaded == host.nbytes, stats


def test_freed_tensor_leaves_the_daemon(client, daemon):
    with client.session() as s:
        keep = s.tensor(16, "float32")
        gone = s.tensor(16, "float32")
        s.synchronize()
        s.free(gone)
        assert not gone.valid
        s.synchronize()
        st = daemon.wait_for(lambda st: st["live_tensors"] == 1)
        assert st["live_tensors"] == 1
        del keep
        s.synchronize()  # dropping the Python object records the release
        st = daemon.wait_for(lambda st: st["live_tensors"] == 0)
        assert st["live_tensors"] == 0
