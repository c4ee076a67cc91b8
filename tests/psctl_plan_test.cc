// psctl calibrate and psctl plan as an operator runs them: the plan of a
// fixture model and calibration (table, JSON equal to the library's own
// figures, plot), bad input (missing, malformed, another cluster's: the
// message names the file and the field), and a calibration against real
// daemons, local and live (bounded, no timing asserted).
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "planner/calibration.h"
#include "planner/json.h"
#include "planner/model_spec.h"
#include "planner/plan.h"
#include "planner/test_fixtures.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

struct PsctlRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  std::string stdout_only;
};

PsctlRun Psctl(const std::vector<std::string>& args,
               absl::Duration timeout = absl::Seconds(120)) {
  static int n = 0;
  ++n;
  // stdout alone in its own file (the JSON), both in the log.
  const std::string out = absl::StrCat(TestTmpDir(), "/plan-", n, ".out");
  std::string cmd = RunfilePath("psctl/psctl");
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  std::vector<std::string> argv = {"/bin/sh", "-c",
                                   absl::StrCat(cmd, " > '", out, "'")};
  Subprocess p(argv, absl::StrCat(TestTmpDir(), "/plan-", n, ".log"));
  PsctlRun r;
  if (!p.Start().ok()) return r;
  auto st = p.Wait(timeout);
  if (st.ok() && WIFEXITED(*st)) r.exit_code = WEXITSTATUS(*st);
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  r.stdout_only = slurp(out);
  r.output = slurp(p.log_path()) + r.stdout_only;
  return r;
}

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(TestTmpDir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

class PsctlPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Write("tiny.json", planner::kTinyModel);
    // The fixture, as if measured on this host.
    ASSERT_OK_AND_ASSIGN(
        planner::Calibration c,
        planner::ParseCalibration(planner::kRoundCalibration, "fixture"));
    c.cluster = planner::ThisHost();
    c.cluster.scheduler = "local";
    calibration_ = absl::StrCat(TestTmpDir(), "/cal.json");
    ASSERT_OK(planner::WriteCalibration(calibration_, c));
    cal_ = c;
  }
  std::string model_, calibration_;
  planner::Calibration cal_;
};

TEST_F(PsctlPlanTest, TableJsonAndPlot) {
  PsctlRun r =
      Psctl({"plan", "--model=" + model_, "--calibration=" + calibration_,
             "--workers=1..4", "--servers=1,2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("WORKERS  SERVERS  MODE"));
  EXPECT_THAT(r.output, HasSubstr("<- recommended"));
  EXPECT_THAT(r.output, HasSubstr("RING EXAMPLES/S"));
  EXPECT_THAT(r.output, HasSubstr("recommended: "));
  EXPECT_THAT(r.output, HasSubstr("SSP bound 3"));

  r = Psctl({"plan", "--model=" + model_, "--calibration=" + calibration_,
             "--workers=1..4", "--servers=1,2", "--modes=bsp,asp", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_OK_AND_ASSIGN(planner::Json j, planner::ParseJson(r.stdout_only));
  const planner::Json* rows = j.Find("configurations");
  ASSERT_NE(rows, nullptr);
  ASSERT_EQ(rows->items().size(), 4u * 2 * 2);
  // The command prints what the library computes.
  ASSERT_OK_AND_ASSIGN(planner::ModelSpec m,
                       planner::ParseModelSpec(planner::kTinyModel, "m"));
  planner::PlanRequest req;
  req.workers = {1, 2, 3, 4};
  req.servers = {1, 2};
  req.modes = {planner::Mode::kBsp, planner::Mode::kAsp};
  const planner::Plan plan = planner::MakePlan(m, cal_, req);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const planner::Json& row = rows->items()[i];
    EXPECT_EQ(row.Find("workers")->number(), plan.rows[i].job.workers);
    EXPECT_EQ(row.Find("mode")->string(),
              planner::ModeName(plan.rows[i].job.mode));
    EXPECT_NEAR(row.Find("examples_per_s")->number(),
                plan.rows[i].examples_per_s,
                1e-6 * plan.rows[i].examples_per_s);
  }
  EXPECT_EQ(j.Find("recommended")->Find("workers")->number(),
            plan.rows[plan.recommended].job.workers);

  if (std::system("command -v gnuplot > /dev/null") != 0) {
    GTEST_SKIP() << "no gnuplot here: the plot is not checked";
  }
  const std::string png = absl::StrCat(TestTmpDir(), "/plan.png");
  r = Psctl({"plan", "--model=" + model_, "--calibration=" + calibration_,
             "--workers=1,2,4", "--servers=1,2", "--plot=" + png});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(png, std::ios::binary);
  char magic[8] = {0};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

TEST_F(PsctlPlanTest, BadInputNamesTheFileAndTheField) {
  const std::vector<std::string> grid = {"--workers=1,2", "--servers=1"};
  auto plan = [&](const std::string& model, const std::string& cal,
                  std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"plan", "--model=" + model,
                                     "--calibration=" + cal};
    args.insert(args.end(), grid.begin(), grid.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return Psctl(args);
  };
  PsctlRun r = plan("/nonexistent/m.json", calibration_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr("model file '/nonexistent/m.json': cannot open"));

  const std::string bad_model = Write(
      "bad.json",
      absl::StrReplaceAll(planner::kTinyModel, {{"[100, 10]", "[100, -10]"}}));
  r = plan(bad_model, calibration_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("model file '", bad_model,
                                     "': field 'dense_layers[1]' (line 4)")));

  std::ifstream in(calibration_);
  std::stringstream text;
  text << in.rdbuf();
  const std::string truncated =
      Write("truncated.json", text.str().substr(0, text.str().size() / 2));
  r = plan(model_, truncated);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("calibration file '", truncated, "'")));

  const std::string missing_field = Write(
      "nolatency.json",
      absl::StrReplaceAll(text.str(), {{"\"latency_us\"", "\"latency\""}}));
  r = plan(model_, missing_field);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("field 'network.latency_us': missing"));

  // Measured elsewhere: refused, unless asked to go on.
  const std::string other = Write("other.json", planner::kRoundCalibration);
  r = plan(model_, other);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("calibration file '", other,
                                     "': field 'cluster.host' is 'testhost'")));
  r = plan(model_, other, {"--allow_other_cluster"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("warning (--allow_other_cluster)"));
  // For a live cluster, the scheduler's address must match.
  r = plan(model_, calibration_, {"--scheduler=10.1.2.3:7070"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("field 'cluster.scheduler' is 'local'"));

  // Usage.
  EXPECT_EQ(Psctl({"plan", "--calibration=" + calibration_}).exit_code, 2);
  r = Psctl({"plan", "--model=" + model_, "--calibration=" + calibration_,
             "--workers=0..3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--workers=0..3"));
  EXPECT_EQ(Psctl({"plan", "--model=" + model_, "--calibration=" + calibration_,
                   "--modes=hogwild"})
                .exit_code,
            2);
  EXPECT_EQ(Psctl({"plan", "--model=" + model_, "--calibration=" + calibration_,
                   "--placement=cloud"})
                .exit_code,
            2);
}

// Against real daemons: a local cluster psctl starts itself, then a live
// one. Probes are cut short; only that the figures are there and sane is
// checked, never how fast anything ran.
TEST(PsctlCalibrateTest, LocalAndLiveClusters) {
  const std::string model = Write("mlp.json", R"({
    "batch": 16, "dense_layers": [64, 32, 10], "handler": "adagrad"})");
  const std::string local = absl::StrCat(TestTmpDir(), "/local.json");
  const std::vector<std::string> quick = {
      "--probe_seconds=0.02", "--probe_rounds=2", "--message_kb=16"};
  std::vector<std::string> args = {"calibrate", "--model=" + model,
                                   "--calibration=" + local,
                                   "--work_dir=" + TestTmpDir() + "/cal"};
  args.insert(args.end(), quick.begin(), quick.end());
  PsctlRun r = Psctl(args, absl::Minutes(4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("latency (4-byte pull)"));
  EXPECT_THAT(r.output, HasSubstr("p10"));
  ASSERT_OK_AND_ASSIGN(planner::Calibration c, planner::ReadCalibration(local));
  EXPECT_EQ(c.cluster.scheduler, "local");
  EXPECT_EQ(c.cluster.host, planner::ThisHost().host);
  EXPECT_GT(c.compute.gemm_peak_gflops.median, 0);
  EXPECT_FALSE(c.compute.effective_cores.empty());
  // The probe's noise never reads more cores than threads or the host has.
  for (const auto& [threads, cores] : c.compute.effective_cores) {
    EXPECT_GT(cores, 0);
    EXPECT_LE(cores, threads);
    EXPECT_LE(cores, c.cluster.cores);
  }
  EXPECT_NE(c.compute.FindLayer(16, 64, 32), nullptr);
  const planner::StepTime* step = c.compute.FindStep(16, {64, 32, 10});
  ASSERT_NE(step, nullptr);
  // The step streamed to the local server, as ps_worker's BSP loop runs it.
  EXPECT_GT(step->streamed_ms.samples, 0);
  EXPECT_GT(step->streamed_ms.median, 0);
  EXPECT_THAT(r.output, HasSubstr("its parts sent to the server"));
  // Its CPU on both sides: the process computes the step and sends it, so
  // it spends at least what the step alone takes; the server serves it.
  EXPECT_GE(step->streamed_cpu_ms, step->ms.p10 * 0.5);
  EXPECT_GT(step->streamed_server_cpu_ms, 0);
  EXPECT_THAT(r.output, HasSubstr("CPU of such a step"));
  EXPECT_GT(c.network.latency_us.median, 0);
  EXPECT_EQ(c.network.message_bytes, 16 << 10);
  EXPECT_EQ(c.network.server_cpu_source, "measured");
  EXPECT_GT(c.network.server_us_per_request, 0);
  EXPECT_GT(c.network.server_serial_fraction, 0);
  EXPECT_LE(c.network.server_serial_fraction, 1);
  EXPECT_GT(c.network.control_client_us, 0);
  EXPECT_EQ(c.apply_ns_per_float.count("adagrad"), 1u);

  // The plan reads it back; --cores_only measures the host again.
  r = Psctl({"plan", "--model=" + model, "--calibration=" + local,
             "--workers=1,2", "--servers=1"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Psctl({"calibrate", "--cores_only", "--calibration=" + local,
             "--probe_seconds=0.02"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cores given to k busy threads"));

  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir() + "/live";
  std::system(("mkdir -p " + o.work_dir).c_str());
  o.num_servers = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalCluster> cluster,
                       LocalCluster::Start(o));
  const std::string address = cluster->scheduler_address();
  const std::string live = absl::StrCat(TestTmpDir(), "/live.json");
  args = {"calibrate", "--scheduler=" + address, "--calibration=" + live};
  args.insert(args.end(), quick.begin(), quick.end());
  r = Psctl(args, absl::Minutes(4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_OK_AND_ASSIGN(planner::Calibration lc, planner::ReadCalibration(live));
  EXPECT_EQ(lc.cluster.scheduler, address);
  // Its servers' CPU cannot be read from here, nor their threads'.
  EXPECT_EQ(lc.network.server_cpu_source, "estimated");
  EXPECT_EQ(lc.network.server_serial_fraction, 1);
  r = Psctl({"plan", "--model=" + model, "--calibration=" + live,
             "--scheduler=" + address, "--workers=2", "--servers=2"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Not the cluster it measured.
  r = Psctl({"plan", "--model=" + model, "--calibration=" + live,
             "--scheduler=127.0.0.1:1", "--workers=2", "--servers=2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("field 'cluster.scheduler' is '",
                                               address, "'")));
  EXPECT_OK(cluster->Stop());
}

}  // namespace
}  // namespace downpour
