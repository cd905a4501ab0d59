// A session's lifecycle (server/session/session.h, NextLifecycle): every transition, and
// every event that does not apply leaving the state alone, so a second Close or a late
// tear-down can never reopen or re-tear a session.
#include <gtest/gtest.h>

#include "session/session.h"

namespace ferry::session {
namespace {

using L = Lifecycle;
using E = LifecycleEvent;

TEST(SessionLifecycleTest, TheWayThroughCloseAndTearDown) {
  L s = L::kOpen;
  s = NextLifecycle(s, E::kClose);
  EXPECT_EQ(s, L::kClosing);
  s = NextLifecycle(s, E::kPostTearDown);
  EXPECT_EQ(s, L::kTearDownPosted);
  s = NextLifecycle(s, E::kTearDownFound);
  EXPECT_EQ(s, L::kTornDown);
}

TEST(SessionLifecycleTest, ATearDownThatFindsWorkGoesBackToClosing) {
  L s = NextLifecycle(L::kTearDownPosted, E::kTearDownDefers);
  EXPECT_EQ(s, L::kClosing);
  EXPECT_EQ(NextLifecycle(s, E::kPostTearDown), L::kTearDownPosted) << "posted again later";
}

TEST(SessionLifecycleTest, EventsThatDoNotApplyLeaveTheStateAlone) {
  const L all[] = {L::kOpen, L::kClosing, L::kTearDownPosted, L::kTornDown};
  const E events[] = {E::kClose, E::kPostTearDown, E::kTearDownFound, E::kTearDownDefers};
  // The only transitions there are; every other (state, event) pair keeps the state.
  auto expected = [](L s, E e) {
    if (s == L::kOpen && e == E::kClose) return L::kClosing;
    if (s == L::kClosing && e == E::kPostTearDown) return L::kTearDownPosted;
    if (s == L::kTearDownPosted && e == E::kTearDownFound) return L::kTornDown;
    if (s == L::kTearDownPosted && e == E::kTearDownDefers) return L::kClosing;
    return s;
  };
  for (L s : all) {
    for (E e : events) {
      EXPECT_EQ(NextLifecycle(s, e), expected(s, e))
          << "state " << static_cast<int>(s) << ", event " << static_cast<int>(e);
    }
  }
  // Nothing leads back to kOpen, and nothing leaves kTornDown.
  for (L s : all) {
    for (E e : events) {
      if (s != L::kOpen) EXPECT_NE(NextLifecycle(s, e), L::kOpen);
      if (s == L::kTornDown) EXPECT_EQ(NextLifecycle(s, e), L::kTornDown);
    }
  }
}

}  // namespace
}  // namespace ferry::session
