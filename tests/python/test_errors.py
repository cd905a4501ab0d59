"""Every ferry::Status reaches Python as the exception class of its ErrorKind."""

import os

import numpy as np
import pytest

import ferry
from ferry import _ferry


def camel(name):
    return "".join(part.capitalize() for part in name.split("_"))


def test_every_error_kind_has_its_class():
    kinds = [k for k in ferry.ErrorKind if k != ferry.ErrorKind.NONE]
    # The enum comes from the C++ build: all of status.h's kinds, none missing.
    assert [int(k) for k in ferry.ErrorKind] == list(range(len(kinds) + 1))
    for kind in kinds:
        cls = ferry.error_class(kind)
        assert cls is not ferry.Error, f"no class for {kind.name}"
        assert cls.__name__ == camel(kind.name)
        assert getattr(ferry, cls.__name__) is cls  # exported
        assert issubclass(cls, ferry.Error) and issubclass(cls, Exception)
        # The way every failing call raises: a Status of that kind from C++.
        with pytest.raises(cls) as info:
            _ferry._raise_status_for_test(int(kind), "what went wrong", 3)
        e = info.value
        assert type(e) is cls
        assert e.kind == kind and e.message == "what went wrong" and e.op_index == 3
        assert e.code == ferry.Code(_ferry._canonical_code(int(kind)))
        assert e.tensor is None and e.buffer is None
        assert str(e) == f"{kind.name} ({e.code.name}): what went wrong [op 3]"
    assert len({ferry.error_class(k) for k in kinds}) == len(kinds)


def test_unavailable_when_no_daemon_answers(tmp_path):
    with pytest.raises(ferry.Unavailable) as info:
        ferry.Client.connect("unix:" + str(tmp_path / "nobody.sock"), connect_timeout=0.3)
    assert info.value.code == ferry.Code.UNAVAILABLE


def test_daemon_errors_name_the_failing_op(session):
    a = session.tensor(4, "float32")
    b = session.tensor(4, "float64")
    c = session.tensor(5, "float32")
    session.synchronize()
    session.fill(a, 1.0)
    session.add(a, b, a)
    with pytest.raises(ferry.DtypeMismatch) as info:
        session.synchronize()
    assert info.value.op_index == 1  # the add, after the fill
    assert info.value.code == ferry.Code.INVALID_ARGUMENT
    session.add(a, c, a)
    with pytest.raises(ferry.ShapeMismatch) as info:
        session.synchronize()
    assert info.value.op_index == 0
    # Integer tensors are not arithmetic operands.
    i = session.tensor(4, "int32")
    session.synchronize()
    session.add(i, i, i)
    with pytest.raises(ferry.DtypeMismatch):
        session.synchronize()
    # The session goes on after a failed submit.
    session.fill(a, 3.0)
    np.testing.assert_array_equal(session.download(a), np.full(4, 3.0, np.float32))


def test_quota_exceeded(client):
    s = client.open_session(device_bytes_quota=1 << 20)
    assert s.device_bytes_quota == 1 << 20
    big = s.tensor(1 << 19, "float32")  # 2 MiB
    with pytest.raises(ferry.QuotaExceeded) as info:
        s.synchronize()
    assert info.value.code == ferry.Code.RESOURCE_EXHAUSTED and info.value.op_index == 0
    with pytest.raises(ferry.QuotaExceeded, match="slab"):
        s.pinned_buffer(s.slab_size + 1)
    s.close()
    del big


def test_input_checked_before_anything_is_sent(session):
    t = session.tensor((4, 8), "float32")
    with pytest.raises(ferry.InvalidArgument, match="complex64"):
        session.tensor(4, "complex64")
    with pytest.raises(ferry.ShapeMismatch):
        session.tensor((2, -1), "float32")
    with pytest.raises(ferry.DtypeMismatch):
        session.upload(t, np.zeros((4, 8), np.float64))
    with pytest.raises(ferry.ShapeMismatch):
        session.upload(t, np.zeros((4, 9), np.float32))
    with pytest.raises(ferry.DtypeMismatch):
        session.download_into(t, np.zeros(32, np.int32))
    with pytest.raises(ferry.ShapeMismatch):
        session.download_into(t, np.zeros(31, np.float32))
    with pytest.raises(ferry.InvalidArgument, match="C-contiguous"):
        session.download_into(t, np.zeros((8, 4), np.float32).T)
    buf = session.pinned_buffer(64)
    with pytest.raises(ferry.OutOfRange):
        buf.numpy(np.float64, (9,))  # 72 bytes
    assert buf.numpy(np.float64).shape == (8,)
    with pytest.raises(ferry.InvalidArgument):
        buf.numpy(object)  # no Python objects over raw bytes
    small = session.tensor(np.int64(3))  # numpy integers are sizes too
    assert small.shape == (3,)
    with pytest.raises(ferry.InvalidArgument):
        session.tensor(4, "uint16")  # a numpy dtype that is not a ferry element type
    assert session.recorded_ops == 2  # the creates: nothing refused above was recorded


def test_a_freed_or_foreign_tensor_is_an_invalid_handle(client, session):
    t = session.tensor(4, "float32")
    session.free(t)
    with pytest.raises(ferry.InvalidHandle, match="freed"):
        session.fill(t, 1.0)
    with pytest.raises(ferry.InvalidHandle):
        session.free(t)
    with client.session() as other:
        foreign = other.tensor(4, "float32")
        with pytest.raises(ferry.InvalidHandle, match="another session"):
            session.fill(foreign, 1.0)
        with pytest.raises(ferry.InvalidArgument, match="another session"):
            session.upload_pending(other.pinned_buffer(16), session.tensor(4, "float32"))
        del foreign


def test_a_closed_session_raises_session_closed(client):
    s = client.open_session()
    t = s.tensor(4, "float32")
    buf = s.pinned_buffer(16)
    s.close()
    for call in (lambda: s.fill(t, 1.0), lambda: s.tensor(4, "float32"), s.submit,
                 s.synchronize, s.close, lambda: s.upload(t, np.zeros(4, np.float32)),
                 lambda: s.download(t), lambda: s.pinned_buffer(16),
                 lambda: s.upload_pending(buf, t)):
        with pytest.raises(ferry.SessionClosed):
            call()
    # The buffer's memory stays valid past the session's end.
    buf.numpy()[:] = 5
    assert int(buf.numpy().sum()) == 80


def test_device_fault_and_reset(start_daemon):
    if os.environ.get("FERRY_TEST_BACKEND", "host") != "host":
        pytest.skip("the fault is injected on the host backend only")
    # The host backend faults on the 200th op it runs (a test-only flag, as in
    # tests/integration/device_test.cc).
    d = start_daemon("--host-fault-after-ops-for-test", "200")
    client = ferry.Client.connect(d.target)
    victim = client.open_session()
    kept = victim.tensor(1 << 10, "float64")
    victim.fill(kept, 1.0)
    victim.synchronize()

    culprit = client.open_session()
    t = culprit.tensor(64, "float64")
    for i in range(400):
        culprit.fill(t, i)
    with pytest.raises(ferry.DeviceFault) as info:
        culprit.synchronize()
    assert info.value.kind == ferry.ErrorKind.DEVICE_FAULT
    # A pending transfer on the failed session fails the same way, giving its values back.
    buf = culprit.pinned_buffer(t.nbytes)
    p = culprit.download_pending(t, buf)
    with pytest.raises(ferry.DeviceFault) as info:
        p.wait()
    assert info.value.tensor is t and info.value.buffer is buf
    assert t.valid and buf.valid

    victim.fill(kept, 2.0)
    with pytest.raises(ferry.DeviceReset):
        victim.synchronize()
    culprit.close()
    victim.close()
