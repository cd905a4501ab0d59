"""ferry's exception classes, its enums (Code, ErrorKind, ModuleFormat) and SessionStats.

Every ferry::Status that is not OK reaches Python as an instance of the class of its
ErrorKind (common/include/ferry/status.h), all under ferry.Error. The C++ module builds them
through _make_error(); the names are the ErrorKind names in CamelCase. The enums' members
come from the C++ build, so they cannot drift from it; _types.pyi spells them out for type
checkers (tests/python/test_stubs.py holds the two together).
"""

import dataclasses
import enum

from . import _ferry

#: Canonical codes (equal to gRPC's status codes).
Code = enum.IntEnum("Code", [(name, value) for value, name in _ferry._code_names()])
#: What went wrong, in ferry's terms (ferry::ErrorKind; stable values).
ErrorKind = enum.IntEnum("ErrorKind", [(name, value) for value, name in _ferry._error_kind_names()])
#: Format of device code for Session.load_module (ferry::ModuleFormat).
ModuleFormat = enum.IntEnum("ModuleFormat",
                            [(name, value) for value, name in _ferry._module_format_names()])


class Error(Exception):
    """A failed ferry call: a ferry::Status that is not OK.

    Attributes: code (Code), kind (ErrorKind), message (str), op_index (int: the failing op
    within its submit, -1 when no single op failed), and tensor / buffer: the values a
    refused or failed pending transfer gives back (None elsewhere).
    """

    def __init__(self, message="", *, code=Code.UNKNOWN, kind=ErrorKind.NONE, op_index=-1):
        super().__init__(message)
        self.message = message
        self.code = _enum_or_int(Code, code)
        self.kind = _enum_or_int(ErrorKind, kind)
        self.op_index = op_index
        self.tensor = None
        self.buffer = None

    def __str__(self):
        kind = self.kind.name if isinstance(self.kind, ErrorKind) else str(self.kind)
        code = self.code.name if isinstance(self.code, Code) else str(self.code)
        text = f"{kind} ({code}): {self.message}"
        if self.op_index >= 0:
            text += f" [op {self.op_index}]"
        return text


def _enum_or_int(enum_type, value):
    try:
        return enum_type(value)
    except ValueError:
        return int(value)


class InvalidHandle(Error):
    """A handle that does not name a live object of the right kind."""


class DtypeMismatch(Error):
    """Operands (or an array and a tensor) of different element types."""


class ShapeMismatch(Error):
    """Operands whose shapes (or element counts) do not fit the op."""


class OutOfRange(Error):
    """An offset or length outside the object it names."""


class QuotaExceeded(Error):
    """A per-session or daemon-wide limit would be passed."""


class OutOfDeviceMemory(Error):
    """The device could not allocate."""


class CompileError(Error):
    """A module failed to compile or load (the log is in the message)."""


class Unsupported(Error):
    """The backend cannot do this."""


class DeviceFault(Error):
    """This session's work faulted the device."""


class DeviceReset(Error):
    """Another session faulted the device; the context was rebuilt."""


class SessionClosed(Error):
    """The session (or its connection) is gone."""


class ProtocolViolation(Error):
    """A message the protocol does not allow here."""


class InvalidArgument(Error):
    """Any other malformed argument."""


class Internal(Error):
    """A broken invariant of ferry's own."""


class Unavailable(Error):
    """The daemon cannot be reached or is draining."""


class Busy(Error):
    """A memory range still in use: a copy in flight, or a buffer with live views."""


class PermissionDenied(Error):
    """The peer may not do this."""


def _camel(name):
    return "".join(part.capitalize() for part in name.split("_"))


_BY_KIND = {}
for _kind in ErrorKind:
    if _kind == ErrorKind.NONE:
        continue
    _cls = globals().get(_camel(_kind.name))
    if isinstance(_cls, type) and issubclass(_cls, Error):
        _BY_KIND[_kind] = _cls
del _kind, _cls


def error_class(kind):
    """Return the exception class of an ErrorKind (ferry.Error for one this package lacks)."""
    try:
        return _BY_KIND.get(ErrorKind(kind), Error)
    except ValueError:
        return Error


def _make_error(code, kind, message, op_index):
    return error_class(kind)(message, code=code, kind=kind, op_index=op_index)


@dataclasses.dataclass(frozen=True)
class SessionStats:
    """Counters of one session, as Session.close() returns them (ferry::SessionStats).

    submits, failed_submits: submits sent, and those that failed. ops: ops run.
    kernel_launches: kernels the daemon launched for the session; graph_launches: replays of
    prepared graphs; kernel_batches: runs of kernel ops the daemon sent as one batch.
    bytes_uploaded, bytes_downloaded: bytes moved by transfers. tensors_created,
    peak_device_bytes: tensors made and the most device memory held at once.
    device_busy_ns: device time of the session's work, measured on the device; of it, the
    copy engines' traffic by direction: h2d_bytes / h2d_ns (host to device) and
    d2h_bytes / d2h_ns (device to host). staged_upload_bytes, staged_download_bytes:
    counted by the client, not the daemon: bytes of blocking uploads and downloads that went
    through the session's shared-memory staging buffer (the rest went inline in messages).
    """

    submits: int = 0
    failed_submits: int = 0
    ops: int = 0
    kernel_launches: int = 0
    bytes_uploaded: int = 0
    bytes_downloaded: int = 0
    tensors_created: int = 0
    peak_device_bytes: int = 0
    device_busy_ns: int = 0
    graph_launches: int = 0
    kernel_batches: int = 0
    h2d_bytes: int = 0
    h2d_ns: int = 0
    d2h_bytes: int = 0
    d2h_ns: int = 0
    staged_upload_bytes: int = 0
    staged_download_bytes: int = 0


# The C++ module lists ferry::SessionStats' fields (and fails to build when the struct gains
# one that list lacks); a field missing here would make close() fail, so fail at import.
_missing = set(_ferry._session_stats_fields()) - {f.name for f in dataclasses.fields(SessionStats)}
if _missing:
    raise ImportError(f"ferry.SessionStats lacks the fields {sorted(_missing)} of the C++ module")
del _missing
