#include "session/registry.h"

namespace ferry::session {

uint64_t SessionRegistry::Add(std::string client_name, PeerIdentity peer,
                              std::shared_ptr<const SessionCounters> counters) {
  std::lock_guard lock(mu_);
  if (sessions_.size() >= max_sessions_) return 0;
  uint64_t id = next_id_++;
  ++sessions_total_;
  sessions_[id] = SessionEntry{id, std::move(client_name), std::move(peer),
                               std::chrono::steady_clock::now(), std::move(counters)};
  return id;
}

void SessionRegistry::Remove(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  const SessionCounters& c = *it->second.counters;
  closed_submits_ += c.submits;
  closed_ops_ += c.ops;
  closed_up_ += c.bytes_uploaded;
  closed_down_ += c.bytes_downloaded;
  sessions_.erase(it);
}

bool SessionRegistry::TryReserveDeviceBytes(uint64_t bytes) {
  uint64_t cur = device_bytes_reserved_.load();
  do {
    if (bytes > device_bytes_cap_ || cur > device_bytes_cap_ - bytes) return false;
  } while (!device_bytes_reserved_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

void SessionRegistry::ReleaseDeviceBytes(uint64_t bytes) { device_bytes_reserved_ -= bytes; }

std::vector<SessionEntry> SessionRegistry::List() const {
  std::lock_guard lock(mu_);
  std::vector<SessionEntry> out;
  out.reserve(sessions_.size());
  for (const auto& [id, e] : sessions_) out.push_back(e);
  return out;
}

DaemonTotals SessionRegistry::Totals() const {
  std::lock_guard lock(mu_);
  DaemonTotals t;
  t.sessions_open = sessions_.size();
  t.sessions_total = sessions_total_;
  t.device_bytes_reserved = device_bytes_reserved_.load();
  t.submits = closed_submits_;
  t.ops = closed_ops_;
  t.bytes_uploaded = closed_up_;
  t.bytes_downloaded = closed_down_;
  for (const auto& [id, e] : sessions_) {
    const SessionCounters& c = *e.counters;
    t.submits_in_flight += c.submits_in_flight;
    t.live_tensors += c.live_tensors;
    t.submits += c.submits;
    t.ops += c.ops;
    t.bytes_uploaded += c.bytes_uploaded;
    t.bytes_downloaded += c.bytes_downloaded;
  }
  return t;
}

}  // namespace ferry::session
