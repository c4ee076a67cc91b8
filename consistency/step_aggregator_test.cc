#include "consistency/step_aggregator.h"

#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace {

TEST(StepAggregatorTest, HoldsUntilEnoughRanksThenHandsThemBackInRankOrder) {
  StepAggregator steps(/*ranks=*/3, /*needed=*/2);
  const std::vector<float> a = {1, 2}, b = {3, 4};
  EXPECT_EQ(steps.Add(2, 0, {}, b, /*waiter=*/7), StepAggregator::kHeld);
  EXPECT_EQ(steps.held_steps(), 1u);
  // A resend of the same rank and clock is not a second rank.
  EXPECT_EQ(steps.Add(2, 0, {}, b, 8), StepAggregator::kHeld);
  EXPECT_EQ(steps.PushedCount(0), 1);
  EXPECT_EQ(steps.Add(0, 0, {}, a, 9), StepAggregator::kComplete);
  const auto& pushes = steps.Pushes(0);
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_TRUE(pushes[0].pushed);
  EXPECT_EQ(
      std::vector<float>(pushes[0].Grads().begin(), pushes[0].Grads().end()),
      a);
  EXPECT_FALSE(pushes[1].pushed);
  EXPECT_EQ(
      std::vector<float>(pushes[2].Grads().begin(), pushes[2].Grads().end()),
      b);
  // Held pushes are copies; the one that completed the step is read from
  // its caller's buffer, which outlives the step's application.
  EXPECT_NE(pushes[2].Grads().data(), b.data());
  EXPECT_EQ(pushes[0].Grads().data(), a.data());
  StepAggregator::Finished f = steps.Finish(0, /*completing=*/9);
  EXPECT_EQ(f.waiters, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(f.ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(steps.next_clock(), 1);
  EXPECT_EQ(steps.held_steps(), 0u);
  // The third rank is late for clock 0.
  EXPECT_EQ(steps.Add(1, 0, {}, a, 0), StepAggregator::kLate);
}

TEST(StepAggregatorTest, TheMeanIsTheRankOrderedSumWhateverTheArrivalOrder) {
  // 5000 floats (more than one block and not a multiple of it) from ranks
  // 3, 0 and 2 of 4, arriving in that order; rank 1 does not push.
  const size_t n = 5000;
  std::vector<std::vector<float>> g(4, std::vector<float>(n));
  uint64_t x = 88172645463325252ull;
  for (auto& v : g) {
    for (float& f : v) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      f = static_cast<float>(static_cast<double>(x % 2000001) / 1e6 - 1.0);
    }
  }
  StepAggregator steps(/*ranks=*/4, /*needed=*/3);
  EXPECT_EQ(steps.Add(3, 0, {}, g[3], 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(0, 0, {}, g[0], 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(2, 0, {}, g[2], 0), StepAggregator::kComplete);
  std::vector<float> mean;
  steps.Mean(0, n, &mean);
  ASSERT_EQ(mean.size(), n);
  size_t differ_from_arrival_order = 0;
  for (size_t j = 0; j < n; ++j) {
    const float expected = (((0.0f + g[0][j]) + g[2][j]) + g[3][j]) / 3.0f;
    ASSERT_EQ(mean[j], expected) << j;  // bit for bit
    const float arrival = (((0.0f + g[3][j]) + g[0][j]) + g[2][j]) / 3.0f;
    differ_from_arrival_order += arrival != expected;
  }
  // The order matters for floats: the test would see the wrong one.
  EXPECT_GT(differ_from_arrival_order, 0u);
  steps.Finish(0, 0);
}

TEST(StepAggregatorTest, KeyBatchesAreKeptWithTheirKeys) {
  StepAggregator steps(2, 2);
  const std::vector<uint64_t> k0 = {5, 1}, k1 = {};
  const std::vector<float> g0 = {0.5f, 0.25f};
  EXPECT_EQ(steps.Add(1, 4, k1, {}, 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(0, 4, k0, g0, 0), StepAggregator::kComplete);
  EXPECT_EQ(std::vector<uint64_t>(steps.Pushes(4)[0].Keys().begin(),
                                  steps.Pushes(4)[0].Keys().end()),
            k0);
  EXPECT_TRUE(steps.Pushes(4)[1].Keys().empty());
  steps.Finish(4, 0);
  EXPECT_EQ(steps.next_clock(), 5);
}

TEST(StepAggregatorTest, DirectStepsAndAReplicaCatchingUp) {
  StepAggregator one(1, 1);
  EXPECT_EQ(one.AddDirect(0), StepAggregator::kComplete);
  one.Finish(0, 0);
  EXPECT_EQ(one.AddDirect(0), StepAggregator::kLate);
  EXPECT_EQ(one.AddDirect(3), StepAggregator::kComplete);

  StepAggregator steps(2, 2);
  const std::vector<float> g = {1};
  EXPECT_EQ(steps.Add(0, 2, {}, g, 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(0, 3, {}, g, 0), StepAggregator::kHeld);
  steps.set_next_clock(3);  // a replica learns clocks below 3 are applied
  EXPECT_EQ(steps.held_steps(), 1u);
  EXPECT_EQ(steps.Add(1, 2, {}, g, 0), StepAggregator::kLate);
  steps.set_next_clock(1);  // never moves back
  EXPECT_EQ(steps.next_clock(), 3);
  EXPECT_EQ(steps.Add(1, 3, {}, g, 0), StepAggregator::kComplete);
}

TEST(StepAggregatorTest, ARetiredRankIsDroppedAndFewerRanksCompleteAStep) {
  StepAggregator steps(/*ranks=*/3, /*needed=*/3);
  const std::vector<float> a = {1}, b = {2}, c = {4};
  // Clock 5: ranks 1 and 2 pushed, rank 0 not yet; clock 6: only rank 2.
  EXPECT_EQ(steps.Add(1, 5, {}, b, /*waiter=*/11), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(2, 5, {}, c, 12), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(2, 6, {}, c, 13), StepAggregator::kHeld);
  std::vector<uint64_t> orphans;
  // Rank 2 retires: its pushes go, and clock 5 needs ranks 0 and 1.
  EXPECT_TRUE(steps.Retire(2, StepCounts{2, {}}, &orphans).empty());
  EXPECT_EQ(orphans, (std::vector<uint64_t>{12, 13}));
  EXPECT_EQ(steps.held_steps(), 1u);  // clock 6 had only rank 2's push
  EXPECT_EQ(steps.PushedCount(5), 1);
  EXPECT_EQ(steps.Add(0, 5, {}, a, 14), StepAggregator::kComplete);
  EXPECT_FALSE(steps.Pushes(5)[2].pushed);
  StepAggregator::Finished f = steps.Finish(5, 14);
  EXPECT_EQ(f.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(f.waiters, (std::vector<uint64_t>{11}));

  // Rank 1 retires while rank 0 waits at clock 6: the step is complete.
  EXPECT_EQ(steps.Add(0, 6, {}, a, 15), StepAggregator::kHeld);
  orphans.clear();
  EXPECT_EQ(steps.Retire(1, StepCounts{1, {}}, &orphans),
            (std::vector<Clock>{6}));
  EXPECT_TRUE(orphans.empty());
  f = steps.Finish(6, 0);
  EXPECT_EQ(f.ranks, (std::vector<int>{0}));
  EXPECT_EQ(f.waiters, (std::vector<uint64_t>{15}));
  EXPECT_EQ(steps.next_clock(), 7);
}

// A BSP job grown at an announced step: steps below it complete with the
// old count, from it on only with the new one, whenever the counts arrive.
TEST(StepAggregatorTest, TheCountOfAStepIsAFunctionOfItsClock) {
  StepAggregator steps(/*ranks=*/3, /*needed=*/2);
  const std::vector<float> g = {1};
  // Clock 4 is held with two pushes when the change "3 from clock 4"
  // arrives: it is not complete by it, and neither is clock 3 with one.
  EXPECT_EQ(steps.Add(0, 3, {}, g, 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(0, 4, {}, g, 0), StepAggregator::kHeld);
  const StepCounts grown{2, {{4, 3}}};
  EXPECT_TRUE(steps.SetNeeded(grown).empty());
  EXPECT_EQ(steps.needed(3), 2);
  EXPECT_EQ(steps.needed(4), 3);
  EXPECT_EQ(steps.needed(100), 3);
  EXPECT_EQ(steps.Add(1, 3, {}, g, 0), StepAggregator::kComplete);
  steps.Finish(3, 0);
  EXPECT_EQ(steps.Add(1, 4, {}, g, 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(2, 4, {}, g, 0), StepAggregator::kComplete);
  EXPECT_EQ(steps.Finish(4, 0).ranks, (std::vector<int>{0, 1, 2}));
  // Lowering a count completes the held steps that now have enough.
  EXPECT_EQ(steps.Add(0, 5, {}, g, 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.Add(1, 5, {}, g, 0), StepAggregator::kHeld);
  EXPECT_EQ(steps.SetNeeded(StepCounts{2, {}}), (std::vector<Clock>{5}));
}

}  // namespace
}  // namespace downpour
