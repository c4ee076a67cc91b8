#include "scheduler/job.h"

#include <string>

#include "absl/time/time.h"
#include "common/test_util.h"
#include "common/types.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"
#include "scheduler/durable_state.h"
#include "scheduler/membership.h"
#include "scheduler/worker_roster.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// Nothing is written: the state lives in memory (no store).
class NoSource : public DurableState::Source {
 public:
  proto::SchedulerState Snapshot() const override { return {}; }
  proto::SchedulerClocks ClocksSnapshot() const override { return {}; }
};

JobOptions Options(WorkerLossOptions::OnLoss on_loss) {
  JobOptions o;
  o.policy = *ConsistencyPolicy::Parse("bsp", 0, /*num_workers=*/3,
                                       /*backup_workers=*/0);
  o.worker_loss.replace_timeout = absl::Seconds(10);
  o.worker_loss.on_loss = on_loss;
  return o;
}

proto::RegisterRequest Worker(const std::string& name, int rank = -1) {
  proto::RegisterRequest req;
  req.set_name(name);
  req.set_role(proto::WORKER);
  if (rank >= 0) req.set_requested_rank(rank);
  return req;
}

class JobTest : public ::testing::Test {
 protected:
  explicit JobTest(
      WorkerLossOptions::OnLoss on_loss = WorkerLossOptions::OnLoss::kContinue)
      : JobTest(Options(on_loss)) {}
  explicit JobTest(const JobOptions& options)
      : job_(options, &map_, &members_, &durable_) {}

  // Registers `name` as Register does, with the rank the job grants.
  NodeId Join(const std::string& name, int rank = -1) {
    const proto::RegisterRequest req = Worker(name, rank);
    absl::StatusOr<int> granted = job_.GrantRank(req, nullptr);
    EXPECT_OK(granted);
    if (!granted.ok()) return kNoNode;
    proto::NodeInfo* n = members_.Add(kNoNode);
    members_.Admit(n, req, kT0);
    EXPECT_OK(job_.TakeOverRank(*granted, name));
    job_.Assign(*granted, n->id());
    return n->id();
  }

  proto::ClusterMap map_;
  NoSource source_;
  DurableState durable_{&map_, &source_};
  Membership members_{MembershipOptions(), &map_};
  Job job_;
};

TEST_F(JobTest, NewWorkersGetTheSmallestFreeRankAndNoMore) {
  const NodeId a = Join("a");
  const NodeId b = Join("b", /*rank=*/2);
  EXPECT_EQ(job_.RankOf(a), 0);
  EXPECT_EQ(job_.RankOf(b), 2);
  EXPECT_EQ(job_.RankOf(Join("c")), 1);
  EXPECT_THAT(job_.GrantRank(Worker("d"), nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(job_.GrantRank(Worker("d", 3), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(JobTest, ARankIsTakenOverFromADeadHolderOnly) {
  const NodeId a = Join("a", 1);
  EXPECT_THAT(job_.GrantRank(Worker("b", 1), nullptr),
              StatusIs(absl::StatusCode::kAlreadyExists));
  members_.MarkDead(members_.Find(a));
  ASSERT_OK_AND_ASSIGN(const int rank, job_.GrantRank(Worker("b", 1), nullptr));
  EXPECT_EQ(rank, 1);
  const NodeId b = Join("b", 1);
  EXPECT_EQ(job_.RankOf(b), 1);
  EXPECT_EQ(job_.RankOf(a), -1);
  // The old name lost it for good.
  EXPECT_THAT(job_.GrantRank(Worker("a"), members_.Find(a)),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(JobTest, ANameKeepsItsRank) {
  const NodeId a = Join("a", 2);
  members_.MarkDead(members_.Find(a));
  ASSERT_OK_AND_ASSIGN(const int again,
                       job_.GrantRank(Worker("a"), members_.Find(a)));
  EXPECT_EQ(again, 2);
  EXPECT_THAT(job_.GrantRank(Worker("a", 0), members_.Find(a)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(JobTest, OnlyTheHolderReportsItsClock) {
  const NodeId a = Join("a");
  const NodeId b = Join("b");
  EXPECT_OK(job_.CheckRankHolder("advance clock", a, 0));
  EXPECT_THAT(job_.CheckRankHolder("advance clock", b, 0),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(job_.CheckRankHolder("advance clock", kNoNode, 2),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(job_.CheckRankHolder("advance clock", a, 3),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(JobTest, ALostRankIsRetiredIntoTheMapAfterTheBound) {
  const NodeId a = Join("a");
  Join("b");
  Join("c");
  job_.WorkerGone(a, "a", "missed heartbeats", /*finished=*/false, kT0);
  const Epoch epoch = map_.epoch();
  const uint64_t version = durable_.version();
  job_.ApplyWorkerLossRule(kT0 + absl::Seconds(9));
  EXPECT_EQ(map_.epoch(), epoch);
  EXPECT_EQ(durable_.version(), version);
  job_.ApplyWorkerLossRule(kT0 + absl::Seconds(10));
  EXPECT_THAT(map_.retired_ranks(), ElementsAre(0));
  EXPECT_EQ(map_.epoch(), epoch + 1);
  EXPECT_GT(durable_.version(), version);
  EXPECT_EQ(durable_.published().epoch(), epoch + 1);  // no store: at once
  proto::JobStatus status;
  job_.FillJobStatus(&status);
  EXPECT_TRUE(status.workers(0).retired());
  EXPECT_FALSE(status.workers(0).lost());
  // The gate moves without it.
  proto::AdvanceClockRequest req;
  proto::AdvanceClockReply reply;
  req.set_node_id(members_.Registered(Worker("b"))->id());
  req.set_rank(1);
  req.set_clock(1);
  EXPECT_OK(job_.Advance(req, &reply));
  req.set_rank(2);
  req.set_node_id(members_.Registered(Worker("c"))->id());
  EXPECT_OK(job_.Advance(req, &reply));
  EXPECT_EQ(reply.gating_clock(), 1);
}

TEST_F(JobTest, AFinishedWorkerIsNoLoss) {
  const NodeId a = Join("a");
  job_.WorkerGone(a, "a", "left", /*finished=*/true, kT0);
  job_.ApplyWorkerLossRule(kT0 + absl::Hours(1));
  EXPECT_OK(job_.failure());
  EXPECT_EQ(map_.retired_ranks_size(), 0);
}

class JobStopTest : public JobTest {
 protected:
  JobStopTest() : JobTest(WorkerLossOptions::OnLoss::kStop) {}
};

TEST_F(JobStopTest, ALostRankFailsTheJobAfterTheBound) {
  const NodeId a = Join("a");
  job_.WorkerGone(a, "a", "missed heartbeats", /*finished=*/false, kT0);
  const uint64_t version = durable_.version();
  job_.ApplyWorkerLossRule(kT0 + absl::Seconds(10));
  EXPECT_THAT(job_.failure(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_GT(durable_.version(), version);  // the failure goes to disk
  proto::JobStatus status;
  job_.FillJobStatus(&status);
  EXPECT_THAT(status.failure(), HasSubstr("'a' (rank 0)"));
}

TEST_F(JobTest, ExportedAndImportedTheRanksAndClocksComeBack) {
  const NodeId a = Join("a");
  const NodeId b = Join("b");
  proto::AdvanceClockRequest req;
  proto::AdvanceClockReply reply;
  req.set_node_id(a);
  req.set_rank(0);
  req.set_clock(1);
  ASSERT_OK(job_.Advance(req, &reply));
  proto::SchedulerState state;
  job_.Export(&state);
  proto::SchedulerClocks clocks = job_.ClocksSnapshot();
  clocks.set_restored_from(4);

  Job recovered(Options(WorkerLossOptions::OnLoss::kContinue), &map_, &members_,
                &durable_);
  EXPECT_OK(recovered.CheckSameJob(state, "dir"));
  recovered.Import(state, clocks, /*restored_from=*/4, nullptr);
  EXPECT_EQ(recovered.RankOf(a), 0);
  EXPECT_EQ(recovered.RankOf(b), 1);
  EXPECT_EQ(recovered.clock(0), 1);

  // Clocks from before the last restore give way to its checkpoint's.
  proto::CheckpointManifest m;
  proto::WorkerStatus* w = m.add_workers();
  w->set_rank(1);
  w->set_clock(3);
  Job rolled_back(Options(WorkerLossOptions::OnLoss::kContinue), &map_,
                  &members_, &durable_);
  rolled_back.Import(state, clocks, /*restored_from=*/5, &m);
  EXPECT_EQ(rolled_back.clock(0), 0);
  EXPECT_EQ(rolled_back.clock(1), 3);

  proto::SchedulerState other = state;
  other.mutable_job()->set_num_workers(4);
  EXPECT_THAT(recovered.CheckSameJob(other, "dir"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// A job with elastic seats: a worker arriving when every rank is held takes
// the next seat and joins at the gating clock; leaving for good retires.
class ElasticJobTest : public JobTest {
 protected:
  ElasticJobTest() : JobTest(SspWithSeats()) {}

  static JobOptions SspWithSeats() {
    JobOptions o;
    o.policy = *ConsistencyPolicy::Parse("ssp", 1, /*num_workers=*/2,
                                         /*backup_workers=*/0,
                                         /*elastic_workers=*/2);
    return o;
  }
  void Report(NodeId id, int rank, Clock clock) {
    proto::AdvanceClockRequest req;
    req.set_node_id(id);
    req.set_rank(rank);
    req.set_clock(clock);
    proto::AdvanceClockReply reply;
    EXPECT_OK(job_.Advance(req, &reply));
  }
};

TEST_F(ElasticJobTest, AWorkerJoinsInTheNextSeatAtTheGatingClock) {
  EXPECT_EQ(map_.job_workers(), 2u);
  const NodeId a = Join("a");
  const NodeId b = Join("b");
  EXPECT_EQ(job_.RankOf(a), 0);
  EXPECT_EQ(job_.RankOf(b), 1);
  Report(a, 0, 1);
  Report(b, 1, 1);
  Report(a, 0, 2);
  Report(b, 1, 2);
  Report(a, 0, 3);
  // Seats are taken in order.
  const absl::StatusOr<int> out_of_order =
      job_.GrantRank(Worker("c", 3), nullptr);
  EXPECT_THAT(out_of_order, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(out_of_order.status().message()),
              HasSubstr("the next is 2"));
  const uint64_t epoch = map_.epoch();
  const NodeId c = Join("c");
  EXPECT_EQ(job_.RankOf(c), 2);
  EXPECT_EQ(job_.clock(2), 2);
  EXPECT_EQ(map_.job_workers(), 3u);
  EXPECT_THAT(map_.seat_clocks(), ElementsAre(2));
  EXPECT_GT(map_.epoch(), epoch);
  proto::JobStatus status;
  job_.FillJobStatus(&status);
  EXPECT_EQ(status.workers_size(), 3);  // the vacant seat is no worker
  // It gates: b catching up does not let a run ahead while c is at 2.
  Report(b, 1, 3);
  EXPECT_EQ(job_.GatingClock(), 2);
  EXPECT_FALSE(job_.MayProceed(4));
  EXPECT_OK(job_.CheckRankHolder("advance clock", c, 2));
  const NodeId d = Join("d", 3);
  EXPECT_EQ(job_.RankOf(d), 3);
  const absl::StatusOr<int> full = job_.GrantRank(Worker("e"), nullptr);
  EXPECT_THAT(full, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(full.status().message()),
              HasSubstr("elastic seats, all taken"));
}

TEST_F(ElasticJobTest, LeavingForGoodRetiresTheRankAtOnce) {
  const NodeId a = Join("a");
  const NodeId b = Join("b");
  Report(a, 0, 1);
  EXPECT_FALSE(job_.MayProceed(2));  // b at 0, s = 1
  ASSERT_OK(job_.LeaveForGood(b, "b", "left for good: test"));
  EXPECT_TRUE(job_.GivenUp(1));
  EXPECT_THAT(map_.retired_ranks(), ElementsAre(1));
  EXPECT_EQ(job_.GatingClock(), 1);
  EXPECT_TRUE(job_.MayProceed(2));
  // Its leave that follows changes nothing; its rank is not taken again.
  job_.WorkerGone(b, "b", "left", /*finished=*/false, kT0);
  EXPECT_EQ(job_.NotWaitedFor(), 1);
  job_.ForgetNode(b);
  EXPECT_EQ(job_.RankOf(Join("c")), 2);  // the next seat, not rank 1
  // The roster and the map survive a restart of the scheduler.
  proto::SchedulerState state;
  job_.Export(&state);
  *state.mutable_map() = map_;
  Job recovered(SspWithSeats(), &map_, &members_, &durable_);
  recovered.Import(state, job_.ClocksSnapshot(), 0, nullptr);
  EXPECT_TRUE(recovered.GivenUp(1));
  EXPECT_EQ(recovered.clock(2), 1);
  EXPECT_EQ(recovered.GatingClock(), 1);
  ASSERT_OK_AND_ASSIGN(const int next,
                       recovered.GrantRank(Worker("d"), nullptr));
  EXPECT_EQ(next, 3);
}

TEST_F(ElasticJobTest, EpochSplitsAreFixedOnFirstAskAndKept) {
  const NodeId a = Join("a");
  Join("b");
  bool fixed = false;
  ASSERT_OK_AND_ASSIGN(std::vector<int> e0, job_.EpochSplit(0, &fixed));
  EXPECT_TRUE(fixed);
  EXPECT_THAT(e0, ElementsAre(0, 1));
  Join("c");  // during epoch 0
  ASSERT_OK_AND_ASSIGN(e0, job_.EpochSplit(0, &fixed));
  EXPECT_FALSE(fixed);
  EXPECT_THAT(e0, ElementsAre(0, 1));
  ASSERT_OK(job_.LeaveForGood(a, "a", "test"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> e1, job_.EpochSplit(1, &fixed));
  EXPECT_THAT(e1, ElementsAre(1, 2));
  EXPECT_THAT(job_.EpochSplit(-1, &fixed),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(job_.EpochSplit(1 + 65, &fixed),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // 64 are kept: epoch 0 is forgotten once epoch 64 is fixed.
  for (int e = 2; e <= 64; ++e) ASSERT_OK(job_.EpochSplit(e, &fixed).status());
  EXPECT_THAT(job_.EpochSplit(0, &fixed),
              StatusIs(absl::StatusCode::kOutOfRange));
  // And they survive a restart of the scheduler.
  proto::SchedulerState state;
  job_.Export(&state);
  *state.mutable_map() = map_;
  Job recovered(SspWithSeats(), &map_, &members_, &durable_);
  recovered.Import(state, job_.ClocksSnapshot(), 0, nullptr);
  ASSERT_OK_AND_ASSIGN(e1, recovered.EpochSplit(1, &fixed));
  EXPECT_FALSE(fixed);
  EXPECT_THAT(e1, ElementsAre(1, 2));
}

TEST_F(JobTest, BspWorkersCannotLeaveForGood) {
  const NodeId a = Join("a");
  const absl::Status refused = job_.LeaveForGood(a, "a", "test");
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("BSP"));
  EXPECT_FALSE(job_.GivenUp(0));
  EXPECT_EQ(map_.retired_ranks_size(), 0);
}

// The operator retires a rank (psctl retire): a live worker is asked, and
// its rank retires when it leaves for good; a rank nobody live holds
// retires at once; the last rank, ranks outside the job, and BSP are
// refused.
TEST_F(ElasticJobTest, TheOperatorRetiresARank) {
  const NodeId a = Join("a");
  const NodeId b = Join("b");
  EXPECT_THAT(job_.Retire(2), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(job_.Retire(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(proto::RetireWorkerReply asked, job_.Retire(1));
  EXPECT_TRUE(asked.asked());
  EXPECT_FALSE(asked.retired());
  EXPECT_EQ(asked.node_id(), b);
  EXPECT_EQ(asked.name(), "b");
  EXPECT_TRUE(job_.AskedToLeave(1));
  EXPECT_FALSE(job_.AskedToLeave(0));
  EXPECT_FALSE(job_.GivenUp(1));  // not before it leaves
  ASSERT_OK(job_.LeaveForGood(b, "b", "left for good: asked"));
  EXPECT_FALSE(job_.AskedToLeave(1));
  ASSERT_OK_AND_ASSIGN(proto::RetireWorkerReply done, job_.Retire(1));
  EXPECT_TRUE(done.retired());
  EXPECT_THAT(map_.retired_ranks(), ElementsAre(1));
  // The last rank not retired stays.
  const absl::StatusOr<proto::RetireWorkerReply> last = job_.Retire(0);
  EXPECT_THAT(last, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(last.status().message()), HasSubstr("last rank"));
  // A rank whose worker is gone (dead, not replaced) retires at once.
  const NodeId c = Join("c");
  EXPECT_EQ(job_.RankOf(c), 2);
  members_.MarkLeft(members_.Find(c));
  ASSERT_OK_AND_ASSIGN(proto::RetireWorkerReply at_once, job_.Retire(2));
  EXPECT_TRUE(at_once.retired());
  EXPECT_THAT(map_.retired_ranks(), ElementsAre(1, 2));
  EXPECT_TRUE(job_.GivenUp(2));
  (void)a;
}

TEST_F(JobTest, BspRanksAreNotRetired) {
  Join("a");
  Join("b");
  const absl::StatusOr<proto::RetireWorkerReply> refused = job_.Retire(1);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("BSP"));
  EXPECT_FALSE(job_.AskedToLeave(1));
}

}  // namespace
}  // namespace downpour
