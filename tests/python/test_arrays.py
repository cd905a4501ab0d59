"""Arrays in and out, checked item by item under whichever numpy is installed (1.x or 2.x).

The module reads arrays through the buffer protocol and makes arrays with numpy's Python
API, never through numpy's C structs (whose layout changed in numpy 2), so every dtype's
itemsize, every shape and every stride must come out the same under both. Inputs that are
not C-contiguous (Fortran order, steps, negative strides, broadcasts) are copied in
row-major order by upload(); download_into() refuses an output it cannot write in place.
"""

import array

import numpy as np
import pytest

import ferry

# Every ferry element type: numpy type, itemsize, and the format numpy's buffer gives.
DTYPES = [
    pytest.param(np.float32, 4, "f", id="float32"),
    pytest.param(np.float64, 8, "d", id="float64"),
    pytest.param(np.int32, 4, "i", id="int32"),
    pytest.param(np.uint8, 1, "B", id="uint8"),
]


def c_strides(shape, itemsize):
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def values(shape, dtype):
    """Distinct values that fit every dtype (uint8 too): 0, 1, 2, ... modulo 251."""
    n = int(np.prod(shape))
    return (np.arange(n) % 251).astype(dtype).reshape(shape)


@pytest.mark.parametrize("dtype,itemsize,fmt", DTYPES)
def test_tensor_dtype_and_download_layout(session, dtype, itemsize, fmt):
    shape = (3, 5, 7)
    t = session.tensor(shape, dtype)
    assert isinstance(t.dtype, np.dtype)
    assert t.dtype == np.dtype(dtype) and t.dtype.itemsize == itemsize
    assert t.size == 105 and t.nbytes == 105 * itemsize
    host = values(shape, dtype)
    session.upload(t, host)
    got = session.download(t)
    assert type(got) is np.ndarray
    assert got.dtype == np.dtype(dtype) and got.itemsize == itemsize
    assert got.shape == shape
    assert got.strides == c_strides(shape, itemsize) == (35 * itemsize, 7 * itemsize, itemsize)
    assert got.flags.c_contiguous and got.flags.writeable and got.flags.owndata
    assert memoryview(got).format == fmt
    np.testing.assert_array_equal(got, host)
    # Rank 0: one element, no strides.
    scalar = session.tensor((), dtype)
    session.upload(scalar, np.array(7, dtype))
    got0 = session.download(scalar)
    assert got0.shape == () and got0.strides == () and got0.dtype == np.dtype(dtype)
    assert got0[()] == 7


@pytest.mark.parametrize("dtype,itemsize,fmt", DTYPES)
def test_buffer_views_have_the_dtype_shape_and_strides_asked_for(session, dtype, itemsize, fmt):
    buf = session.pinned_buffer(4096)
    whole = buf.numpy()
    assert whole.dtype == np.uint8 and whole.shape == (4096,) and whole.strides == (1,)
    view = buf.numpy(dtype, (8, 16))
    assert view.dtype == np.dtype(dtype) and view.itemsize == itemsize
    assert view.shape == (8, 16) and view.strides == (16 * itemsize, itemsize)
    assert view.flags.c_contiguous and view.flags.writeable and not view.flags.owndata
    assert view.__array_interface__["data"][0] == buf.address
    assert np.shares_memory(view, whole)
    flat = buf.numpy(dtype)  # as many as fit, 1-D
    assert flat.shape == (4096 // itemsize,) and flat.strides == (itemsize,)
    # A write through one view is the bytes the others see: no copy anywhere.
    view[1, 2] = 9
    offset = (16 + 2) * itemsize
    assert whole[offset:offset + itemsize].view(dtype)[0] == 9
    assert flat[16 + 2] == 9
    mv = buf.memoryview()
    assert mv.format == "B" and mv.itemsize == 1 and mv.strides == (1,) and not mv.readonly
    dl = np.from_dlpack(buf)
    assert dl.dtype == np.uint8 and dl.shape == (4096,) and dl.strides == (1,)
    assert np.shares_memory(dl, view)
    assert buf.views == 5  # whole, view, flat, mv, dl: each holds the buffer
    # The memory the views share is what a transfer moves.
    t = session.tensor((8, 16), dtype)
    session.fill(t, 3)
    del whole, view, flat, mv, dl
    t, buf = session.download_pending(t, buf).wait()
    np.testing.assert_array_equal(buf.numpy(dtype, (8, 16)), np.full((8, 16), 3, dtype))


def non_contiguous_inputs(dtype):
    """Inputs of 48 elements that are not C-contiguous, and how they were made."""
    base = values((6, 8), dtype)
    long = values((96,), dtype)
    return {
        "Fortran order": np.asfortranarray(base),
        "transposed": base.T,
        "negative row stride": base[::-1],
        "negative strides both": base[::-1, ::-1],
        "step 2": long[::2],
        "step -2": long[::-2],
        "column slice": values((6, 16), dtype)[:, 3:11],
        "broadcast (stride 0)": np.broadcast_to(values((8,), dtype), (6, 8)),
    }


@pytest.mark.parametrize("dtype,itemsize,fmt", DTYPES)
def test_upload_copies_non_contiguous_inputs_in_row_major_order(session, dtype, itemsize, fmt):
    t = session.tensor((6, 8), dtype)
    for name, arr in non_contiguous_inputs(dtype).items():
        assert not arr.flags.c_contiguous, name
        assert arr.itemsize == itemsize, name
        before = arr.copy()
        session.upload(t, arr)
        got = session.download(t)
        np.testing.assert_array_equal(got.ravel(), np.ravel(arr, order="C"), err_msg=name)
        np.testing.assert_array_equal(arr, before, err_msg=name)  # the input is left alone


@pytest.mark.parametrize("dtype,itemsize,fmt", DTYPES)
def test_download_into_writes_in_place_or_refuses(session, dtype, itemsize, fmt):
    t = session.tensor((6, 8), dtype)
    host = values((6, 8), dtype)
    session.upload(t, host)
    # Same dtype, same element count, C-contiguous and writable: written in place.
    for out in (np.zeros((6, 8), dtype), np.zeros(48, dtype), np.zeros((2, 3, 8), dtype)):
        session.download_into(t, out)
        np.testing.assert_array_equal(out.ravel(), host.ravel())
    refused = {
        "transposed": np.zeros((8, 6), dtype).T,
        "column step": np.zeros((6, 16), dtype)[:, ::2],
        "negative row stride": np.zeros((6, 8), dtype)[::-1],
        "step -2": np.zeros(96, dtype)[::-2],
        "read-only": np.zeros((6, 8), dtype),
    }
    refused["read-only"].setflags(write=False)
    for name, out in refused.items():
        with pytest.raises(ferry.InvalidArgument, match="C-contiguous and writable"):
            session.download_into(t, out)
        assert not out.any(), name  # nothing was written
    other = np.float64 if dtype != np.float64 else np.float32
    with pytest.raises(ferry.DtypeMismatch):
        session.download_into(t, np.zeros((6, 8), other))
    with pytest.raises(ferry.ShapeMismatch):
        session.download_into(t, np.zeros(47, dtype))


@pytest.mark.parametrize("dtype,itemsize,fmt", DTYPES)
def test_non_native_byte_order_is_refused(session, dtype, itemsize, fmt):
    swapped = np.dtype(dtype).newbyteorder(">")
    t = session.tensor(4, dtype)
    data = np.zeros(4, swapped)
    if itemsize == 1:  # one byte has no order: uint8 is uint8
        session.upload(t, data)
        assert session.tensor(4, swapped).dtype == np.uint8
        return
    assert memoryview(data).format.startswith(">")
    with pytest.raises(ferry.DtypeMismatch, match="big-endian"):
        session.upload(t, data)
    with pytest.raises(ferry.DtypeMismatch):
        session.download_into(t, data)
    with pytest.raises(ferry.InvalidArgument):
        session.tensor(4, swapped)


@pytest.mark.parametrize("other", [np.float16, np.int8, np.int16, np.int64, np.uint16,
                                   np.uint32, np.uint64, np.bool_, np.complex64])
def test_other_numpy_dtypes_are_refused(session, other):
    for dtype in (np.float32, np.float64, np.int32, np.uint8):
        t = session.tensor(4, dtype)
        with pytest.raises(ferry.DtypeMismatch):
            session.upload(t, np.zeros(4, other))
    with pytest.raises(ferry.InvalidArgument, match="not a ferry element type"):
        session.tensor(4, other)
    structured = np.zeros(4, dtype=[("a", np.float32)])
    with pytest.raises(ferry.DtypeMismatch):
        session.upload(session.tensor(4, np.float32), structured)


def test_upload_takes_any_buffer(session):
    """Not only numpy: any object with the buffer protocol, by its format and itemsize."""
    u8 = session.tensor(6, np.uint8)
    session.upload(u8, b"ferry!")
    assert session.download(u8).tobytes() == b"ferry!"
    session.upload(u8, bytearray(b"abcdef"))
    assert session.download(u8).tobytes() == b"abcdef"
    f32 = session.tensor(3, np.float32)
    session.upload(f32, array.array("f", [1.5, 2.5, 3.5]))
    np.testing.assert_array_equal(session.download(f32), np.array([1.5, 2.5, 3.5], np.float32))
    i32 = session.tensor(3, np.int32)
    session.upload(i32, memoryview(array.array("i", [-1, 0, 7])))
    np.testing.assert_array_equal(session.download(i32), np.array([-1, 0, 7], np.int32))
    # A strided memoryview is copied in row-major order like a strided array.
    session.upload(i32, memoryview(array.array("i", [5, 0, 6, 0, 7]))[::2])
    np.testing.assert_array_equal(session.download(i32), np.array([5, 6, 7], np.int32))
    # Bytes of floats are bytes: the format decides, not the size.
    with pytest.raises(ferry.DtypeMismatch):
        session.upload(f32, np.zeros(3, np.float32).tobytes())
    # Objects without the buffer protocol go through numpy.asarray (a list of floats: float64).
    f64 = session.tensor(3, np.float64)
    session.upload(f64, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(session.download(f64), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ferry.DtypeMismatch):
        session.upload(f32, [1.0, 2.0, 3.0])
    # download_into takes any writable buffer of the right format.
    out = array.array("f", [0.0, 0.0, 0.0])
    session.download_into(f32, out)
    assert list(out) == [1.5, 2.5, 3.5]
    with pytest.raises(ferry.InvalidArgument, match="writable"):
        session.download_into(u8, b"xxxxxx")


def test_a_view_of_a_buffer_outlives_its_python_objects(session):
    """A view keeps the slab range alive after the buffer object is gone, under any numpy."""
    buf = session.pinned_buffer(1024)
    view = buf.numpy(np.float64, (2, 64))
    address = buf.address
    view[:] = 2.5
    del buf
    assert view.__array_interface__["data"][0] == address
    assert (view == 2.5).all() and view.strides == (512, 8)
