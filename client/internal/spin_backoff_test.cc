#include "client/internal/spin_backoff.h"

#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace client_internal {
namespace {

// How many waits in a row sleep before the next one spins.
int SleepsBeforeSpin(SpinBackoff& b) {
  int sleeps = 0;
  while (!b.ShouldSpin()) ++sleeps;
  return sleeps;
}

TEST(SpinBackoffTest, SpinsUntilASpinRunsOut) {
  SpinBackoff b;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(b.ShouldSpin());
    b.Succeeded();
  }
}

TEST(SpinBackoffTest, ASpinInTimeEndsTheBackOff) {
  SpinBackoff b;
  b.RanOut();
  EXPECT_EQ(SleepsBeforeSpin(b), 1);
  b.RanOut();
  EXPECT_EQ(SleepsBeforeSpin(b), 2);
  b.RanOut();
  EXPECT_EQ(SleepsBeforeSpin(b), 4);
  b.Succeeded();
  b.RanOut();
  EXPECT_EQ(SleepsBeforeSpin(b), 1);
}

TEST(SpinBackoffTest, TheSleepsStopAtTheCap) {
  SpinBackoff b;
  std::vector<int> seen;
  for (int i = 0; i < 10; ++i) {
    b.RanOut();
    seen.push_back(SleepsBeforeSpin(b));
  }
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 64, 64, 64}));
}

}  // namespace
}  // namespace client_internal
}  // namespace downpour
