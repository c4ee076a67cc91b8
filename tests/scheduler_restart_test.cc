// The scheduler killed in the middle of a BSP job and restarted on its
// state dir (ps_scheduler --state_dir): servers and workers keep working on
// the data plane through the outage and re-attach with their node ids; the
// job finishes with exactly the parameters of a run without the outage; a
// table declared after the restart gets a new id and its own values; and a
// second scheduler on the same state dir refuses to start.
#include <signal.h>
#include <sys/wait.h>

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "models/model.h"
#include "tests/model_params.h"

namespace downpour {
namespace {

constexpr int kWorkers = 2;
constexpr int kSteps = 400;

std::string FreshDir(const std::string& tag) {
  const std::string dir = TestTmpDir() + "/" + tag;
  EXPECT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  return dir;
}

std::vector<std::unique_ptr<Subprocess>> StartWorkers(
    const std::string& scheduler, const std::string& dir) {
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int i = 0; i < kWorkers; ++i) {
    procs.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{
            RunfilePath("worker/ps_worker"), "--scheduler=" + scheduler,
            absl::StrCat("--name=w", i), "--model=mlp",
            absl::StrCat("--steps=", kSteps), "--batch=32", "--seed=3",
            "--eval_every=100000", "--lr=0.05", "--warmup_steps=5"},
        absl::StrCat(dir, "/worker-", i, ".log")));
    EXPECT_OK(procs.back()->Start());
  }
  return procs;
}

std::vector<float> ReadParams(const std::string& scheduler) {
  ClientOptions co;
  co.scheduler_address = scheduler;
  auto client = Client::Connect(co);
  EXPECT_OK(client);
  if (!client.ok()) return {};
  auto params = ReadModelParams(**client, *MakeMlp({784, 256, 10}), "mlp");
  EXPECT_OK(params);
  return params.ok() ? *std::move(params) : std::vector<float>();
}

struct JobRun {
  std::vector<float> params;
  int64_t killed_at = -1;
  int64_t restarted_at = -1;
};

JobRun Train(const std::string& tag, bool restart_scheduler) {
  JobRun run;
  const std::string dir = FreshDir(tag);
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = 2;
  o.durable = true;
  o.scheduler_flags = {"--consistency=bsp",
                       absl::StrCat("--num_workers=", kWorkers)};
  auto started = LocalCluster::Start(o);
  EXPECT_OK(started);
  if (!started.ok()) return run;
  LocalCluster& cluster = **started;
  const std::string address = cluster.scheduler_address();
  auto workers = StartWorkers(address, dir);
  SchedulerClient sched(address);
  if (restart_scheduler) {
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (absl::Now() < deadline) {
      auto status = sched.GetJobStatus();
      if (status.ok() && status->gating_clock() >= 40) {
        run.killed_at = status->gating_clock();
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    auto before = sched.GetClusterMap();
    EXPECT_OK(before);
    if (!before.ok()) return run;
    TableId max_table = 0;
    for (const auto& t : before->tables()) {
      max_table = std::max(max_table, t.spec().id());
    }
    cluster.scheduler().Signal(SIGKILL);
    EXPECT_OK(cluster.scheduler().Wait(absl::Seconds(10)));
    // The outage: the data plane goes on without the scheduler.
    absl::SleepFor(absl::Seconds(1));
    EXPECT_OK(cluster.RestartScheduler());

    // A second scheduler on the same state dir refuses, naming the reason.
    Subprocess twin(
        {RunfilePath("scheduler/ps_scheduler"), "--listen=127.0.0.1:0",
         "--state_dir=" + cluster.state_dir(), "--consistency=bsp",
         absl::StrCat("--num_workers=", kWorkers)},
        dir + "/twin-scheduler.log");
    EXPECT_OK(twin.Start());
    auto st = twin.Wait(absl::Seconds(20));
    EXPECT_OK(st);
    if (st.ok()) {
      EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << twin.LogTail();
    }
    EXPECT_TRUE(absl::StrContains(twin.LogTail(), "is in use"))
        << twin.LogTail();

    // The test's own channel saw the old process die: its first calls may
    // fail until it reconnects.
    absl::StatusOr<proto::JobStatus> after;
    for (const absl::Time end = absl::Now() + absl::Seconds(10);
         absl::Now() < end;) {
      after = sched.GetJobStatus();
      if (after.ok()) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_OK(after);
    if (after.ok()) run.restarted_at = after->gating_clock();
    // The servers kept their ids (the map lists them alive, same names).
    auto map = sched.GetClusterMap();
    EXPECT_OK(map);
    if (map.ok()) {
      EXPECT_GE(map->epoch(), before->epoch());
      std::map<std::string, NodeId> ids;
      for (const auto& n : before->nodes()) ids[n.name()] = n.id();
      for (const auto& n : map->nodes()) {
        EXPECT_EQ(ids[n.name()], n.id()) << n.name();
        if (n.role() == proto::SERVER) {
          EXPECT_EQ(n.state(), proto::ALIVE) << n.name();
        }
      }
    }
    // A table declared now gets an id never given before, and its own
    // values (not those of an older table that had the id).
    ClientOptions co;
    co.scheduler_address = address;
    auto client = Client::Connect(co);
    EXPECT_OK(client);
    if (client.ok()) {
      TableOptions fresh;
      fresh.name = "after-restart";
      fresh.width = 10;
      fresh.num_keys = 256;
      fresh.init = "constant";
      fresh.init_a = 3.25f;
      auto t = (*client)->CreateTable(fresh);
      EXPECT_OK(t);
      if (t.ok()) {
        EXPECT_GT(t->id, max_table);
        std::vector<float> v(2560);
        EXPECT_OK(
            (*client)->GetSync(*t, Keys::Range(0, 256), absl::MakeSpan(v)));
        EXPECT_EQ(v, std::vector<float>(2560, 3.25f));
      }
    }
  }
  for (auto& p : workers) {
    auto st = p->Wait(absl::Seconds(300));
    EXPECT_OK(st);
    if (st.ok()) {
      EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << p->LogTail();
    }
  }
  // No server exited through it all.
  for (int i = 0; i < cluster.num_servers(); ++i) {
    EXPECT_TRUE(cluster.server(i).running()) << cluster.server(i).LogTail();
  }
  run.params = ReadParams(address);
  EXPECT_OK(cluster.Stop());
  return run;
}

TEST(SchedulerRestartTest, BspJobGoesThroughAKilledSchedulerBitForBit) {
  const JobRun clean = Train("clean", false);
  const JobRun restarted = Train("restarted", true);
  ASSERT_FALSE(clean.params.empty());
  ASSERT_EQ(restarted.params.size(), clean.params.size());
  std::cout << "scheduler killed at clock " << restarted.killed_at
            << ", back at clock " << restarted.restarted_at << " of " << kSteps
            << std::endl;
  EXPECT_EQ(CountDiffering(clean.params, restarted.params), 0u)
      << "of " << clean.params.size() << " parameters";
}

}  // namespace
}  // namespace downpour
