// ClientMessages as the wire carries them (serialized through protobuf), for unit tests of
// what reads a client's bytes: the message intake, the ring intake, the wire scan.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/v1/session.pb.h"

namespace ferry::testing {

/// A Submit{submit_id, `ops` empty fills} numbered `sequence` (0: unnumbered).
inline std::string SubmitOfFills(uint64_t ops, uint64_t submit_id, uint64_t sequence) {
  v1::ClientMessage m;
  m.set_sequence(sequence);
  m.mutable_submit()->set_submit_id(submit_id);
  for (uint64_t i = 0; i < ops; ++i) m.mutable_submit()->add_ops()->mutable_fill();
  return m.SerializeAsString();
}

/// A Submit{submit_id, one launch} numbered `sequence`, whose function's name is the one byte
/// `name_byte`: a string that is not UTF-8 when that byte is 0x80 or above.
inline std::string SubmitWithLaunchNamed(char name_byte, uint64_t submit_id, uint64_t sequence) {
  v1::ClientMessage m;
  m.set_sequence(sequence);
  m.mutable_submit()->set_submit_id(submit_id);
  m.mutable_submit()->add_ops()->mutable_launch()->set_function("f");
  std::string bytes = m.SerializeAsString();
  bytes[bytes.find('f')] = name_byte;
  return bytes;
}

}  // namespace ferry::testing
