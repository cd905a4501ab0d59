// Checks through libferry that a daemon (or one session of it) still does ordinary work, for
// tests that first did something a daemon must survive. Failures are reported through gtest;
// a fatal one returns from the helper, so wrap calls in ASSERT_NO_FATAL_FAILURE where the test
// must stop there.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/client.h"

namespace ferry::testing {

/// Fill a tensor of `n` f32 with `value` on `session`, download it and expect `value` in every
/// element; the tensor is released before returning.
inline void ExpectRoundTrip(Session& session, int64_t n, float value) {
  Tensor t = session.create_tensor<float>({n});
  session.fill(t, value);
  auto back = session.download<float>(t);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, std::vector<float>(static_cast<size_t>(n), value));
}

/// ExpectRoundTrip on `session`, then close it (which must succeed).
inline void ExpectRoundTripAndClose(Session& session, int64_t n, float value) {
  ASSERT_NO_FATAL_FAILURE(ExpectRoundTrip(session, n, value));
  ASSERT_TRUE(session.close().ok());
}

/// Connect to `target`, open a session, ExpectRoundTripAndClose on it: the daemon still
/// serves a well-behaved client.
inline void ExpectServes(const std::string& target, int64_t n = 1000, float value = 2.5f) {
  auto client = Client::connect(target);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto session = client->open_session();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ExpectRoundTripAndClose(*session, n, value);
}

}  // namespace ferry::testing
