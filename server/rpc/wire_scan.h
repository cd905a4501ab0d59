// WireScan: what a client message will cost the daemon, read from its wire bytes before it
// is parsed.
//
// Parsing a protobuf message allocates an object per sub-message, a slot per repeated
// element and an entry per unknown field: a Submit of empty ops takes ~28 bytes of memory per
// byte on the wire (a 60 MiB message of 4-byte ops parsed to ~1.6 GB). So every message a
// client sends, through its stream or its submit ring, is scanned first: the scan walks the
// wire format against ClientMessage's schema without allocating anything, counts the ops,
// and estimates the memory the parse would take (`parsed_bytes`). The connection refuses what
// is over its bounds before it is parsed (rpc/message_intake.h), so a refused message costs
// the daemon about its own size.
//
// The estimate counts, per the generated classes of this build: each message object, a
// pointer per repeated message element, each repeated scalar element, each string or bytes
// field (its object and its bytes), and each unknown field; it is within a small factor of
// what the parse allocates (tests/unit/wire_scan_test.cc checks it against SpaceUsedLong).
//
// Thread-safe: a pure function over its input (the schema tables are built once, on first
// use).
#pragma once

#include <google/protobuf/io/zero_copy_stream.h>

#include <cstdint>
#include <string_view>

#include "ferry/status.h"

namespace ferry::rpc {

/// What a scan found; `status` says whether the bytes are a well-formed ClientMessage.
struct WireScan {
  /// OK; PROTOCOL_VIOLATION when the bytes are not a ClientMessage (a truncated or
  /// malformed field, a group, nesting past the schema's depth): the scan stopped there, and
  /// the counts below are what it saw until then; else INVALID_ARGUMENT, naming the field,
  /// when a string field is not valid UTF-8 (protobuf would refuse to parse it): the scan
  /// went on to the end.
  Status status;
  /// The number of the ClientMessage.kind field set last (1 open, 2 submit, 3 synchronize,
  /// 4 close; 0 none), as the parse would leave it.
  uint32_t kind = 0;
  uint64_t sequence = 0;   // ClientMessage.sequence
  uint64_t submit_id = 0;  // Submit.submit_id
  uint64_t ops = 0;        // Submit.ops entries
  /// Bit n set: some op has its kind field number n (Op.kind, 1..31).
  uint32_t op_kinds = 0;
  uint64_t upload_bytes = 0;    // Upload.data bytes, over all ops
  uint64_t downloads = 0;       // Download ops with a length
  uint64_t download_bytes = 0;  // Download.length, over all ops (saturating)
  /// The estimated memory the parse would take. Once it passes the scan's `max_parsed_bytes`
  /// the scan stops looking inside nested messages (it still reads the top level, for
  /// `sequence`): it is then only known to be over (`over_budget`), and the op counts stop.
  uint64_t parsed_bytes = 0;
  bool over_budget = false;
};

/// The most a scan can estimate (WireScan::parsed_bytes) for a message of `size` bytes,
/// whatever they are: a message for which this fits every bound needs no scan to be held to
/// them (rpc/message_intake.h).
uint64_t MostParsedBytes(uint64_t size);

/// Scan one ClientMessage of `size` bytes from `in`. `max_parsed_bytes` (0: none) bounds the
/// work spent counting a message already too large (WireScan::over_budget).
WireScan ScanClientMessage(google::protobuf::io::ZeroCopyInputStream& in, uint64_t size,
                           uint64_t max_parsed_bytes = 0);
/// The same over bytes in memory (a submit ring record).
WireScan ScanClientMessage(std::string_view bytes, uint64_t max_parsed_bytes = 0);

}  // namespace ferry::rpc
