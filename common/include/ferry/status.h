// Status and Result: how every ferry module, and the public client API, reports failure.
//
// A Status carries a canonical code (one-to-one with gRPC's codes, like absl::Status) and,
// beside it, a finer ErrorKind that says what exactly went wrong (invalid handle, device
// fault, ...), plus the index of the op that failed where one did. No exceptions cross a
// module boundary or the public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ferry {

/// Canonical error codes; the numeric values equal gRPC's status codes.
enum class Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

/// What went wrong, in ferry's terms. Values are stable: they travel on the wire
/// (ferry.v1.ErrorKind has the same numbers).
enum class ErrorKind : int {
  kNone = 0,
  kInvalidHandle = 1,       // a handle that does not name a live object of the right kind
  kDtypeMismatch = 2,       // operands of different element types
  kShapeMismatch = 3,       // operands whose shapes do not fit the op
  kOutOfRange = 4,          // an offset or length outside the object it names
  kQuotaExceeded = 5,       // a per-session or daemon-wide limit would be passed
  kOutOfDeviceMemory = 6,   // the device could not allocate
  kCompileError = 7,        // a module failed to compile or load (log in the message)
  kUnsupported = 8,         // the backend cannot do this (e.g. PTX on the host backend)
  kDeviceFault = 9,         // this session's work faulted the device
  kDeviceReset = 10,        // another session faulted the device; the context was rebuilt
  kSessionClosed = 11,      // the session (or its connection) is gone
  kProtocolViolation = 12,  // a message the protocol does not allow here
  kInvalidArgument = 13,    // any other malformed argument (bad dtype, zero-sized grid, ...)
  kInternal = 14,           // a broken invariant of ferry's own
  kUnavailable = 15,        // the daemon cannot be reached or is draining
  kBusy = 16,               // a shared-memory range a copy in flight still uses
  kPermissionDenied = 17,   // the peer may not do this (raw kernels, admin calls)
};

/// The highest ErrorKind this build knows; a peer's larger value is not one of ours.
inline constexpr ErrorKind kLastErrorKind = ErrorKind::kPermissionDenied;

std::string_view CodeName(Code code);
std::string_view ErrorKindName(ErrorKind kind);
/// Return the canonical code an ErrorKind is reported under.
Code CanonicalCode(ErrorKind kind);

/// A success, or an error with a code, a kind, a message and optionally the index of the
/// op (within its submit) that failed. Cheap to copy when OK.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorKind kind, std::string message, int op_index = -1)
      : code_(CanonicalCode(kind)),
        kind_(kind),
        message_(std::move(message)),
        op_index_(op_index) {}
  Status(Code code, ErrorKind kind, std::string message, int op_index = -1)
      : code_(code), kind_(kind), message_(std::move(message)), op_index_(op_index) {}

  static Status Ok() { return Status(); }

  /// Build a Status from the numbers a peer sent (ferry.v1.Error). A code outside gRPC's
  /// range becomes UNKNOWN; a kind this build does not know (a newer peer's) becomes INTERNAL
  /// with "unknown error kind N: " before the message, so it is never taken for one of ours.
  static Status FromWire(int code, int kind, std::string message, int op_index = -1);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  /// Index of the failing op within its submit, or -1 when no single op failed.
  int op_index() const { return op_index_; }

  /// Return a copy that names op `index` as the one that failed.
  Status WithOpIndex(int index) const {
    Status s = *this;
    s.op_index_ = index;
    return s;
  }
  /// Return a copy with `context` put in front of the message.
  Status WithContext(std::string_view context) const;

  /// Format as "KIND: message (op N)" for logs and test failures.
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  ErrorKind kind_ = ErrorKind::kNone;
  std::string message_;
  int op_index_ = -1;
};

inline bool operator==(const Status& a, const Status& b) {
  return a.code() == b.code() && a.kind() == b.kind() && a.message() == b.message() &&
         a.op_index() == b.op_index();
}

/// A value or an error Status. Accessing value() of an error is a programming error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ferry

#define FERRY_CONCAT_INNER_(a, b) a##b
#define FERRY_CONCAT_(a, b) FERRY_CONCAT_INNER_(a, b)

/// Return from the enclosing function if `expr` (a Status) is not OK.
#define FERRY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::ferry::Status ferry_status_ = (expr);        \
    if (!ferry_status_.ok()) return ferry_status_; \
  } while (0)

#define FERRY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

/// Evaluate `expr` (a Result<T>); on error return its Status, else assign the value to lhs.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_CONCAT_(ferry_result_, __LINE__), lhs, expr)
