#include "planner/calibration.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_replace.h"
#include "common/test_util.h"
#include "planner/test_fixtures.h"

namespace downpour {
namespace planner {
namespace {

using ::testing::HasSubstr;

TEST(SpreadTest, PercentilesByInterpolation) {
  const Spread s = SpreadOf({5, 1, 3, 2, 4});
  EXPECT_EQ(s.median, 3);
  EXPECT_NEAR(s.p10, 1.4, 1e-12);  // 1 + 0.4 x (2 - 1)
  EXPECT_NEAR(s.p90, 4.6, 1e-12);
  EXPECT_EQ(s.samples, 5);
  EXPECT_EQ(SpreadOf({}).samples, 0);
  EXPECT_EQ(SpreadOf({7}).p90, 7);
}

TEST(CalibrationTest, ParsesWritesAndReadsBack) {
  ASSERT_OK_AND_ASSIGN(Calibration c, ParseCalibration(kRoundCalibration, "c"));
  EXPECT_EQ(c.cluster.host, "testhost");
  EXPECT_EQ(c.cluster.cores, 2);
  EXPECT_EQ(c.compute.gemm_peak_gflops.p90, 10);
  EXPECT_EQ(c.network.in_flight, 4);
  // Written before the data thread's share was measured: all of it.
  EXPECT_EQ(c.network.server_serial_fraction, 1);
  EXPECT_EQ(c.apply_ns_per_float.at("adagrad").median, 2);
  ASSERT_NE(c.compute.FindLayer(10, 100, 10), nullptr);
  EXPECT_EQ(c.compute.FindLayer(10, 100, 11), nullptr);

  // A step, measured plain and streamed to a server, travels with it.
  StepTime t;
  t.batch = 10;
  t.layer_sizes = {100, 10};
  t.ms = {0.1, 0.08, 0.12, 5};
  t.streamed_ms = {0.15, 0.12, 0.2, 7};
  t.streamed_cpu_ms = 0.21;
  t.streamed_server_cpu_ms = 0.04;
  c.compute.steps.push_back(t);

  const std::string path = ::testing::TempDir() + "/cal.json";
  ASSERT_OK(WriteCalibration(path, c));
  ASSERT_OK_AND_ASSIGN(Calibration back, ReadCalibration(path));
  EXPECT_EQ(CalibrationToJson(back).Dump(), CalibrationToJson(c).Dump());
  const StepTime* read = back.compute.FindStep(10, {100, 10});
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(read->streamed_ms.p10, 0.12);
  EXPECT_EQ(read->streamed_ms.samples, 7);
  EXPECT_EQ(read->streamed_cpu_ms, 0.21);
  EXPECT_EQ(read->streamed_server_cpu_ms, 0.04);
  std::remove(path.c_str());
}

TEST(CalibrationTest, EffectiveCoresInterpolate) {
  ComputeCalibration c;
  EXPECT_EQ(c.EffectiveCores(8), 8);  // nothing measured
  c.effective_cores = {{1, 0.5}, {2, 0.9}, {4, 1.5}};
  EXPECT_EQ(c.EffectiveCores(0.5), 0.25);  // proportional below the first
  EXPECT_EQ(c.EffectiveCores(1), 0.5);
  EXPECT_NEAR(c.EffectiveCores(3), 1.2, 1e-12);
  EXPECT_EQ(c.EffectiveCores(16), 1.5);  // flat beyond the last count
}

// Each bad calibration names the file and the field.
TEST(CalibrationTest, BadInputNamesTheField) {
  struct Case {
    std::string from, to;  // an edit of kRoundCalibration
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"\"format_version\": 1", "\"format_version\": 2",
       absl::StatusCode::kFailedPrecondition,
       "calibration file 'c.json': field 'format_version' is 2, this psctl "
       "reads 1"},
      {"\"cores\": 2,", "", absl::StatusCode::kInvalidArgument,
       "calibration file 'c.json': field 'cluster.cores': missing"},
      {"\"latency_us\": {\"median\": 105", "\"latency_us\": {\"median\": 0",
       absl::StatusCode::kInvalidArgument,
       "field 'network.latency_us.median' (line 19): must lie between p10 "
       "and p90"},
      {"\"push_gbs_1\": {\"median\": 1, \"p10\": 1",
       "\"push_gbs_1\": {\"median\": 0, \"p10\": 0",
       absl::StatusCode::kInvalidArgument,
       "field 'network.push_gbs_1.median' (line 22): must be > 0"},
      {"\"step_cv\": 0.1", "\"step_cv\": -1",
       absl::StatusCode::kInvalidArgument,
       "field 'compute.step_cv' (line 10): must be in [0, 10], is -1"},
      {"{\"threads\": 2, \"cores\": 2}", "{\"threads\": 1, \"cores\": 2}",
       absl::StatusCode::kInvalidArgument,
       "field 'compute.effective_cores[1].threads' (line 9): thread counts "
       "must increase"},
      {"\"server_us_per_held_request\": 5,",
       "\"server_us_per_held_request\": 5, \"server_serial_fraction\": 1.5,",
       absl::StatusCode::kInvalidArgument,
       "field 'network.server_serial_fraction' (line 33): must be in [0, 1], "
       "is 1.5"},
      {"\"server_cpu_source\"", "\"server_cpu_sauce\"",
       absl::StatusCode::kInvalidArgument,
       "field 'network.server_cpu_sauce' (line 36): unknown field"},
      {"\"in_flight\": 4,", "\"in_flight\": 4",
       absl::StatusCode::kInvalidArgument,
       "calibration file 'c.json': line 22, column 5: expected ',' or '}'"},
  };
  for (const Case& c : cases) {
    const std::string text =
        absl::StrReplaceAll(kRoundCalibration, {{c.from, c.to}});
    ASSERT_NE(text, kRoundCalibration) << c.from;
    auto r = ParseCalibration(text, "calibration file 'c.json'");
    EXPECT_THAT(r, StatusIs(c.code)) << c.from;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.from;
  }
}

TEST(CalibrationTest, MissingFileIsNotFound) {
  auto r = ReadCalibration("/nonexistent/cal.json");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(r.status().message(),
              HasSubstr("calibration file '/nonexistent/cal.json'"));
}

TEST(CalibrationTest, RefusesAnotherCluster) {
  ASSERT_OK_AND_ASSIGN(Calibration c, ParseCalibration(kRoundCalibration, "c"));
  ClusterIdentity here = c.cluster;
  EXPECT_OK(CheckCluster(c, here, "", "calibration file 'c.json'"));
  here.host = "otherhost";
  absl::Status s = CheckCluster(c, here, "", "calibration file 'c.json'");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(s.message(),
              HasSubstr("calibration file 'c.json': field 'cluster.host' is "
                        "'testhost', this host is 'otherhost'"));
  here = c.cluster;
  here.cores = 16;
  s = CheckCluster(c, here, "", "calibration file 'c.json'");
  EXPECT_THAT(s.message(), HasSubstr("field 'cluster.cores' is '2'"));
  // For a live cluster the scheduler's address decides.
  s = CheckCluster(c, here, "10.0.0.1:7070", "calibration file 'c.json'");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(s.message(), HasSubstr("field 'cluster.scheduler' is 'local'"));
  c.cluster.scheduler = "10.0.0.1:7070";
  EXPECT_OK(CheckCluster(c, here, "10.0.0.1:7070", "c"));
}

TEST(CalibrationTest, ThisHostHasANameAndCores) {
  const ClusterIdentity id = ThisHost();
  EXPECT_FALSE(id.host.empty());
  EXPECT_FALSE(id.cpu_model.empty());
  EXPECT_GE(id.cores, 1);
}

}  // namespace
}  // namespace planner
}  // namespace downpour
