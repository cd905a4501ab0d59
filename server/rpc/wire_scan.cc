#include "rpc/wire_scan.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ferry/v1/session.pb.h"

namespace ferry::rpc {
namespace {

namespace pb = google::protobuf;

// Memory a parse takes beyond each message object, per this build's protobuf (3.21; heap or
// arena): a repeated message element's pointer slot, a string or bytes field's object and its
// heap block's header, an unknown field's entry; repeated scalars and slots grow by doubling,
// so an element is counted twice.
constexpr uint64_t kSlotBytes = 2 * sizeof(void*);
constexpr uint64_t kStringBytes = sizeof(std::string) + 16;
constexpr uint64_t kUnknownFieldBytes = 32;
// ClientMessage nests five deep (ClientMessage, Submit, Op, Launch, KernelArg); the scan only
// descends into fields the schema declares, so this is a guard, not a rule clients meet.
constexpr int kMaxDepth = 16;

// What the scan reads a field for.
enum class Role : uint8_t {
  kNone,
  kKind,            // ClientMessage.kind (oneof)
  kSequence,        // ClientMessage.sequence
  kSubmitId,        // Submit.submit_id
  kOp,              // Submit.ops
  kOpKind,          // Op.kind (oneof)
  kUploadData,      // Upload.data
  kDownloadLength,  // Download.length
};

enum class Type : uint8_t { kVarint, kFixed32, kFixed64, kString, kBytes, kMessage };

struct Shape;

struct Field {
  bool known = false;
  Type type = Type::kVarint;
  bool repeated = false;
  uint8_t element_bytes = 0;  // a repeated scalar's element in memory
  Role role = Role::kNone;
  const Shape* message = nullptr;  // for kMessage
  const pb::FieldDescriptor* descriptor = nullptr;
};

// One message type's fields by number, and its object's size.
struct Shape {
  std::vector<Field> fields;
  uint64_t object_bytes = 0;
};

Type TypeOf(const pb::FieldDescriptor& f) {
  switch (f.type()) {
    case pb::FieldDescriptor::TYPE_MESSAGE:
    case pb::FieldDescriptor::TYPE_GROUP:
      return Type::kMessage;
    case pb::FieldDescriptor::TYPE_STRING:
      return Type::kString;
    case pb::FieldDescriptor::TYPE_BYTES:
      return Type::kBytes;
    case pb::FieldDescriptor::TYPE_FIXED32:
    case pb::FieldDescriptor::TYPE_SFIXED32:
    case pb::FieldDescriptor::TYPE_FLOAT:
      return Type::kFixed32;
    case pb::FieldDescriptor::TYPE_FIXED64:
    case pb::FieldDescriptor::TYPE_SFIXED64:
    case pb::FieldDescriptor::TYPE_DOUBLE:
      return Type::kFixed64;
    default:
      return Type::kVarint;
  }
}

uint8_t ElementBytes(const pb::FieldDescriptor& f) {
  switch (f.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return 1;
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_ENUM:
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return 4;
    default:
      return 8;
  }
}

// The schema of ClientMessage and everything it holds, as tables the scan indexes by field
// number. Built once.
class Schema {
 public:
  static const Schema& Get() {
    static const Schema* schema = new Schema();
    return *schema;
  }
  const Shape& client_message() const { return *root_; }
  /// The most the estimate can grow by per byte on the wire: any field takes at least 2 bytes
  /// (a tag and a byte), and costs at most its object and slot, a string's object and slot, an
  /// unknown field's entry or a repeated scalar's 16 bytes, plus at most its payload bytes; a
  /// packed element takes 1 byte and costs 16.
  uint64_t most_bytes_per_wire_byte() const { return most_per_byte_; }

 private:
  Schema() {
    const pb::Descriptor* client = v1::ClientMessage::descriptor();
    const pb::Descriptor* submit = v1::Submit::descriptor();
    const pb::Descriptor* op = v1::Op::descriptor();
    for (int i = 0; i < client->oneof_decl(0)->field_count(); ++i) {
      roles_[client->oneof_decl(0)->field(i)] = Role::kKind;
    }
    roles_[client->FindFieldByName("sequence")] = Role::kSequence;
    roles_[submit->FindFieldByName("submit_id")] = Role::kSubmitId;
    roles_[submit->FindFieldByName("ops")] = Role::kOp;
    for (int i = 0; i < op->oneof_decl(0)->field_count(); ++i) {
      roles_[op->oneof_decl(0)->field(i)] = Role::kOpKind;
    }
    roles_[v1::Upload::descriptor()->FindFieldByName("data")] = Role::kUploadData;
    roles_[v1::Download::descriptor()->FindFieldByName("length")] = Role::kDownloadLength;
    root_ = Make(client);
    uint64_t dearest = std::max({kStringBytes + kSlotBytes, kUnknownFieldBytes, uint64_t{16}});
    for (const auto& [d, shape] : shapes_)
      dearest = std::max(dearest, shape->object_bytes + kSlotBytes);
    most_per_byte_ = std::max<uint64_t>((dearest + 1) / 2 + 1, 16);
  }

  const Shape* Make(const pb::Descriptor* d) {
    if (auto it = shapes_.find(d); it != shapes_.end()) return it->second.get();
    auto owned = std::make_unique<Shape>();
    Shape* shape = owned.get();
    shapes_[d] = std::move(owned);  // before the fields: a type that holds itself finds it
    shape->object_bytes = pb::MessageFactory::generated_factory()->GetPrototype(d)->SpaceUsedLong();
    int max_number = 0;
    for (int i = 0; i < d->field_count(); ++i)
      max_number = std::max(max_number, d->field(i)->number());
    shape->fields.resize(static_cast<size_t>(max_number) + 1);
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* fd = d->field(i);
      Field& f = shape->fields[static_cast<size_t>(fd->number())];
      f.known = true;
      f.type = TypeOf(*fd);
      f.repeated = fd->is_repeated();
      f.element_bytes = ElementBytes(*fd);
      f.descriptor = fd;
      if (auto r = roles_.find(fd); r != roles_.end()) f.role = r->second;
      if (f.type == Type::kMessage) f.message = Make(fd->message_type());
    }
    return shape;
  }

  std::map<const pb::FieldDescriptor*, Role> roles_;
  std::map<const pb::Descriptor*, std::unique_ptr<Shape>> shapes_;
  const Shape* root_ = nullptr;
  uint64_t most_per_byte_ = 0;
};

// Checks that bytes fed to it, in pieces, are well-formed UTF-8 (the Unicode standard's table
// of well-formed byte sequences: no overlong forms, no surrogates, nothing past U+10FFFF).
class Utf8Check {
 public:
  bool Feed(const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const uint8_t b = p[i];
      if (need_ > 0) {
        if (b < lo_ || b > hi_) return false;
        --need_;
        lo_ = 0x80;
        hi_ = 0xBF;
        continue;
      }
      if (b < 0x80) continue;
      if (b >= 0xC2 && b <= 0xDF) {
        Expect(1, 0x80, 0xBF);
      } else if (b == 0xE0) {
        Expect(2, 0xA0, 0xBF);
      } else if (b == 0xED) {
        Expect(2, 0x80, 0x9F);
      } else if (b >= 0xE1 && b <= 0xEF) {
        Expect(2, 0x80, 0xBF);
      } else if (b == 0xF0) {
        Expect(3, 0x90, 0xBF);
      } else if (b >= 0xF1 && b <= 0xF3) {
        Expect(3, 0x80, 0xBF);
      } else if (b == 0xF4) {
        Expect(3, 0x80, 0x8F);
      } else {
        return false;
      }
    }
    return true;
  }
  bool complete() const { return need_ == 0; }

 private:
  void Expect(int need, uint8_t lo, uint8_t hi) {
    need_ = need;
    lo_ = lo;
    hi_ = hi;
  }
  int need_ = 0;
  uint8_t lo_ = 0x80, hi_ = 0xBF;
};

// A message's bytes, read front to back from one buffer (a ring record) or from a
// ZeroCopyInputStream's pieces (a gRPC message arrives in slices). Offsets count from the
// message's start; every read is bounded by an `end` offset the caller passes (the end of the
// message it reads in), so nothing past a field's message is ever read. Reads within one piece
// take the fast path; only a value that straddles two pieces is read a byte at a time.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes)
      : piece_(reinterpret_cast<const uint8_t*>(bytes.data())),
        p_(piece_),
        end_(piece_ + bytes.size()) {}
  explicit Cursor(pb::io::ZeroCopyInputStream& stream) : stream_(&stream) {}

  uint64_t offset() const { return before_ + static_cast<uint64_t>(p_ - piece_); }

  // A varint of at most `max_bytes` bytes (protobuf's parser reads a tag or a length in at most
  // 5, any other varint in at most 10) that ends before `end`, modulo 2^64; false when it is cut
  // short there or runs longer.
  bool Varint(uint64_t end, int max_bytes, uint64_t* value) {
    const uint64_t room = std::min<uint64_t>(static_cast<uint64_t>(end_ - p_), end - offset());
    uint64_t v = 0;
    if (room >= static_cast<uint64_t>(max_bytes)) {
      for (int i = 0; i < max_bytes; ++i) {
        const uint8_t b = p_[i];
        v |= uint64_t{b & 0x7fu} << (7 * i);
        if (b < 0x80) {
          p_ += i + 1;
          *value = v;
          return true;
        }
      }
      return false;
    }
    for (int i = 0; i < max_bytes && offset() < end; ++i) {
      if (p_ == end_ && !Refill()) return false;
      const uint8_t b = *p_++;
      v |= uint64_t{b & 0x7fu} << (7 * i);
      if (b < 0x80) {
        *value = v;
        return true;
      }
    }
    return false;
  }

  // Consume the next `n` bytes, handing them to `fn(const uint8_t*, uint64_t)` in the pieces
  // they lie in; false when the input ends first. The caller has checked `n` against its end.
  template <typename Fn>
  bool Pieces(uint64_t n, Fn&& fn) {
    while (n > 0) {
      if (p_ == end_ && !Refill()) return false;
      const uint64_t take = std::min<uint64_t>(n, static_cast<uint64_t>(end_ - p_));
      fn(p_, take);
      p_ += take;
      n -= take;
    }
    return true;
  }
  bool Skip(uint64_t n) {
    return Pieces(n, [](const uint8_t*, uint64_t) {});
  }

 private:
  // The next non-empty piece of the stream; false at its end (or for a buffer).
  bool Refill() {
    if (!stream_) return false;
    const void* data = nullptr;
    int size = 0;
    while (stream_->Next(&data, &size)) {
      if (size <= 0) continue;
      before_ = offset();
      piece_ = p_ = static_cast<const uint8_t*>(data);
      end_ = piece_ + size;
      return true;
    }
    return false;
  }

  pb::io::ZeroCopyInputStream* stream_ = nullptr;
  const uint8_t* piece_ = nullptr;  // the piece being read, p_ in it, end_ its end
  const uint8_t* p_ = nullptr;
  const uint8_t* end_ = nullptr;
  uint64_t before_ = 0;  // bytes of the message before piece_
};

// protobuf's parser reads a length in at most 5 bytes and refuses one of 2 GiB or more.
constexpr int kMaxLengthBytes = 5;
constexpr uint64_t kMaxLength = (uint64_t{1} << 31) - 1;

class Scanner {
 public:
  Scanner(Cursor& in, uint64_t max_parsed_bytes, WireScan& out)
      : in_(in), max_(max_parsed_bytes), out_(out) {}

  // Walk the fields of a message of `shape` that ends at offset `end`; false (out_.status set)
  // when the bytes are not such a message.
  bool Message(const Shape& shape, int depth, uint64_t end) {
    while (in_.offset() < end) {
      if (out_.over_budget && depth > 0) {
        // Already refused: only the top level's fields (the sequence) are still wanted.
        return in_.Skip(end - in_.offset()) || Malformed("a field is cut short");
      }
      // A tag as protobuf's parser reads it: at most 5 bytes, kept modulo 2^32.
      uint64_t tag64 = 0;
      if (!in_.Varint(end, 5, &tag64)) {
        return Malformed("a tag is cut short or longer than 5 bytes");
      }
      const auto tag = static_cast<uint32_t>(tag64);
      const uint32_t number = tag >> 3;
      const uint32_t wire = tag & 7;
      if (number == 0) return Malformed("a field has number 0 or a cut-short tag");
      const Field* f = number < shape.fields.size() && shape.fields[number].known
                           ? &shape.fields[number]
                           : nullptr;
      bool ok = false;
      switch (wire) {
        case 0:
          ok = Varint(f, end);
          break;
        case 1:
          ok = Fixed(f, Type::kFixed64, end);
          break;
        case 5:
          ok = Fixed(f, Type::kFixed32, end);
          break;
        case 2:
          ok = LengthDelimited(f, number, depth, end);
          break;
        default:
          return Malformed("wire type " + std::to_string(wire) +
                           " (groups are not in the protocol)");
      }
      if (!ok) return false;
    }
    return true;
  }

 private:
  // Not a ClientMessage: the scan stops. This outranks a bad string found before.
  bool Malformed(const std::string& what) {
    if (out_.status.kind() != ErrorKind::kProtocolViolation) {
      out_.status = Status(ErrorKind::kProtocolViolation,
                           "the message is not a ClientMessage: " + what + " (at byte " +
                               std::to_string(in_.offset()) + ")");
    }
    return false;
  }

  void Cost(uint64_t bytes) {
    out_.parsed_bytes =
        bytes > UINT64_MAX - out_.parsed_bytes ? UINT64_MAX : out_.parsed_bytes + bytes;
    if (max_ && out_.parsed_bytes > max_) out_.over_budget = true;
  }
  void Unknown(uint64_t payload) { Cost(kUnknownFieldBytes + payload); }
  // A scalar field of `f` as the parse keeps it.
  void Scalar(const Field& f) {
    if (f.repeated) Cost(2 * uint64_t{f.element_bytes});
  }

  bool Varint(const Field* f, uint64_t end) {
    uint64_t v = 0;
    if (!in_.Varint(end, 10, &v)) return Malformed("a varint is cut short or longer than 10 bytes");
    if (!f || f->type != Type::kVarint) {
      Unknown(0);
      return true;
    }
    Scalar(*f);
    switch (f->role) {
      case Role::kSequence:
        out_.sequence = v;
        break;
      case Role::kSubmitId:
        out_.submit_id = v;
        break;
      case Role::kDownloadLength:
        if (!out_.over_budget) {
          ++out_.downloads;
          out_.download_bytes =
              v > UINT64_MAX - out_.download_bytes ? UINT64_MAX : out_.download_bytes + v;
        }
        break;
      default:
        break;
    }
    return true;
  }

  bool Fixed(const Field* f, Type type, uint64_t end) {
    const uint64_t size = type == Type::kFixed64 ? 8 : 4;
    if (end - in_.offset() < size || !in_.Skip(size)) {
      return Malformed("a fixed-size field is cut short");
    }
    if (f && f->type == type) {
      Scalar(*f);
    } else {
      Unknown(0);
    }
    return true;
  }

  bool LengthDelimited(const Field* f, uint32_t number, int depth, uint64_t end) {
    uint64_t length = 0;
    if (!in_.Varint(end, kMaxLengthBytes, &length) || length > kMaxLength) {
      return Malformed("a length is cut short, longer than 5 bytes or 2 GiB or more");
    }
    if (length > end - in_.offset()) {
      return Malformed("a length of " + std::to_string(length) + " passes its message's end");
    }
    if (f && f->type == Type::kMessage) return Nested(*f, number, length, depth);
    if (f && (f->type == Type::kString || f->type == Type::kBytes)) {
      Cost(kStringBytes + length + (f->repeated ? kSlotBytes : 0));
      if (f->role == Role::kUploadData && !out_.over_budget) out_.upload_bytes += length;
      if (f->type == Type::kString) return Utf8(*f, length);
      return in_.Skip(length) || Malformed("a field is cut short");
    }
    if (f && f->repeated) return Packed(*f, length);  // a packed repeated scalar
    Unknown(length);
    return in_.Skip(length) || Malformed("a field is cut short");
  }

  bool Nested(const Field& f, uint32_t number, uint64_t length, int depth) {
    Cost(f.message->object_bytes + (f.repeated ? kSlotBytes : 0));
    if (f.role == Role::kKind) out_.kind = number;
    if (f.role == Role::kOp && !out_.over_budget) ++out_.ops;
    if (f.role == Role::kOpKind && number < 32 && !out_.over_budget) out_.op_kinds |= 1u << number;
    if (depth + 1 >= kMaxDepth) return Malformed("messages nest too deep");
    return Message(*f.message, depth + 1, in_.offset() + length);
  }

  // A packed repeated scalar: `length` bytes of varints or fixed-size values.
  bool Packed(const Field& f, uint64_t length) {
    uint64_t elements = 0;
    if (f.type == Type::kVarint) {
      // A varint ends at each byte below 0x80: the last byte must be one, and none is longer
      // than 10 bytes (protobuf refuses it).
      uint32_t run = 0;  // bytes of the varint being read so far
      bool too_long = false;
      const bool whole = in_.Pieces(length, [&](const uint8_t* p, uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) {
          ++run;
          too_long = too_long || run > 10;
          if (p[i] < 0x80) {
            ++elements;
            run = 0;
          }
        }
      });
      if (!whole) return Malformed("a packed field is cut short");
      if (too_long) return Malformed("a packed varint is longer than 10 bytes");
      if (run != 0) return Malformed("a packed varint is cut short");
    } else {
      const uint64_t size = f.type == Type::kFixed64 ? 8 : 4;
      if (length % size != 0) {
        return Malformed("a packed field's length is not a multiple of its values");
      }
      elements = length / size;
      if (!in_.Skip(length)) return Malformed("a packed field is cut short");
    }
    Cost(elements * 2 * uint64_t{f.element_bytes});
    return true;
  }

  // A string field's bytes, which must be UTF-8 (proto3: the parse refuses anything else). One
  // that is not is noted and the scan goes on (the message's sequence may come after it).
  bool Utf8(const Field& f, uint64_t length) {
    Utf8Check check;
    bool valid = true;
    if (!in_.Pieces(length, [&](const uint8_t* p, uint64_t n) {
          valid = valid && check.Feed(p, static_cast<size_t>(n));
        })) {
      return Malformed("a string is cut short");
    }
    if (!(valid && check.complete()) && out_.status.ok()) {
      out_.status = Status(ErrorKind::kInvalidArgument,
                           "field " + f.descriptor->full_name() + " is not valid UTF-8");
    }
    return true;
  }

  Cursor& in_;
  const uint64_t max_;
  WireScan& out_;
};

WireScan Scan(Cursor& in, uint64_t size, uint64_t max_parsed_bytes) {
  WireScan out;
  if (size > kMaxLength) {
    out.status = Status(ErrorKind::kProtocolViolation, "a message of " + std::to_string(size) +
                                                           " bytes (protobuf's most is 2 GiB)");
    return out;
  }
  // The parse makes the top message's object too (an empty message holds that much).
  const Shape& top = Schema::Get().client_message();
  out.parsed_bytes = top.object_bytes;
  Scanner scanner(in, max_parsed_bytes, out);
  scanner.Message(top, 0, size);
  return out;
}

}  // namespace

uint64_t MostParsedBytes(uint64_t size) {
  const Schema& schema = Schema::Get();
  const uint64_t per_byte = schema.most_bytes_per_wire_byte();
  const uint64_t top = schema.client_message().object_bytes;
  if (size > (UINT64_MAX - top) / per_byte) return UINT64_MAX;
  return top + size * per_byte;
}

WireScan ScanClientMessage(pb::io::ZeroCopyInputStream& stream, uint64_t size,
                           uint64_t max_parsed_bytes) {
  Cursor in(stream);
  return Scan(in, size, max_parsed_bytes);
}

WireScan ScanClientMessage(std::string_view bytes, uint64_t max_parsed_bytes) {
  Cursor in(bytes);
  return Scan(in, bytes.size(), max_parsed_bytes);
}

}  // namespace ferry::rpc
