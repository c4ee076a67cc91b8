#include "planner/plan.h"

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "planner/test_fixtures.h"

namespace downpour {
namespace planner {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseCountsTest, RangesListsAndErrors) {
  EXPECT_THAT(*ParseCounts("4", "--workers"), ElementsAre(4));
  EXPECT_THAT(*ParseCounts("1..4", "--workers"), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(*ParseCounts("8,1,2,4", "--workers"), ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(*ParseCounts("1,3..4,3", "--workers"), ElementsAre(1, 3, 4));
  for (const char* bad : {"", "0", "4..2", "x", "1..", "1,,2", "5000"}) {
    auto r = ParseCounts(bad, "--servers");
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--servers=")) << bad;
  }
  EXPECT_THAT(*ParseModes("asp,bsp", "--modes"),
              ElementsAre(Mode::kBsp, Mode::kAsp));
  EXPECT_THAT(ParseModes("bsp,hogwild", "--modes").status().message(),
              HasSubstr("'hogwild' is not bsp, ssp or asp"));
}

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(model_, ParseModelSpec(kTinyModel, "m"));
    ASSERT_OK_AND_ASSIGN(cal_, ParseCalibration(kRoundCalibration, "c"));
  }
  ModelSpec model_;
  Calibration cal_;
};

TEST_F(PlanTest, GridAndRecommendation) {
  PlanRequest r;
  r.workers = {1, 2, 4};
  r.servers = {1, 2};
  const Plan plan = MakePlan(model_, cal_, r);
  ASSERT_EQ(plan.rows.size(), 3u * 2 * 3);
  ASSERT_EQ(plan.all_reduce.size(), 3u * 2);
  // Nesting: workers, then servers, then modes.
  EXPECT_EQ(plan.rows[0].job.workers, 1);
  EXPECT_EQ(plan.rows[3].job.servers, 2);
  EXPECT_EQ(plan.rows[4].job.mode, Mode::kSsp);
  // The recommendation is the fastest row, or one within 3% of it with
  // fewer processes.
  double best = 0;
  for (const Prediction& p : plan.rows) best = std::max(best, p.examples_per_s);
  const Prediction& rec = plan.rows[plan.recommended];
  EXPECT_GE(rec.examples_per_s, (1 - kRecommendTolerance) * best);
  for (const Prediction& p : plan.rows) {
    if (p.examples_per_s >= (1 - kRecommendTolerance) * best) {
      EXPECT_LE(rec.job.workers + rec.job.servers,
                p.job.workers + p.job.servers);
    }
  }
  EXPECT_THAT(plan.reason, HasSubstr("examples/s predicted"));
  EXPECT_THAT(plan.reason, HasSubstr("ring all-reduce"));
}

TEST_F(PlanTest, TiesGoToFewerProcessesThenToBsp) {
  // With nothing but compute (no network costs, no stragglers, cores for
  // everyone), every mode and server count predicts the same throughput at
  // a given worker count.
  cal_.network = NetworkCalibration();  // no CPU per request or byte
  for (Spread* s : {&cal_.network.push_gbs_1, &cal_.network.pull_gbs_1,
                    &cal_.network.push_gbs_k, &cal_.network.pull_gbs_k}) {
    s->median = s->p10 = s->p90 = 1e9;
  }
  cal_.apply_ns_per_float.clear();
  cal_.compute.step_cv = 0;
  PlanRequest r;
  r.workers = {2};
  r.servers = {1, 2};
  r.options.cores = 64;  // not the calibrated 2: taken at face value
  const Plan plan = MakePlan(model_, cal_, r);
  const Prediction& rec = plan.rows[plan.recommended];
  EXPECT_EQ(rec.job.servers, 1);
  EXPECT_EQ(rec.job.mode, Mode::kBsp);
  EXPECT_EQ(rec.bottleneck, Bottleneck::kCompute);
}

TEST_F(PlanTest, JsonAndPlot) {
  PlanRequest r;
  r.workers = {1, 2};
  r.servers = {1, 2};
  r.modes = {Mode::kBsp, Mode::kAsp};
  const Plan plan = MakePlan(model_, cal_, r);
  const Json j = PlanToJson(plan, model_, cal_);
  ASSERT_NE(j.Find("configurations"), nullptr);
  EXPECT_EQ(j.Find("configurations")->items().size(), 8u);
  const Json& first = j.Find("configurations")->items()[0];
  EXPECT_EQ(first.Find("mode")->string(), "bsp");
  EXPECT_GT(first.Find("examples_per_s")->number(), 0);
  EXPECT_NE(first.Find("busiest_server"), nullptr);
  EXPECT_EQ(j.Find("all_reduce")->items()[1].Find("algorithm")->string(),
            "tree");
  EXPECT_NE(j.Find("recommended")->Find("reason"), nullptr);
  EXPECT_EQ(j.Find("model")->Find("dense_parameters")->number(), 1010);
  // Parses back.
  EXPECT_OK(ParseJson(j.Dump()).status());

  const std::string data = PlotData(plan);
  EXPECT_THAT(data, HasSubstr("# bsp, 1 servers\n1 "));
  EXPECT_THAT(data, HasSubstr("# asp, 2 servers\n"));
  EXPECT_THAT(data, HasSubstr("# ring all-reduce\n"));
  const std::string gp = GnuplotScript(plan, "/tmp/p.dat", "/tmp/p.png", "t");
  EXPECT_THAT(gp, HasSubstr("set output '/tmp/p.png'"));
  EXPECT_THAT(gp, HasSubstr("multiplot layout 1,2"));
  // Blocks 0-3 are bsp/asp x 1/2 servers; 4 is the ring.
  EXPECT_THAT(gp, HasSubstr("index 3 using 1:2"));
  EXPECT_THAT(gp, HasSubstr("index 4 using 1:2 with lines dt 2"));
}

}  // namespace
}  // namespace planner
}  // namespace downpour
