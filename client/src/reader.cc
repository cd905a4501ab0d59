// The session's reader thread: applies the daemon's messages (download chunks,
// completions, Closed, errors) to the SessionState under its mutex.
#include <cstring>

#include "ferry/wire.h"
#include "session_state.h"

namespace ferry::internal {

void SessionState::ReadLoop() {
  v1::ServerMessage m;
  bool kept = false;  // a kept stream's Closed ends the reading (Closed.stream_kept)
  while (!kept && stream_->Read(&m)) {
    MutexLock lock(&mu_);
    answers_.fetch_add(1, std::memory_order_release);  // for waiters polling (Wait)
    switch (m.kind_case()) {
      case v1::ServerMessage::kDownloadChunk: {
        const auto& c = m.download_chunk();
        auto t = download_targets_.find(c.submit_id());
        if (t == download_targets_.end()) break;
        auto d = t->second.find(c.op_index());
        if (d == t->second.end()) break;
        auto [dest, length] = d->second;
        uint64_t end = 0;
        if (__builtin_add_overflow(c.offset(), c.data().size(), &end) || end > length) {
          dead_ = Status(ErrorKind::kProtocolViolation, "download chunk out of range");
          cv_.NotifyAll();
          return;
        }
        std::memcpy(static_cast<char*>(dest) + c.offset(), c.data().data(), c.data().size());
        break;
      }
      case v1::ServerMessage::kCompleted: {
        const auto& c = m.completed();
        const uint64_t last = c.submit_id();
        // A coalesced run (first_submit_id..submit_id) is of submits that all succeeded.
        const uint64_t first = c.first_submit_id() != 0 ? c.first_submit_id() : last;
        if (first > last || (first != last && c.has_error())) {
          dead_ = Status(ErrorKind::kProtocolViolation, "a coalesced Completed is malformed");
          cv_.NotifyAll();
          return;
        }
        last_completed_ = last;
        download_targets_.erase(download_targets_.lower_bound(first),
                                download_targets_.upper_bound(last));
        for (auto t = tracked_.lower_bound(first); t != tracked_.end() && t->first <= last; ++t) {
          t->second = c.has_error() ? wire::FromProto(c.error()) : Status::Ok();
        }
        if (c.has_error()) failures_[last] = wire::FromProto(c.error());
        cv_.NotifyAll();
        break;
      }
      case v1::ServerMessage::kSynchronized:  // libferry sends no Synchronize (protocol.md)
        cv_.NotifyAll();
        break;
      case v1::ServerMessage::kClosed:
        closed_stats_ = wire::StatsFromProto<SessionStats>(m.closed().stats());
        // A kept stream carries the next session's messages: read no further.
        stream_kept_ = kept = m.closed().stream_kept();
        kept_ms_ = m.closed().kept_ms();
        cv_.NotifyAll();
        break;
      case v1::ServerMessage::kError:
        dead_ = wire::FromProto(m.error());
        cv_.NotifyAll();
        break;
      case v1::ServerMessage::kDraining:
        draining_ = true;
        break;
      default:
        break;
    }
  }
  MutexLock lock(&mu_);
  answers_.fetch_add(1, std::memory_order_release);  // the stream's end, for waiters polling
  if (dead_.ok()) {
    dead_ = closed_stats_ ? Status(ErrorKind::kSessionClosed, "the session is closed")
                          : Status(ErrorKind::kUnavailable,
                                   "the daemon ended the session stream (daemon gone?)");
  }
  cv_.NotifyAll();
}
}  // namespace ferry::internal
