// Fuzz target: the scan of a client message's wire bytes before it is parsed
// (server/rpc/wire_scan.cc), which every stream and submit ring message goes through.
//
// What must hold whatever the bytes: the scan never reads outside them (ASan would see it);
// it agrees with protobuf on whether they parse (a message the scan passes parses, and one
// protobuf refuses the scan does not pass, so that nothing the daemon then parses can
// surprise it); and for one that parses, its estimate of the parse's memory is not far below
// what the parsed message holds (the bound the daemon enforces with it); and the same bytes in
// pieces (gRPC hands a message over in slices) scan the same; and no estimate passes
// MostParsedBytes, the bound the intake trusts to parse small messages without a scan.
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "ferry/v1/session.pb.h"
#include "fuzz_check.h"
#include "rpc/wire_scan.h"

namespace {

void Check(bool ok, const char* what) { ferry::fuzz::CheckOrAbort(ok, "wire_scan_fuzz", what); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const ferry::rpc::WireScan scan = ferry::rpc::ScanClientMessage(bytes);
  ferry::v1::ClientMessage parsed;
  const bool parses = parsed.ParseFromArray(data, static_cast<int>(size));
  if (scan.status.ok()) {
    Check(parses, "the scan passed bytes protobuf does not parse");
    Check(scan.parsed_bytes * 4 >= parsed.SpaceUsedLong(),
          "the scan's estimate is less than a quarter of what the parse holds");
    Check(scan.kind == static_cast<uint32_t>(parsed.kind_case()), "the kind differs");
    Check(scan.sequence == parsed.sequence(), "the sequence differs");
  }
  if (!parses) Check(!scan.status.ok(), "protobuf refused bytes the scan passed");
  // The intake parses a message without a scan where this most fits its bounds.
  Check(scan.parsed_bytes <= ferry::rpc::MostParsedBytes(size),
        "the estimate passed the most MostParsedBytes allows");
  // A budget changes where the scan stops counting, never whether the bytes are a message.
  const ferry::rpc::WireScan budgeted = ferry::rpc::ScanClientMessage(bytes, 64);
  Check(budgeted.status.kind() == scan.status.kind() || budgeted.over_budget,
        "a budget changed the verdict");
  // In pieces of 1 to 16 bytes, as the first byte picks.
  const int piece = size > 0 ? 1 + data[0] % 16 : 1;
  google::protobuf::io::ArrayInputStream stream(data, static_cast<int>(size), piece);
  const ferry::rpc::WireScan pieces = ferry::rpc::ScanClientMessage(stream, size);
  Check(pieces.status.kind() == scan.status.kind(), "pieces changed the verdict");
  Check(pieces.parsed_bytes == scan.parsed_bytes && pieces.ops == scan.ops &&
            pieces.sequence == scan.sequence && pieces.kind == scan.kind &&
            pieces.upload_bytes == scan.upload_bytes,
        "pieces changed what the scan counts");
  return 0;
}
