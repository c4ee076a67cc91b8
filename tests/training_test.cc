// Training through the real daemons: ps_scheduler, ps_server and ps_worker
// processes on 127.0.0.1.
//  - BSP with fixed seeds is bit-for-bit repeatable and equals a
//    single-process run that averages the same per-worker gradients.
//  - Under SSP(s) with workers of very different speeds, no pull sees a
//    staleness above s (measured by the servers for every pull), and
//    under SSP(3) some pull does see a stale value (not BSP in disguise).
//  - Downpour's n_fetch / n_push: the servers count the pulls and pushes.
//  - Sparse logistic regression on click data beats the constant predictor
//    on held-out rows under BSP, SSP and ASP.
#include <sys/wait.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/grpc_channel.h"
#include "common/test_util.h"
#include "grpcpp/grpcpp.h"
#include "launch/local_job.h"
#include "models/batcher.h"
#include "models/dataset.h"
#include "models/learning_rate.h"
#include "models/model.h"
#include "models/sparse_lr.h"
#include "proto/downpour.grpc.pb.h"
#include "tests/model_params.h"
#include "worker/worker.h"

namespace downpour {
namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

struct JobResult {
  std::vector<float> params;
  int64_t max_staleness = -1;  // over every server's tables
  uint64_t tracked_pulls = 0;
  // Data-plane requests the servers received, summed over servers.
  uint64_t pull_requests = 0;
  uint64_t push_requests = 0;
  uint64_t errors = 0;
  // Requests one pull of every parameter table makes: one per (table,
  // server owning part of it), from the cluster map.
  uint64_t parts_per_pull = 0;
};

// Runs a job of `workers` softmax workers and returns the final parameters.
// `extra` flags go to every worker.
JobResult RunJob(const std::string& tag, const std::string& consistency,
                 int staleness, int workers, int steps, int slow_rank,
                 const std::vector<std::string>& extra = {}) {
  JobResult result;
  const std::string dir = TestTmpDir() + "/" + tag;
  EXPECT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = 2;
  o.cluster.scheduler_flags = {"--consistency=" + consistency,
                               absl::StrCat("--staleness=", staleness),
                               absl::StrCat("--num_workers=", workers)};
  for (int i = 0; i < workers; ++i) {
    std::vector<std::string> flags = {
        "--model=softmax", absl::StrCat("--steps=", steps), "--batch=32",
        "--seed=7",        "--eval_every=100000",           "--lr=0.05",
        "--warmup_steps=5"};
    if (i == slow_rank) flags.push_back("--slow_factor=5");
    flags.insert(flags.end(), extra.begin(), extra.end());
    o.workers.push_back(flags);
  }
  auto job = LocalJob::Start(o);
  EXPECT_OK(job);
  if (!job.ok()) return result;
  // Every worker exits with status 0 (the error names the one that did
  // not, with its log).
  EXPECT_OK((*job)->WaitForWorkers(absl::Seconds(240) * workers));
  ClientOptions co;
  co.scheduler_address = (*job)->scheduler_address();
  auto client = Client::Connect(co);
  EXPECT_OK(client);
  if (!client.ok()) return result;
  auto params =
      ReadModelParams(**client, *MakeSoftmaxRegression(784, 10), "softmax");
  EXPECT_OK(params);
  if (!params.ok()) return result;
  result.params = *std::move(params);
  // Staleness as the servers measured it for every pull.
  SchedulerClient sched((*job)->scheduler_address());
  auto map = sched.GetClusterMap();
  EXPECT_OK(map);
  if (!map.ok()) return result;
  for (const auto& t : map->tables()) {
    if (t.spec().name().rfind("softmax/", 0) != 0) continue;
    for (const auto& r : t.ranges()) {
      if (r.end() > r.begin() && r.begin() < t.spec().num_keys())
        ++result.parts_per_pull;
    }
  }
  for (const auto& n : map->nodes()) {
    if (n.role() != proto::SERVER) continue;
    auto stub = proto::ServerAdmin::NewStub(
        NewGrpcChannel(n.admin_address(), ClusterAuth()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    proto::ServerStats stats;
    EXPECT_TRUE(stub->GetStats(&ctx, proto::StatsRequest(), &stats).ok());
    for (const auto& t : stats.tables()) {
      result.max_staleness = std::max(result.max_staleness, t.max_staleness());
      result.tracked_pulls += t.tracked_pulls();
    }
    const auto& ops = stats.requests_by_op();
    if (ops.count("PULL")) result.pull_requests += ops.at("PULL");
    if (ops.count("PUSH")) result.push_requests += ops.at("PUSH");
    result.errors += stats.errors();
  }
  client->reset();
  EXPECT_OK((*job)->Stop());
  return result;
}

// The same job in one process: each step, every rank's gradient on its own
// batch, scaled by the BSP rate, summed in rank order and averaged.
std::vector<float> SingleProcessBsp(int workers, int steps) {
  auto full = LoadFashionMnist(kData, true);
  EXPECT_OK(full);
  auto model = MakeSoftmaxRegression(784, 10);
  std::vector<float> params(model->NumParams());
  model->Init(7, params.data());
  std::vector<Dataset> shards;
  std::vector<Batcher> batchers;
  for (int r = 0; r < workers; ++r) {
    shards.push_back(Shard(*full, r, workers));
    batchers.emplace_back(shards.back().num_examples, 7, r);
  }
  std::vector<float> grad(params.size()), sum(params.size());
  for (int step = 0; step < steps; ++step) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    const float lr = BspLearningRate(0.05, workers, 5, step);
    for (int r = 0; r < workers; ++r) {
      model->LossAndGradient(params.data(), shards[r], batchers[r].Next(32),
                             grad.data());
      for (size_t j = 0; j < grad.size(); ++j) sum[j] += grad[j] * lr;
    }
    for (size_t j = 0; j < params.size(); ++j) {
      params[j] -= 1.0f * (sum[j] / static_cast<float>(workers));
    }
  }
  return params;
}

TEST(TrainingTest, BspIsBitForBitRepeatableAndMatchesSingleProcess) {
  constexpr int kWorkers = 3, kSteps = 25;
  JobResult a = RunJob("bsp-a", "bsp", 0, kWorkers, kSteps, /*slow_rank=*/1);
  JobResult b = RunJob("bsp-b", "bsp", 0, kWorkers, kSteps, /*slow_rank=*/-1);
  ASSERT_FALSE(a.params.empty());
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_EQ(CountDiffering(a.params, b.params), 0u);
  std::vector<float> ref = SingleProcessBsp(kWorkers, kSteps);
  EXPECT_EQ(CountDiffering(ref, a.params), 0u)
      << "of " << ref.size() << " parameters";
  // Under BSP every pull sees every update of the previous iteration.
  EXPECT_EQ(a.max_staleness, 0);
  EXPECT_GT(a.tracked_pulls, 0u);
}

TEST(TrainingTest, SspStalenessNeverExceedsTheBound) {
  for (int s : {1, 3}) {
    JobResult r =
        RunJob(absl::StrCat("ssp", s), "ssp", s, 3, 40, /*slow_rank=*/0);
    EXPECT_GT(r.tracked_pulls, 0u);
    EXPECT_GE(r.max_staleness, 0);
    EXPECT_LE(r.max_staleness, s) << "SSP bound " << s;
    // A system that silently ran BSP would pass the bound: with s = 3 and
    // a worker 5x slower, the fast ones must actually run ahead of it.
    if (s == 3) {
      EXPECT_GT(r.max_staleness, 0) << "SSP(3) behaved as BSP";
    }
    std::printf("SSP s=%d: max staleness observed %lld over %llu pulls\n", s,
                static_cast<long long>(r.max_staleness),
                static_cast<unsigned long long>(r.tracked_pulls));
  }
}

// Downpour's n_fetch / n_push under ASP: each worker pulls every n_fetch
// steps and pushes its accumulated gradients every n_push steps (and once
// more at the end for the remainder), counted by the servers; the model
// still learns.
TEST(TrainingTest, DownpourFetchAndPushEveryNSteps) {
  constexpr int kWorkers = 2, kSteps = 61, kFetch = 5, kPush = 3;
  JobResult r = RunJob("downpour", "asp", 0, kWorkers, kSteps, /*slow_rank=*/-1,
                       {absl::StrCat("--n_fetch=", kFetch),
                        absl::StrCat("--n_push=", kPush), "--async_lr=0.05"});
  ASSERT_FALSE(r.params.empty());
  ASSERT_GT(r.parts_per_pull, 0u);
  const uint64_t fetches = (kSteps + kFetch - 1) / kFetch;  // 13
  const uint64_t pushes = (kSteps + kPush - 1) / kPush;     // 21
  // Rank 0 also pulls once to evaluate at the last step. A request the
  // servers rejected (a map moving during start-up) is retried and counted
  // twice, so errors widen the window.
  const uint64_t want_pulls = r.parts_per_pull * (kWorkers * fetches + 1);
  const uint64_t want_pushes = r.parts_per_pull * kWorkers * pushes;
  EXPECT_GE(r.pull_requests, want_pulls);
  EXPECT_LE(r.pull_requests, want_pulls + r.errors);
  EXPECT_GE(r.push_requests, want_pushes);
  EXPECT_LE(r.push_requests, want_pushes + r.errors);
  EXPECT_LE(r.errors, 4u);
  std::printf(
      "n_fetch %d, n_push %d: %llu pull and %llu push requests (%llu parts "
      "each), %llu errors\n",
      kFetch, kPush, static_cast<unsigned long long>(r.pull_requests),
      static_cast<unsigned long long>(r.push_requests),
      static_cast<unsigned long long>(r.parts_per_pull),
      static_cast<unsigned long long>(r.errors));

  // Training moved the model: the zero parameters score 10% accuracy on
  // the test set (and a loss of ln(10) = 2.30). The loss is no measure
  // here: with fetches every 5 steps, stale Adagrad steps overshoot, and
  // after 61 steps it depends on how the workers interleaved (0.79 to 2.85
  // in 23 runs, alone and beside other tests, above its start once;
  // accuracy 0.61 to 0.72 in the same runs).
  auto test = LoadFashionMnist(kData, false);
  ASSERT_OK(test);
  auto model = MakeSoftmaxRegression(784, 10);
  auto [accuracy, loss] = model->Evaluate(r.params.data(), *test);
  std::printf("after %d steps: test accuracy %.3f, test loss %.3f\n", kSteps,
              accuracy, loss);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(accuracy, 0.4);
}

// n_fetch / n_push and Hogwild threads are ASP-only: a BSP worker refuses
// them at start with a clear message.
TEST(TrainingTest, AspOnlyFlagsRejectedUnderBsp) {
  const std::string dir = TestTmpDir() + "/asp-only";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = 1;
  o.cluster.scheduler_flags = {"--consistency=bsp", "--num_workers=2"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--n_fetch=5", "ASP mode"}, {"--hogwild_threads=2", "need ASP"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_OK(job->AddWorker({"--model=softmax", "--steps=5", cases[i].first}));
    auto st = job->WaitForWorker(i, absl::Seconds(60));
    ASSERT_OK(st);
    Subprocess& w = job->worker(i);
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << w.LogTail();
    EXPECT_NE(w.LogTail().find(cases[i].second), std::string::npos)
        << w.LogTail();
  }
  EXPECT_OK(job->Stop());
}

// Options that no policy accepts stop the worker at start with the reason,
// before it computes anything (--threads reaches the model's factory,
// which would abort on 0).
TEST(TrainingTest, BadWorkerOptionsExitWithTheReason) {
  const std::string dir = TestTmpDir() + "/bad-options";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = 1;
  o.cluster.scheduler_flags = {"--consistency=asp", "--num_workers=3"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--threads=0", "threads 0: must be >= 1"},
      {"--hogwild_threads=0", "hogwild_threads must be >= 1"},
      {"--device=tpu", "device 'tpu' for model 'softmax'"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_OK(job->AddWorker({"--model=softmax", "--steps=5", cases[i].first}));
    auto st = job->WaitForWorker(i, absl::Seconds(60));
    ASSERT_OK(st);
    Subprocess& w = job->worker(i);
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << w.LogTail();
    EXPECT_NE(w.LogTail().find(cases[i].second), std::string::npos)
        << w.LogTail();
  }
  EXPECT_OK(job->Stop());
}

// Hogwild: 4 threads in one worker share one parameter array without
// locks; the model still learns well (a softmax regression that loses its
// pulls or its pushes, or computes on garbage, stays far below 75%).
TEST(TrainingTest, HogwildThreadsTrain) {
  // At 400 steps the test accuracy still swings between 0.73 and 0.80 from
  // run to run (the last Adagrad steps of a racing ASP run); at 800 it has
  // settled well above the bar.
  constexpr int kSteps = 800;
  JobResult r =
      RunJob("hogwild", "asp", 0, /*workers=*/1, kSteps, /*slow_rank=*/-1,
             {"--hogwild_threads=4", "--async_lr=0.05"});
  ASSERT_FALSE(r.params.empty());
  ASSERT_GT(r.parts_per_pull, 0u);
  // Every step pulls and pushes once, whichever thread takes it.
  EXPECT_GE(r.push_requests, r.parts_per_pull * kSteps);
  EXPECT_LE(r.push_requests, r.parts_per_pull * kSteps + r.errors);
  auto test = LoadFashionMnist(kData, false);
  ASSERT_OK(test);
  auto model = MakeSoftmaxRegression(784, 10);
  auto [accuracy, loss] = model->Evaluate(r.params.data(), *test);
  std::printf(
      "hogwild, 4 threads, %d steps: test accuracy %.3f, test loss %.3f\n",
      kSteps, accuracy, loss);
  EXPECT_GT(accuracy, 0.75);
}

// Sparse logistic regression on synthetic power-law click data, 2 workers
// and 2 servers: each step pulls and pushes only the batch's feature ids.
// The held-out log-loss of the trained weights, computed here from the
// table, must be clearly below that of the best constant predictor.
TEST(TrainingTest, SparseLogisticRegressionBeatsConstantPredictor) {
  constexpr int kRows = 30000, kPerRow = 20, kFeatures = 20000, kSeed = 5;
  constexpr double kHoldout = 0.1;
  SparseDataset all = GenerateClickData(kRows, kPerRow, kFeatures, 1.1, kSeed);
  const size_t train_rows = static_cast<size_t>(kRows * (1.0 - kHoldout));
  double positives = 0;
  for (size_t r = 0; r < train_rows; ++r) positives += all.labels[r];
  const double p = positives / train_rows;
  SparseDataset held;
  for (size_t r = train_rows; r < all.NumRows(); ++r) {
    for (size_t f = all.row_offsets[r]; f < all.row_offsets[r + 1]; ++f) {
      held.feature_ids.push_back(all.feature_ids[f]);
      held.feature_values.push_back(all.feature_values[f]);
    }
    held.row_offsets.push_back(held.feature_ids.size());
    held.labels.push_back(all.labels[r]);
  }
  double constant_loss = 0;
  for (float y : held.labels)
    constant_loss -= y > 0.5 ? std::log(p) : std::log(1 - p);
  constant_loss /= held.NumRows();
  const std::vector<uint64_t> ids = BatchFeatureIds(held, 0, held.NumRows());
  std::vector<Key> keys;
  for (uint64_t id : ids) keys.push_back(SparseFeatureKey(id));

  for (const std::string consistency : {"bsp", "ssp", "asp"}) {
    SCOPED_TRACE(consistency);
    const std::string dir = TestTmpDir() + "/sparse-" + consistency;
    ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
    LocalJobOptions o;
    o.cluster.bin_dir = RunfilePath("");
    o.cluster.work_dir = dir;
    o.cluster.num_servers = 2;
    o.cluster.scheduler_flags = {"--consistency=" + consistency,
                                 "--staleness=2", "--num_workers=2"};
    const std::vector<std::string> flags = {
        "--model=sparse_lr",
        absl::StrCat("--click_rows=", kRows),
        absl::StrCat("--click_features_per_row=", kPerRow),
        absl::StrCat("--click_num_features=", kFeatures),
        "--click_zipf=1.1",
        absl::StrCat("--holdout=", kHoldout),
        absl::StrCat("--seed=", kSeed),
        "--steps=300",
        "--batch=100",
        "--eval_every=100",
        "--async_lr=0.5"};
    o.workers = {flags, flags};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
    ASSERT_OK(job->WaitForWorkers(absl::Seconds(240) * 2));
    ClientOptions co;
    co.scheduler_address = job->scheduler_address();
    auto client = Client::Connect(co);
    ASSERT_OK(client);
    auto table = (*client)->OpenTable(kSparseLrTable);
    ASSERT_OK(table);
    EXPECT_TRUE(table->sparse);
    EXPECT_EQ(table->width, 1u);
    std::vector<float> w(ids.size()), grad(ids.size());
    ASSERT_OK((*client)->GetSync(*table, keys, absl::MakeSpan(w)));
    const double loss = SparseLogRegLossAndGradient(
        held, 0, held.NumRows(), ids, w, absl::MakeSpan(grad));
    const SparseEval e = EvaluateSparseLogReg(held, ids, w);
    std::printf(
        "sparse_lr %s: held-out log-loss %.4f (constant predictor %.4f), "
        "accuracy %.3f, AUC %.3f\n",
        consistency.c_str(), loss, constant_loss, e.accuracy, e.auc);
    EXPECT_NEAR(e.log_loss, loss, 1e-6);
    EXPECT_LT(loss, constant_loss - 0.05);
    EXPECT_GT(e.auc, 0.7);
    client->reset();
    EXPECT_OK(job->Stop());
  }
}

}  // namespace
}  // namespace downpour
