// Sparse logistic regression (ps_worker --model=sparse_lr) through the real
// daemons on 127.0.0.1, on a libsvm FILE:
//  - two workers under BSP learn a planted model from the file: the
//    held-out log-loss and AUC, computed here from the servers' table,
//    clearly beat the best constant predictor;
//  - under BSP the servers aggregate each clock's key batches and apply
//    them once in rank order, so a second run with the same seeds ends
//    with bit-for-bit the same weights;
//  - a clocked push to a synced sparse table reaches every server, with
//    an empty batch where the worker has no keys, and, held while its
//    range is split, is sent again to both halves;
//  - a malformed file (non-numeric feature, missing label) or a missing
//    one makes the worker exit 1 with a message naming file and line.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "common/types.h"
#include "launch/local_cluster.h"
#include "launch/local_job.h"
#include "models/dataset.h"
#include "models/model.h"
#include "models/sparse_lr.h"
#include "tests/cluster_fixture.h"
#include "worker/worker.h"

namespace downpour {
namespace {

constexpr double kHoldout = 0.1;

// Writes `data` as libsvm text with +1/-1 labels, a comment line and a
// blank line (both ignored by the parser).
void WriteLibsvm(const SparseDataset& data, const std::string& path) {
  std::ofstream out(path);
  out << "# synthetic clicks, planted logistic model\n\n";
  for (size_t r = 0; r < data.NumRows(); ++r) {
    out << (data.labels[r] > 0.5 ? "+1" : "-1");
    for (size_t f = data.row_offsets[r]; f < data.row_offsets[r + 1]; ++f) {
      out << ' ' << data.feature_ids[f] << ':' << data.feature_values[f];
    }
    out << '\n';
  }
  ASSERT_TRUE(out.good()) << path;
}

// The rows [begin, end) of `data`.
SparseDataset Rows(const SparseDataset& data, size_t begin, size_t end) {
  SparseDataset out;
  for (size_t r = begin; r < end; ++r) {
    for (size_t f = data.row_offsets[r]; f < data.row_offsets[r + 1]; ++f) {
      out.feature_ids.push_back(data.feature_ids[f]);
      out.feature_values.push_back(data.feature_values[f]);
    }
    out.row_offsets.push_back(out.feature_ids.size());
    out.labels.push_back(data.labels[r]);
  }
  return out;
}

// Runs a scheduler, 2 servers and `workers` sparse_lr workers with
// `flags`, checks that every worker exits 0, and returns the table's
// weights of `keys` read after they have.
std::vector<float> RunSparseJob(const std::string& tag,
                                const std::string& consistency, int workers,
                                const std::vector<std::string>& flags,
                                const std::vector<Key>& keys) {
  const std::string dir = TestTmpDir() + "/" + tag;
  EXPECT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = 2;
  o.cluster.scheduler_flags = {"--consistency=" + consistency,
                               absl::StrCat("--num_workers=", workers)};
  std::vector<std::string> worker_flags = {"--model=sparse_lr"};
  worker_flags.insert(worker_flags.end(), flags.begin(), flags.end());
  o.workers.assign(workers, worker_flags);
  auto job = LocalJob::Start(o);
  EXPECT_OK(job);
  if (!job.ok()) return {};
  // Every worker exits with status 0 (the error names the one that did
  // not, with its log).
  const absl::Status all_ok =
      (*job)->WaitForWorkers(absl::Seconds(240) * workers);
  EXPECT_OK(all_ok);
  std::vector<float> w;
  if (all_ok.ok()) {
    ClientOptions co;
    co.scheduler_address = (*job)->scheduler_address();
    auto client = Client::Connect(co);
    EXPECT_OK(client);
    if (client.ok()) {
      auto table = (*client)->OpenTable(kSparseLrTable);
      EXPECT_OK(table);
      if (table.ok()) {
        w.resize(keys.size());
        EXPECT_OK((*client)->GetSync(*table, keys, absl::MakeSpan(w)));
      }
    }
  }
  EXPECT_OK((*job)->Stop());
  return w;
}

TEST(SparseTrainingTest, LibsvmFileUnderBspBeatsConstantAndRepeatsBitForBit) {
  constexpr int kRows = 20000, kPerRow = 20, kFeatures = 20000, kSeed = 5;
  const SparseDataset all =
      GenerateClickData(kRows, kPerRow, kFeatures, 1.1, kSeed);
  const std::string path = TestTmpDir() + "/clicks.libsvm";
  ASSERT_NO_FATAL_FAILURE(WriteLibsvm(all, path));

  // The worker holds out the last rows, as it computes the split.
  const size_t train_rows = static_cast<size_t>(
      std::floor(static_cast<double>(kRows) * (1.0 - kHoldout)));
  const SparseDataset held = Rows(all, train_rows, kRows);
  double positives = 0;
  for (size_t r = 0; r < train_rows; ++r) positives += all.labels[r];
  const double p = positives / train_rows;
  double constant_loss = 0;
  for (float y : held.labels) {
    constant_loss -= y > 0.5 ? std::log(p) : std::log(1 - p);
  }
  constant_loss /= held.NumRows();
  // Every feature id in the file: the weights compared between runs.
  const std::vector<uint64_t> ids = BatchFeatureIds(all, 0, all.NumRows());
  std::vector<Key> keys;
  for (uint64_t id : ids) keys.push_back(SparseFeatureKey(id));

  const std::vector<std::string> flags = {
      "--libsvm=" + path, absl::StrCat("--holdout=", kHoldout),
      "--seed=3",         "--steps=300",
      "--batch=100",      "--eval_every=100",
      "--async_lr=0.5"};
  const std::vector<float> a = RunSparseJob("libsvm-a", "bsp", 2, flags, keys);
  const std::vector<float> b = RunSparseJob("libsvm-b", "bsp", 2, flags, keys);
  ASSERT_EQ(a.size(), keys.size());
  ASSERT_EQ(b.size(), keys.size());

  // Learnt from the file: the held-out figures from the table.
  const std::vector<uint64_t> held_ids =
      BatchFeatureIds(held, 0, held.NumRows());
  std::vector<float> w(held_ids.size());
  for (size_t i = 0; i < held_ids.size(); ++i) {
    w[i] =
        a[std::lower_bound(ids.begin(), ids.end(), held_ids[i]) - ids.begin()];
  }
  const SparseEval e = EvaluateSparseLogReg(held, held_ids, w);
  std::printf(
      "sparse_lr on %s, BSP: held-out log-loss %.4f (constant %.4f), "
      "accuracy %.3f, AUC %.3f\n",
      path.c_str(), e.log_loss, constant_loss, e.accuracy, e.auc);
  EXPECT_LT(e.log_loss, constant_loss - 0.05);
  EXPECT_GT(e.auc, 0.7);
  size_t nonzero = 0;
  for (float v : a) nonzero += v != 0;
  EXPECT_GT(nonzero, keys.size() / 2) << "of " << keys.size() << " weights";

  // Repeatable: the same bits in every weight.
  size_t differ = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0u) << "of " << keys.size() << " weights";
}

// Two servers and a client with a synced sparse table "synced" (width 1,
// the "sum" handler, steps of 2 workers): the two tests of the client's
// side of synced sparse tables below.
struct SyncedCluster {
  absl::Status Start(const std::string& name,
                     std::vector<std::string> scheduler_flags = {}) {
    const std::string dir = TestTmpDir() + "/" + name;
    if (system(("mkdir -p " + dir).c_str()) != 0) {
      return absl::InternalError("cannot make " + dir);
    }
    LocalClusterOptions o;
    o.bin_dir = RunfilePath("");
    o.work_dir = dir;
    o.num_servers = 2;
    o.scheduler_flags = std::move(scheduler_flags);
    DP_ASSIGN_OR_RETURN(cluster, LocalCluster::Start(o));
    ClientOptions co;
    co.scheduler_address = cluster->scheduler_address();
    DP_ASSIGN_OR_RETURN(client, Client::Connect(co));
    TableOptions t;
    t.name = "synced";
    t.sparse = true;
    t.width = 1;
    t.handler = "sum";
    t.sync_workers = 2;
    t.tracked_workers = 2;
    DP_ASSIGN_OR_RETURN(table, client->CreateTable(t));
    return absl::OkStatus();
  }
  // Key k's value, read without a clock.
  float Get(Key k) {
    client->SetWorkerClock(0, -1);
    float v = -1;
    EXPECT_OK(
        client->GetSync(table, std::vector<Key>{k}, absl::MakeSpan(&v, 1)));
    return v;
  }
  absl::Status Stop() {
    client.reset();
    return cluster->Stop();
  }

  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<Client> client;
  Table table;
};

// The client's side of synced sparse tables: a clocked push sends every
// server a batch, empty ones included, so that a server none of whose keys
// a rank touched still hears from it and applies the clock. Without the
// empty parts, key kA below would stay held forever.
TEST(SparseTrainingTest, SyncedSparsePushReachesEveryServer) {
  SyncedCluster c;
  ASSERT_OK(c.Start("synced-client"));
  Client* client = c.client.get();
  const Table table = c.table;
  auto get = [&](Key k) { return c.Get(k); };
  // The key space is split in two contiguous ranges, one per server.
  const Key ka = 5, kb = kKeySpaceEnd - 5;
  auto push = [&](int rank, int64_t clock, std::vector<Key> keys,
                  std::vector<float> grads) {
    client->SetWorkerClock(rank, clock);
    return client->PushSync(table, keys, grads);
  };
  // A held push is answered only once its step is applied (so that an
  // answered gradient cannot be lost with a server before it counts): the
  // first rank of each clock pushes asynchronously.
  const std::vector<Key> first_keys = {ka};
  const std::vector<float> first_grads = {2};
  auto push_async = [&](int rank, int64_t clock, const std::vector<Key>& keys,
                        const std::vector<float>& grads) {
    client->SetWorkerClock(rank, clock);
    return client->Push(table, keys, grads);
  };
  // Clock 0: rank 0 touches kA only, rank 1 nothing at all.
  Ticket held = push_async(0, 0, first_keys, first_grads);
  EXPECT_EQ(get(ka), 0.0f);  // held: rank 1 has not pushed clock 0
  EXPECT_THAT(client->Wait(held, absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));  // not yet
  ASSERT_OK(push(1, 0, {}, {}));
  ASSERT_OK(client->Wait(held));
  EXPECT_EQ(get(ka), 1.0f);  // mean over both ranks
  // Clock 1: both touch kB only.
  const std::vector<Key> kb_keys = {kb};
  const std::vector<float> kb_grads = {2};
  held = push_async(1, 1, kb_keys, kb_grads);
  ASSERT_OK(push(0, 1, {kb}, {4}));
  ASSERT_OK(client->Wait(held));
  EXPECT_EQ(get(kb), 3.0f);
  EXPECT_EQ(get(ka), 1.0f);
  EXPECT_OK(c.Stop());
}

// A rank's push held for a step when its range is split: the server
// abandons the step, and the client sends the push again to each half
// (an empty batch to the half where it has no keys), so that both halves
// count the rank and the step completes with the same mean. Rank 0 has a
// key in the lower half only, rank 1 in the upper half only.
TEST(SparseTrainingTest, AHeldSyncedPushIsSentAgainToBothHalvesOfASplit) {
  SyncedCluster c;
  ASSERT_OK(c.Start("synced-split", {"--replicas=2"}));
  Client* client = c.client.get();
  const Table table = c.table;
  auto get = [&](Key k) { return c.Get(k); };
  // Two keys of the first range, on either side of the split key.
  const Key ka = 5, kb = 1000, split_at = 500;
  const std::vector<Key> both = {ka, kb};
  const std::vector<float> grads = {2, 4};
  // An asynchronous push reads its keys and values until it is answered:
  // they live to the end of the test.
  const std::vector<Key> lower = {ka};
  const std::vector<float> lower_grads = {2};
  client->SetWorkerClock(0, 0);
  Ticket held = client->Push(table, lower, lower_grads);
  EXPECT_THAT(client->Wait(held, absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));  // held
  SchedulerClient sched(c.cluster->scheduler_address());
  ASSERT_OK(SplitAndAwait(sched, "synced", split_at, absl::Seconds(30)));
  // Rank 1 pushes kb, in the upper half: that half completes the step
  // only if rank 0's push was sent again to it too (empty).
  client->SetWorkerClock(1, 0);
  ASSERT_OK(client->PushSync(table, std::vector<Key>{kb}, {4}));
  ASSERT_OK(client->Wait(held, absl::Seconds(30)));
  EXPECT_EQ(get(ka), 1.0f);  // the mean over both ranks, once
  EXPECT_EQ(get(kb), 2.0f);
  // The next step, on the halves from the start.
  client->SetWorkerClock(1, 1);
  held = client->Push(table, both, grads);
  client->SetWorkerClock(0, 1);
  ASSERT_OK(client->PushSync(table, both, grads));
  ASSERT_OK(client->Wait(held, absl::Seconds(30)));
  EXPECT_EQ(get(ka), 3.0f);
  EXPECT_EQ(get(kb), 6.0f);
  EXPECT_OK(c.Stop());
}

// The same for a merge (scheduler/splits.h): the neighbours of a table that
// aggregates BSP steps merge into one range that keeps their steps apart
// (RangeAssignment.step_cuts). Rank 0's push, held in both halves when
// they merge, is sent again to each stretch; rank 1, on the merged map,
// pushes each stretch as well; both steps complete with the mean over both
// ranks, and the next step runs on the merged range.
TEST(SparseTrainingTest, AHeldSyncedPushGoesToEachStretchOfAMerge) {
  SyncedCluster c;
  ASSERT_OK(c.Start("synced-merge", {"--replicas=2", "--merge_min_age_s=0"}));
  Client* client = c.client.get();
  const Table table = c.table;
  SchedulerClient sched(c.cluster->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::ClusterMap map, sched.GetClusterMap());
  const proto::TableMap* t = TableNamed(map, "synced");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->ranges_size(), 2);
  const Key boundary = t->ranges(0).end();
  const Key ka = 5, kb = kKeySpaceEnd - 5;
  // Read by the held push until it is answered.
  const std::vector<Key> both = {ka, kb};
  const std::vector<float> first = {2, 4};
  client->SetWorkerClock(0, 0);
  Ticket held = client->Push(table, both, first);
  EXPECT_THAT(client->Wait(held, absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));  // held
  ASSERT_OK(MergeAndAwait(sched, "synced", boundary, absl::Seconds(30)));
  ASSERT_OK_AND_ASSIGN(map, sched.GetClusterMap());
  t = TableNamed(map, "synced");
  ASSERT_EQ(t->ranges_size(), 1);
  ASSERT_EQ(t->ranges(0).step_cuts_size(), 1);
  EXPECT_EQ(t->ranges(0).step_cuts(0), boundary);
  client->SetWorkerClock(1, 0);
  ASSERT_OK(client->PushSync(table, both, {6, 8}));
  ASSERT_OK(client->Wait(held, absl::Seconds(30)));
  EXPECT_EQ(c.Get(ka), 4.0f);  // (2 + 6) / 2, once
  EXPECT_EQ(c.Get(kb), 6.0f);  // (4 + 8) / 2
  // The next step: each rank touches one side.
  const std::vector<Key> lower = {ka};
  const std::vector<float> two = {2};
  client->SetWorkerClock(1, 1);
  held = client->Push(table, lower, two);
  client->SetWorkerClock(0, 1);
  ASSERT_OK(client->PushSync(table, std::vector<Key>{kb}, {2}));
  ASSERT_OK(client->Wait(held, absl::Seconds(30)));
  EXPECT_EQ(c.Get(ka), 5.0f);
  EXPECT_EQ(c.Get(kb), 7.0f);
  EXPECT_OK(c.Stop());
}

TEST(SparseTrainingTest, MalformedLibsvmFileIsAClearErrorNamingFileAndLine) {
  const std::string dir = TestTmpDir() + "/bad-libsvm";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  struct Case {
    std::string name;
    std::string text;  // empty: the file does not exist
    std::string want;  // in the worker's log, besides the path
  };
  const std::vector<Case> cases = {
      {"non-numeric-feature", "+1 1:1 2:1\n-1 3:1\n+1 4:1 abc:1\n",
       "line 3: bad feature 'abc:1'"},
      {"missing-label", "+1 1:1\n3:1 7:1\n", "line 2: bad label '3:1'"},
      {"missing-file", "", "cannot open libsvm file"},
  };
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = 1;
  o.cluster.scheduler_flags = {"--consistency=asp",
                               absl::StrCat("--num_workers=", cases.size())};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const std::string path = dir + "/" + cases[i].name + ".libsvm";
    if (!cases[i].text.empty()) {
      std::ofstream(path) << cases[i].text;
    }
    ASSERT_OK(
        job->AddWorker({"--model=sparse_lr", "--libsvm=" + path, "--steps=5"}));
    auto st = job->WaitForWorker(i, absl::Seconds(60));
    ASSERT_OK(st);
    Subprocess& w = job->worker(i);
    // Exit status 1 (an error), not a signal (a crash).
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << w.LogTail();
    EXPECT_NE(w.LogTail().find(path), std::string::npos) << w.LogTail();
    EXPECT_NE(w.LogTail().find(cases[i].want), std::string::npos)
        << w.LogTail();
  }
  EXPECT_OK(job->Stop());
}

}  // namespace
}  // namespace downpour
