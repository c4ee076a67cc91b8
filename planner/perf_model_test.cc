#include "planner/perf_model.h"

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "planner/order_stats.h"
#include "planner/test_fixtures.h"
#include "planner/traffic.h"

namespace downpour {
namespace planner {
namespace {

constexpr double kUs = 1e-6;

class PerfModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(model_, ParseModelSpec(kTinyModel, "m"));
    ASSERT_OK_AND_ASSIGN(cal_, ParseCalibration(kRoundCalibration, "c"));
  }
  ModelSpec model_;
  Calibration cal_;
};

TEST(OrderStatsTest, KnownValues) {
  EXPECT_NEAR(NormalOrderStatistic(1, 1), 0, 1e-9);
  EXPECT_NEAR(NormalOrderStatistic(2, 2), 0.5642, 1e-4);  // 1 / sqrt(pi)
  EXPECT_NEAR(NormalOrderStatistic(1, 2), -0.5642, 1e-4);
  EXPECT_NEAR(NormalOrderStatistic(2, 3), 0, 1e-6);  // the median
  EXPECT_NEAR(NormalOrderStatistic(4, 4), 1.0294, 1e-4);
  EXPECT_NEAR(NormalOrderStatistic(8, 8), 1.4236, 1e-4);
  // A backup worker: the 4th fastest of 5 comes sooner than the slowest of 4.
  EXPECT_NEAR(NormalOrderStatistic(4, 5), 0.4950, 1e-4);
}

TEST_F(PerfModelTest, WorkerComputeFromLayerRates) {
  // Forward and weight gradient: 2 x 10 x 100 x 10 = 20000 FLOP each at
  // 1 GFLOP/s = 20 us; no input gradient for the first layer. Memory:
  // 10 x 10 activations x 24 bytes + the batch gathered, 2 x 4 x 10 x 100:
  // 10400 bytes at 10 GB/s = 1.04 us.
  const ComputeEstimate e = WorkerCompute(model_, cal_.compute);
  EXPECT_NEAR(e.forward_s, 20 * kUs, 1e-12);
  EXPECT_NEAR(e.backward_s, 20 * kUs, 1e-12);
  EXPECT_NEAR(e.memory_s, 1.04 * kUs, 1e-12);
  EXPECT_FALSE(e.roofline);
}

TEST_F(PerfModelTest, UncalibratedLayersUseTheRoofline) {
  model_.layer_sizes = {100, 10, 10};
  const ComputeEstimate e = WorkerCompute(model_, cal_.compute);
  EXPECT_TRUE(e.roofline);
  // Layer 1 (10 -> 10, batch 10): 2000 FLOP over 3 x 100 floats = 1200
  // bytes; 10 GB/s x 2000 / 1200 = 16.7 GFLOP/s, above the 10 GFLOP/s
  // peak, so 0.2 us for each of its three products.
  EXPECT_NEAR(e.forward_s, (20 + 0.2) * kUs, 1e-12);
  EXPECT_NEAR(e.backward_s, (20 + 0.4) * kUs, 1e-12);
}

TEST_F(PerfModelTest, TrafficFollowsPlacementAndLoops) {
  // W0 (100 rows of 40 bytes) on 2 servers: rows [0, 50) and [50, 100);
  // b0 (1 row) lands on server 0.
  std::vector<ServerTraffic> t = StepTraffic(model_, 2, Mode::kBsp);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].bytes_up, 2040);
  EXPECT_EQ(t[1].bytes_up, 2000);
  EXPECT_EQ(t[0].requests, 2);  // one part of W0, one of b0
  EXPECT_EQ(t[1].requests, 1);
  EXPECT_EQ(t[0].floats_applied, 510);
  EXPECT_EQ(StepTraffic(model_, 2, Mode::kSsp)[0].requests, 4);
  // The MLP's W0 (784 x 256 floats = 784 KiB) is cut into 128-row parts
  // of 128 KiB: 7 parts; on 2 servers the cut at row 392 splits one.
  ModelSpec mlp = model_;
  mlp.layer_sizes = {784, 256, 10};
  t = StepTraffic(mlp, 2, Mode::kBsp);
  EXPECT_EQ(t[0].requests, 4 + 3);  // W0 rows [0, 392): parts 0-3; b0, W1, b1
  EXPECT_EQ(t[1].requests, 4 + 1);  // W0 rows [392, 784): parts 3-6; W1
  EXPECT_EQ(Total(t).bytes_up, 4.0 * mlp.DenseFloats());
}

TEST_F(PerfModelTest, OneAspWorkerWaitsForTheRoundTrip) {
  // Tc = 41.04 us, and the training thread issues 2 requests of 4040 bytes
  // each way: 2 x 2 us + 8080 x 0.01 ns = 4.0808 us. The PushPull (1 GB/s)
  // takes 100 + 4.04 + 4.04 = 108.08 us, so 62.9592 us is not hidden.
  JobShape job;
  job.mode = Mode::kAsp;
  const Prediction p = Predict(model_, cal_, job, PlanOptions{});
  EXPECT_NEAR(p.compute.total_s(), 41.04 * kUs, 1e-12);
  EXPECT_EQ(p.straggler_factor, 1);
  EXPECT_NEAR(p.caller_cpu_s, 4.0808 * kUs, 1e-12);
  EXPECT_NEAR(p.exposed_comm_s, 62.9592 * kUs, 1e-11);
  EXPECT_NEAR(p.critical_s, 108.08 * kUs, 1e-11);
  // Client: 2 requests x 10 us + 8080 bytes x 0.1 ns + a 20 us clock
  // report = 40.808 us. Server: 20.808 us plus 1010 floats x 2 ns
  // (adagrad) = 22.828 us. Host: 41.04 + 40.808 + 22.828 + 30 (the
  // scheduler's share of the report) = 134.676 us of CPU keep 1.246
  // threads busy over the critical path; the 2 cores give them that, so
  // the host term equals the critical path.
  EXPECT_NEAR(p.client_cpu_s, 40.808 * kUs, 1e-11);
  EXPECT_NEAR(p.server_s, 22.828 * kUs, 1e-11);
  EXPECT_NEAR(p.effective_cores, 134.676 / 108.08, 1e-9);
  EXPECT_NEAR(p.host_s, 108.08 * kUs, 1e-11);
  EXPECT_EQ(p.bottleneck, Bottleneck::kLatency);
  EXPECT_NEAR(p.step_s, 108.08 * kUs, 1e-11);
  EXPECT_NEAR(p.examples_per_s, 10 / (108.08 * kUs), 1e-3);
}

TEST_F(PerfModelTest, AProcessKeepsUpToTwoThreadsBusy) {
  // 8 free cores, and a client whose I/O threads spend 200 us a request
  // (the calling thread still 2 us): with 1 ASP worker and 1 server, the
  // job's CPU keeps more threads busy over the critical path than it has
  // processes, as on the 16-core host (8 workers and one server kept 10.9
  // cores busy). Two busy threads a process, not one.
  Calibration c = cal_;
  c.cluster.cores = 8;
  c.compute.effective_cores = {{1, 1}, {8, 8}};
  c.network.client_us_per_request = 200;
  JobShape job;
  job.mode = Mode::kAsp;
  const Prediction p = Predict(model_, c, job, PlanOptions{});
  EXPECT_NEAR(p.critical_s, 108.08 * kUs, 1e-11);
  // 41.04 us of compute, 2 x 200 + 0.808 + 20 us of client CPU, 30 us of
  // the scheduler's, 22.828 us of the server's: 514.676 us, 4.76 threads
  // over the critical path, of which 2 processes keep 4 busy.
  EXPECT_NEAR(p.client_cpu_s, 420.808 * kUs, 1e-11);
  EXPECT_NEAR(p.effective_cores, 4, 1e-9);
  EXPECT_NEAR(p.host_s, 514.676 / 4 * kUs, 1e-11);
  EXPECT_EQ(p.bottleneck, Bottleneck::kHostCores);
}

TEST_F(PerfModelTest, FourBspWorkersOnTwoCoresAreHostBound) {
  JobShape job;
  job.workers = 4;
  job.servers = 2;
  job.mode = Mode::kBsp;
  const Prediction p = Predict(model_, cal_, job, PlanOptions{});
  // g = 1 + 0.1 x E[slowest of 4] = 1.10294.
  EXPECT_NEAR(p.straggler_factor, 1.10294, 1e-5);
  // Server 0, per step of the job: 4 x (2 requests x 10 us + 2040 bytes x
  // 0.2 ns) = 81.632 us, holding 4 x 2040 bytes x 5 ns = 40.8 us, and
  // 510 floats x (4 x 0.5 + 1.5) ns = 1.785 us; server 1: 4 x (10 + 0.4)
  // + 40 + 1.75 = 83.35 us.
  EXPECT_EQ(p.busiest.index, 0);
  EXPECT_NEAR(p.server_s, 124.217 * kUs, 1e-11);
  EXPECT_EQ(p.busiest.requests, 8);
  EXPECT_EQ(p.busiest.bytes_in, 4 * 2040);
  EXPECT_NEAR(p.servers_cpu_s, (124.217 + 83.35) * kUs, 1e-11);
  // The last part (all 4040 bytes) round trip: 100 + 8.08 us; then the
  // busiest server's turn, less what it receives from the 3 workers
  // answered first while the last computes: 3/4 of 4 x (10 / 2 us + 2040
  // bytes x 0.1 ns) = 30.612 us (the compute, 51.97 us, covers it). That
  // is more than the last part's own work (its push 0.404 us, apply 1.515
  // us, half of 3 other replies 0.606 us).
  EXPECT_NEAR(p.server_wait_s, (124.217 - 30.612) * kUs, 1e-11);
  EXPECT_NEAR(p.exposed_comm_s, (108.08 + 93.605) * kUs, 1e-11);
  // The training thread: 41.04 us of compute and 3 requests (6.0808 us).
  EXPECT_NEAR(p.critical_s, (1.10294 * 47.1208 + 201.685) * kUs, 1e-9);
  // Host: 4 x (41.04 + 50.808 + 30) + 124.217 + 83.35 = 694.959 us of
  // CPU, 2.74 threads busy over the critical path, of which the 2 cores
  // run 2.
  EXPECT_NEAR(p.client_cpu_s, 50.808 * kUs, 1e-11);
  EXPECT_NEAR(p.host_s, 694.959 / 2 * kUs, 1e-10);
  EXPECT_EQ(p.bottleneck, Bottleneck::kHostCores);
  EXPECT_NEAR(p.examples_per_s, 40 / (347.4795 * kUs), 1);
}

TEST_F(PerfModelTest, BspWorkersWaitForTheBusiestServersTurn) {
  // One host per process: no host term. The BSP step is the compute, the
  // last part's round trip and the server's turn, one after another.
  JobShape job;
  job.workers = 4;
  job.servers = 1;
  job.mode = Mode::kBsp;
  PlanOptions o;
  o.placement = Placement::kDedicatedHosts;
  o.nic_gbs = 100;
  const Prediction p = Predict(model_, cal_, job, o);
  // The server's turn: 4 x (2 requests x 10 us + 4040 bytes x 0.2 ns) =
  // 83.232 us, holding 4 x 4040 bytes x 5 ns = 80.8 us, summing and
  // applying 1010 floats x 3.5 ns = 3.535 us: 167.567 us; of its receiving,
  // 4 x (5 + 0.404) us, the 3 workers answered first's share (31.212 us)
  // overlaps the last one's compute.
  EXPECT_NEAR(p.server_s, 167.567 * kUs, 1e-11);
  EXPECT_NEAR(p.server_wait_s, (167.567 - 31.212) * kUs, 1e-11);
  EXPECT_NEAR(p.critical_s,
              p.straggler_factor * (p.compute.total_s() + p.caller_cpu_s) +
                  (108.08 + 136.355) * kUs,
              1e-11);
  EXPECT_EQ(p.step_s, p.critical_s);
  EXPECT_EQ(p.bottleneck, Bottleneck::kServerCpu);
  // One worker: nobody is answered first, the whole turn waits.
  job.workers = 1;
  const Prediction one = Predict(model_, cal_, job, o);
  EXPECT_NEAR(one.server_wait_s, one.server_s, 1e-15);
  // ASP overlaps the server's work with the next step: no turn to wait.
  job.workers = 4;
  job.mode = Mode::kAsp;
  const Prediction asp = Predict(model_, cal_, job, o);
  EXPECT_EQ(asp.server_wait_s, 0);
  EXPECT_LT(asp.critical_s, p.critical_s);
}

TEST_F(PerfModelTest, OnlyTheDataThreadsShareOfAServerIsServedInTurn) {
  // The job above with a quarter of the server's request and byte CPU on
  // its data thread: server 0's 81.632 us of requests and bytes count
  // 20.408 us towards its step; holding (40.8 us) and applying (1.785 us)
  // stay whole. All of its CPU still counts towards the host.
  cal_.network.server_serial_fraction = 0.25;
  JobShape job;
  job.workers = 4;
  job.servers = 2;
  job.mode = Mode::kBsp;
  const Prediction p = Predict(model_, cal_, job, PlanOptions{});
  EXPECT_NEAR(p.server_s, (20.408 + 42.585) * kUs, 1e-11);
  EXPECT_NEAR(p.busiest.cpu_s, 124.217 * kUs, 1e-11);
  EXPECT_NEAR(p.servers_cpu_s, (124.217 + 83.35) * kUs, 1e-11);
}

TEST_F(PerfModelTest, AMeasuredStepReplacesTheLayerEstimate) {
  // The whole step measured at 82.08 us (p10), twice the layer estimate:
  // every part doubles.
  StepTime t;
  t.batch = 10;
  t.layer_sizes = {100, 10};
  t.ms.median = t.ms.p90 = 0.1;
  t.ms.p10 = 0.08208;
  cal_.compute.steps.push_back(t);
  const ComputeEstimate e = WorkerCompute(model_, cal_.compute);
  EXPECT_TRUE(e.measured_step);
  EXPECT_NEAR(e.estimated_s, 41.04 * kUs, 1e-12);
  EXPECT_NEAR(e.total_s(), 82.08 * kUs, 1e-12);
  EXPECT_NEAR(e.forward_s, 40 * kUs, 1e-12);
  // Another batch size is not that step.
  model_.batch = 20;
  EXPECT_FALSE(WorkerCompute(model_, cal_.compute).measured_step);
}

// The streamed step measured at twice the client CPU and three times the
// server CPU that the per-request costs make of its traffic: BSP's
// data-plane CPU follows the measurement, other modes keep the costs. One
// worker's step against one server: W0 (4000 bytes) and b0 (40 bytes) a
// part each, 2 x 10 us + 4040 bytes x 0.1 ns each way = 20.808 us on
// either side.
TEST_F(PerfModelTest, TheStreamedStepsCpuScalesBspsDataPlane) {
  JobShape job;
  job.workers = 2;
  job.servers = 1;
  job.mode = Mode::kBsp;
  JobShape asp = job;
  asp.mode = Mode::kAsp;
  StepTime t;
  t.batch = model_.batch;
  t.layer_sizes = model_.layer_sizes;
  t.ms.median = t.ms.p90 = t.ms.p10 = 0.05;
  cal_.compute.steps.push_back(t);
  const Prediction before = Predict(model_, cal_, job, PlanOptions());
  const Prediction asp_before = Predict(model_, cal_, asp, PlanOptions());

  // The probe's process: the step's 50 us and twice 20.808 us; its
  // server: three times 20.808 us and the parts applied with sgd (1010
  // floats at 1 ns).
  cal_.compute.steps.back().streamed_cpu_ms = (50 + 2 * 20.808) * 1e-3;
  cal_.compute.steps.back().streamed_server_cpu_ms = (3 * 20.808 + 1.01) * 1e-3;
  const Prediction after = Predict(model_, cal_, job, PlanOptions());
  const double control = 20 * kUs;
  EXPECT_NEAR(before.client_cpu_s - control, 20.808 * kUs, 1e-11);
  EXPECT_NEAR(after.client_cpu_s - control, 2 * 20.808 * kUs, 1e-11);
  // Two senders' transport, each three times the cost figures'.
  EXPECT_NEAR(after.servers_cpu_s - before.servers_cpu_s, 2 * 2 * 20.808 * kUs,
              1e-11);
  const Prediction asp_after = Predict(model_, cal_, asp, PlanOptions());
  EXPECT_EQ(asp_after.client_cpu_s, asp_before.client_cpu_s);
  EXPECT_EQ(asp_after.servers_cpu_s, asp_before.servers_cpu_s);
}

TEST_F(PerfModelTest, DedicatedHostsHaveNoHostTermButALink) {
  JobShape job;
  job.workers = 4;
  job.servers = 1;
  job.mode = Mode::kAsp;
  PlanOptions o;
  o.placement = Placement::kDedicatedHosts;
  o.nic_gbs = 0.0001;  // 100 KB/s: the server's link is the limit
  const Prediction p = Predict(model_, cal_, job, o);
  EXPECT_EQ(p.host_s, 0);
  // 4 x 4040 bytes in per step at 1e5 bytes/s.
  EXPECT_NEAR(p.nic_s, 4 * 4040 / 1e5, 1e-9);
  EXPECT_EQ(p.bottleneck, Bottleneck::kServerNic);
}

TEST_F(PerfModelTest, BackupWorkersAndStalenessShrinkTheStragglerFactor) {
  JobShape job;
  job.workers = 4;
  job.mode = Mode::kBsp;
  const double bsp = Predict(model_, cal_, job, {}).straggler_factor;
  job.backup_workers = 1;
  const double backup = Predict(model_, cal_, job, {}).straggler_factor;
  job.backup_workers = 0;
  job.mode = Mode::kSsp;
  job.staleness = 3;
  const double ssp = Predict(model_, cal_, job, {}).straggler_factor;
  EXPECT_NEAR(backup, 1 + 0.1 * 0.4950, 1e-4);
  EXPECT_NEAR(ssp, 1 + 0.1 * 1.0294 / 2, 1e-4);  // / sqrt(s + 1)
  EXPECT_LT(backup, bsp);
  EXPECT_LT(ssp, bsp);
}

TEST_F(PerfModelTest, RingAllReduce) {
  // 4 workers, 4040 bytes: 6 messages of 1010 bytes (600 us of latency,
  // 6.06 us of transfer) and 757.5 floats summed (0.379 us); the backward
  // pass (20 us) hides 20 us of it; then the update, 1010 x 1.5 ns.
  const Prediction p =
      PredictAllReduce(model_, cal_, 4, AllReduce::kRing, PlanOptions{});
  EXPECT_NEAR(p.exposed_comm_s, (606.43875 - 20 + 1.515) * kUs, 1e-11);
  EXPECT_EQ(p.bottleneck, Bottleneck::kLatency);
  const Prediction tree =
      PredictAllReduce(model_, cal_, 4, AllReduce::kTree, PlanOptions{});
  // 2 levels each way: 4 x (100 + 4.04) us + 2 x 1010 x 0.5 ns.
  EXPECT_NEAR(tree.exposed_comm_s, (416.16 + 1.01 - 20 + 1.515) * kUs, 1e-11);
  // One worker all-reduces nothing.
  const Prediction one =
      PredictAllReduce(model_, cal_, 1, AllReduce::kRing, PlanOptions{});
  EXPECT_NEAR(one.exposed_comm_s, 1.515 * kUs, 1e-12);
}

}  // namespace
}  // namespace planner
}  // namespace downpour
