#include "ferry/status.h"

namespace ferry {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kCancelled:
      return "CANCELLED";
    case Code::kUnknown:
      return "UNKNOWN";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kAlreadyExists:
      return "ALREADY_EXISTS";
    case Code::kPermissionDenied:
      return "PERMISSION_DENIED";
    case Code::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case Code::kAborted:
      return "ABORTED";
    case Code::kOutOfRange:
      return "OUT_OF_RANGE";
    case Code::kUnimplemented:
      return "UNIMPLEMENTED";
    case Code::kInternal:
      return "INTERNAL";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kDataLoss:
      return "DATA_LOSS";
    case Code::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

std::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNone:
      return "NONE";
    case ErrorKind::kInvalidHandle:
      return "INVALID_HANDLE";
    case ErrorKind::kDtypeMismatch:
      return "DTYPE_MISMATCH";
    case ErrorKind::kShapeMismatch:
      return "SHAPE_MISMATCH";
    case ErrorKind::kOutOfRange:
      return "OUT_OF_RANGE";
    case ErrorKind::kQuotaExceeded:
      return "QUOTA_EXCEEDED";
    case ErrorKind::kOutOfDeviceMemory:
      return "OUT_OF_DEVICE_MEMORY";
    case ErrorKind::kCompileError:
      return "COMPILE_ERROR";
    case ErrorKind::kUnsupported:
      return "UNSUPPORTED";
    case ErrorKind::kDeviceFault:
      return "DEVICE_FAULT";
    case ErrorKind::kDeviceReset:
      return "DEVICE_RESET";
    case ErrorKind::kSessionClosed:
      return "SESSION_CLOSED";
    case ErrorKind::kProtocolViolation:
      return "PROTOCOL_VIOLATION";
    case ErrorKind::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case ErrorKind::kInternal:
      return "INTERNAL";
    case ErrorKind::kUnavailable:
      return "UNAVAILABLE";
    case ErrorKind::kBusy:
      return "BUSY";
    case ErrorKind::kPermissionDenied:
      return "PERMISSION_DENIED";
  }
  return "UNKNOWN_KIND";
}

Code CanonicalCode(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNone:
      return Code::kOk;
    case ErrorKind::kInvalidHandle:
    case ErrorKind::kDtypeMismatch:
    case ErrorKind::kShapeMismatch:
    case ErrorKind::kCompileError:
    case ErrorKind::kProtocolViolation:
    case ErrorKind::kInvalidArgument:
      return Code::kInvalidArgument;
    case ErrorKind::kOutOfRange:
      return Code::kOutOfRange;
    case ErrorKind::kQuotaExceeded:
    case ErrorKind::kOutOfDeviceMemory:
      return Code::kResourceExhausted;
    case ErrorKind::kUnsupported:
      return Code::kUnimplemented;
    case ErrorKind::kDeviceFault:
      return Code::kInternal;
    case ErrorKind::kDeviceReset:
      return Code::kAborted;
    case ErrorKind::kSessionClosed:
      return Code::kFailedPrecondition;
    case ErrorKind::kInternal:
      return Code::kInternal;
    case ErrorKind::kUnavailable:
      return Code::kUnavailable;
    case ErrorKind::kBusy:
      return Code::kFailedPrecondition;
    case ErrorKind::kPermissionDenied:
      return Code::kPermissionDenied;
  }
  return Code::kUnknown;
}

Status Status::FromWire(int code, int kind, std::string message, int op_index) {
  if (kind < 0 || kind > static_cast<int>(kLastErrorKind)) {
    message = "unknown error kind " + std::to_string(kind) + ": " + message;
    kind = static_cast<int>(ErrorKind::kInternal);
  }
  if (code <= 0 || code > static_cast<int>(Code::kUnauthenticated)) {
    code = static_cast<int>(Code::kUnknown);
  }
  return Status(static_cast<Code>(code), static_cast<ErrorKind>(kind), std::move(message),
                op_index);
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  Status s = *this;
  s.message_ = std::string(context) + ": " + message_;
  return s;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(ErrorKindName(kind_));
  out += " (";
  out += CodeName(code_);
  out += "): ";
  out += message_;
  if (op_index_ >= 0) out += " [op " + std::to_string(op_index_) + "]";
  return out;
}

}  // namespace ferry
