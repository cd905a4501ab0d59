"""ferry for Python: share a GPU through a ferry daemon, with libferry's contract.

    import ferry, numpy as np
    client = ferry.Client.connect("unix:/run/ferry/ferryd-0.sock")
    with client.session() as s:
        x = s.tensor((1024,), "float32")
        s.upload(x, np.ones(1024, np.float32))
        ...

A thin module over libferry (ferry._ferry, built by the project's CMake): the same sessions,
ops, raw kernels (Module, KernelArg), prepared graphs (Graph), pinned buffers and pending
transfers, with every ferry::Status raised as the exception class of its ErrorKind (all under
ferry.Error). Every call releases the GIL before it waits for the session or the daemon.
Arrays come in through the buffer protocol and go out as numpy arrays made by numpy's own
Python API, so the module works with numpy 1.x and 2.x alike.
"""

from . import _ferry
from ._types import (
    Busy,
    Code,
    CompileError,
    DeviceFault,
    DeviceReset,
    DtypeMismatch,
    Error,
    ErrorKind,
    Internal,
    InvalidArgument,
    InvalidHandle,
    ModuleFormat,
    OutOfDeviceMemory,
    OutOfRange,
    PermissionDenied,
    ProtocolViolation,
    QuotaExceeded,
    SessionClosed,
    SessionStats,
    ShapeMismatch,
    Unavailable,
    Unsupported,
    error_class,
)

Client = _ferry.Client
Session = _ferry.Session
Tensor = _ferry.Tensor
PinnedBuffer = _ferry.PinnedBuffer
Pending = _ferry.Pending
Module = _ferry.Module
Graph = _ferry.Graph
KernelArg = _ferry.KernelArg

__all__ = [
    "Busy", "Client", "Code", "CompileError", "DeviceFault", "DeviceReset", "DtypeMismatch",
    "Error", "ErrorKind", "Graph", "Internal", "InvalidArgument", "InvalidHandle", "KernelArg",
    "Module", "ModuleFormat", "OutOfDeviceMemory", "OutOfRange", "Pending", "PermissionDenied",
    "PinnedBuffer", "ProtocolViolation", "QuotaExceeded", "Session", "SessionClosed",
    "SessionStats", "ShapeMismatch", "Tensor", "Unavailable", "Unsupported", "error_class",
]
