#include "transport/channel_stock.h"

#include <optional>

namespace ferry::transport {

std::shared_ptr<ChannelStock> ChannelStock::Create(
    uint64_t ring_bytes, size_t depth, std::function<void(std::function<void()>)> run_later) {
  std::shared_ptr<ChannelStock> stock(new ChannelStock(ring_bytes, depth, std::move(run_later)));
  stock->Refill();  // the first sessions find their pairs ready
  return stock;
}

ChannelStock::Channels ChannelStock::Make(uint64_t ring_bytes) {
  Channels c{CompletionBoard::Create(),
             Status(ErrorKind::kInvalidArgument, "no submit ring (its size is 0)")};
  if (ring_bytes > 0) c.ring = SubmitRing::Create(ring_bytes);
  return c;
}

ChannelStock::Channels ChannelStock::Take() {
  std::optional<Channels> taken;
  bool post = false;
  {
    MutexLock lock(&mu_);
    if (!ready_.empty()) {
      taken = std::move(ready_.front());
      ready_.pop_front();
    }
    if (!refill_posted_ && ready_.size() < depth_) post = refill_posted_ = true;
  }
  if (post) {
    run_later_([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->Refill();
    });
  }
  return taken ? std::move(*taken) : Make(ring_bytes_);
}

void ChannelStock::Refill() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (ready_.size() >= depth_) {
        refill_posted_ = false;
        return;
      }
    }
    Channels made = Make(ring_bytes_);  // outside the lock: a Take meanwhile makes its own
    MutexLock lock(&mu_);
    ready_.push_back(std::move(made));
  }
}

size_t ChannelStock::ready() const {
  MutexLock lock(&mu_);
  return ready_.size();
}

}  // namespace ferry::transport
