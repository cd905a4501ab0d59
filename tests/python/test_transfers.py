"""Pinned buffers, their zero-copy views, and pending transfers from Python."""

import gc

import numpy as np
import pytest

import ferry


def wait_ready(pending, limit=100000):
    """Poll is_ready() (which never blocks) a bounded number of times; return how many."""
    for polls in range(limit):
        if pending.is_ready():
            return polls
    return limit


def first_mismatch(got, want):
    bad = np.flatnonzero(got != want)
    return None if bad.size == 0 else (int(bad[0]), got[bad[0]], want[bad[0]])


def test_pending_upload_from_a_numpy_view(session):
    n = 1 << 16
    t = session.tensor(n, "float32")
    buf = session.pinned_buffer(t.nbytes)
    assert buf.is_shared and buf.nbytes == t.nbytes
    view = buf.numpy(np.float32, (n,))
    view[:] = np.arange(n, dtype=np.float32) * 0.5
    del view
    p = session.upload_pending(buf, t)
    assert not t.valid and not buf.valid  # lent until wait()
    wait_ready(p)
    t2, buf2 = p.wait()
    assert t2 is t and buf2 is buf and t.valid and buf.valid
    got = session.download(t)
    # Element by element: the first element that differs, if any.
    assert first_mismatch(got, np.arange(n, dtype=np.float32) * 0.5) is None


def test_pending_download_into_a_numpy_view(session):
    rows, cols = 64, 100
    src = np.arange(rows * cols, dtype=np.float64).reshape(rows, cols)
    t = session.tensor((rows, cols), "float64")
    session.upload(t, src)
    session.scale(t, 3.0, t)
    buf = session.pinned_buffer(t.nbytes + 4096)  # larger than the tensor: its start is used
    before = buf.address
    p = session.download_pending(t, buf)  # submits the recorded scale first
    t2, buf2 = p.wait()
    assert buf.address == before  # the slab range did not move
    view = buf.numpy(np.float64, (rows, cols))
    assert view.__array_interface__["data"][0] == before
    want = 3.0 * src
    for i in range(rows):
        for j in range(cols):
            assert view[i, j] == want[i, j], (i, j)


def test_views_are_the_slab_memory_without_a_copy(session):
    buf = session.pinned_buffer(1 << 20)
    as_numpy = buf.numpy()  # uint8, every byte
    as_dlpack = np.from_dlpack(buf)
    assert buf.__dlpack_device__() == (3, 0)  # kDLCUDAHost: memory the daemon registers
    assert as_numpy.shape == as_dlpack.shape == (1 << 20,)
    assert as_numpy.dtype == as_dlpack.dtype == np.uint8
    assert np.shares_memory(as_numpy, as_dlpack)
    assert as_numpy.__array_interface__["data"][0] == buf.address
    assert as_dlpack.__array_interface__["data"][0] == buf.address
    floats = buf.numpy("float32", (16, 4))
    assert floats.__array_interface__["data"][0] == buf.address
    floats[0, 0] = 1.0  # 0x3f800000, little-endian
    assert list(as_dlpack[:4]) == [0x00, 0x00, 0x80, 0x3F]
    mv = buf.memoryview()
    assert len(mv) == 1 << 20 and mv[3] == 0x3F
    assert buf.views == 4


def test_a_view_keeps_its_buffer_alive(session):
    buf = session.pinned_buffer(4096)
    view = buf.numpy(np.int32, (1024,))
    view[:] = np.arange(1024, dtype=np.int32)
    address = buf.address
    del buf
    gc.collect()
    # The range is still the view's: a new buffer does not get it (the slab is first fit).
    other = session.pinned_buffer(4096)
    assert other.address != address
    assert first_mismatch(view, np.arange(1024, dtype=np.int32)) is None
    del view
    gc.collect()
    again = session.pinned_buffer(4096)
    assert again.address == address  # the last view gone, the range is free again


def test_a_buffer_with_live_views_is_refused(session):
    t = session.tensor(256, "float32")
    buf = session.pinned_buffer(t.nbytes)
    makers = {
        "numpy": lambda: buf.numpy(np.float32),
        "slice of numpy": lambda: buf.numpy()[10:20],
        "memoryview": lambda: buf.memoryview(),
        "DLPack capsule": lambda: buf.__dlpack__(),
        "numpy.from_dlpack": lambda: np.from_dlpack(buf),
    }
    for name, make in makers.items():
        view = make()
        assert buf.views == 1, name
        with pytest.raises(ferry.Busy, match="live view"):
            session.upload_pending(buf, t)
        with pytest.raises(ferry.Busy):
            session.download_pending(t, buf)
        assert t.valid and buf.valid, name  # a refusal takes nothing
        del view
        gc.collect()
        assert buf.views == 0, name
    p = session.download_pending(t, buf)
    p.wait()


def test_a_dropped_pending_detaches(client, daemon):
    with client.session() as s:
        kept = s.tensor(1024, "float32")
        t = s.tensor(1 << 20, "float32")
        s.fill(t, 7.0)
        buf = s.pinned_buffer(t.nbytes)
        p = s.download_pending(t, buf)
        del p  # detach: the library keeps both until the copy is done
        assert not t.valid and not buf.valid
        with pytest.raises(ferry.InvalidHandle, match="dropped"):
            s.fill(t, 1.0)
        with pytest.raises(ferry.InvalidArgument, match="dropped"):
            buf.numpy()
        with pytest.raises(ferry.InvalidHandle):
            s.upload_pending(s.pinned_buffer(16), t)
        # The session goes on, and the detached tensor is released once its copy is done
        # (at a later call into the session).
        s.fill(kept, 2.0)
        st = None
        for _ in range(200):
            s.synchronize()
            st = daemon.status()
            if st["live_tensors"] == 1:
                break
        assert st["live_tensors"] == 1, st
        np.testing.assert_array_equal(s.download(kept), np.full(1024, 2.0, np.float32))


def test_a_refused_transfer_gives_both_values_back(session):
    t = session.tensor(1024, "float32")
    small = session.pinned_buffer(1024)  # a quarter of the tensor
    p = session.download_pending(t, small)
    with pytest.raises(ferry.OutOfRange):
        p.is_ready()
    with pytest.raises(ferry.OutOfRange) as info:
        p.wait()
    e = info.value
    assert e.tensor is t and e.buffer is small
    assert t.valid and small.valid
    assert e.kind == ferry.ErrorKind.OUT_OF_RANGE and e.code == ferry.Code.OUT_OF_RANGE
    # Both work again.
    session.fill(t, 1.0)
    big = session.pinned_buffer(t.nbytes)
    session.download_pending(t, big).wait()
    assert first_mismatch(big.numpy(np.float32, (1024,)), np.ones(1024, np.float32)) is None
    small.numpy()[:] = 1


def test_waiting_twice_is_an_error(session):
    t = session.tensor(4, "float32")
    buf = session.pinned_buffer(16)
    p = session.upload_pending(buf, t)
    p.wait()
    with pytest.raises(ferry.InvalidArgument, match="already waited"):
        p.wait()
    with pytest.raises(ferry.InvalidArgument):
        p.is_ready()


def test_lent_values_cannot_be_used_until_wait(session):
    t = session.tensor(1 << 18, "float32")
    buf = session.pinned_buffer(t.nbytes)
    p = session.upload_pending(buf, t)
    assert p.tensor is t and p.buffer is buf
    with pytest.raises(ferry.InvalidHandle, match="lent"):
        session.fill(t, 0.0)
    with pytest.raises(ferry.InvalidHandle, match="lent"):
        session.download(t)
    with pytest.raises(ferry.InvalidArgument, match="lent"):
        buf.numpy()
    with pytest.raises(ferry.InvalidArgument, match="lent"):
        np.from_dlpack(buf)
    other = session.tensor(4, "float32")
    with pytest.raises(ferry.InvalidArgument, match="lent"):
        session.upload_pending(buf, other)
    assert other.valid  # the refused call took nothing
    p.wait()
    session.fill(t, 0.0)
    session.synchronize()
