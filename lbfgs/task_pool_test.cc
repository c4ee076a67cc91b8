#include "lbfgs/task_pool.h"

#include <thread>

#include "common/test_util.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using Assignment = TaskPool::Assignment;
const std::vector<std::pair<uint64_t, uint64_t>> kThree = {
    {0, 10}, {10, 20}, {20, 30}};

TEST(TaskPoolTest, HandsOutEachTaskAndCountsFirstResultsOnly) {
  TaskPool pool(/*backups=*/false, absl::Seconds(60));
  std::thread coordinator([&] {
    auto r = pool.RunRound(1, kThree, absl::Seconds(20));
    ASSERT_OK(r);
    EXPECT_EQ(*r, (std::vector<double>{0.5, 1.5, 2.5}));
  });
  std::vector<Assignment> got;
  for (int i = 0; i < 3; ++i) {
    Assignment a = pool.Next("w" + std::to_string(i), absl::Seconds(10));
    ASSERT_EQ(a.kind, Assignment::kRun);
    EXPECT_EQ(a.round, 1);
    EXPECT_EQ(a.task, static_cast<uint64_t>(i));
    EXPECT_EQ(a.begin, kThree[i].first);
    EXPECT_FALSE(a.backup);
    got.push_back(a);
  }
  // Nothing left, no backups: wait.
  EXPECT_EQ(pool.Next("w3", absl::Milliseconds(50)).kind, Assignment::kWait);
  EXPECT_TRUE(pool.Finish(1, 1, 1.5));
  EXPECT_FALSE(pool.Finish(1, 1, 99.0));  // duplicate
  EXPECT_FALSE(pool.Finish(0, 0, 99.0));  // an old round
  EXPECT_FALSE(pool.Finish(1, 7, 99.0));  // no such task
  EXPECT_TRUE(pool.Finish(1, 0, 0.5));
  EXPECT_TRUE(pool.Finish(1, 2, 2.5));
  coordinator.join();
  EXPECT_FALSE(pool.Finish(1, 2, 99.0));  // after the round closed
  const TaskStats s = pool.stats();
  EXPECT_EQ(s.assigned, 3u);
  EXPECT_EQ(s.dropped, 4u);  // three in the round, one after
  pool.Close();
  EXPECT_EQ(pool.Next("w0", absl::Seconds(1)).kind, Assignment::kDone);
}

TEST(TaskPoolTest, IdleWorkersGetBackupCopiesOfRunningTasks) {
  TaskPool pool(/*backups=*/true, absl::Seconds(60));
  std::thread coordinator([&] {
    auto r = pool.RunRound(5, {{0, 1}, {1, 2}}, absl::Seconds(20));
    ASSERT_OK(r);
    EXPECT_EQ(*r, (std::vector<double>{3.0, 4.0}));
  });
  Assignment slow = pool.Next("slow", absl::Seconds(10));
  Assignment fast = pool.Next("fast", absl::Seconds(10));
  ASSERT_EQ(slow.task, 0u);
  ASSERT_EQ(fast.task, 1u);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(pool.Finish(5, 1, 4.0));  // the median task takes ~200 ms
  // Task 0 is not late yet (a copy waits until it ran twice the median).
  EXPECT_EQ(pool.Next("fast", absl::Milliseconds(50)).kind, Assignment::kWait);
  // Then "fast", idle, gets a copy of task 0, which "slow" still runs.
  Assignment copy = pool.Next("fast", absl::Seconds(10));
  ASSERT_EQ(copy.kind, Assignment::kRun);
  EXPECT_EQ(copy.task, 0u);
  EXPECT_TRUE(copy.backup);
  // At most two copies at once, and never to the worker running it.
  EXPECT_EQ(pool.Next("third", absl::Milliseconds(50)).kind, Assignment::kWait);
  EXPECT_EQ(pool.Next("slow", absl::Milliseconds(50)).kind, Assignment::kWait);
  EXPECT_TRUE(pool.Finish(5, 0, 3.0));  // the backup wins
  coordinator.join();
  EXPECT_FALSE(pool.Finish(5, 0, 3.0));  // the slow original is dropped
  EXPECT_EQ(pool.stats().backups, 1u);
}

TEST(TaskPoolTest, ExpiredLeaseIsHandedToAnotherWorker) {
  TaskPool pool(/*backups=*/false, absl::Milliseconds(100));
  std::thread coordinator([&] {
    auto r = pool.RunRound(2, {{0, 1}}, absl::Seconds(20));
    ASSERT_OK(r);
    EXPECT_EQ(*r, std::vector<double>{7.0});
  });
  ASSERT_EQ(pool.Next("dies", absl::Seconds(10)).kind, Assignment::kRun);
  // Within the lease nobody else gets it; after it, the next idle worker.
  Assignment again = pool.Next("other", absl::Seconds(10));
  ASSERT_EQ(again.kind, Assignment::kRun);
  EXPECT_EQ(again.task, 0u);
  EXPECT_TRUE(pool.Finish(2, 0, 7.0));
  coordinator.join();
  EXPECT_EQ(pool.stats().reassigned, 1u);
}

TEST(TaskPoolTest, WaitsForWorkersToHearTheJobIsDone) {
  TaskPool pool(true, absl::Seconds(60));
  EXPECT_EQ(pool.Next("a", absl::Milliseconds(1)).kind, Assignment::kWait);
  EXPECT_EQ(pool.Next("b", absl::Milliseconds(1)).kind, Assignment::kWait);
  pool.Close();
  std::thread a([&] {
    EXPECT_EQ(pool.Next("a", absl::Seconds(1)).kind, Assignment::kDone);
  });
  // "b" never asks again: presumed gone after 300 ms of silence.
  const absl::Time start = absl::Now();
  pool.WaitForWorkersToLeave(absl::Milliseconds(300), absl::Seconds(20));
  const absl::Duration waited = absl::Now() - start;
  a.join();
  EXPECT_GE(waited, absl::Milliseconds(200));
  EXPECT_LT(waited, absl::Seconds(10));
}

TEST(TaskPoolTest, RoundTimesOutWithoutWorkers) {
  TaskPool pool(true, absl::Seconds(1));
  EXPECT_THAT(pool.RunRound(1, kThree, absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

}  // namespace
}  // namespace downpour
