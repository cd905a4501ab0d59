// Fuzz target: the daemon's side of the submit ring (server/transport/submit_ring.cc), with the
// client's side of the shared memory in the fuzzer's hands.
//
// The input is a little program the "client" runs against one fresh ring of 4 KiB: each
// step writes bytes into the data area, stores a head, or has the daemon Take. What must
// hold whatever the client writes: Take never reads outside the mapping (ASan would see it),
// a record is never longer than the ring, the daemon's published tail never passes the head
// it accepted, and a broken ring stays broken.
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz_check.h"
#include "transport/submit_ring.h"

using ferry::transport::SubmitRing;

namespace {

struct Input {
  const uint8_t* p;
  size_t n;
  bool Empty() const { return n == 0; }
  uint8_t U8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{U8()} << (8 * i);
    return v;
  }
};

void Check(bool ok, const char* what) { ferry::fuzz::CheckOrAbort(ok, "submit_ring_fuzz", what); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto created = SubmitRing::Create(SubmitRing::kMinCapacity);
  Check(created.ok(), "Create failed");
  std::unique_ptr<SubmitRing> ring = std::move(*created);
  // The client's own mapping of the same memfd, as libferry maps it.
  void* m = mmap(nullptr, ring->map_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, ring->memfd(), 0);
  Check(m != MAP_FAILED, "mmap failed");
  char* client = static_cast<char*>(m);
  char* ring_data = client + SubmitRing::kHeaderBytes;
  const uint64_t capacity = ring->capacity();

  Input in{data, size};
  uint64_t head = 0;  // what the client last stored
  bool broken = false;
  std::string record, why;
  for (int step = 0; step < 256 && !in.Empty(); ++step) {
    switch (in.U8() % 5) {
      case 0: {  // a well-formed record at the client's head (when it fits): deeper paths
        uint32_t len = in.U8() * 8 + in.U8() % 8;
        uint64_t at = head & (capacity - 1);
        if (at + 8 + len > capacity) break;
        std::memcpy(ring_data + at, &len, 4);
        std::memset(ring_data + at + 4, 0, 4);
        std::memset(ring_data + at + 8, 'r', len);
        head += 8 + ((len + 7) & ~7u);
        std::memcpy(client + SubmitRing::kHeadOffset, &head, 8);
        break;
      }
      case 1: {  // raw bytes anywhere in the data area
        uint64_t at = (in.U8() | (uint64_t{in.U8()} << 8)) & (capacity - 1);
        size_t len = in.U8() % 16;
        for (size_t i = 0; i < len && at + i < capacity; ++i) ring_data[at + i] = in.U8();
        break;
      }
      case 2:  // any head at all
        head = in.U64();
        std::memcpy(client + SubmitRing::kHeadOffset, &head, 8);
        break;
      case 3: {  // a skip marker at the head
        uint64_t at = head & (capacity - 1);
        uint32_t skip = SubmitRing::kSkipToStart;
        if (at + 4 <= capacity) std::memcpy(ring_data + at, &skip, 4);
        break;
      }
      default: {  // the daemon takes
        (void)ring->HasRecord();
        SubmitRing::Took t = ring->Take(&record, &why);
        if (t == SubmitRing::Took::kBroken) {
          Check(!why.empty(), "broken without a reason");
          broken = true;
        } else {
          Check(!broken, "a broken ring came back");
        }
        if (t == SubmitRing::Took::kRecord) {
          Check(record.size() + 8 <= capacity, "a record longer than the ring");
        }
        uint64_t tail = 0;
        std::memcpy(&tail, client + SubmitRing::kTailOffset, 8);
        if (!broken) Check(head - tail <= capacity, "the tail passed the head");
        break;
      }
    }
  }
  munmap(m, ring->map_bytes());
  return 0;
}
