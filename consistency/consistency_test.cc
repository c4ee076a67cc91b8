#include "consistency/consistency.h"

#include <random>

#include "common/test_util.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace {

ConsistencyPolicy Policy(const std::string& name, Clock s, int n, int b = 0) {
  auto p = ConsistencyPolicy::Parse(name, s, n, b);
  EXPECT_OK(p);
  return *p;
}

TEST(ConsistencyPolicyTest, ParseRejectsBadInput) {
  EXPECT_THAT(ConsistencyPolicy::Parse("nope", 0, 1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ConsistencyPolicy::Parse("ssp", -1, 1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ConsistencyPolicy::Parse("bsp", 0, 0, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Policy("ssp", 3, 4).ToString(), "SSP(s=3) with 4 workers");
}

TEST(ConsistencyPolicyTest, JobConfigRoundTrips) {
  for (const ConsistencyPolicy& p :
       {Policy("bsp", 0, 3), Policy("ssp", 4, 2, 1), Policy("asp", 0, 5, 2)}) {
    proto::JobConfig job;
    p.ToJob(&job);
    ASSERT_OK_AND_ASSIGN(ConsistencyPolicy back,
                         ConsistencyPolicy::FromJob(job));
    EXPECT_EQ(back.kind, p.kind);
    EXPECT_EQ(back.staleness, p.staleness);
    EXPECT_EQ(back.num_workers, p.num_workers);
    EXPECT_EQ(back.backup_workers, p.backup_workers);
    EXPECT_EQ(back.ToString(), p.ToString());
  }
  proto::JobConfig job;
  Policy("ssp", 3, 2).ToJob(&job);
  EXPECT_EQ(job.consistency(), proto::SSP);
  EXPECT_EQ(job.staleness(), 3);
}

TEST(ConsistencyPolicyTest, FromJobRejectsBadConfigs) {
  proto::JobConfig job;
  job.set_num_workers(1);
  // Unspecified kind: an old or broken scheduler.
  EXPECT_THAT(ConsistencyPolicy::FromJob(job),
              StatusIs(absl::StatusCode::kInvalidArgument));
  job.set_consistency(static_cast<proto::Consistency>(17));
  EXPECT_THAT(ConsistencyPolicy::FromJob(job),
              StatusIs(absl::StatusCode::kInvalidArgument));
  job.set_consistency(proto::SSP);
  job.set_staleness(-1);
  EXPECT_THAT(ConsistencyPolicy::FromJob(job),
              StatusIs(absl::StatusCode::kInvalidArgument));
  job.set_staleness(1);
  job.set_num_workers(0);
  EXPECT_THAT(ConsistencyPolicy::FromJob(job),
              StatusIs(absl::StatusCode::kInvalidArgument));
  job.set_num_workers(3000000000u);  // does not fit an int
  EXPECT_THAT(ConsistencyPolicy::FromJob(job),
              StatusIs(absl::StatusCode::kInvalidArgument));
  job.set_num_workers(2);
  EXPECT_OK(ConsistencyPolicy::FromJob(job));
}

TEST(ConsistencyPolicyTest, AllowsAndTableEnforcement) {
  const ConsistencyPolicy bsp = Policy("bsp", 0, 3, 1);
  EXPECT_TRUE(bsp.is_bsp());
  EXPECT_FALSE(bsp.is_asp());
  EXPECT_TRUE(bsp.Allows(4, 4));
  EXPECT_FALSE(bsp.Allows(5, 4));
  EXPECT_EQ(bsp.sync_workers(), 3u);
  EXPECT_EQ(bsp.tracked_workers(), 4u);
  EXPECT_EQ(bsp.total_workers(), 4);

  const ConsistencyPolicy ssp = Policy("ssp", 2, 3);
  EXPECT_TRUE(ssp.Allows(6, 4));
  EXPECT_FALSE(ssp.Allows(7, 4));
  EXPECT_EQ(ssp.sync_workers(), 0u);
  EXPECT_EQ(ssp.tracked_workers(), 3u);

  const ConsistencyPolicy asp = Policy("asp", 0, 2);
  EXPECT_TRUE(asp.is_asp());
  EXPECT_TRUE(asp.Allows(1000000, 0));
  EXPECT_EQ(asp.sync_workers(), 0u);
  EXPECT_EQ(asp.tracked_workers(), 2u);
}

TEST(ClockTableTest, BspWaitsForEveryWorker) {
  ClockTable t(Policy("bsp", 0, 3));
  EXPECT_TRUE(t.MayProceed(0));
  ASSERT_OK(t.Advance(0, 1));
  EXPECT_FALSE(t.MayProceed(1));  // workers 1 and 2 still at 0
  ASSERT_OK(t.Advance(1, 1));
  ASSERT_OK(t.Advance(2, 1));
  EXPECT_TRUE(t.MayProceed(1));
  EXPECT_FALSE(t.MayProceed(2));
  EXPECT_THAT(t.Advance(1, 0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(t.Advance(3, 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ClockTableTest, SspBoundAndAsp) {
  ClockTable ssp(Policy("ssp", 2, 2));
  ASSERT_OK(ssp.Advance(0, 2));
  EXPECT_TRUE(ssp.MayProceed(2));  // 2 - 0 <= 2
  ASSERT_OK(ssp.Advance(0, 3));
  EXPECT_FALSE(ssp.MayProceed(3));
  ClockTable asp(Policy("asp", 0, 2));
  ASSERT_OK(asp.Advance(0, 100));
  EXPECT_TRUE(asp.MayProceed(100));
}

TEST(ClockTableTest, BackupWorkersGateOnTheNthFastest) {
  ClockTable t(Policy("bsp", 0, 2, 1));  // 3 workers, 2 count
  ASSERT_OK(t.Advance(0, 1));
  EXPECT_FALSE(t.MayProceed(1));
  ASSERT_OK(t.Advance(2, 1));  // worker 1 is the straggler
  EXPECT_EQ(t.GatingClock(), 1);
  EXPECT_TRUE(t.MayProceed(1));
}

// A retired (lost, given up) worker no longer holds the others back, in
// the gate and in the bound on reported clocks. The clocks are set with
// Restore: Advance would refuse them one at a time (they are far apart).
TEST(ClockTableTest, RetiredWorkerNoLongerGates) {
  ClockTable ssp(Policy("ssp", 1, 3));
  ASSERT_OK(ssp.Restore(0, 5));
  ASSERT_OK(ssp.Restore(2, 4));  // worker 1 stays at 0: lost
  EXPECT_EQ(ssp.GatingClock(), 0);
  EXPECT_FALSE(ssp.MayProceed(2));
  EXPECT_FALSE(ssp.WithinBound(2, 6));
  ssp.Retire(1);
  EXPECT_TRUE(ssp.retired(1));
  EXPECT_EQ(ssp.GatingClock(), 4);
  EXPECT_TRUE(ssp.MayProceed(5));
  EXPECT_FALSE(ssp.MayProceed(6));
  EXPECT_TRUE(ssp.WithinBound(2, 6));
  ASSERT_OK(ssp.Advance(2, 6));
  ssp.Retire(7);  // outside the job: ignored
  // With backups fewer than N left: the minimum of those left.
  ClockTable b(Policy("bsp", 0, 2, 1));
  ASSERT_OK(b.Restore(0, 3));
  ASSERT_OK(b.Restore(1, 2));
  b.Retire(2);
  EXPECT_EQ(b.GatingClock(), 2);
  b.Retire(1);
  EXPECT_EQ(b.GatingClock(), 3);
  b.Retire(0);
  EXPECT_EQ(b.GatingClock(), 3);  // nobody left: the largest clock
}

// Restore sets recorded clocks without Advance's checks, but not outside
// the job or below zero.
TEST(ClockTableTest, RestoreSetsRecordedClocks) {
  ClockTable bsp(Policy("bsp", 0, 2));
  ASSERT_OK(bsp.Restore(0, 40));
  EXPECT_EQ(bsp.clock(0), 40);
  ASSERT_OK(bsp.Restore(1, 40));
  EXPECT_EQ(bsp.GatingClock(), 40);
  ASSERT_OK(bsp.Restore(0, 7));  // back too: a rollback
  EXPECT_EQ(bsp.clock(0), 7);
  EXPECT_THAT(bsp.Restore(2, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bsp.Restore(-1, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bsp.Restore(0, -3), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(bsp.clock(0), 7);
}

TEST(ClockTableTest, ClocksFromTheFutureAreRefused) {
  ClockTable bsp(Policy("bsp", 0, 3));
  // No worker may be more than one ahead of the slowest under BSP.
  EXPECT_FALSE(bsp.WithinBound(0, 2));
  absl::Status far = bsp.Advance(0, Clock{1} << 62);
  EXPECT_THAT(far, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(far.message()),
              ::testing::HasSubstr("ahead of the gating clock 0"));
  EXPECT_EQ(bsp.clock(0), 0) << "a refused clock changed the table";
  EXPECT_THAT(bsp.Advance(0, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(bsp.Advance(0, 1));
  // The slowest may always catch up, even in one report of several steps
  // (reports are coalesced): worker 1 at 0 jumps to 1, worker 2 is at 0.
  ASSERT_OK(bsp.Advance(1, 1));
  EXPECT_FALSE(bsp.WithinBound(0, 2));  // worker 2 is still at 0
  ASSERT_OK(bsp.Advance(2, 1));
  EXPECT_TRUE(bsp.WithinBound(0, 2));
  ASSERT_OK(bsp.Advance(0, 2));
  // Clocks (2, 1, 1): worker 1 reporting 3 would be 2 ahead of worker 2.
  EXPECT_FALSE(bsp.WithinBound(1, 3));
  EXPECT_TRUE(bsp.WithinBound(1, 2));

  ClockTable ssp(Policy("ssp", 2, 2));
  ASSERT_OK(ssp.Advance(0, 3));  // s + 1 ahead of worker 1
  EXPECT_THAT(ssp.Advance(0, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Worker 1 catching up far beyond worker 0 is bounded by worker 0 too.
  EXPECT_TRUE(ssp.WithinBound(1, 6));
  EXPECT_FALSE(ssp.WithinBound(1, 7));
  ASSERT_OK(ssp.Advance(1, 6));

  // With backup workers only the N fastest gate: the straggler does not
  // hold the others back.
  ClockTable backups(Policy("bsp", 0, 2, 1));
  ASSERT_OK(backups.Advance(0, 1));
  ASSERT_OK(backups.Advance(1, 1));
  ASSERT_OK(backups.Advance(0, 2));
  ASSERT_OK(backups.Advance(1, 2));
  EXPECT_EQ(backups.clock(2), 0);
  EXPECT_FALSE(backups.WithinBound(0, 4));

  ClockTable asp(Policy("asp", 0, 2));
  EXPECT_TRUE(asp.WithinBound(0, Clock{1} << 62));
  ASSERT_OK(asp.Advance(0, Clock{1} << 62));
  EXPECT_THAT(asp.Advance(0, 5),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(ClockTableTest, ClaimsOfWaitingReportsAdmitEachOther) {
  // Two BSP workers at 18 in the table, both truly at 23 (their reports
  // were coalesced): each report alone is refused...
  ClockTable bsp(Policy("bsp", 0, 2));
  ASSERT_OK(bsp.Restore(0, 18));
  ASSERT_OK(bsp.Restore(1, 18));
  EXPECT_FALSE(bsp.WithinBound(0, 23));
  EXPECT_FALSE(bsp.WithinBound(1, 23));
  // ...but the one waiting claims its clock, which admits the other's.
  bsp.Claim(0, 23);
  EXPECT_TRUE(bsp.WithinBound(1, 23));
  ASSERT_OK(bsp.Advance(1, 23));
  EXPECT_TRUE(bsp.WithinBound(0, 23));
  bsp.Unclaim(0, 23);
  ASSERT_OK(bsp.Advance(0, 23));
  // A claim moves neither the gate nor what may proceed.
  ClockTable ssp(Policy("ssp", 1, 2));
  ssp.Claim(0, Clock{1} << 62);
  EXPECT_EQ(ssp.GatingClock(), 0);
  EXPECT_FALSE(ssp.MayProceed(3));
  // While it stands it admits worker 1's reports; once withdrawn, worker 1
  // is bounded by worker 0's recorded 0 again.
  EXPECT_TRUE(ssp.WithinBound(1, 3));
  ssp.Unclaim(0, Clock{1} << 62);
  EXPECT_FALSE(ssp.WithinBound(1, 3));
  ssp.Unclaim(1, 5);  // without a claim: ignored
  ssp.Claim(9, 5);    // outside the job: ignored
  EXPECT_EQ(ssp.GatingClock(), 0);
}

// Simulates workers of very different speeds under the clock protocol and
// checks the staleness every pull sees against the bound.
TEST(StalenessTest, SimulatedRunsRespectTheBound) {
  for (Clock s : {Clock{0}, Clock{1}, Clock{3}}) {
    const uint32_t seed = TestSeed(static_cast<uint32_t>(11 + s));
    SCOPED_TRACE(::testing::Message() << "s=" << s << " seed " << seed);
    std::mt19937 rng(seed);
    constexpr int kWorkers = 4;
    ClockTable table(Policy(s == 0 ? "bsp" : "ssp", s, kWorkers));
    StalenessTracker tracker(kWorkers);
    std::vector<int> speed = {1, 2, 5, 13};  // relative chance of a step
    std::vector<Clock> clock(kWorkers, 0);
    for (int step = 0; step < 20000; ++step) {
      const int w =
          std::discrete_distribution<int>(speed.begin(), speed.end())(rng);
      if (!table.MayProceed(clock[w])) continue;
      EXPECT_LE(tracker.Observe(clock[w]), s);  // the pull
      tracker.Applied(w, clock[w]);             // push, acknowledged
      ASSERT_OK(table.Advance(w, ++clock[w]));  // then the clock
    }
    EXPECT_LE(tracker.max_observed(), s);
    if (s > 0) {  // the bound is reached
      EXPECT_GT(tracker.max_observed(), 0);
    }
  }
}

TEST(StalenessTest, BackupWorkersCountOnlyTheFastest) {
  StalenessTracker t(3, /*counted=*/2);
  for (Clock c = 0; c < 5; ++c) {
    t.Applied(0, c);
    t.Applied(2, c);
  }
  // Worker 1 applied nothing, but it is the backup that was left behind.
  EXPECT_EQ(t.Observe(5), 0);
  StalenessTracker all(3);
  for (Clock c = 0; c < 5; ++c) {
    all.Applied(0, c);
    all.Applied(2, c);
  }
  EXPECT_EQ(all.Observe(5), 5);
  // Worker 1 retired (the job went on without it): no longer stale.
  all.Retire(1);
  EXPECT_EQ(all.Observe(5), 0);
  EXPECT_EQ(all.Observe(7), 2);
}

// Elastic seats: vacant ones gate nobody; a joiner starts at the gating
// clock and gates from then on; BSP has none with backup workers.
TEST(ClockTableTest, ElasticSeatsJoinAtTheGatingClock) {
  EXPECT_THAT(ConsistencyPolicy::Parse("bsp", 0, 2, 1, /*elastic=*/1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ConsistencyPolicy::Parse("ssp", 1, 2, 0, /*elastic=*/-1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(const ConsistencyPolicy p,
                       ConsistencyPolicy::Parse("ssp", 1, 2, 0, 2));
  EXPECT_EQ(p.total_workers(), 2);
  EXPECT_EQ(p.max_ranks(), 4);
  EXPECT_EQ(p.tracked_workers(), 4u);
  EXPECT_EQ(p.ToString(), "SSP(s=1) with 2 workers + 2 elastic");
  proto::JobConfig job;
  p.ToJob(&job);
  EXPECT_EQ(job.elastic_workers(), 2u);
  ASSERT_OK_AND_ASSIGN(const ConsistencyPolicy back,
                       ConsistencyPolicy::FromJob(job));
  EXPECT_EQ(back.elastic_workers, 2);
  job.set_consistency(proto::BSP);
  job.set_backup_workers(1);
  EXPECT_THAT(ConsistencyPolicy::FromJob(job),
              StatusIs(absl::StatusCode::kInvalidArgument));

  ClockTable t(p);
  EXPECT_EQ(t.size(), 4);
  EXPECT_EQ(t.joined(), 2);
  ASSERT_OK(t.Advance(0, 1));
  ASSERT_OK(t.Advance(1, 1));
  ASSERT_OK(t.Advance(0, 2));
  ASSERT_OK(t.Advance(1, 2));
  // The vacant seats (clock 0) hold nobody back.
  EXPECT_EQ(t.GatingClock(), 2);
  EXPECT_TRUE(t.MayProceed(3));
  EXPECT_THAT(t.Advance(2, 1), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(t.Advance(0, 3));
  ASSERT_OK_AND_ASSIGN(const int seat, t.Join());
  EXPECT_EQ(seat, 2);
  EXPECT_EQ(t.joined(), 3);
  EXPECT_EQ(t.clock(2), 2);  // the gating clock when it joined
  EXPECT_TRUE(t.counted(2));
  EXPECT_FALSE(t.counted(3));
  // From now on it gates: rank 0 at 3 may not run past 2 + s + 1.
  ASSERT_OK(t.Advance(1, 3));
  EXPECT_EQ(t.GatingClock(), 2);
  EXPECT_FALSE(t.MayProceed(4));
  EXPECT_FALSE(t.WithinBound(0, 5));
  ASSERT_OK(t.Advance(2, 3));
  EXPECT_EQ(t.GatingClock(), 3);
  EXPECT_TRUE(t.MayProceed(4));
  // Leaving for good: it retires and gates nobody again.
  t.Retire(2);
  ASSERT_OK(t.Advance(0, 4));
  ASSERT_OK(t.Advance(1, 4));
  EXPECT_EQ(t.GatingClock(), 4);
  ASSERT_OK_AND_ASSIGN(const int last, t.Join());
  EXPECT_EQ(last, 3);
  EXPECT_EQ(t.clock(3), 4);
  EXPECT_THAT(t.Join(), StatusIs(absl::StatusCode::kResourceExhausted));
  // Restored from the scheduler's state: clamped to [N + b, size()].
  ClockTable r(p);
  r.SetJoined(9);
  EXPECT_EQ(r.joined(), 4);
  r.SetJoined(0);
  EXPECT_EQ(r.joined(), 2);
}

// Under BSP a joiner starts one step beyond the gate: the step under way
// completes with the workers already there, the next counts it too.
TEST(ClockTableTest, ABspJoinerStartsAtTheNextStep) {
  ASSERT_OK_AND_ASSIGN(const ConsistencyPolicy p,
                       ConsistencyPolicy::Parse("bsp", 0, 2, 0, 1));
  EXPECT_EQ(p.sync_workers(), 2u);
  ClockTable t(p);
  ASSERT_OK(t.Advance(0, 1));
  ASSERT_OK(t.Advance(1, 1));
  ASSERT_OK(t.Advance(0, 2));  // rank 1 is still in step 1
  ASSERT_OK_AND_ASSIGN(const int seat, t.Join());
  EXPECT_EQ(seat, 2);
  EXPECT_EQ(t.clock(2), 2);
  EXPECT_EQ(t.GatingClock(), 1);
  EXPECT_FALSE(t.MayProceed(2));
  ASSERT_OK(t.Advance(1, 2));
  EXPECT_EQ(t.GatingClock(), 2);
  EXPECT_TRUE(t.MayProceed(2));
  EXPECT_FALSE(t.MayProceed(3));  // every rank, the joiner's too
}

// The servers leave vacant seats out of the staleness figures.
TEST(StalenessTest, VacantSeatsDoNotLookStale) {
  StalenessTracker t(/*num_workers=*/3);
  t.Applied(0, 4);
  t.Applied(1, 4);
  EXPECT_EQ(t.Observe(5), 5);  // rank 2 (a seat) at 0
  t.SetJoined(2);
  EXPECT_EQ(t.Observe(5), 0);
  t.SetJoined(3, {3});  // a worker took the seat, from clock 3
  EXPECT_EQ(t.applied()[2], 3);
  EXPECT_EQ(t.Observe(5), 2);
  t.Applied(2, 3);
  EXPECT_EQ(t.Observe(5), 1);
  t.SetJoined(0);  // 0: every tracked rank
  EXPECT_EQ(t.Observe(6), 2);
}

}  // namespace
TEST(ConsistencyPolicyTest, ATableKeepsItsOwnPolicyOverTheJobsWorkers) {
  auto job = ConsistencyPolicy::Parse("bsp", 0, 4, 1);
  ASSERT_TRUE(job.ok());
  proto::TableSpec spec;
  // Not following the job: the job's policy (nothing to enforce).
  spec.set_consistency(proto::ASP);
  EXPECT_TRUE(job->ForTable(spec).is_bsp());
  spec.set_follows_job(true);
  const ConsistencyPolicy asp = job->ForTable(spec);
  EXPECT_TRUE(asp.is_asp());
  EXPECT_EQ(asp.sync_workers(), 0u);     // applied on arrival
  EXPECT_EQ(asp.tracked_workers(), 5u);  // staleness over N + b
  spec.set_consistency(proto::SSP);
  spec.set_staleness(2);
  const ConsistencyPolicy ssp = job->ForTable(spec);
  EXPECT_EQ(ssp.bound(), 2);
  EXPECT_TRUE(ssp.Allows(5, 3));
  EXPECT_FALSE(ssp.Allows(6, 3));
  EXPECT_EQ(ssp.num_workers, 4);
  // Unspecified: the job's.
  spec.set_consistency(proto::CONSISTENCY_UNSPECIFIED);
  EXPECT_EQ(job->ForTable(spec).sync_workers(), 4u);
}

}  // namespace downpour
