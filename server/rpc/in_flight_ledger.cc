#include "rpc/in_flight_ledger.h"

#include <algorithm>
#include <string>

#include "rpc/session_context.h"

namespace ferry::rpc {

void InFlightLedger::AddUnanswered(uint64_t n) {
  unanswered_ += n;
  if (gauges_) gauges_->unanswered += static_cast<int64_t>(n);
}

Status InFlightLedger::ChargeSubmit(IncomingMessage& message, uint64_t session_limit) {
  const WireScan& scan = message.scan;
  const bool refused = !message.refusal.ok();
  // Saturating: download lengths are the client's word; admission checks them.
  constexpr uint64_t kMost = 1ull << 62;
  uint64_t charge = kMessageCost;
  if (!refused) {
    charge = std::min(kMost, charge + scan.parsed_bytes);
    charge = std::min(kMost, charge + std::min(kMost, scan.download_bytes));
    charge = std::min(kMost, charge + scan.downloads * kMessageCost);
  }
  AddUnanswered(1);
  charges_.push_back({scan.submit_id, charge, false, !refused && scan.downloads > 0});
  bytes_ += charge;
  if (gauges_) gauges_->bytes_in_flight += static_cast<int64_t>(charge);
  if (refused) return message.refusal;
  if (session_limit && charge > session_limit) {
    return Status(ErrorKind::kQuotaExceeded,
                  "the submit alone would make the daemon hold about " + std::to_string(charge) +
                      " bytes for the session (its ops, inline uploads and downloads), over "
                      "its in-flight limit of " +
                      std::to_string(session_limit) + " bytes (ferryd --session-in-flight-bytes)");
  }
  if (!registry_) return Status::Ok();
  // And to the daemon and the session's identity; the parse is held already. A refused
  // submit is charged the session's part only (its hold is refunded with it).
  const uint64_t rest = charge - std::min(charge, message.hold.bytes());
  FERRY_RETURN_IF_ERROR(registry_->ChargeInFlightBytes(account_.get(), rest));
  message.hold.Release();  // its bytes are part of `charge` now, given back with it
  charges_.back().held = true;
  return Status::Ok();
}

void InFlightLedger::Answered(const v1::ServerMessage& written) {
  uint64_t answers = 1;
  if (written.has_completed()) {
    // One Completed may answer a run of consecutive submits (coalesced completions).
    const uint64_t last = written.completed().submit_id();
    const uint64_t first =
        written.completed().first_submit_id() ? written.completed().first_submit_id() : last;
    answers = last - first + 1;
    while (!charges_.empty() && charges_.front().submit_id >= first &&
           charges_.front().submit_id <= last) {
      Release(charges_.front());
      charges_.pop_front();
    }
  } else if (!written.has_synchronized()) {
    return;
  }
  CountAnswered(answers);
}

bool InFlightLedger::AnsweredOnBoard(uint64_t submit_id) {
  // Its charge need not be the oldest: an earlier submit's Completed may still wait to be
  // written.
  auto it = std::find_if(charges_.begin(), charges_.end(),
                         [&](const Charge& c) { return c.submit_id == submit_id; });
  if (it == charges_.end() || it->downloads) return false;
  Release(*it);
  charges_.erase(it);
  CountAnswered(1);
  return true;
}

void InFlightLedger::Clear() {
  if (gauges_) {
    gauges_->unanswered -= static_cast<int64_t>(unanswered_);
    gauges_->bytes_in_flight -= static_cast<int64_t>(bytes_);
  }
  for (const Charge& c : charges_) {
    if (c.held && registry_) registry_->RefundInFlightBytes(account_.get(), c.bytes);
  }
  charges_.clear();
  unanswered_ = bytes_ = 0;
}

bool InFlightLedger::OverBytes(uint64_t session_limit, uint64_t outbox_bytes,
                               uint64_t headroom) const {
  if (session_limit && (bytes_ >= session_limit || outbox_bytes >= session_limit)) return true;
  return bytes_ > 0 && registry_ && registry_->InFlightBytesRoomBelow(account_.get(), headroom);
}

uint64_t InFlightLedger::Room(uint64_t session_limit) const {
  uint64_t room = registry_ ? registry_->InFlightBytesRoom(account_.get()) : UINT64_MAX;
  if (session_limit) room = std::min(room, session_limit - std::min(session_limit, bytes_));
  return room;
}

void InFlightLedger::Release(const Charge& c) {
  bytes_ -= c.bytes;
  if (gauges_) gauges_->bytes_in_flight -= static_cast<int64_t>(c.bytes);
  if (c.held && registry_) registry_->RefundInFlightBytes(account_.get(), c.bytes);
}

void InFlightLedger::CountAnswered(uint64_t n) {
  n = std::min(n, unanswered_);
  unanswered_ -= n;
  if (gauges_) gauges_->unanswered -= static_cast<int64_t>(n);
}

}  // namespace ferry::rpc
