// Waiting for a backend Stream's work in tests of the backends (the conformance suite, the
// host backend's unit tests).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>

#include "backend/backend.h"

namespace ferry::backend::testing {

/// Wait up to `timeout` for everything enqueued on `stream` so far; the completion's status.
/// When OnComplete is not called in time the test fails and the process aborts: the callback
/// still references the stream's work, so nothing safe is left to do.
inline Status SyncStream(Stream& stream, std::chrono::seconds timeout) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> future = promise->get_future();
  stream.OnComplete([promise](Status status) { promise->set_value(std::move(status)); });
  if (future.wait_for(timeout) != std::future_status::ready) {
    ADD_FAILURE() << "OnComplete was not called within " << timeout.count() << " s";
    std::abort();
  }
  return future.get();
}

}  // namespace ferry::backend::testing
