// Jobs that survive a lost worker, over the real daemons (scheduler,
// servers and ps_worker processes on loopback):
//  - BSP without backups: a worker killed with -9 and replaced under the
//    same name; the replacement takes its rank, data shard and clock, and
//    the final parameters equal the single-process computation bit for bit
//    (within 1e-2 relative when the kill fell between two sends of a step,
//    which the replacement logs).
//  - The same for a worker killed before its first clock report: the
//    replacement skips the start-up barrier the job has passed.
//  - BSP with one backup worker: a kill changes nothing; the others finish
//    without waiting for a replacement (the bound is set to ten minutes).
//  - SSP and ASP, --on_worker_loss=continue: the job finishes with fewer
//    workers soon after the bound; the lost rank is shown as retired.
//  - BSP, --on_worker_loss=continue: the servers complete the held step
//    and the later ones with the workers left; the parameters equal the
//    single-process run without the lost rank from its last step on, bit
//    for bit.
//  - --on_worker_loss=stop (SSP, ASP, and BSP with the survivors blocked on
//    the data plane): every survivor exits with status 1 soon after the
//    bound, naming the lost worker.
//  - A worker lost before the start-up barrier: the others pass it once
//    the job gives the rank up (a backup absorbs it, or it is retired).
//  - SIGTERM: the worker logs, leaves the job, the scheduler shows it LEFT
//    at once (long before heartbeats would expire), and a replacement
//    finishes the job.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "launch/local_job.h"
#include "models/batcher.h"
#include "models/dataset.h"
#include "models/learning_rate.h"
#include "models/model.h"
#include "proto/downpour.pb.h"
#include "tests/model_params.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";
constexpr int kBatch = 32;
constexpr uint64_t kSeed = 7;

std::vector<std::string> WorkerFlags(int steps) {
  return {"--model=softmax",
          absl::StrCat("--steps=", steps),
          absl::StrCat("--batch=", kBatch),
          absl::StrCat("--seed=", kSeed),
          "--eval_every=100000",
          "--lr=0.05",
          "--warmup_steps=5"};
}

// A job of two servers in its own folder, without workers yet.
LocalJobOptions JobOptions(const std::string& tag,
                           std::vector<std::string> scheduler_flags) {
  const std::string dir = TestTmpDir() + "/" + tag;
  EXPECT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = 2;
  o.cluster.scheduler_flags = std::move(scheduler_flags);
  return o;
}

std::unique_ptr<LocalJob> StartJob(const std::string& tag,
                                   std::vector<std::string> scheduler_flags,
                                   int workers, int steps) {
  LocalJobOptions o = JobOptions(tag, std::move(scheduler_flags));
  // Worker i (named w<i>) takes rank i, so that a test knows whom it kills.
  for (int i = 0; i < workers; ++i) {
    o.workers.push_back(WorkerFlags(steps));
    o.workers.back().push_back(absl::StrCat("--rank=", i));
  }
  auto job = LocalJob::Start(o);
  EXPECT_OK(job);
  return job.ok() ? std::move(*job) : nullptr;
}

// Polls the job status until worker `rank` has reported `clock`.
absl::Status WaitForClock(const std::string& scheduler, int rank, int64_t clock,
                          absl::Duration timeout) {
  SchedulerClient sched(scheduler);
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto status = sched.GetJobStatus();
    if (status.ok() && status->workers(rank).clock() >= clock) {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("worker ", rank, " did not reach clock ", clock));
}

std::string ReadLog(Subprocess& p) {
  std::ifstream in(p.log_path());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int ExitCode(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
}

// The softmax tables of a finished job, in the model's block order.
std::vector<float> ReadParams(const std::string& scheduler) {
  ClientOptions co;
  co.scheduler_address = scheduler;
  auto client = Client::Connect(co);
  EXPECT_OK(client);
  if (!client.ok()) return {};
  auto params =
      ReadModelParams(**client, *MakeSoftmaxRegression(784, 10), "softmax");
  EXPECT_OK(params);
  return params.ok() ? *std::move(params) : std::vector<float>();
}

// The BSP job in one process: each step, every rank's gradient on its own
// batch, scaled by the BSP rate, summed in rank order and averaged. From
// step `retired_from` on, rank `retired` no longer takes part (the job went
// on without it): the others keep their shards and rate, and the mean is
// over them.
std::vector<float> SingleProcessBsp(int workers, int steps, int retired = -1,
                                    int retired_from = -1) {
  auto full = LoadFashionMnist(kData, true);
  EXPECT_OK(full);
  auto model = MakeSoftmaxRegression(784, 10);
  std::vector<float> params(model->NumParams());
  model->Init(kSeed, params.data());
  std::vector<Dataset> shards;
  std::vector<Batcher> batchers;
  for (int r = 0; r < workers; ++r) {
    shards.push_back(Shard(*full, r, workers));
    batchers.emplace_back(shards.back().num_examples, kSeed, r);
  }
  std::vector<float> grad(params.size()), sum(params.size());
  for (int step = 0; step < steps; ++step) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    const float lr = BspLearningRate(0.05, workers, 5, step);
    const bool without = retired >= 0 && step >= retired_from;
    for (int r = 0; r < workers; ++r) {
      if (without && r == retired) continue;
      model->LossAndGradient(params.data(), shards[r], batchers[r].Next(kBatch),
                             grad.data());
      for (size_t j = 0; j < grad.size(); ++j) sum[j] += grad[j] * lr;
    }
    const float pushed = static_cast<float>(without ? workers - 1 : workers);
    for (size_t j = 0; j < params.size(); ++j) {
      params[j] -= 1.0f * (sum[j] / pushed);
    }
  }
  return params;
}

proto::NodeState WorkerState(const std::string& scheduler,
                             const std::string& name) {
  SchedulerClient sched(scheduler);
  auto map = sched.GetClusterMap();
  EXPECT_OK(map);
  if (!map.ok()) return proto::STATE_UNSPECIFIED;
  for (const auto& n : map->nodes()) {
    if (n.role() == proto::WORKER && n.name() == name) return n.state();
  }
  return proto::STATE_UNSPECIFIED;
}

// Kills worker 1 of a two-worker BSP job and starts its replacement under
// the dead worker's name (index 2 in the harness, name w1), which gets
// rank 1, its shard and its clock. Both must finish within `wait`, and the
// parameters must equal the single-process run bit for bit. `*log`: the
// replacement's log.
void ReplaceWorker1AndCompare(LocalJob* job, int steps, absl::Duration wait,
                              std::string* log) {
  job->worker(1).Signal(SIGKILL);
  ASSERT_OK_AND_ASSIGN(int killed, job->WaitForWorker(1, absl::Seconds(10)));
  ASSERT_TRUE(WIFSIGNALED(killed));
  std::vector<std::string> flags = WorkerFlags(steps);
  flags.push_back("--name=w1");
  flags.push_back("--rank=1");
  ASSERT_OK(job->AddWorker(flags));
  ASSERT_OK_AND_ASSIGN(int w2, job->WaitForWorker(2, wait));
  ASSERT_OK_AND_ASSIGN(int w0, job->WaitForWorker(0, absl::Seconds(60)));
  EXPECT_EQ(ExitCode(w0), 0) << job->worker(0).LogTail();
  EXPECT_EQ(ExitCode(w2), 0) << job->worker(2).LogTail();
  *log = ReadLog(job->worker(2));
  EXPECT_THAT(*log, HasSubstr("rank 1 of 2"));

  const std::vector<float> got = ReadParams(job->scheduler_address());
  const std::vector<float> want = SingleProcessBsp(2, steps);
  ASSERT_EQ(got.size(), want.size());
  if (log->find("not bit for bit") == std::string::npos) {
    EXPECT_EQ(CountDiffering(got, want), 0u)
        << "of " << got.size() << " parameters";
    return;
  }
  // The lost worker died between two sends of one step (the replacement
  // logs it): its gradient of the parts still waiting was recomputed on
  // parameters in which the other parts had taken the step. Then the run
  // is close to the undisturbed one, not equal (docs/ARCHITECTURE.md).
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * double{got[i] - want[i]};
    norm += want[i] * double{want[i]};
  }
  const double relative = std::sqrt(diff / norm);
  std::cout << "the lost worker died between two sends of a step: relative "
            << "distance to the undisturbed run " << relative << "\n";
  EXPECT_LT(relative, 1e-2);
}

TEST(WorkerLossTest, BspReplacementTakesOverBitForBit) {
  constexpr int kSteps = 3000;
  auto job = StartJob("bsp_replace",
                      {"--consistency=bsp", "--num_workers=2",
                       "--worker_replace_timeout_ms=120000"},
                      2, kSteps);
  ASSERT_NE(job, nullptr);
  ASSERT_OK(WaitForClock(job->scheduler_address(), 1, 100, absl::Minutes(2)));
  std::string log;
  ReplaceWorker1AndCompare(job.get(), kSteps, absl::Minutes(4), &log);
  EXPECT_THAT(log, HasSubstr("(the rank's clock: replacing a lost worker)"));

  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  EXPECT_EQ(status.failure(), "");
  EXPECT_EQ(status.workers(1).clock(), kSteps);
  EXPECT_TRUE(status.workers(1).finished());
  EXPECT_OK(job->Stop());
}

// Lost after the start-up barrier but before its first clock report, the
// worker's clock is 0, as a new worker's is: its replacement must still
// know that the job passed "init-params", or it would wait there alone
// (and, as rank 0, write the initial values over trained ones).
TEST(WorkerLossTest, BspReplacementOfAWorkerLostBeforeItsFirstClock) {
  constexpr int kSteps = 300;
  LocalJobOptions o =
      JobOptions("bsp_first_clock", {"--consistency=bsp", "--num_workers=2",
                                     "--worker_replace_timeout_ms=120000"});
  o.workers = {WorkerFlags(kSteps), WorkerFlags(kSteps)};
  o.workers[0].push_back("--rank=0");
  o.workers[1].push_back("--rank=1");
  // Its first step lasts seconds (it sends nothing before the step ends).
  o.workers[1].push_back("--slow_factor=20000");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (ReadLog(job->worker(1)).find("parameters initialized") ==
             std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_THAT(ReadLog(job->worker(1)), HasSubstr("parameters initialized"));
  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus before, sched.GetJobStatus());
  ASSERT_EQ(before.workers(1).clock(), 0);
  std::string log;
  // Well within the 120 s the barrier would make it wait.
  ReplaceWorker1AndCompare(job.get(), kSteps, absl::Seconds(90), &log);
  EXPECT_EQ(log.find("parameters initialized"), std::string::npos) << log;
  EXPECT_OK(job->Stop());
}

TEST(WorkerLossTest, BspBackupWorkerAbsorbsAKillWithoutWaiting) {
  constexpr int kSteps = 1500;
  // A ten-minute bound: finishing within the test's timeout shows that
  // nobody waited for a replacement.
  auto job =
      StartJob("bsp_backup",
               {"--consistency=bsp", "--num_workers=2", "--backup_workers=1",
                "--dead_after_ms=3000", "--worker_replace_timeout_ms=600000"},
               3, kSteps);
  ASSERT_NE(job, nullptr);
  ASSERT_OK(WaitForClock(job->scheduler_address(), 2, 50, absl::Minutes(2)));
  job->worker(2).Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_OK_AND_ASSIGN(int w0, job->WaitForWorker(0, absl::Minutes(3)));
  ASSERT_OK_AND_ASSIGN(int w1, job->WaitForWorker(1, absl::Minutes(3)));
  EXPECT_EQ(ExitCode(w0), 0) << job->worker(0).LogTail();
  EXPECT_EQ(ExitCode(w1), 0) << job->worker(1).LogTail();
  std::cout << "survivors finished " << absl::Now() - killed
            << " after the kill\n";
  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  EXPECT_EQ(status.failure(), "");
  EXPECT_EQ(status.workers(0).clock(), kSteps);
  EXPECT_EQ(status.workers(1).clock(), kSteps);
  EXPECT_LT(status.workers(2).clock(), kSteps);
  EXPECT_OK(job->Stop());
}

// Kills worker 2 of three mid-run without a replacement, under `policy`.
// Returns the job once worker 2 is dead.
std::unique_ptr<LocalJob> KillOneOfThree(const std::string& tag,
                                         const std::string& policy,
                                         const std::string& on_loss,
                                         int steps) {
  auto job =
      StartJob(tag,
               {"--consistency=" + policy, "--staleness=2", "--num_workers=3",
                "--dead_after_ms=3000", "--worker_replace_timeout_ms=2000",
                "--on_worker_loss=" + on_loss},
               3, steps);
  if (job == nullptr) return nullptr;
  EXPECT_OK(WaitForClock(job->scheduler_address(), 2, 20, absl::Minutes(2)));
  job->worker(2).Signal(SIGKILL);
  auto st = job->WaitForWorker(2, absl::Seconds(10));
  EXPECT_OK(st);
  return job;
}

void ExpectContinues(const std::string& policy) {
  constexpr int kSteps = 1500;
  auto job = KillOneOfThree(policy + "_continue", policy, "continue", kSteps);
  ASSERT_NE(job, nullptr);
  const absl::Time killed = absl::Now();
  ASSERT_OK_AND_ASSIGN(int w0, job->WaitForWorker(0, absl::Minutes(3)));
  ASSERT_OK_AND_ASSIGN(int w1, job->WaitForWorker(1, absl::Minutes(3)));
  EXPECT_EQ(ExitCode(w0), 0) << job->worker(0).LogTail();
  EXPECT_EQ(ExitCode(w1), 0) << job->worker(1).LogTail();
  std::cout << policy << ": survivors finished " << absl::Now() - killed
            << " after the kill\n";
  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  EXPECT_EQ(status.failure(), "");
  EXPECT_EQ(status.workers(0).clock(), kSteps);
  EXPECT_EQ(status.workers(1).clock(), kSteps);
  // The survivors may finish before the kill is noticed (ASP never waits).
  for (absl::Time deadline = absl::Now() + absl::Seconds(10);
       !status.workers(2).lost() && !status.workers(2).retired() &&
       absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_OK_AND_ASSIGN(status, sched.GetJobStatus());
  }
  EXPECT_TRUE(status.workers(2).lost() || status.workers(2).retired());
  if (policy == "ssp") {
    // SSP waits for the lost worker until the bound, then retires it.
    EXPECT_TRUE(status.workers(2).retired());
  }
  EXPECT_OK(job->Stop());
}

TEST(WorkerLossTest, SspContinuesWithFewerWorkersAfterTheBound) {
  ExpectContinues("ssp");
}

TEST(WorkerLossTest, AspContinuesWithFewerWorkers) { ExpectContinues("asp"); }

// The scheduler killed while it waits for a replacement: the restarted one
// reads the lost rank from its state dir, goes on waiting from when the
// worker was lost and retires it at the bound. (Forgotten, the rank would
// gate the survivors for ever: its node is dead, nothing would lose it
// again.)
TEST(WorkerLossTest, ARestartedSchedulerKeepsWaitingForTheLostWorker) {
  constexpr int kSteps = 1500;
  LocalJobOptions o =
      JobOptions("restart_while_lost",
                 {"--consistency=ssp", "--staleness=2", "--num_workers=3",
                  "--dead_after_ms=2000", "--worker_replace_timeout_ms=8000",
                  "--on_worker_loss=continue"});
  o.cluster.durable = true;
  for (int i = 0; i < 3; ++i) {
    o.workers.push_back(WorkerFlags(kSteps));
    o.workers.back().push_back(absl::StrCat("--rank=", i));
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  ASSERT_OK(WaitForClock(job->scheduler_address(), 2, 20, absl::Minutes(2)));
  job->worker(2).Signal(SIGKILL);
  ASSERT_OK(job->WaitForWorker(2, absl::Seconds(10)).status());
  const absl::Time killed = absl::Now();
  SchedulerClient sched(job->scheduler_address());
  proto::JobStatus status;
  while (!status.workers_size() || !status.workers(2).lost()) {
    ASSERT_LT(absl::Now() - killed, absl::Seconds(20)) << "never lost";
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_OK_AND_ASSIGN(status, sched.GetJobStatus());
  }
  job->cluster().scheduler().Signal(SIGKILL);
  ASSERT_OK(job->cluster().scheduler().Wait(absl::Seconds(10)).status());
  ASSERT_OK(job->cluster().RestartScheduler());
  const absl::Duration down = absl::Now() - killed;
  SchedulerClient restarted(job->scheduler_address());
  absl::StatusOr<proto::JobStatus> first;
  for (absl::Time deadline = absl::Now() + absl::Seconds(10);
       !(first = restarted.GetJobStatus()).ok() && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_OK_AND_ASSIGN(status, std::move(first));
  EXPECT_TRUE(status.workers(2).lost() || status.workers(2).retired())
      << "after the restart, rank 2 is "
      << status.workers(2).ShortDebugString();
  ASSERT_OK_AND_ASSIGN(int w0, job->WaitForWorker(0, absl::Minutes(3)));
  ASSERT_OK_AND_ASSIGN(int w1, job->WaitForWorker(1, absl::Minutes(3)));
  EXPECT_EQ(ExitCode(w0), 0) << job->worker(0).LogTail();
  EXPECT_EQ(ExitCode(w1), 0) << job->worker(1).LogTail();
  ASSERT_OK_AND_ASSIGN(status, restarted.GetJobStatus());
  EXPECT_TRUE(status.workers(2).retired());
  EXPECT_EQ(status.workers(0).clock(), kSteps);
  std::cout << "scheduler restarted " << down << " after the kill; survivors "
            << "finished " << absl::Now() - killed << " after it\n";
  EXPECT_OK(job->Stop());
}

// Every survivor exits with status 1 soon after the bound, naming the lost
// worker. `steps` keeps the survivors running (or blocked) past it.
void ExpectStops(const std::unique_ptr<LocalJob>& job,
                 const std::vector<int>& survivors, const std::string& lost) {
  const absl::Time killed = absl::Now();
  for (int i : survivors) {
    // Dead after 3 s (not less: this loaded 2-core machine delays
    // heartbeats by a second at times), bound 2 s: well within 60 s.
    ASSERT_OK_AND_ASSIGN(int st, job->WaitForWorker(i, absl::Seconds(60)));
    EXPECT_EQ(ExitCode(st), 1) << job->worker(i).LogTail();
    EXPECT_THAT(ReadLog(job->worker(i)), HasSubstr(lost));
  }
  std::cout << "survivors exited " << absl::Now() - killed
            << " after the kill\n";
  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  EXPECT_THAT(status.failure(), HasSubstr(lost));
  EXPECT_THAT(status.failure(), HasSubstr("--on_worker_loss=stop"));
  EXPECT_OK(job->Stop());
}

TEST(WorkerLossTest, SspStopsNamingTheLostWorker) {
  auto job = KillOneOfThree("ssp_stop", "ssp", "stop", 100000);
  ASSERT_NE(job, nullptr);
  ExpectStops(job, {0, 1}, "worker 'w2' (rank 2)");
}

TEST(WorkerLossTest, AspStopsNamingTheLostWorker) {
  auto job = KillOneOfThree("asp_stop", "asp", "stop", 1000000);
  ASSERT_NE(job, nullptr);
  ExpectStops(job, {0, 1}, "worker 'w2' (rank 2)");
}

// BSP survivors wait on the data plane (their PushPull is held until every
// rank pushed): they learn of the failure through their heartbeats.
TEST(WorkerLossTest, BspStopsSurvivorsBlockedOnTheDataPlane) {
  auto job =
      StartJob("bsp_stop",
               {"--consistency=bsp", "--num_workers=2", "--dead_after_ms=3000",
                "--worker_replace_timeout_ms=2000"},
               2, 100000);
  ASSERT_NE(job, nullptr);
  ASSERT_OK(WaitForClock(job->scheduler_address(), 1, 20, absl::Minutes(2)));
  job->worker(1).Signal(SIGKILL);
  ASSERT_OK(job->WaitForWorker(1, absl::Seconds(10)).status());
  ExpectStops(job, {0}, "worker 'w1' (rank 1)");
}

// BSP, --on_worker_loss=continue: rank 2 of three is killed while it is in
// a step (slowed, so that it is computing, not sending, when killed); the
// survivors wait for it up to the bound, then the servers complete the held
// step with the two ranks left and every later step with them. The final
// parameters equal the single-process run in which rank 2 stopped after its
// last pushed step, bit for bit.
TEST(WorkerLossTest, BspContinuesWithFewerWorkersBitForBit) {
  constexpr int kSteps = 300;
  LocalJobOptions o = JobOptions(
      "bsp_continue",
      {"--consistency=bsp", "--num_workers=3", "--dead_after_ms=3000",
       "--worker_replace_timeout_ms=2000", "--on_worker_loss=continue"});
  for (int i = 0; i < 3; ++i) {
    o.workers.push_back(WorkerFlags(kSteps));
    o.workers.back().push_back(absl::StrCat("--rank=", i));
  }
  // A step of rank 2 is ~2000 times its compute (about half a second, a
  // few seconds under ASan), spent before it sends anything.
  o.workers[2].push_back("--slow_factor=2000");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  ASSERT_OK(WaitForClock(job->scheduler_address(), 2, 3, absl::Minutes(2)));
  job->worker(2).Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_OK(job->WaitForWorker(2, absl::Seconds(10)).status());
  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  // Rank 2 reported finishing steps [0, k): it was killed inside step k.
  const int k = static_cast<int>(status.workers(2).clock());
  ASSERT_OK_AND_ASSIGN(int w0, job->WaitForWorker(0, absl::Minutes(3)));
  ASSERT_OK_AND_ASSIGN(int w1, job->WaitForWorker(1, absl::Minutes(3)));
  EXPECT_EQ(ExitCode(w0), 0) << job->worker(0).LogTail();
  EXPECT_EQ(ExitCode(w1), 0) << job->worker(1).LogTail();
  std::cout << "bsp: rank 2 killed in step " << k << "; survivors finished "
            << absl::Now() - killed << " after the kill\n";
  ASSERT_OK_AND_ASSIGN(status, sched.GetJobStatus());
  EXPECT_EQ(status.failure(), "");
  EXPECT_TRUE(status.workers(2).retired());
  EXPECT_EQ(status.workers(0).clock(), kSteps);
  EXPECT_EQ(status.workers(1).clock(), kSteps);
  EXPECT_EQ(status.workers(0).max_staleness(), 0);

  const std::vector<float> got = ReadParams(job->scheduler_address());
  std::vector<float> want = SingleProcessBsp(3, kSteps, 2, k);
  ASSERT_EQ(got.size(), want.size());
  size_t differing = CountDiffering(got, want);
  if (differing != 0) {
    // Killed between sending step k and reporting it: then step k had
    // its gradient too.
    want = SingleProcessBsp(3, kSteps, 2, k + 1);
    differing = CountDiffering(got, want);
    if (differing == 0) {
      std::cout << "rank 2's step " << k << " was applied before the kill\n";
    }
  }
  EXPECT_EQ(differing, 0u) << "of " << got.size() << " parameters";
  EXPECT_OK(job->Stop());
}

// A worker lost before the start-up barrier ('init-params'), which counts
// every worker of the job: the barrier does not wait for a rank the job
// goes on without. Worker 2 registers and then fails at start (no data),
// so it never arrives. With a backup worker the others pass at once once
// it is lost; without one (BSP, continue) once it is retired, and the run
// is then the two-worker part of a three-worker job from step 0, bit for
// bit.
std::unique_ptr<LocalJob> StartWithAWorkerThatDiesAtStart(
    const std::string& tag, std::vector<std::string> scheduler_flags,
    int steps) {
  LocalJobOptions o = JobOptions(tag, std::move(scheduler_flags));
  for (int i = 0; i < 3; ++i) {
    o.workers.push_back(WorkerFlags(steps));
    o.workers.back().push_back(absl::StrCat("--rank=", i));
  }
  o.workers[2].push_back("--data_dir=/nonexistent");
  auto job = LocalJob::Start(o);
  EXPECT_OK(job);
  return job.ok() ? std::move(*job) : nullptr;
}

void ExpectSurvivorsFinish(LocalJob* job, int steps) {
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(int w2, job->WaitForWorker(2, absl::Seconds(60)));
  EXPECT_EQ(ExitCode(w2), 1);
  // The barrier's own timeout is 120 s: well within it.
  ASSERT_OK_AND_ASSIGN(int w0, job->WaitForWorker(0, absl::Seconds(60)));
  ASSERT_OK_AND_ASSIGN(int w1, job->WaitForWorker(1, absl::Seconds(60)));
  EXPECT_EQ(ExitCode(w0), 0) << job->worker(0).LogTail();
  EXPECT_EQ(ExitCode(w1), 0) << job->worker(1).LogTail();
  std::cout << "survivors finished " << absl::Now() - start
            << " after the start\n";
  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  EXPECT_EQ(status.failure(), "");
  EXPECT_EQ(status.workers(0).clock(), steps);
  EXPECT_EQ(status.workers(1).clock(), steps);
}

TEST(WorkerLossTest, TheStartBarrierDoesNotWaitForAWorkerABackupAbsorbs) {
  constexpr int kSteps = 200;
  auto job = StartWithAWorkerThatDiesAtStart(
      "barrier_backup",
      {"--consistency=bsp", "--num_workers=2", "--backup_workers=1",
       "--dead_after_ms=3000", "--worker_replace_timeout_ms=600000"},
      kSteps);
  ASSERT_NE(job, nullptr);
  ExpectSurvivorsFinish(job.get(), kSteps);
  EXPECT_OK(job->Stop());
}

TEST(WorkerLossTest, TheStartBarrierDoesNotWaitForARetiredWorker) {
  constexpr int kSteps = 200;
  auto job = StartWithAWorkerThatDiesAtStart(
      "barrier_retired",
      {"--consistency=bsp", "--num_workers=3", "--dead_after_ms=3000",
       "--worker_replace_timeout_ms=2000", "--on_worker_loss=continue"},
      kSteps);
  ASSERT_NE(job, nullptr);
  ExpectSurvivorsFinish(job.get(), kSteps);
  const std::vector<float> got = ReadParams(job->scheduler_address());
  const std::vector<float> want = SingleProcessBsp(3, kSteps, 2, 0);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(CountDiffering(got, want), 0u)
      << "of " << got.size() << " parameters";
  EXPECT_OK(job->Stop());
}

TEST(WorkerLossTest, SigtermLeavesAtOnceAndAReplacementFinishes) {
  constexpr int kSteps = 3000;
  // Heartbeats would take 60 s to expire: LEFT can only come from Leave.
  auto job =
      StartJob("sigterm",
               {"--consistency=bsp", "--num_workers=2", "--dead_after_ms=60000",
                "--worker_replace_timeout_ms=120000"},
               2, kSteps);
  ASSERT_NE(job, nullptr);
  ASSERT_OK(WaitForClock(job->scheduler_address(), 1, 100, absl::Minutes(2)));
  job->worker(1).Signal(SIGTERM);
  const absl::Time sent = absl::Now();
  ASSERT_OK_AND_ASSIGN(int st, job->WaitForWorker(1, absl::Seconds(20)));
  EXPECT_EQ(ExitCode(st), 143) << job->worker(1).LogTail();
  EXPECT_EQ(WorkerState(job->scheduler_address(), "w1"), proto::LEFT);
  EXPECT_LT(absl::Now() - sent, absl::Seconds(20));
  const std::string log = ReadLog(job->worker(1));
  EXPECT_THAT(log, HasSubstr("SIGTERM: leaving the job, reporting clock"));
  SchedulerClient sched(job->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  EXPECT_TRUE(status.workers(1).lost());
  EXPECT_FALSE(status.workers(1).finished());

  std::vector<std::string> flags = WorkerFlags(kSteps);
  flags.push_back("--name=w1");
  flags.push_back("--rank=1");
  ASSERT_OK(job->AddWorker(flags));
  ASSERT_OK_AND_ASSIGN(int w0, job->WaitForWorker(0, absl::Minutes(4)));
  ASSERT_OK_AND_ASSIGN(int w2, job->WaitForWorker(2, absl::Minutes(4)));
  EXPECT_EQ(ExitCode(w0), 0) << job->worker(0).LogTail();
  EXPECT_EQ(ExitCode(w2), 0) << job->worker(2).LogTail();
  // A worker that finished leaves as finished: LEFT at once, and no loss.
  EXPECT_EQ(WorkerState(job->scheduler_address(), "w1"), proto::LEFT);
  ASSERT_OK_AND_ASSIGN(status, sched.GetJobStatus());
  EXPECT_TRUE(status.workers(1).finished());
  EXPECT_FALSE(status.workers(1).lost());
  EXPECT_EQ(status.failure(), "");
  const std::vector<float> got = ReadParams(job->scheduler_address());
  const std::vector<float> want = SingleProcessBsp(2, kSteps);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(CountDiffering(got, want), 0u)
      << "of " << got.size() << " parameters";
  EXPECT_OK(job->Stop());
}

}  // namespace
}  // namespace downpour
