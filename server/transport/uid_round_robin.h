// UidRoundRobin: a queue that serves its keys (uids) in turn, each key's items in the order
// they came. One uid with many items queued delays another uid's next item by at most one
// item per server, however many it has. Not thread-safe (its owner's lock guards it).
#pragma once

#include <sys/types.h>

#include <deque>
#include <map>
#include <utility>

namespace ferry::transport {

template <typename T>
class UidRoundRobin {
 public:
  void Push(uid_t uid, T item) { queued_[uid].push_back(std::move(item)); }
  bool empty() const { return queued_.empty(); }
  /// The front item of the uid after the one served last (wrapping around). Not empty().
  T Pop() {
    auto it = queued_.upper_bound(last_);
    if (it == queued_.end()) it = queued_.begin();
    T item = std::move(it->second.front());
    it->second.pop_front();
    last_ = it->first;
    if (it->second.empty()) queued_.erase(it);
    return item;
  }

 private:
  std::map<uid_t, std::deque<T>> queued_;  // no empty deques
  uid_t last_ = 0;
};

}  // namespace ferry::transport
