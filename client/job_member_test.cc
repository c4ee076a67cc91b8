// JobMember against a real scheduler (the Scheduler library serving gRPC on
// 127.0.0.1, as ps_scheduler does): joining, heartbeats, clock reports,
// WaitClock and barriers.
#include "client/job_member.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "proto/downpour.pb.h"
#include "scheduler/scheduler.h"

namespace downpour {
namespace {

class JobMemberTest : public ::testing::Test {
 protected:
  // Starts a scheduler for a job of `policy`.
  void StartScheduler(const std::string& policy, Clock staleness, int workers,
                      int backups = 0) {
    SchedulerOptions o;
    o.heartbeat_interval = absl::Milliseconds(50);
    o.dead_after = absl::Milliseconds(400);
    auto p = ConsistencyPolicy::Parse(policy, staleness, workers, backups);
    ASSERT_OK(p);
    o.policy = *p;
    auto s = Scheduler::Create(o);
    ASSERT_OK(s);
    scheduler_ = std::move(*s);
    admin_ = std::make_unique<SchedulerClient>(scheduler_->address());
  }
  JobMemberOptions Options(const std::string& name) const {
    JobMemberOptions o;
    o.scheduler_address = scheduler_->address();
    o.name = name;
    o.register_timeout = absl::Seconds(5);
    return o;
  }
  std::unique_ptr<JobMember> MustJoin(const std::string& name) {
    auto m = JobMember::Join(Options(name));
    EXPECT_OK(m);
    return m.ok() ? std::move(*m) : nullptr;
  }
  // The state of the node `id` in the scheduler's map.
  proto::NodeState StateOf(NodeId id) const {
    const proto::ClusterMap map = scheduler_->CurrentMap();
    for (const auto& n : map.nodes()) {
      if (n.id() == id) return n.state();
    }
    return proto::STATE_UNSPECIFIED;
  }
  // Waits (5 s at most) until node `id` is in `state`.
  bool WaitForState(NodeId id, proto::NodeState state) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (StateOf(id) != state && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return StateOf(id) == state;
  }

  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<SchedulerClient> admin_;
};

TEST_F(JobMemberTest, JoinGivesRanksInOrderAndTheTypedPolicy) {
  StartScheduler("ssp", 3, 2, 1);
  auto a = MustJoin("a");
  auto b = MustJoin("b");
  auto c = MustJoin("c");
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->rank(), 0);
  EXPECT_EQ(b->rank(), 1);
  EXPECT_EQ(c->rank(), 2);
  EXPECT_NE(a->node_id(), kNoNode);
  EXPECT_NE(a->node_id(), b->node_id());
  const ConsistencyPolicy& p = b->policy();
  EXPECT_EQ(p.kind, ConsistencyPolicy::Kind::kSsp);
  EXPECT_EQ(p.staleness, 3);
  EXPECT_EQ(p.num_workers, 2);
  EXPECT_EQ(p.backup_workers, 1);
  EXPECT_EQ(p.bound(), 3);
  EXPECT_EQ(a->reported_clock(), 0);

  // The job is full; a live name cannot be taken twice.
  EXPECT_THAT(JobMember::Join(Options("d")),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(JobMember::Join(Options("a")),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(JobMember::Join(JobMemberOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// A member may ask for its rank (an Indexed Job's completion index): it
// gets exactly that one, and a replacement takes it back from a dead
// holder.
TEST_F(JobMemberTest, RequestedRanks) {
  StartScheduler("bsp", 0, 2, 1);
  JobMemberOptions o = Options("pod-2");
  o.rank = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<JobMember> two, JobMember::Join(o));
  EXPECT_EQ(two->rank(), 2);
  auto first = MustJoin("x");  // no request: the smallest free rank
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rank(), 0);
  JobMemberOptions taken = Options("pod-2b");
  taken.rank = 2;
  EXPECT_THAT(JobMember::Join(taken),
              StatusIs(absl::StatusCode::kAlreadyExists));
  JobMemberOptions outside = Options("pod-9");
  outside.rank = 3;
  EXPECT_THAT(JobMember::Join(outside),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // The holder dies; a replacement under another name takes the rank.
  const NodeId dead = two->node_id();
  two.reset();
  ASSERT_TRUE(WaitForState(dead, proto::DEAD));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<JobMember> again,
                       JobMember::Join(taken));
  EXPECT_EQ(again->rank(), 2);
}

TEST_F(JobMemberTest, JoinFailsWhenNoSchedulerAnswers) {
  StartScheduler("bsp", 0, 1);
  JobMemberOptions o = Options("lost");
  scheduler_->Shutdown();
  o.register_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto m = JobMember::Join(o);
  EXPECT_THAT(m, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::HasSubstr(o.scheduler_address));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(JobMemberTest, HeartbeatsKeepItAliveAndARejoinKeepsTheRank) {
  StartScheduler("asp", 0, 2);
  auto a = MustJoin("a");
  auto b = MustJoin("b");
  ASSERT_TRUE(a && b);
  const NodeId a_id = a->node_id();
  // Five times the scheduler's dead_after: alive only through heartbeats.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_EQ(StateOf(a_id), proto::ALIVE);
  EXPECT_EQ(StateOf(b->node_id()), proto::ALIVE);
  a.reset();
  ASSERT_TRUE(WaitForState(a_id, proto::DEAD));
  EXPECT_EQ(StateOf(b->node_id()), proto::ALIVE);
  auto again = MustJoin("a");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->node_id(), a_id);
  EXPECT_EQ(again->rank(), 0);
  EXPECT_EQ(StateOf(a_id), proto::ALIVE);
}

TEST_F(JobMemberTest, ClockReportsReachTheJobStatus) {
  StartScheduler("asp", 0, 2);
  auto a = MustJoin("a");
  auto b = MustJoin("b");
  ASSERT_TRUE(a && b);
  ClockReport r;
  r.clock = 1;
  r.loss = 2.5;
  r.examples = 64;
  r.test_accuracy = 0.5;
  ASSERT_OK(a->ReportClock(r));
  for (Clock c = 2; c <= 20; ++c) {
    r.clock = c;
    r.loss = 1.0 / c;
    r.examples = 64 * c;
    r.test_accuracy = -1;  // not evaluated: the 0.5 stays
    r.max_staleness = 3;
    r.discarded = 2;
    ASSERT_OK(a->ReportClock(r));
    EXPECT_EQ(a->reported_clock(), c);
  }
  ASSERT_OK(a->Flush(absl::Seconds(10)));
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, admin_->GetJobStatus());
  ASSERT_EQ(status.workers_size(), 2);
  const proto::WorkerStatus& w = status.workers(0);
  EXPECT_EQ(w.clock(), 20);
  EXPECT_DOUBLE_EQ(w.loss(), 1.0 / 20);
  EXPECT_EQ(w.examples(), 64u * 20);
  EXPECT_DOUBLE_EQ(w.test_accuracy(), 0.5);
  EXPECT_EQ(w.max_staleness(), 3);
  EXPECT_EQ(w.discarded(), 2u);
  EXPECT_EQ(status.workers(1).clock(), 0);

  // b learns a's clock from the reply to its own report.
  r = ClockReport();
  r.clock = 1;
  ASSERT_OK(b->ReportClock(r));
  ASSERT_OK(b->Flush(absl::Seconds(10)));
  EXPECT_EQ(b->others_lower_bound(), 20);
}

TEST_F(JobMemberTest, AReportThatMovesTheClockBackIsAStickyError) {
  StartScheduler("asp", 0, 1);
  auto a = MustJoin("a");
  ASSERT_TRUE(a);
  ClockReport r;
  r.clock = 5;
  ASSERT_OK(a->ReportClock(r));
  ASSERT_OK(a->Flush(absl::Seconds(10)));
  r.clock = 3;
  ASSERT_OK(a->ReportClock(r));  // the error comes back later
  EXPECT_THAT(a->Flush(absl::Seconds(10)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  r.clock = 6;
  EXPECT_THAT(a->ReportClock(r),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(JobMemberTest, BspWaitClockBlocksUntilEveryWorkerReported) {
  StartScheduler("bsp", 0, 2);
  auto a = MustJoin("a");
  auto b = MustJoin("b");
  ASSERT_TRUE(a && b);
  // Clock 0 never waits.
  ASSERT_OK_AND_ASSIGN(Clock gating, a->WaitClock(0, absl::Seconds(5)));
  EXPECT_EQ(gating, 0);
  ClockReport r;
  r.clock = 1;
  ASSERT_OK(a->ReportClock(r));
  ASSERT_OK(a->Flush(absl::Seconds(10)));
  EXPECT_THAT(a->WaitClock(1, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));

  absl::Notification released;
  absl::StatusOr<Clock> waited;
  std::thread waiter([&] {
    waited = a->WaitClock(1, absl::Seconds(20));
    released.Notify();
  });
  EXPECT_FALSE(
      released.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  ASSERT_OK(b->ReportClock(r));
  EXPECT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(20)));
  waiter.join();
  ASSERT_OK(waited);
  EXPECT_EQ(*waited, 1);
  EXPECT_EQ(a->others_lower_bound(), 1);  // learnt from the gate
}

// Without backups, WaitClock answers from what the member knows when that
// suffices: shown here by answering after the scheduler is gone.
TEST_F(JobMemberTest, WaitClockDoesNotAskWhenTheBoundAlreadyAllows) {
  StartScheduler("ssp", 2, 2);
  auto a = MustJoin("a");
  auto b = MustJoin("b");
  ASSERT_TRUE(a && b);
  ClockReport r;
  r.clock = 1;
  ASSERT_OK(b->ReportClock(r));
  ASSERT_OK(b->Flush(absl::Seconds(10)));
  r.clock = 2;
  ASSERT_OK(a->ReportClock(r));
  ASSERT_OK(a->Flush(absl::Seconds(10)));
  ASSERT_EQ(a->others_lower_bound(), 1);
  scheduler_->Shutdown();
  // Gating >= min(2, 1) = 1, and 3 - 1 <= s.
  ASSERT_OK_AND_ASSIGN(Clock known, a->WaitClock(3, absl::Seconds(5)));
  EXPECT_EQ(known, 1);
  // 4 - 1 > s: only the scheduler can tell, and it is gone.
  EXPECT_THAT(a->WaitClock(4, absl::Seconds(5)),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(JobMemberTest, AspNeverWaits) {
  StartScheduler("asp", 0, 2);
  auto a = MustJoin("a");
  ASSERT_TRUE(a);
  scheduler_->Shutdown();
  EXPECT_OK(a->WaitClock(1000000, absl::Seconds(5)));
}

// With backups the gate is the N-th fastest clock, and a straggler learns
// from WaitClock that it should skip ahead.
TEST_F(JobMemberTest, BackupWorkersAlwaysAskAndLearnToSkipAhead) {
  StartScheduler("bsp", 0, 2, 1);
  auto a = MustJoin("a");
  auto b = MustJoin("b");
  auto c = MustJoin("c");
  ASSERT_TRUE(a && b && c);
  ClockReport r;
  r.clock = 4;
  ASSERT_OK(a->ReportClock(r));
  ASSERT_OK(b->ReportClock(r));
  ASSERT_OK(a->Flush(absl::Seconds(10)));
  ASSERT_OK(b->Flush(absl::Seconds(10)));
  ASSERT_OK_AND_ASSIGN(Clock gating, c->WaitClock(1, absl::Seconds(5)));
  EXPECT_EQ(gating, 4);  // above c's clock: skip to 4
}

TEST_F(JobMemberTest, BarrierWaitsForEveryWorkerOfTheJob) {
  StartScheduler("bsp", 0, 1, 1);  // N + b = 2 must arrive
  auto a = MustJoin("a");
  auto b = MustJoin("b");
  ASSERT_TRUE(a && b);
  EXPECT_THAT(a->Barrier("lonely", absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  absl::Status sa, sb;
  std::thread ta([&] { sa = a->Barrier("init", absl::Seconds(20)); });
  std::thread tb([&] { sb = b->Barrier("init", absl::Seconds(20)); });
  ta.join();
  tb.join();
  EXPECT_OK(sa);
  EXPECT_OK(sb);
}

}  // namespace
}  // namespace downpour
