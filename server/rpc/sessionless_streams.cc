#include "rpc/sessionless_streams.h"

#include <utility>

namespace ferry::rpc {

SessionlessStreams::Ticket& SessionlessStreams::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    identity_ = std::move(other.identity_);
  }
  return *this;
}

void SessionlessStreams::Ticket::Release() {
  if (owner_ == nullptr) return;
  std::exchange(owner_, nullptr)->Give(identity_);
}

Result<SessionlessStreams::Ticket> SessionlessStreams::Admit(const std::string& identity) {
  return Take(identity, /*count_refusal=*/true);
}

std::optional<SessionlessStreams::Ticket> SessionlessStreams::Keep(const std::string& identity) {
  Result<Ticket> ticket = Take(identity, /*count_refusal=*/false);
  if (!ticket.ok()) return std::nullopt;
  return std::move(*ticket);
}

Result<SessionlessStreams::Ticket> SessionlessStreams::Take(const std::string& identity,
                                                            bool count_refusal) {
  MutexLock lock(&mu_);
  if (limits_.total != 0 && count_ >= limits_.total) {
    if (count_refusal) ++refused_total_limit_;
    return Status(ErrorKind::kUnavailable,
                  "the daemon holds its maximum of streams without a session (" +
                      std::to_string(limits_.total) + ", max-sessionless-streams)");
  }
  uint32_t& mine = by_identity_[identity];
  if (limits_.per_identity != 0 && mine >= limits_.per_identity) {
    if (count_refusal) ++refused_per_identity_;
    return Status(ErrorKind::kUnavailable,
                  identity + " holds its maximum of streams without a session (" +
                      std::to_string(limits_.per_identity) + ", max-sessionless-streams-per-uid)");
  }
  ++mine;
  ++count_;
  return Ticket(this, identity);
}

SessionlessStreams::Ticket SessionlessStreams::Hold(const std::string& identity) {
  MutexLock lock(&mu_);
  ++by_identity_[identity];
  ++count_;
  return Ticket(this, identity);
}

void SessionlessStreams::Give(const std::string& identity) {
  MutexLock lock(&mu_);
  auto it = by_identity_.find(identity);
  if (it == by_identity_.end()) return;
  if (--it->second == 0) by_identity_.erase(it);
  --count_;
}

uint64_t SessionlessStreams::count() const {
  MutexLock lock(&mu_);
  return count_;
}

uint64_t SessionlessStreams::refused_per_identity() const {
  MutexLock lock(&mu_);
  return refused_per_identity_;
}

uint64_t SessionlessStreams::refused_total_limit() const {
  MutexLock lock(&mu_);
  return refused_total_limit_;
}

}  // namespace ferry::rpc
