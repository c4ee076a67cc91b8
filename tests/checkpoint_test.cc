// Checkpoints, restores and export over the real daemons: ps_scheduler with
// --state_dir, ps_server with --data_dir, real ps_worker processes.
//  - BSP: a checkpoint at clock c, then kill -9 of every process; the
//    restarted cluster holds exactly the parameters of a clean run stopped
//    at c, bit for bit, and the workers resume at c and end exactly where a
//    clean run of the whole job ends.
//  - A disk that fills up under a server (fault injection below RocksDB):
//    the checkpoint fails cleanly, no manifest is written, and the one
//    before still restores. Export to .npy, from the running cluster and
//    from the data dirs, reads back with the same bits.
#include <signal.h>
#include <sys/wait.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "models/dataset.h"
#include "models/model.h"
#include "psctl/export.h"
#include "psctl/npy.h"
#include "tests/model_params.h"

namespace downpour {
namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";
constexpr int kWorkers = 2;

std::string FreshDir(const std::string& tag) {
  const std::string dir = TestTmpDir() + "/" + tag;
  EXPECT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  return dir;
}

std::vector<std::unique_ptr<Subprocess>> StartWorkers(
    const std::string& scheduler, const std::string& dir, int steps,
    const std::string& log_tag) {
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int i = 0; i < kWorkers; ++i) {
    std::vector<std::string> argv = {RunfilePath("worker/ps_worker"),
                                     "--scheduler=" + scheduler,
                                     absl::StrCat("--name=w", i),
                                     "--model=mlp",
                                     absl::StrCat("--steps=", steps),
                                     "--batch=32",
                                     "--seed=7",
                                     "--eval_every=100000",
                                     "--lr=0.05",
                                     "--warmup_steps=5"};
    procs.push_back(std::make_unique<Subprocess>(
        argv, absl::StrCat(dir, "/worker-", i, log_tag, ".log")));
    EXPECT_OK(procs.back()->Start());
  }
  return procs;
}

void ExpectClean(std::vector<std::unique_ptr<Subprocess>>& procs) {
  for (auto& p : procs) {
    auto st = p->Wait(absl::Seconds(300));
    ASSERT_OK(st);
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << p->LogTail();
  }
}

void Kill(Subprocess& p) {
  if (!p.running()) return;
  p.Signal(SIGKILL);
  EXPECT_OK(p.Wait(absl::Seconds(10)));
}

// The MLP's parameters, table by table; retried (a restore may be under
// way: lost ranges answer kDataLoss) until `deadline`.
absl::StatusOr<std::vector<float>> ReadParams(const std::string& scheduler,
                                              absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  absl::Status last;
  while (absl::Now() < deadline) {
    ClientOptions co;
    co.scheduler_address = scheduler;
    co.op_timeout = absl::Seconds(3);
    auto client = Client::Connect(co);
    if (!client.ok()) {
      last = client.status();
      continue;
    }
    auto params = ReadModelParams(**client, *MakeMlp({784, 256, 10}), "mlp");
    if (params.ok()) return params;
    last = params.status();
    absl::SleepFor(absl::Milliseconds(200));
  }
  return Annotate(last, "read the parameters");
}

// A clean run of the same job, `steps` steps.
std::vector<float> CleanRun(const std::string& tag, int steps) {
  const std::string dir = FreshDir(tag);
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = 2;
  o.scheduler_flags = {"--consistency=bsp",
                       absl::StrCat("--num_workers=", kWorkers)};
  auto cluster = LocalCluster::Start(o);
  EXPECT_OK(cluster);
  if (!cluster.ok()) return {};
  auto workers = StartWorkers((*cluster)->scheduler_address(), dir, steps, "");
  ExpectClean(workers);
  auto params = ReadParams((*cluster)->scheduler_address(), absl::Seconds(30));
  EXPECT_OK(params);
  EXPECT_OK((*cluster)->Stop());
  return params.ok() ? *params : std::vector<float>();
}

TEST(CheckpointTest, BspRestoreIsExactAndTrainingResumesWhereItStopped) {
  constexpr int kSteps = 240;
  const std::string dir = FreshDir("bsp-restore");
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = 2;
  o.durable = true;
  o.scheduler_flags = {"--consistency=bsp",
                       absl::StrCat("--num_workers=", kWorkers)};
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));
  const std::string address = cluster->scheduler_address();
  auto workers = StartWorkers(address, dir, kSteps, "");
  SchedulerClient sched(address);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    auto status = sched.GetJobStatus();
    if (status.ok() && status->gating_clock() >= kSteps / 3) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_OK_AND_ASSIGN(proto::CheckpointManifest m,
                       sched.Checkpoint(absl::Seconds(60)));
  const int64_t c = m.clock();
  std::cout << "checkpoint " << m.id() << " at clock " << c << ": "
            << m.tables_size() << " tables, " << m.bytes() << " bytes in "
            << m.duration_ms() << " ms" << std::endl;
  ASSERT_GT(c, 0);
  ASSERT_LT(c, kSteps);
  EXPECT_EQ(m.tables_size(), 4);
  ASSERT_EQ(m.workers_size(), kWorkers);
  for (const auto& w : m.workers()) EXPECT_EQ(w.clock(), c);
  // Training goes on past the checkpoint; then everything dies at once.
  while (absl::Now() < deadline) {
    auto status = sched.GetJobStatus();
    if (status.ok() && status->gating_clock() >= c + 10) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (auto& w : workers) Kill(*w);
  for (int i = 0; i < cluster->num_servers(); ++i) Kill(cluster->server(i));
  Kill(cluster->scheduler());

  // The same scheduler state and data dirs: the job is back at clock c.
  ASSERT_OK(cluster->RestartScheduler());
  for (int i = 0; i < cluster->num_servers(); ++i) {
    ASSERT_OK(cluster->RestartServer(i));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<float> restored,
                       ReadParams(address, absl::Seconds(60)));
  ASSERT_OK_AND_ASSIGN(proto::ClusterMap map, sched.GetClusterMap());
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) {
      EXPECT_FALSE(r.lost()) << t.spec().name() << " from key " << r.begin();
    }
  }
  ASSERT_OK_AND_ASSIGN(proto::JobStatus job, sched.GetJobStatus());
  EXPECT_EQ(job.gating_clock(), c);

  // The workers (same names) resume at c and finish the job.
  auto resumed = StartWorkers(address, dir, kSteps, ".resumed");
  ExpectClean(resumed);
  EXPECT_TRUE(absl::StrContains(resumed[0]->LogTail(100000),
                                absl::StrCat("resuming at clock ", c)))
      << resumed[0]->LogTail();
  ASSERT_OK_AND_ASSIGN(std::vector<float> final_params,
                       ReadParams(address, absl::Seconds(30)));
  EXPECT_OK(cluster->Stop());

  // What the checkpoint restored is a clean run stopped at c, bit for bit;
  // and the resumed job ends where a clean run of the whole job ends.
  const std::vector<float> at_c = CleanRun("clean-at-c", static_cast<int>(c));
  ASSERT_EQ(at_c.size(), restored.size());
  EXPECT_EQ(CountDiffering(at_c, restored), 0u)
      << "of " << restored.size() << " parameters at clock " << c;
  const std::vector<float> whole = CleanRun("clean-whole", kSteps);
  EXPECT_EQ(CountDiffering(whole, final_params), 0u)
      << "of " << final_params.size() << " parameters at the end";
  auto test = LoadFashionMnist(kData, false);
  ASSERT_OK(test);
  const double accuracy =
      MakeMlp({784, 256, 10})->Evaluate(final_params.data(), *test).first;
  std::cout << "test accuracy after the restore: " << accuracy << std::endl;
  EXPECT_GT(accuracy, 0.7);
}

// --replicas=1: a server killed and restarted (same name, same data dir)
// comes back without its ranges' data, so the whole job rolls back to the
// newest checkpoint: the servers load it, the workers still running fail
// (their steps were cut off), and restarted workers resume at its clock.
// The job then ends exactly where a clean run ends.
TEST(CheckpointTest, AServerThatComesBackRollsTheJobBackToTheCheckpoint) {
  constexpr int kSteps = 240;
  const std::string dir = FreshDir("rollback");
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = 2;
  o.durable = true;
  o.scheduler_flags = {"--consistency=bsp",
                       absl::StrCat("--num_workers=", kWorkers),
                       "--checkpoint_every_clocks=40"};
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));
  const std::string address = cluster->scheduler_address();
  auto workers = StartWorkers(address, dir, kSteps, "");
  SchedulerClient sched(address);
  int64_t newest = -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    auto list = sched.ListCheckpoints();
    auto status = sched.GetJobStatus();
    if (list.ok() && !list->empty() && status.ok() &&
        status->gating_clock() >= list->back().clock() + 10 &&
        list->back().clock() >= 40) {
      newest = list->back().clock();
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(newest, 40);
  cluster->server(1).Signal(SIGKILL);
  ASSERT_OK(cluster->server(1).Wait(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_OK(cluster->RestartServer(1));
  // The running workers' steps were cut off by the rollback: they stop.
  for (auto& w : workers) {
    ASSERT_OK_AND_ASSIGN(int st, w->Wait(absl::Seconds(120)));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << w->LogTail();
  }
  ASSERT_OK_AND_ASSIGN(std::vector<proto::CheckpointManifest> list,
                       sched.ListCheckpoints());
  ASSERT_FALSE(list.empty());
  const proto::CheckpointManifest& m = list.back();
  // Restarted, they are told where the job went back to, and resume there.
  auto resumed = StartWorkers(address, dir, kSteps, ".resumed");
  ExpectClean(resumed);
  EXPECT_TRUE(absl::StrContains(
      resumed[0]->LogTail(100000),
      absl::StrCat("resuming at clock ", m.clock(),
                   " (restored from checkpoint ", m.id(), ")")))
      << resumed[0]->LogTail();
  std::cout << "server-1 killed after checkpoint " << m.id() << " at clock "
            << m.clock() << "; the job rolled back there" << std::endl;
  ASSERT_OK_AND_ASSIGN(std::vector<float> final_params,
                       ReadParams(address, absl::Seconds(30)));
  EXPECT_OK(cluster->Stop());
  const std::vector<float> whole = CleanRun("rollback-clean", kSteps);
  EXPECT_EQ(CountDiffering(whole, final_params), 0u)
      << "of " << final_params.size() << " parameters at the end";
}

// Values of the small dense table.
std::vector<float> Values(uint64_t rows, uint32_t width, float scale) {
  std::vector<float> v(rows * width);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = scale * static_cast<float>(i) - 3;
  return v;
}

std::vector<float> FloatsOf(const NpyArray& a) {
  std::vector<float> v(a.data.size() / sizeof(float));
  std::memcpy(v.data(), a.data.data(), a.data.size());
  return v;
}

TEST(CheckpointTest, AFullDiskFailsTheCheckpointAndThePreviousOneRestores) {
  const std::string dir = FreshDir("disk-full");
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = 2;
  o.durable = true;
  // Each server's data dir "fills up" after 8 MiB.
  o.server_flags = {"--inject_disk_full_after_mb=8"};
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));
  const std::string address = cluster->scheduler_address();
  SchedulerClient sched(address);
  ClientOptions co;
  co.scheduler_address = address;
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(co));

  TableOptions small;
  small.name = "small";
  small.width = 4;
  small.num_keys = 1000;
  small.handler = "adam";
  ASSERT_OK_AND_ASSIGN(Table t, client->CreateTable(small));
  // A twin that goes through the same writes, to tell what a second Adam
  // step gives from the checkpoint's state.
  small.name = "twin";
  ASSERT_OK_AND_ASSIGN(Table twin, client->CreateTable(small));
  const std::vector<float> v1 = Values(1000, 4, 0.5f);
  const std::vector<float> g1 = Values(1000, 4, 0.01f);
  const std::vector<float> g2 = Values(1000, 4, -0.02f);
  for (const Table& x : {t, twin}) {
    ASSERT_OK(client->PutSync(x, Keys::Range(0, 1000), v1));
    ASSERT_OK(client->PushSync(x, Keys::Range(0, 1000), g1));
  }
  std::vector<float> at_checkpoint(4000);
  ASSERT_OK(
      client->GetSync(t, Keys::Range(0, 1000), absl::MakeSpan(at_checkpoint)));
  TableOptions sparse;
  sparse.name = "sparse";
  sparse.width = 3;
  sparse.sparse = true;
  sparse.handler = "sum";
  ASSERT_OK_AND_ASSIGN(Table sp, client->CreateTable(sparse));
  const std::vector<Key> keys = {uint64_t{1} << 63, 5, uint64_t{1} << 40, 77};
  const std::vector<float> sparse_values = {1, 2, 3, 4,  5,  6,
                                            7, 8, 9, 10, 11, 12};
  ASSERT_OK(client->PutSync(sp, keys, sparse_values));
  ASSERT_OK_AND_ASSIGN(proto::CheckpointManifest first,
                       sched.Checkpoint(absl::Seconds(60)));
  EXPECT_EQ(first.tables_size(), 3);

  // 32 MiB more, 16 per server: their disks fill up.
  TableOptions big;
  big.name = "big";
  big.width = 4;
  big.num_keys = 2 << 20;
  ASSERT_OK_AND_ASSIGN(Table b, client->CreateTable(big));
  ASSERT_OK(client->PutSync(b, Keys::Range(0, big.num_keys),
                            std::vector<float>(big.num_keys * 4, 1.0f)));
  // Adam's second step, on the twin, after the checkpoint.
  ASSERT_OK(client->PushSync(twin, Keys::Range(0, 1000), g2));
  std::vector<float> second_step(4000);
  ASSERT_OK(
      client->GetSync(twin, Keys::Range(0, 1000), absl::MakeSpan(second_step)));
  auto failed = sched.Checkpoint(absl::Seconds(60));
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "disk is full"))
      << failed.status();
  ASSERT_OK_AND_ASSIGN(std::vector<proto::CheckpointManifest> list,
                       sched.ListCheckpoints());
  ASSERT_EQ(list.size(), 1u);  // no manifest for the failed one
  EXPECT_EQ(list[0].id(), first.id());

  // Export of the running cluster, after a change made since.
  const std::vector<float> v2 = Values(1000, 4, -0.25f);
  ASSERT_OK(client->PutSync(t, Keys::Range(0, 1000), v2));
  ASSERT_OK_AND_ASSIGN(ExportResult live,
                       ExportFromCluster(address, ClusterAuth(),
                                         {"small", dir + "/live-small"}));
  ASSERT_EQ(live.files.size(), 1u);
  ASSERT_OK_AND_ASSIGN(NpyArray live_small, ReadNpy(live.files[0]));
  EXPECT_EQ(live_small.descr, "<f4");
  EXPECT_EQ(live_small.shape, (std::vector<uint64_t>{1000, 4}));
  EXPECT_EQ(CountDiffering(FloatsOf(live_small), v2), 0u);
  ASSERT_OK_AND_ASSIGN(ExportResult live_sparse,
                       ExportFromCluster(address, ClusterAuth(),
                                         {"sparse", dir + "/live-sparse"}));
  ASSERT_OK_AND_ASSIGN(NpyArray sk, ReadNpy(live_sparse.files[0]));
  ASSERT_OK_AND_ASSIGN(NpyArray sv, ReadNpy(live_sparse.files[1]));
  EXPECT_EQ(sk.descr, "<u8");
  ASSERT_EQ(sk.shape, (std::vector<uint64_t>{4}));
  std::vector<Key> got_keys(4);
  std::memcpy(got_keys.data(), sk.data.data(), sk.data.size());
  EXPECT_EQ(got_keys,
            (std::vector<Key>{5, 77, uint64_t{1} << 40, uint64_t{1} << 63}));
  EXPECT_EQ(FloatsOf(sv),
            (std::vector<float>{4, 5, 6, 10, 11, 12, 7, 8, 9, 1, 2, 3}));
  client.reset();

  // Everything dies; the restart restores the first checkpoint.
  for (int i = 0; i < cluster->num_servers(); ++i) Kill(cluster->server(i));
  Kill(cluster->scheduler());
  ASSERT_OK(cluster->RestartScheduler());
  for (int i = 0; i < cluster->num_servers(); ++i) {
    ASSERT_OK(cluster->RestartServer(i));
  }
  ASSERT_OK_AND_ASSIGN(client, Client::Connect(co));
  std::vector<float> restored(4000);
  absl::Status read;
  for (const absl::Time end = absl::Now() + absl::Seconds(60);
       absl::Now() < end;) {
    auto t2 = client->OpenTable("small");
    read = t2.ok() ? client->GetSync(*t2, Keys::Range(0, 1000),
                                     absl::MakeSpan(restored))
                   : t2.status();
    if (read.ok()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_OK(read);
  EXPECT_EQ(CountDiffering(restored, at_checkpoint), 0u);
  // The handler state came back too: Adam's second step from the restored
  // state gives what it gave the twin before the kill.
  ASSERT_OK_AND_ASSIGN(Table t2, client->OpenTable("small"));
  ASSERT_OK(client->PushSync(t2, Keys::Range(0, 1000), g2));
  std::vector<float> second_again(4000);
  ASSERT_OK(
      client->GetSync(t2, Keys::Range(0, 1000), absl::MakeSpan(second_again)));
  EXPECT_EQ(CountDiffering(second_again, second_step), 0u);
  ASSERT_OK(client->PutSync(t2, Keys::Range(0, 1000), at_checkpoint));
  std::vector<float> sparse_back(12);
  ASSERT_OK_AND_ASSIGN(Table sp2, client->OpenTable("sparse"));
  ASSERT_OK(client->GetSync(sp2, keys, absl::MakeSpan(sparse_back)));
  EXPECT_EQ(sparse_back, sparse_values);
  // The table declared after the checkpoint is gone.
  EXPECT_THAT(client->OpenTable("big"), StatusIs(absl::StatusCode::kNotFound));
  client.reset();
  EXPECT_OK(cluster->Stop());

  // Offline, from the stopped servers' data dirs: the first checkpoint, and
  // through the ps_export binary the newest (the last one, at SIGTERM).
  const std::vector<std::string> dirs = {cluster->data_dir(0),
                                         cluster->data_dir(1)};
  ASSERT_OK_AND_ASSIGN(
      ExportResult off,
      ExportFromCheckpoint(dirs, first.id(), {"small", dir + "/off-small"}));
  EXPECT_EQ(off.checkpoint, first.id());
  ASSERT_OK_AND_ASSIGN(NpyArray off_small, ReadNpy(off.files[0]));
  EXPECT_EQ(CountDiffering(FloatsOf(off_small), at_checkpoint), 0u);
  Subprocess tool(
      {RunfilePath("psctl/ps_export"), "--data_dirs=" + dirs[0] + "," + dirs[1],
       "--table=sparse", "--out=" + dir + "/tool-sparse"},
      dir + "/ps_export.log");
  ASSERT_OK(tool.Start());
  ASSERT_OK_AND_ASSIGN(int st, tool.Wait(absl::Seconds(30)));
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << tool.LogTail();
  ASSERT_OK_AND_ASSIGN(NpyArray tool_values,
                       ReadNpy(dir + "/tool-sparse.values.npy"));
  EXPECT_EQ(FloatsOf(tool_values), FloatsOf(sv));
  EXPECT_THAT(ExportFromCheckpoint(dirs, 0, {"big", dir + "/none"}),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace downpour
