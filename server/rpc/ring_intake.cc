#include "rpc/ring_intake.h"

#include <chrono>
#include <thread>
#include <utility>

#include "ferry/trace_points.h"
#include "rpc/session_context.h"

namespace ferry::rpc {
namespace {

// Messages from the ring that are quick and have at most this many ops together are handled
// on the ring poller's thread when the poller has nothing else to do (no other ring has a
// message waiting); anything else goes to the executor's threads, so that neither one session's
// long submits nor many sessions' short ones hold up the other rings.
constexpr int kInlineOps = 8;
// When the session's executor is busy then (typically the completion watcher finishing the
// delivery that let the client submit again), the poller waits this long for it before handing
// the message to the io threads: a thread wake-up costs 5–30 µs on a VM, the end of a delivery
// a few.
constexpr std::chrono::microseconds kWaitForExecutor{50};
// The ring poller's thread, which every local session's ring shares, parses records itself
// only while one ring is busy (RingPoller::Taken::quiet: the fast path that may also run them
// there), and at most this many bytes of them per hand-over. Anything else is parsed on the
// session's executor (Drain), on an io thread, at most kParseSlice of a turn at a time: a
// client that writes records slow to parse (a 64 KiB record of empty ops took 0.7 ms, and up to
// 6 ms) spends its own session's turns, not the poller's time that other sessions' rings wait
// for.
constexpr size_t kParseOnPollerBudget = 64 << 10;
constexpr std::chrono::milliseconds kParseSlice{2};

}  // namespace

transport::RingPoller::Handler RingIntake::MakeHandler(session::Executor executor,
                                                       StreamGauges* gauges,
                                                       std::shared_ptr<IntakeGate> gate,
                                                       Deliver deliver) {
  return [executor = std::move(executor), gauges, gate = std::move(gate),
          deliver = std::move(deliver)](transport::RingPoller::Taken taken) {
    // Until each is handled (or its session is gone).
    gauges->messages_in_hand += static_cast<int64_t>(taken.records.size());
    const IntakeBounds bounds = gate->Get();
    std::vector<Record> records;
    records.reserve(taken.records.size());
    bool here = taken.quiet && taken.broken.empty();
    size_t parse_budget = taken.quiet ? kParseOnPollerBudget : 0;
    int ops = 0;
    for (std::string& record : taken.records) {
      Record& r = records.emplace_back();
      if (!record.empty() && record.size() > parse_budget) {
        r.unparsed = std::move(record);  // parsed on the executor, or the long lane
        here = false;
        parse_budget = 0;  // in ring order: none after it either
        continue;
      }
      parse_budget -= record.size();
      r.message = TakeClientMessage(record, bounds);
      if (!r.message->violation.ok()) {  // a protocol violation, in its place
        here = false;
      } else {
        here = here && IsQuick(*r.message);
        if (r.message->message->has_submit()) {
          FERRY_TRACE(trace::kTake, r.message->scan.submit_id);
          ops += static_cast<int>(r.message->scan.ops);
        }
      }
    }
    here = here && ops <= kInlineOps;
    std::function<void()> fn = [deliver, records = std::move(records),
                                broken = std::move(taken.broken)]() mutable {
      deliver(std::move(records), std::move(broken));
    };
    if (here) {
      const auto until = std::chrono::steady_clock::now() + kWaitForExecutor;
      FERRY_TRACE(trace::kRun0, 0);
      do {
        // The completions that queue meanwhile (the watcher found the executor busy with
        // these messages) are delivered here too: handed on, they would wait for an io
        // thread's wake-up, and a streaming client for them.
        if (executor.TryRun(fn, session::SerialExecutor::Followers::kRunHere)) {
          FERRY_TRACE(trace::kRun1, 0);
          return;
        }
        FERRY_TRACE(trace::kRunFail, 0);
        std::this_thread::yield();
      } while (std::chrono::steady_clock::now() < until);
    }
    executor.Post(std::move(fn), "ring messages");
  };
}

void RingIntake::Drop() {
  if (!ring_) return;
  ring_->Remove();
  ring_.reset();
  credits_ = 0;
  ClearBacklog();
}

void RingIntake::ClearBacklog() {
  Unhand(backlog_.size());
  backlog_.clear();
  broken_.clear();
}

void RingIntake::Arm(size_t credits, uint64_t bytes) {
  credits_ = credits;
  ring_->Arm(static_cast<uint32_t>(credits), std::max<uint64_t>(bytes, 1));
}

bool RingIntake::Take(std::vector<Record> records, std::string broken) {
  if (!ring_) {  // dropped after these were taken: the stream is ending
    Unhand(records.size());
    return false;
  }
  credits_ = 0;  // disarmed: the poller handed over what it took
  for (Record& r : records) backlog_.push_back(std::move(r));
  if (!broken.empty()) broken_ = std::move(broken);
  return true;
}

// The count of what is taken was bounded when the ring was armed; the host's limits (bytes in
// flight, the outbox) are looked at before each message, and a message the sequencer holds
// (waiting for a lower number from the stream) holds the rest. Messages taken together go to
// the session as runs of at most submit_run submits (Session::BeginSubmitRun): one completion
// watch per run, one batch for its kernel ops.
void RingIntake::Drain(Host& host) {
  if (draining_) return;  // called again from a message's handling: the loop goes on
  draining_ = true;
  std::shared_ptr<session::Session> run;  // the session a run is open on
  uint32_t run_submits = 0;
  auto end_run = [&] {
    if (run) run->EndSubmitRun();
    run = nullptr;
  };
  while (ring_ && !backlog_.empty() && !long_record_ && host.MayTakeRingMessage()) {
    std::shared_ptr<session::Session> session = host.ring_session();
    const uint32_t run_limit = session ? session->config().submit_run : 0;
    if (run && run_submits >= run_limit) end_run();
    if (!run && session && run_limit > 1 && backlog_.size() > 1) {
      run = session;
      run_submits = 0;
      run->BeginSubmitRun(OpsAhead(run_limit));
    }
    Record& front = backlog_.front();
    if (!front.unparsed.empty() && front.unparsed.size() <= kLongLaneRecordBytes) {
      // Left to the executor by the poller (kParseOnPollerBudget): parsed here, on an io
      // thread, never on a caller's thread (a gRPC thread, the completion watcher), and not
      // past the turn's slice: the rest after other sessions' work.
      if (session::SerialExecutor::RunningOnCallersThread() ||
          std::chrono::steady_clock::now() - session::SerialExecutor::TurnStart() > kParseSlice) {
        end_run();
        host.YieldRingDrain();
        break;
      }
      front.message = TakeClientMessage(front.unparsed, gate_->Get());
      front.unparsed.clear();
    }
    if (!front.unparsed.empty()) {
      // A large record: parsed and handled on the long lane, where the drain goes on; the
      // messages behind it wait.
      end_run();
      std::string record = std::move(front.unparsed);
      backlog_.pop_front();
      long_record_ = true;
      host.PostLongRecord(std::move(record));
      break;
    }
    std::shared_ptr<IncomingMessage> m = std::move(front.message);
    backlog_.pop_front();
    Unhand(1);
    const bool submit = m->message && m->message->has_submit();
    if (host.AcceptRingMessage(std::move(m)) && submit) ++run_submits;
  }
  end_run();
  if (ring_ && backlog_.empty() && !broken_.empty()) {
    const std::string broken = std::move(broken_);
    broken_.clear();
    host.RingBroken(broken);
  }
  draining_ = false;
}

void RingIntake::LongRecordDone() {
  long_record_ = false;
  Unhand(1);
}

uint64_t RingIntake::OpsAhead(uint32_t submits) const {
  uint64_t ops = 0;
  for (const Record& r : backlog_) {
    if (!r.message || r.message->scan.kind != v1::ClientMessage::kSubmit) continue;
    ops += r.message->scan.ops;
    if (--submits == 0) break;
  }
  return ops;
}

void RingIntake::Unhand(size_t n) {
  if (gauges_ && n) gauges_->messages_in_hand -= static_cast<int64_t>(n);
}

}  // namespace ferry::rpc
