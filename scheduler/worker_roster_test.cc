#include "scheduler/worker_roster.h"

#include "common/test_util.h"

namespace downpour {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ConsistencyPolicy Policy(const std::string& name, int n, int b) {
  auto p = ConsistencyPolicy::Parse(name, name == "ssp" ? 2 : 0, n, b);
  EXPECT_OK(p);
  return *p;
}

WorkerLossOptions Options(WorkerLossOptions::OnLoss on_loss) {
  WorkerLossOptions o;
  o.replace_timeout = absl::Seconds(10);
  o.on_loss = on_loss;
  return o;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(WorkerLossOptionsTest, ParseOnLoss) {
  auto stop = WorkerLossOptions::ParseOnLoss("stop");
  ASSERT_OK(stop);
  EXPECT_EQ(*stop, WorkerLossOptions::OnLoss::kStop);
  auto go_on = WorkerLossOptions::ParseOnLoss("continue");
  ASSERT_OK(go_on);
  EXPECT_EQ(*go_on, WorkerLossOptions::OnLoss::kContinue);
  EXPECT_THAT(WorkerLossOptions::ParseOnLoss("later"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      std::string(WorkerLossOptions::ParseOnLoss("later").status().message()),
      HasSubstr("stop or continue"));
}

TEST(WorkerRosterTest, StopFailsTheJobNamingTheWorkerAfterTheBound) {
  WorkerRoster roster(Policy("bsp", 3, 0),
                      Options(WorkerLossOptions::OnLoss::kStop));
  roster.Lost(1, "w1", "missed heartbeats", kT0);
  EXPECT_TRUE(roster.lost(1));
  EXPECT_TRUE(roster.Check(kT0 + absl::Seconds(9)).empty());
  EXPECT_OK(roster.failure());
  EXPECT_TRUE(roster.Check(kT0 + absl::Seconds(10)).empty());
  EXPECT_THAT(roster.failure(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(std::string((roster.failure()).message()),
              AllOf(HasSubstr("'w1' (rank 1)"), HasSubstr("missed heartbeats"),
                    HasSubstr("--on_worker_loss=stop")));
}

TEST(WorkerRosterTest, ReplacementWithinTheBoundKeepsTheJob) {
  WorkerRoster roster(Policy("ssp", 2, 0),
                      Options(WorkerLossOptions::OnLoss::kStop));
  roster.Lost(0, "w0", "left: SIGTERM", kT0);
  EXPECT_OK(roster.Replaced(0));
  EXPECT_FALSE(roster.lost(0));
  EXPECT_TRUE(roster.Check(kT0 + absl::Hours(1)).empty());
  EXPECT_OK(roster.failure());
}

TEST(WorkerRosterTest, ContinueRetiresTheRankForGood) {
  WorkerRoster roster(Policy("ssp", 3, 0),
                      Options(WorkerLossOptions::OnLoss::kContinue));
  roster.Lost(2, "w2", "missed heartbeats", kT0);
  EXPECT_TRUE(roster.Check(kT0 + absl::Seconds(5)).empty());
  EXPECT_THAT(roster.Check(kT0 + absl::Seconds(11)), ElementsAre(2));
  EXPECT_TRUE(roster.retired(2));
  EXPECT_FALSE(roster.lost(2));
  EXPECT_OK(roster.failure());
  EXPECT_TRUE(roster.Check(kT0 + absl::Seconds(20)).empty());  // once
  EXPECT_THAT(roster.Replaced(2),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(absl::Status(roster.Replaced(2)).message()),
              HasSubstr("went on without it"));
  roster.Lost(2, "w2", "again", kT0);  // retired: no longer tracked
  EXPECT_FALSE(roster.lost(2));
}

TEST(WorkerRosterTest, BackupWorkersAbsorbLossesUpToB) {
  WorkerRoster roster(Policy("bsp", 2, 1),
                      Options(WorkerLossOptions::OnLoss::kStop));
  roster.Lost(0, "w0", "missed heartbeats", kT0);
  EXPECT_TRUE(roster.Check(kT0 + absl::Hours(1)).empty());
  EXPECT_OK(roster.failure());
  // A second loss exceeds the backups: now the bound applies, to the
  // ranks lost longer than it.
  roster.Lost(2, "w2", "missed heartbeats", kT0 + absl::Hours(1));
  roster.Check(kT0 + absl::Hours(1) + absl::Seconds(1));
  EXPECT_THAT(roster.failure(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(std::string((roster.failure()).message()),
              HasSubstr("'w0' (rank 0)"));
}

TEST(WorkerRosterTest, FinishedWorkersAreNotLost) {
  WorkerRoster roster(Policy("asp", 2, 0),
                      Options(WorkerLossOptions::OnLoss::kStop));
  roster.Finished(1);
  roster.Lost(1, "w1", "missed heartbeats", kT0);
  EXPECT_FALSE(roster.lost(1));
  roster.Lost(9, "w9", "outside the job", kT0);  // ignored
  roster.Check(kT0 + absl::Hours(1));
  EXPECT_OK(roster.failure());
}

TEST(WorkerRosterTest, ExportedAndImportedItGoesOnWhereItWas) {
  WorkerRoster roster(Policy("ssp", 4, 0),
                      Options(WorkerLossOptions::OnLoss::kContinue));
  roster.Lost(1, "w1", "missed heartbeats", kT0);
  roster.Lost(2, "w2", "left: SIGTERM", kT0 + absl::Seconds(4));
  roster.Finished(3);
  EXPECT_THAT(roster.Check(kT0 + absl::Seconds(10)), ElementsAre(1));
  const proto::WorkerRosterState saved = roster.Export();
  EXPECT_EQ(saved.ranks_size(), 3);  // rank 0 has nothing to keep

  // A restarted scheduler: rank 1 stays retired, rank 2's wait goes on
  // from when it was lost (not from the restart), rank 3 finished.
  WorkerRoster again(Policy("ssp", 4, 0),
                     Options(WorkerLossOptions::OnLoss::kContinue));
  again.Import(saved);
  EXPECT_TRUE(again.retired(1));
  EXPECT_TRUE(again.lost(2));
  EXPECT_TRUE(again.finished(3));
  EXPECT_FALSE(again.lost(0));
  EXPECT_THAT(again.Replaced(1),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(again.Check(kT0 + absl::Seconds(13)).empty());
  EXPECT_THAT(again.Check(kT0 + absl::Seconds(14)), ElementsAre(2));

  // A job that stopped stays stopped.
  WorkerRoster stopped(Policy("bsp", 2, 0),
                       Options(WorkerLossOptions::OnLoss::kStop));
  stopped.Lost(0, "w0", "missed heartbeats", kT0);
  stopped.Check(kT0 + absl::Seconds(10));
  ASSERT_FALSE(stopped.failure().ok());
  WorkerRoster stopped_again(Policy("bsp", 2, 0),
                             Options(WorkerLossOptions::OnLoss::kStop));
  stopped_again.Import(stopped.Export());
  EXPECT_EQ(stopped_again.failure(), stopped.failure());
  // Ranks beyond this job (a state of another shape) are ignored.
  proto::WorkerRosterState odd;
  odd.add_ranks()->set_rank(7);
  odd.mutable_ranks(0)->set_lost(true);
  stopped_again.Import(odd);
  EXPECT_OK(stopped_again.failure());
  EXPECT_FALSE(stopped_again.lost(0));
}

}  // namespace
}  // namespace downpour
