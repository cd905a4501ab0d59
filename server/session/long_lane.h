// LongLane: the threads for work that no slice cuts and that may hold its thread for long (a
// large graph's instantiation, a module's compile, a copy from a message's own memory:
// docs/architecture.md "Executors"), shared by every session, fair between identities.
//
// Every session's executor hands its long-lane turns here (SerialExecutor::Lane::kLong),
// named by its identity ("uid:N", "remote:NAME": registry.h IdentityOf). At most
// per_identity() of one identity's functions run at once: the lane's threads less one (at
// least one), so that while one tenant keeps the lane busy (its sessions each instantiating
// a large graph, for seconds) a thread stays free for another tenant's module load or direct
// copy. Functions that wait for a thread are started identity by identity in turn (as
// transport::UidRoundRobin serves uids), each identity's in the order they were posted: one
// identity with many waiting delays another's next one by at most one function per thread.
//
// Thread-safe. The io_context's `threads` threads (ferryd's "ferry-long") run the functions;
// the lane must outlive every function posted to it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>

#include "ferry/mutex.h"

namespace ferry::session {

class LongLane {
 public:
  /// `threads`: how many threads run `io` (at least 1).
  LongLane(boost::asio::io_context& io, int threads);

  /// Run `fn` on one of the lane's threads: now, when a thread is free and `identity` has
  /// fewer than per_identity() functions running; else once its turn comes.
  void Post(const std::string& identity, std::function<void()> fn);

  /// The most functions of one identity that run at once.
  int per_identity() const { return per_identity_; }
  /// Functions posted and not yet started (waiting for a thread or for their identity's turn).
  uint64_t waiting() const;

 private:
  // Hand `fn` to a thread; call with mu_ held, where a thread is free and `identity` below
  // its bound.
  void StartLocked(const std::string& identity, std::function<void()> fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A function of `identity` returned: start the next waiting one whose identity may run.
  void Finished(const std::string& identity);

  boost::asio::io_context& io_;
  const int threads_;
  const int per_identity_;
  mutable Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> running_by_identity_ ABSL_GUARDED_BY(mu_);  // no zeros
  // Waiting functions by identity (no empty deques), served in turn after `last_served_`.
  std::map<std::string, std::deque<std::function<void()>>> waiting_ ABSL_GUARDED_BY(mu_);
  std::string last_served_ ABSL_GUARDED_BY(mu_);
  uint64_t waiting_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::session
