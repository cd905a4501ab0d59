// Protobuf wire bytes written by hand, for tests that send what no message serializes to (a
// malformed field, a string that is not UTF-8) or a message too large to build as one (an op
// bomb): written out here, not taken from the code under test.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::testing {

/// A varint's bytes.
inline std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

/// A length-delimited field's bytes: its tag, its length, `payload`.
inline std::string LengthField(uint32_t number, const std::string& payload) {
  return Varint(uint64_t{number} << 3 | 2) + Varint(payload.size()) + payload;
}

/// A varint field's bytes.
inline std::string VarintField(uint32_t number, uint64_t value) {
  return Varint(uint64_t{number} << 3) + Varint(value);
}

/// The bytes of a ClientMessage holding Submit{submit_id, ops: `ops` empty fills} (4 bytes an
/// op, the cheapest op there is to send), numbered `sequence` (0: none) after it.
inline std::string OpBomb(uint64_t ops, uint64_t submit_id, uint64_t sequence = 0) {
  const std::string op("\x12\x02\x2a\x00", 4);  // Submit.ops { Op.fill {} }
  std::string submit = VarintField(1, submit_id);
  submit.reserve(submit.size() + ops * op.size());
  for (uint64_t i = 0; i < ops; ++i) submit += op;
  return LengthField(2, submit) + (sequence ? VarintField(10, sequence) : std::string());
}

}  // namespace ferry::testing
