// Conversions between ferry.v1 messages and the daemon's own op types. The only place (with
// the services) that knows the wire format; DType, Status and counters convert through
// ferry/wire.h, shared with libferry.
#pragma once

#include <optional>

#include "ferry/status.h"
#include "ferry/v1/session.pb.h"
#include "session/ops.h"
#include "session/session.h"

namespace ferry::rpc {

/// Summarize a submit's wire ops (session::SubmitSummary), once, where it is read: what the
/// rpc layer asks before the ops are decoded, and the session after. An op with no kind this
/// build knows counts as malformed.
session::SubmitSummary Summarize(const v1::Submit& submit);

/// Decode a submit's ops. Never fails: an op that cannot be decoded becomes a MalformedOp
/// that admission refuses (and marks `summary`, Summarize's of the same submit, malformed).
/// Upload bytes are referenced, not copied: `message` must outlive the request (the
/// request's payload keeps it alive).
session::SubmitRequest ToSubmitRequest(std::shared_ptr<const v1::ClientMessage> message,
                                       session::SubmitSummary summary);
/// The same, summarizing the submit itself (tests, fuzzing).
session::SubmitRequest ToSubmitRequest(std::shared_ptr<const v1::ClientMessage> message);

/// The kind of a wire op, for asking session::Traits about it before decoding; nullopt for
/// an op with no kind set (or one this build does not know).
std::optional<session::OpKind> KindOf(const v1::Op& op);

/// Coalesced completions (docs/protocol.md, ordering rule 3): when `next` is the successful
/// Completed of the submit right after `run` (a successful Completed, possibly already a run),
/// extend `run` through it (setting first_submit_id) and return true; `next` is then not to be
/// sent. Anything else (a failure, another message, a gap in the ids) returns false and
/// leaves `run` as it was.
bool AbsorbCompletion(v1::Completed* run, const v1::ServerMessage& next);

}  // namespace ferry::rpc
