// protobuf's own log lines (a parse that meets a string that is not UTF-8 logs one, for
// example) go to the daemon's log, at most one a second: a client that sends such messages
// on end cannot flood the log. Lines past that are counted and the count is logged with the
// next line let through.
#pragma once

namespace ferry::rpc {

/// Route protobuf's log lines to spdlog (INFO as debug, WARNING and ERROR as warnings: what a
/// client sends causes them, FATAL as critical), at most one a second. Only the first call
/// sets the route (protobuf's SetLogHandler is not thread-safe); make it before the daemon
/// serves.
void RouteProtobufLogs();

}  // namespace ferry::rpc
