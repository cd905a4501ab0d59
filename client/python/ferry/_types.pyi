"""Types of ferry._types: the enums' members spelled out (at run time they come from the C++
build; tests/python/test_stubs.py checks that the two agree)."""

import enum
from typing import Any, Optional, Type

from . import _ferry

class Code(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

class ErrorKind(enum.IntEnum):
    NONE = 0
    INVALID_HANDLE = 1
    DTYPE_MISMATCH = 2
    SHAPE_MISMATCH = 3
    OUT_OF_RANGE = 4
    QUOTA_EXCEEDED = 5
    OUT_OF_DEVICE_MEMORY = 6
    COMPILE_ERROR = 7
    UNSUPPORTED = 8
    DEVICE_FAULT = 9
    DEVICE_RESET = 10
    SESSION_CLOSED = 11
    PROTOCOL_VIOLATION = 12
    INVALID_ARGUMENT = 13
    INTERNAL = 14
    UNAVAILABLE = 15
    BUSY = 16
    PERMISSION_DENIED = 17

class ModuleFormat(enum.IntEnum):
    PTX = 1
    CUBIN = 2
    CUDA_SOURCE = 3

class Error(Exception):
    message: str
    code: Code | int
    kind: ErrorKind | int
    op_index: int
    tensor: Optional[_ferry.Tensor]
    buffer: Optional[_ferry.PinnedBuffer]
    def __init__(self, message: str = "", *, code: Code | int = ...,
                 kind: ErrorKind | int = ..., op_index: int = -1) -> None: ...

class InvalidHandle(Error): ...
class DtypeMismatch(Error): ...
class ShapeMismatch(Error): ...
class OutOfRange(Error): ...
class QuotaExceeded(Error): ...
class OutOfDeviceMemory(Error): ...
class CompileError(Error): ...
class Unsupported(Error): ...
class DeviceFault(Error): ...
class DeviceReset(Error): ...
class SessionClosed(Error): ...
class ProtocolViolation(Error): ...
class InvalidArgument(Error): ...
class Internal(Error): ...
class Unavailable(Error): ...
class Busy(Error): ...
class PermissionDenied(Error): ...

def error_class(kind: ErrorKind | int) -> Type[Error]: ...
def _make_error(code: int, kind: int, message: str, op_index: int) -> Error: ...

class SessionStats:
    submits: int
    failed_submits: int
    ops: int
    kernel_launches: int
    bytes_uploaded: int
    bytes_downloaded: int
    tensors_created: int
    peak_device_bytes: int
    device_busy_ns: int
    graph_launches: int
    kernel_batches: int
    h2d_bytes: int
    h2d_ns: int
    d2h_bytes: int
    d2h_ns: int
    staged_upload_bytes: int
    staged_download_bytes: int
    def __init__(self, submits: int = 0, failed_submits: int = 0, ops: int = 0,
                 kernel_launches: int = 0, bytes_uploaded: int = 0, bytes_downloaded: int = 0,
                 tensors_created: int = 0, peak_device_bytes: int = 0, device_busy_ns: int = 0,
                 graph_launches: int = 0, kernel_batches: int = 0, h2d_bytes: int = 0,
                 h2d_ns: int = 0, d2h_bytes: int = 0, d2h_ns: int = 0,
                 staged_upload_bytes: int = 0, staged_download_bytes: int = 0) -> None: ...
