// Fuzz target: the slab socket's message parser (ParseSlabMessage, server/transport/slab_broker.h),
// fed the way SlabBroker::Serve feeds it: one connection's bytes, a hello first, then
// requests, parsed message by message off the front of what arrived.
//
// What must hold for any bytes: the parser never reads past its input (ASan), takes at least
// one byte of a whole message and never more than it was given, returns a token only from a
// hello that starts with the magic, and an op only from a bound connection's request.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "transport/slab_broker.h"

using ferry::transport::ParseSlabMessage;
using ferry::transport::SlabMessage;

namespace {
void Check(bool ok, const char* what) { ferry::fuzz::CheckOrAbort(ok, "slab_request_fuzz", what); }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte splits the stream in two arrivals, as recv may cut it anywhere.
  if (size == 0) return 0;
  size_t cut = data[0] % (size);
  std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string in;
  bool bound = false;
  for (int arrival = 0; arrival < 2; ++arrival) {
    in.append(arrival == 0 ? all.substr(0, std::min(cut, all.size()))
                           : all.substr(std::min(cut, all.size())));
    for (int i = 0; i < 1024; ++i) {
      // A copy of exactly the received bytes, so reading one past them is an ASan report.
      std::unique_ptr<char[]> exact(new char[in.size() ? in.size() : 1]);
      std::memcpy(exact.get(), in.data(), in.size());
      SlabMessage m = ParseSlabMessage(std::string_view(exact.get(), in.size()), bound);
      if (m.kind == SlabMessage::Kind::kNeedMore) {
        Check(m.bytes == 0, "took bytes of an incomplete message");
        break;
      }
      Check(m.bytes > 0 && m.bytes <= in.size(), "took no bytes or more than it had");
      switch (m.kind) {
        case SlabMessage::Kind::kHello:
          Check(!bound, "a hello on a bound connection");
          Check(std::memcmp(in.data(), ferry::transport::kSlabMagic, 4) == 0,
                "hello without magic");
          Check(m.token.size() == ferry::transport::kSlabTokenBytes, "a token of the wrong size");
          bound = true;  // as if the token were good
          break;
        case SlabMessage::Kind::kBadHello:
          Check(!bound, "a bad hello on a bound connection");
          return 0;  // the broker closes the connection
        case SlabMessage::Kind::kRequest:
          Check(bound, "a request before the hello");
          Check(m.op >= ferry::transport::kSlabRequestAcquire &&
                    m.op <= ferry::transport::kSlabRequestRingDoorbell,
                "an unknown op accepted");
          break;
        case SlabMessage::Kind::kBadRequest:
          Check(bound, "a bad request before the hello");
          return 0;  // the broker closes the connection
        case SlabMessage::Kind::kNeedMore:
          break;
      }
      in.erase(0, m.bytes);
    }
  }
  return 0;
}
