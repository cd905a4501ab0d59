#include "rpc/message_intake.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "rpc/convert.h"
#include "session/ops.h"

namespace ferry::rpc {
namespace {

google::protobuf::ArenaOptions ArenaFor(char* first_block, size_t size) {
  google::protobuf::ArenaOptions o;
  o.initial_block = first_block;
  o.initial_block_size = size;
  return o;
}

const char* KindName(uint32_t kind) {
  switch (kind) {
    case v1::ClientMessage::kOpen:
      return "an Open";
    case v1::ClientMessage::kSubmit:
      return "a Submit";
    case v1::ClientMessage::kSynchronize:
      return "a Synchronize";
    case v1::ClientMessage::kClose:
      return "a Close";
    default:
      return "a message with no kind";
  }
}

// Decide what becomes of a scanned message (see the header): a violation, a refused submit, or
// one to parse (charged, for a submit). Sets `in`'s outcome; true when it is to be parsed.
bool Admit(IncomingMessage& in, uint64_t size, const IntakeBounds& bounds) {
  const WireScan& scan = in.scan;
  const bool submit = scan.kind == v1::ClientMessage::kSubmit;
  if (!scan.status.ok()) {
    // A bad string in a submit refuses that submit; anything else is the stream's end.
    if (bounds.session && submit && scan.status.kind() == ErrorKind::kInvalidArgument) {
      in.refusal = scan.status;
    } else {
      in.violation = scan.status;
    }
    return false;
  }
  if (!bounds.session || !submit) {
    if (scan.parsed_bytes > kMaxControlBytes) {
      in.violation = Status(ErrorKind::kProtocolViolation,
                            std::string(KindName(scan.kind)) + " of " + std::to_string(size) +
                                " bytes; a message other than a Submit" +
                                (bounds.session ? "" : ", and any message before Open,") +
                                " may take at most " + std::to_string(kMaxControlBytes) +
                                " bytes of the daemon's memory");
      return false;
    }
    return true;
  }
  // Over budget first: the scan stopped counting ops there.
  if (scan.over_budget) {
    in.refusal =
        Status(ErrorKind::kQuotaExceeded,
               "the submit (" + std::to_string(size) + " bytes) would take over " +
                   std::to_string(bounds.max_parsed_bytes) +
                   " bytes of the daemon's memory once parsed, the session's in-flight limit "
                   "(ferryd --session-in-flight-bytes); it was refused before it was parsed");
    return false;
  }
  if (bounds.max_ops && scan.ops > bounds.max_ops) {
    in.refusal = Status(ErrorKind::kQuotaExceeded,
                        "a submit may carry at most " + std::to_string(bounds.max_ops) +
                            " ops, this one has " + std::to_string(scan.ops) +
                            " (ferryd --session-max-submit-ops)");
    return false;
  }
  if (bounds.registry) {
    if (Status s = bounds.registry->ChargeInFlightBytes(bounds.account.get(), scan.parsed_bytes);
        !s.ok()) {
      in.refusal = std::move(s);
      return false;
    }
    in.hold = InFlightHold(bounds.registry, bounds.account, scan.parsed_bytes);
  }
  return true;
}

// Whether a message of `size` bytes may be parsed without a scan: the most the scan could
// estimate for it (MostParsedBytes) fits every bound it would be held to (a submit's in-flight
// bytes in its session, a control message's kMaxControlBytes, what its identity and the daemon
// may still hold), and it cannot carry more ops than a submit may (an op takes at least 2
// bytes). A scan costs about what the parse of a submit of small ops costs, so most submits
// skip it; one that fails to parse is scanned after all, which says why.
bool FitsUnscanned(uint64_t size, const IntakeBounds& bounds) {
  if (bounds.max_ops && size / 2 > bounds.max_ops) return false;
  uint64_t room = kMaxControlBytes;
  if (bounds.session && bounds.max_parsed_bytes) room = std::min(room, bounds.max_parsed_bytes);
  if (bounds.registry) {
    room = std::min(room, bounds.registry->InFlightBytesRoom(bounds.account.get()));
  }
  return MostParsedBytes(size) <= room;
}

// What a scan would have found, read from the parsed message; `parsed_bytes` is what the
// parse took (its arena's bytes in use).
WireScan ScanOfParsed(const v1::ClientMessage& m, uint64_t parsed_bytes) {
  WireScan out;
  out.kind = static_cast<uint32_t>(m.kind_case());
  out.sequence = m.sequence();
  out.parsed_bytes = parsed_bytes;
  if (!m.has_submit()) return out;
  out.submit_id = m.submit().submit_id();
  out.ops = static_cast<uint64_t>(m.submit().ops_size());
  for (const v1::Op& op : m.submit().ops()) {
    const auto kind = static_cast<uint32_t>(op.kind_case());
    if (kind < 32) out.op_kinds |= 1u << kind;
    if (op.has_upload()) {
      out.upload_bytes += op.upload().data().size();
    } else if (op.has_download() && op.download().length() != 0) {
      ++out.downloads;
      const uint64_t length = op.download().length();
      out.download_bytes =
          length > UINT64_MAX - out.download_bytes ? UINT64_MAX : out.download_bytes + length;
    }
  }
  return out;
}

// Take a message of `size` bytes: parse it at once where it fits its bounds whatever it holds
// (FitsUnscanned), else scan it, admit it and parse it only then. `read(f)` calls f with a new
// input stream over the message from its start (it may be read twice).
template <typename Read>
std::shared_ptr<IncomingMessage> Take(uint64_t size, Read read, const IntakeBounds& bounds) {
  auto in = std::make_shared<IncomingMessage>();
  bool parsed = false;
  if (FitsUnscanned(size, bounds)) {
    in->message = google::protobuf::Arena::CreateMessage<v1::ClientMessage>(&in->arena);
    read([&](google::protobuf::io::ZeroCopyInputStream& s) {
      parsed = in->message->ParseFromZeroCopyStream(&s);
    });
    if (parsed) {
      in->scan = ScanOfParsed(*in->message, static_cast<uint64_t>(in->arena.SpaceUsed()));
    } else {
      in = std::make_shared<IncomingMessage>();  // the scan below says what is wrong
    }
  }
  if (!parsed) {
    const uint64_t budget = bounds.session ? bounds.max_parsed_bytes : kMaxControlBytes;
    read([&](google::protobuf::io::ZeroCopyInputStream& s) {
      in->scan = ScanClientMessage(s, size, budget);
    });
  }
  if (Admit(*in, size, bounds)) {
    if (!parsed) {
      in->message = google::protobuf::Arena::CreateMessage<v1::ClientMessage>(&in->arena);
      read([&](google::protobuf::io::ZeroCopyInputStream& s) {
        parsed = in->message->ParseFromZeroCopyStream(&s);
      });
    }
    if (!parsed) {
      // The scan passed what protobuf refuses: the stream's end all the same.
      in->hold = InFlightHold();
      in->violation =
          Status(ErrorKind::kProtocolViolation, "the message does not parse as a ClientMessage");
      in->message = nullptr;
    } else if (in->message->has_submit()) {
      in->summary = Summarize(in->message->submit());
    }
  } else if (in->violation.ok()) {
    // A refused submit: what the session needs to answer it in its place (a parsed one is
    // dropped: it stays on the arena until the message goes).
    in->message = google::protobuf::Arena::CreateMessage<v1::ClientMessage>(&in->arena);
    in->message->set_sequence(in->scan.sequence);
    in->message->mutable_submit()->set_submit_id(in->scan.submit_id);
  } else {
    in->message = nullptr;
  }
  return in;
}

}  // namespace

// A message whose handling is short and never blocks may be handled on the gRPC thread
// that read it (gRPC's reactions must not block): a Synchronize; a Close (Session::Close
// tears down at once only a session that holds nothing on the device, else it posts the
// teardown); or a submit of at most session::kQuickSubmitOps ops, each of which only enqueues
// device work that runs asynchronously (and at most session::kQuickSubmitUploadBytes of inline
// upload bytes). An Open is handled there while the device serves (SessionReactor::OnReadDone).
// Everything else goes to the executor's threads: Open while the device is rebuilt, and submits
// with an op that may block the thread: a Download (into pageable chunks the copy waits for the
// stream), a create or free (allocation may trim the pool), module loads (NVRTC compiles take up to
// seconds) and unloads, GEMMs and graph captures (the first makes cuBLAS state, and loads the
// library), graph frees. The same rule as the session's (session::SubmitSummary::quick), from
// the summary the message was taken with.
bool IsQuick(const IncomingMessage& in) {
  const v1::ClientMessage& m = *in.message;
  if (m.has_synchronize() || m.has_close()) return true;
  return m.has_submit() && in.summary.quick();
}

InFlightHold& InFlightHold::operator=(InFlightHold&& o) noexcept {
  if (this != &o) {
    Refund();
    registry_ = o.registry_;
    account_ = std::move(o.account_);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void InFlightHold::Refund() {
  if (bytes_ && registry_) registry_->RefundInFlightBytes(account_.get(), bytes_);
  bytes_ = 0;
}

IncomingMessage::IncomingMessage() : arena(ArenaFor(first_block_, kFirstBlock)) {}

std::shared_ptr<IncomingMessage> TakeClientMessage(std::string_view bytes,
                                                   const IntakeBounds& bounds) {
  const int size =
      static_cast<int>(std::min<size_t>(bytes.size(), std::numeric_limits<int>::max()));
  return Take(
      bytes.size(),
      [&](auto&& f) {
        google::protobuf::io::ArrayInputStream s(bytes.data(), size);
        f(s);
      },
      bounds);
}

std::shared_ptr<IncomingMessage> TakeClientMessage(grpc::ByteBuffer& bytes,
                                                   const IntakeBounds& bounds) {
  return Take(
      bytes.Length(),
      [&](auto&& f) {
        grpc::ProtoBufferReader s(&bytes);
        f(s);
      },
      bounds);
}

}  // namespace ferry::rpc
