#include "session/long_lane.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <utility>

namespace ferry::session {

LongLane::LongLane(boost::asio::io_context& io, int threads)
    : io_(io), threads_(std::max(threads, 1)), per_identity_(std::max(threads_ - 1, 1)) {}

void LongLane::Post(const std::string& identity, std::function<void()> fn) {
  MutexLock lock(&mu_);
  auto running = running_by_identity_.find(identity);
  const bool identity_may_run =
      running == running_by_identity_.end() || running->second < per_identity_;
  // Behind its own identity's waiting functions, whatever the threads: in order.
  if (running_ < threads_ && identity_may_run && waiting_.count(identity) == 0) {
    StartLocked(identity, std::move(fn));
    return;
  }
  waiting_[identity].push_back(std::move(fn));
  ++waiting_count_;
}

uint64_t LongLane::waiting() const {
  MutexLock lock(&mu_);
  return waiting_count_;
}

void LongLane::StartLocked(const std::string& identity, std::function<void()> fn) {
  ++running_;
  ++running_by_identity_[identity];
  last_served_ = identity;
  boost::asio::post(io_, [this, identity, fn = std::move(fn)] {
    fn();
    Finished(identity);
  });
}

void LongLane::Finished(const std::string& identity) {
  MutexLock lock(&mu_);
  --running_;
  auto it = running_by_identity_.find(identity);
  if (--it->second == 0) running_by_identity_.erase(it);
  // Post and Finished never leave a thread free while a waiting function may start, so this
  // one freed thread starts at most one: the next identity after the one served last
  // (wrapping around) that is below its bound.
  if (waiting_.empty()) return;
  auto next = waiting_.upper_bound(last_served_);
  for (size_t looked = 0; looked < waiting_.size(); ++looked, ++next) {
    if (next == waiting_.end()) next = waiting_.begin();
    auto r = running_by_identity_.find(next->first);
    if (r != running_by_identity_.end() && r->second >= per_identity_) continue;
    std::function<void()> fn = std::move(next->second.front());
    next->second.pop_front();
    --waiting_count_;
    const std::string served = next->first;
    if (next->second.empty()) waiting_.erase(next);
    StartLocked(served, std::move(fn));
    return;
  }
  // Every waiting identity is at its bound: one of its own turns will start its next.
}

}  // namespace ferry::session
