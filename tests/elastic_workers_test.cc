// Workers joining and leaving a running SSP job, over the real daemons
// (scheduler and servers on loopback; the workers are JobMembers and
// clients in this process, each stepping when the test says so):
//  - a worker registering when every rank is held takes the elastic seat
//    (--elastic_workers), starts at the gating clock, and gates the others
//    from its first clock on (they wait for it at the bound);
//  - its pushes are accepted and no pull looks staler than the bound: the
//    servers count the seat from the clock it joined at;
//  - a worker leaving for good retires its rank at once: the others run
//    past the bound without it;
//  - every push is in the table, exactly (each adds 1 to every key);
//  - each epoch's examples are split over the workers in the job when it
//    began (JobMember::EpochShareOf): every example trained once per epoch
//    through a join and a leave, also as ps_worker's loops draw them
//    (worker/example_stream.h);
//  - the operator retires a worker (psctl retire): it leaves for good and
//    exits 0, and the other trains on without it;
//  - a BSP job grows at the step the scheduler announces, on every server
//    at once, bit for bit as a reference grown there by construction.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/job_member.h"
#include "cluster/scheduler_client.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "proto/downpour.pb.h"
#include "testing/suite_cluster.h"
#include "worker/example_stream.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kKeys = 64;
constexpr int kStaleness = 1;

class ElasticWorkersTest : public ::testing::Test {
 protected:
  struct Worker {
    std::unique_ptr<JobMember> member;
    std::unique_ptr<Client> client;
    Clock clock = 0;
  };

  void SetUp() override {
    dir_ = TestTmpDir() + "/" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_EQ(system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str()), 0);
    LocalClusterOptions o = SuiteCluster::Defaults();  // two servers
    o.work_dir = dir_;
    // A held worker (SIGSTOP) must not be declared dead meanwhile.
    o.scheduler_flags = {
        "--consistency=ssp", absl::StrCat("--staleness=", kStaleness),
        "--num_workers=2", "--elastic_workers=1", "--dead_after_ms=60000"};
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(o));
    sched_ = std::make_unique<SchedulerClient>(cluster_->scheduler_address());
  }
  void TearDown() override {
    workers_.clear();
    if (cluster_ != nullptr) {
      EXPECT_OK(cluster_->Stop());
    }
  }

  absl::StatusOr<Worker*> Join(const std::string& name) {
    JobMemberOptions mo;
    mo.scheduler_address = cluster_->scheduler_address();
    mo.name = name;
    auto w = std::make_unique<Worker>();
    DP_ASSIGN_OR_RETURN(w->member, JobMember::Join(mo));
    ClientOptions co;
    co.scheduler_address = cluster_->scheduler_address();
    DP_ASSIGN_OR_RETURN(w->client, Client::Connect(co));
    w->clock = w->member->start_clock();
    workers_.push_back(std::move(w));
    return workers_.back().get();
  }

  // One iteration of `w` at its clock: wait for the gate, pull, push 1 to
  // every key, report the next clock.
  absl::Status Step(Worker* w) {
    DP_RETURN_IF_ERROR(
        w->member->WaitClock(w->clock, absl::Seconds(60)).status());
    DP_ASSIGN_OR_RETURN(Table t, w->client->OpenTable("w"));
    w->client->SetWorkerClock(w->member->rank(), w->clock);
    std::vector<float> values(kKeys), ones(kKeys, 1.0f);
    DP_RETURN_IF_ERROR(
        w->client->PullSync(t, Keys::Range(0, kKeys), absl::MakeSpan(values)));
    DP_RETURN_IF_ERROR(w->client->PushSync(t, Keys::Range(0, kKeys), ones));
    ++w->clock;
    ClockReport report;
    report.clock = w->clock;
    DP_RETURN_IF_ERROR(w->member->ReportClock(report));
    return w->member->Flush(absl::Seconds(30));
  }

  proto::ClusterMap Map() {
    auto map = sched_->GetClusterMap();
    EXPECT_OK(map);
    return map.ok() ? *map : proto::ClusterMap();
  }

  std::string dir_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<SchedulerClient> sched_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(ElasticWorkersTest, SspWorkersJoinAndLeaveForGood) {
  ASSERT_OK_AND_ASSIGN(Worker * a, Join("a"));
  ASSERT_OK_AND_ASSIGN(Worker * b, Join("b"));
  EXPECT_EQ(a->member->rank(), 0);
  EXPECT_EQ(b->member->rank(), 1);
  EXPECT_EQ(a->member->policy().max_ranks(), 3);
  {
    TableOptions to;
    to.name = "w";
    to.num_keys = kKeys;
    to.handler = "sum";
    to.follows_job = true;
    ASSERT_OK(a->client->CreateTable(to).status());
  }
  EXPECT_EQ(Map().job_workers(), 2u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(Step(a));
    ASSERT_OK(Step(b));
  }

  // c joins the running job in the seat, at the gating clock.
  ASSERT_OK_AND_ASSIGN(Worker * c, Join("c"));
  EXPECT_EQ(c->member->rank(), 2);
  EXPECT_EQ(c->member->start_clock(), 3);
  proto::ClusterMap map = Map();
  EXPECT_EQ(map.job_workers(), 3u);
  EXPECT_THAT(map.seat_clocks(), ElementsAre(3));
  // No seat is left.
  {
    JobMemberOptions mo;
    mo.scheduler_address = cluster_->scheduler_address();
    mo.name = "d";
    mo.register_timeout = absl::Seconds(5);
    EXPECT_THAT(JobMember::Join(mo).status(),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }

  // It gates from its first clock: a cannot start iteration 5 (two ahead
  // of c's 3 with s = 1) until c completes iteration 3.
  ASSERT_OK(Step(a));
  ASSERT_OK(Step(b));
  EXPECT_THAT(a->member->WaitClock(5, absl::Milliseconds(300)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_OK(Step(c));
  ASSERT_OK(a->member->WaitClock(5, absl::Seconds(60)).status());

  // No pull looked staler than the bound, the joiner's included. (Checked
  // before b leaves: the servers learn that its rank retired from a later
  // map, and until then b's count is what they measure against.)
  for (Worker* w : {a, b, c}) {
    EXPECT_LE(w->client->max_staleness(), kStaleness);
  }

  // b leaves for good: a and c run past b's clock 4 + s + 1 without it.
  ASSERT_OK(b->member->LeaveForGood("test", absl::Seconds(30)));
  EXPECT_THAT(Map().retired_ranks(), ElementsAre(1));
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(Step(a));
    ASSERT_OK(Step(c));
  }
  EXPECT_EQ(a->clock, 7);
  EXPECT_EQ(c->clock, 7);

  // Every push is in: a 7, b 4, c 4 (iterations 3 to 6).
  ASSERT_OK_AND_ASSIGN(Table t, a->client->OpenTable("w"));
  std::vector<float> values(kKeys);
  ASSERT_OK(
      a->client->GetSync(t, Keys::Range(0, kKeys), absl::MakeSpan(values)));
  for (int k = 0; k < kKeys; ++k) ASSERT_EQ(values[k], 15.0f) << "key " << k;

  auto status = sched_->GetJobStatus();
  ASSERT_OK(status);
  ASSERT_EQ(status->workers_size(), 3);
  EXPECT_TRUE(status->workers(1).retired());
  EXPECT_EQ(status->workers(2).clock(), 7);
}

// Each epoch's examples are split over the workers in the job when it
// began: a worker joining during an epoch trains none of it, one leaving
// for good between epochs none of the next; every example is trained once
// per epoch.
TEST_F(ElasticWorkersTest, EachEpochIsSplitOverTheWorkersPresentAtItsStart) {
  constexpr int kExamples = 1000;
  ASSERT_OK_AND_ASSIGN(Worker * a, Join("a"));
  ASSERT_OK_AND_ASSIGN(Worker * b, Join("b"));
  std::vector<std::vector<int>> trained(3, std::vector<int>(kExamples, 0));
  auto train = [&](Worker* w, int epoch) -> absl::StatusOr<int> {
    DP_ASSIGN_OR_RETURN(EpochShare share,
                        w->member->EpochShareOf(epoch, absl::Seconds(30)));
    int n = 0;
    if (!share.trains()) return n;
    for (int i = share.index; i < kExamples; i += share.count) {
      ++trained[epoch][i];
      ++n;
    }
    return n;
  };
  // Epoch 0 begins with a and b; c joins during it and gets none of it.
  ASSERT_OK_AND_ASSIGN(int n, train(a, 0));
  EXPECT_EQ(n, 500);
  ASSERT_OK_AND_ASSIGN(Worker * c, Join("c"));
  ASSERT_OK_AND_ASSIGN(n, train(c, 0));
  EXPECT_EQ(n, 0);
  ASSERT_OK(train(b, 0).status());
  // Epoch 1 begins with all three (c asks first).
  ASSERT_OK_AND_ASSIGN(n, train(c, 1));
  EXPECT_EQ(n, 333);
  ASSERT_OK(train(a, 1).status());
  ASSERT_OK(train(b, 1).status());
  // b leaves for good between epochs: epoch 2 is a's and c's.
  ASSERT_OK(b->member->LeaveForGood("test", absl::Seconds(30)));
  ASSERT_OK_AND_ASSIGN(n, train(a, 2));
  EXPECT_EQ(n, 500);
  ASSERT_OK(train(c, 2).status());
  for (int e = 0; e < 3; ++e) {
    for (int i = 0; i < kExamples; ++i) {
      ASSERT_EQ(trained[e][i], 1) << "epoch " << e << ", example " << i;
    }
  }
  // A split stays what it was fixed as.
  ASSERT_OK_AND_ASSIGN(EpochShare again,
                       a->member->EpochShareOf(1, absl::Seconds(30)));
  EXPECT_EQ(again.index, 0);
  EXPECT_EQ(again.count, 3);
  EXPECT_THAT(a->member->EpochShareOf(-1, absl::Seconds(5)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(a->member->EpochShareOf(1000, absl::Seconds(5)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Only for the caller's own rank.
  EXPECT_THAT(sched_->EpochSplit(a->member->node_id(), 2, 1).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

// What ps_worker's loops draw in a job with seats (worker/example_stream.h):
// a, b, then c joining during epoch 0 and b leaving for good after epoch
// 1, each drawing through the epoch splits; every example is drawn once
// per epoch, and a stream made again for a rank (a replacement) and moved
// past what its predecessor drew goes on with the same examples.
TEST_F(ElasticWorkersTest, WorkersDrawEachEpochsExamplesOnce) {
  constexpr int kExamples = 1000;
  constexpr uint64_t kSeed = 7;
  ASSERT_OK_AND_ASSIGN(Worker * a, Join("a"));
  ASSERT_OK_AND_ASSIGN(Worker * b, Join("b"));
  auto sa = ExampleStream::Create(*a->member, kSeed, kExamples, 0);
  auto sb = ExampleStream::Create(*b->member, kSeed, kExamples, 1);
  std::vector<std::vector<int>> drawn(3, std::vector<int>(kExamples, 0));
  // Draws n examples from `s`, all of which must be of `epoch`.
  auto draw = [&](ExampleStream& s, int n, int64_t epoch) -> absl::Status {
    std::vector<int> batch;
    std::vector<int64_t> epochs;
    DP_RETURN_IF_ERROR(s.Next(n, &batch, &epochs));
    for (size_t i = 0; i < batch.size(); ++i) {
      if (epochs[i] != epoch) {
        return absl::InternalError(absl::StrCat("drew an example of epoch ",
                                                epochs[i], ", not ", epoch));
      }
      ++drawn[epoch][batch[i]];
    }
    return absl::OkStatus();
  };
  // Epoch 0 is split over a and b (500 each); c joins during it, has none
  // of it, and goes on to epoch 1, which begins with it: 334, 333, 333.
  ASSERT_OK(draw(*sa, 200, 0));
  ASSERT_OK_AND_ASSIGN(Worker * c, Join("c"));
  auto sc = ExampleStream::Create(*c->member, kSeed, kExamples, 2);
  ASSERT_OK(draw(*sc, 10, 1));
  ASSERT_OK(draw(*sa, 300, 0));
  ASSERT_OK(draw(*sb, 500, 0));
  ASSERT_OK(draw(*sa, 334, 1));
  ASSERT_OK(draw(*sb, 333, 1));
  ASSERT_OK(draw(*sc, 323, 1));
  // b leaves for good between epochs: epoch 2 is a's and c's.
  ASSERT_OK(b->member->LeaveForGood("test", absl::Seconds(30)));
  ASSERT_OK(draw(*sa, 500, 2));
  ASSERT_OK(draw(*sc, 500, 2));
  for (int e = 0; e < 3; ++e) {
    for (int i = 0; i < kExamples; ++i) {
      ASSERT_EQ(drawn[e][i], 1) << "epoch " << e << ", example " << i;
    }
  }
  // A's stream made again and moved past the 1334 examples drawn.
  auto again = ExampleStream::Create(*a->member, kSeed, kExamples, 0);
  ASSERT_OK(again->Skip(1334, 1));
  std::vector<int> next, next_again;
  ASSERT_OK(sa->Next(50, &next));
  ASSERT_OK(again->Next(50, &next_again));
  EXPECT_EQ(next, next_again);
}

// The same through real ps_worker processes (softmax on Fashion-MNIST,
// batches of 1000): two start, a third takes the seat once the first has
// trained its share of epoch 0. Each worker logs every share it completed;
// every epoch whose split all completed holds each of the 60,000 examples
// once (the shares' sizes add up), the joiner trains only in splits of 3
// and from its first clock on (no share drawn and dropped), and every
// worker ends cleanly. Under SSP (the fixture's job) and under BSP, where
// the joiner starts at the step the job grows at.
void PsWorkersTrainEachEpochsExamplesOnce(const std::string& scheduler,
                                          const std::string& dir) {
  constexpr int kTrainExamples = 60000;
  auto start = [&](int i) -> std::unique_ptr<Subprocess> {
    auto p = std::make_unique<Subprocess>(
        std::vector<std::string>{
            RunfilePath("worker/ps_worker"), "--scheduler=" + scheduler,
            absl::StrCat("--name=w", i), "--model=softmax", "--batch=1000",
            "--steps=100", "--seed=7", "--eval_every=100000"},
        absl::StrCat(dir, "/w", i, ".log"));
    EXPECT_OK(p->Start());
    return p;
  };
  auto log_of = [&](int i) {
    std::ifstream in(absl::StrCat(dir, "/w", i, ".log"));
    return std::string(std::istreambuf_iterator<char>(in),
                       std::istreambuf_iterator<char>());
  };
  std::vector<std::unique_ptr<Subprocess>> procs;
  procs.push_back(start(0));
  procs.push_back(start(1));
  const absl::Time deadline = absl::Now() + absl::Minutes(3);
  while (!absl::StrContains(log_of(0), "epoch 0: trained") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(log_of(0), HasSubstr("epoch 0: trained 30000 examples"));
  // The joiner joins before epoch 2 begins whatever the load: w1 is held
  // (and w0 by the gate) until it has registered. Free, the two ran 30
  // more steps before a loaded machine had started the third process, and
  // no epoch was left for three to complete.
  procs[1]->Signal(SIGSTOP);
  procs.push_back(start(2));
  while (!absl::StrContains(log_of(2), "registered as node") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  procs[1]->Signal(SIGCONT);
  ASSERT_THAT(log_of(2), HasSubstr("registered as node"));
  for (auto& p : procs) {
    ASSERT_OK_AND_ASSIGN(int status, p->Wait(absl::Minutes(5)));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << p->LogTail();
  }
  // epoch -> share index -> examples; and each epoch's worker count.
  std::map<int64_t, std::map<int, int64_t>> shares;
  std::map<int64_t, int> counts;
  const std::regex line(
      "epoch ([0-9]+): trained ([0-9]+) examples, share ([0-9]+) of ([0-9]+)");
  const std::regex done("done: ([0-9]+) examples");
  for (int i = 0; i < 3; ++i) {
    const std::string log = log_of(i);
    // What its shares say it trained is what its loop trained, at most
    // (the last share may be cut by the end of the run): none dropped.
    std::smatch trained;
    ASSERT_TRUE(std::regex_search(log, trained, done)) << log;
    int64_t in_shares = 0;
    for (auto m = std::sregex_iterator(log.begin(), log.end(), line);
         m != std::sregex_iterator(); ++m) {
      in_shares += std::stoll((*m)[2]);
      const int64_t epoch = std::stoll((*m)[1]);
      const int count = std::stoi((*m)[4]);
      EXPECT_EQ(shares[epoch].count(std::stoi((*m)[3])), 0u)
          << "a share of epoch " << epoch << " completed twice";
      shares[epoch][std::stoi((*m)[3])] = std::stoll((*m)[2]);
      EXPECT_TRUE(counts.emplace(epoch, count).first->second == count);
      if (i == 2) {
        EXPECT_EQ(count, 3) << "the joiner trained in epoch " << epoch;
      }
    }
    EXPECT_LE(in_shares, std::stoll(trained[1])) << "worker " << i;
    // Less by no more than the share it was on (30,000 at most).
    EXPECT_GE(in_shares, std::stoll(trained[1]) - 30000) << "worker " << i;
  }
  int complete = 0, of_three = 0;
  for (const auto& [epoch, by_index] : shares) {
    if (static_cast<int>(by_index.size()) != counts[epoch]) continue;
    int64_t total = 0;
    for (const auto& [index, n] : by_index) total += n;
    EXPECT_EQ(total, kTrainExamples) << "epoch " << epoch;
    ++complete;
    of_three += counts[epoch] == 3;
  }
  // 100 steps of 1000 are 5 epochs of two workers' shares, more of three.
  EXPECT_GE(complete, 3);
  EXPECT_GE(of_three, 1);
  EXPECT_EQ(counts[0], 2);
  EXPECT_THAT(log_of(2), HasSubstr("epoch 0: not in its split"));
}

TEST_F(ElasticWorkersTest, PsWorkersTrainEachEpochsExamplesOnce) {
  PsWorkersTrainEachEpochsExamplesOnce(cluster_->scheduler_address(), dir_);
}

TEST_F(ElasticWorkersTest, BspPsWorkersTrainEachEpochsExamplesOnce) {
  const std::string dir = dir_ + "/bsp_ps";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalClusterOptions o = SuiteCluster::Defaults();
  o.work_dir = dir;
  o.scheduler_flags = {"--consistency=bsp", "--num_workers=2",
                       "--elastic_workers=1", "--dead_after_ms=60000"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalCluster> bsp,
                       LocalCluster::Start(o));
  PsWorkersTrainEachEpochsExamplesOnce(bsp->scheduler_address(), dir);
  if (HasFatalFailure()) return;
  // Every worker ended at the job's last step: the joiner counted in each
  // step from the one it started at.
  SchedulerClient sched(bsp->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  ASSERT_EQ(status.workers_size(), 3);
  for (const proto::WorkerStatus& w : status.workers()) {
    EXPECT_EQ(w.clock(), 100) << "rank " << w.rank();
  }
  EXPECT_OK(bsp->Stop());
}

// psctl retire: the operator removes a worker from a running SSP job. It
// finishes its step, leaves for good and exits 0; the other runs past the
// bound without it to its last step (it would wait at the bound for ever
// otherwise); the last rank is not retired.
TEST_F(ElasticWorkersTest, PsctlRetiresAPsWorker) {
  auto log_of = [&](const std::string& name) {
    std::ifstream in(absl::StrCat(dir_, "/", name, ".log"));
    return std::string(std::istreambuf_iterator<char>(in),
                       std::istreambuf_iterator<char>());
  };
  // Started one after the other, so that w<i> holds rank i.
  const absl::Time deadline = absl::Now() + absl::Minutes(3);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < 2; ++i) {
    const std::string name = absl::StrCat("w", i);
    workers.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{RunfilePath("worker/ps_worker"),
                                 "--scheduler=" + cluster_->scheduler_address(),
                                 "--name=" + name, "--model=softmax",
                                 "--batch=1000", "--steps=150", "--seed=7",
                                 "--eval_every=100000"},
        absl::StrCat(dir_, "/", name, ".log")));
    ASSERT_OK(workers.back()->Start());
    while (!absl::StrContains(log_of(name), "registered as node") &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_THAT(log_of(name), HasSubstr(absl::StrCat("rank ", i, " of 2")));
  }
  while (!absl::StrContains(log_of("w1"), "epoch 0: trained") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(log_of("w1"), HasSubstr("epoch 0: trained"));
  auto retire = [&](const std::string& rank, const std::string& log) {
    return std::make_unique<Subprocess>(
        std::vector<std::string>{RunfilePath("psctl/psctl"), "retire", rank,
                                 "--scheduler=" + cluster_->scheduler_address(),
                                 "--timeout_s=120"},
        absl::StrCat(dir_, "/", log, ".log"));
  };
  auto psctl = [&](const std::string& rank,
                   const std::string& log) -> absl::StatusOr<int> {
    std::unique_ptr<Subprocess> p = retire(rank, log);
    DP_RETURN_IF_ERROR(p->Start());
    DP_ASSIGN_OR_RETURN(const int status, p->Wait(absl::Minutes(3)));
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  // w0 is held (SIGSTOP) while w1 is asked, so that w1, gated by it, cannot
  // finish its steps before it hears of the request however loaded the
  // machine is.
  workers[0]->Signal(SIGSTOP);
  std::unique_ptr<Subprocess> first = retire("1", "retire1");
  ASSERT_OK(first->Start());
  while (!absl::StrContains(log_of("w1"), "to leave the job for good") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  workers[0]->Signal(SIGCONT);
  ASSERT_OK_AND_ASSIGN(const int exit, first->Wait(absl::Minutes(3)));
  EXPECT_TRUE(WIFEXITED(exit) && WEXITSTATUS(exit) == 0) << log_of("retire1");
  EXPECT_THAT(log_of("retire1"), HasSubstr("rank 1: retired (worker 'w1')"));
  for (auto& w : workers) {
    ASSERT_OK_AND_ASSIGN(const int status, w->Wait(absl::Minutes(3)));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << w->LogTail();
  }
  EXPECT_THAT(log_of("w1"), HasSubstr("asked to leave the job for good"));
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched_->GetJobStatus());
  ASSERT_EQ(status.workers_size(), 2);
  EXPECT_TRUE(status.workers(1).retired());
  EXPECT_LT(status.workers(1).clock(), 150);
  EXPECT_EQ(status.workers(0).clock(), 150);
  EXPECT_THAT(Map().retired_ranks(), ElementsAre(1));
  // Rank 0 is the last; rank 5 is not in the job.
  ASSERT_OK_AND_ASSIGN(const int last, psctl("0", "retire0"));
  EXPECT_EQ(last, 1);
  EXPECT_THAT(log_of("retire0"), HasSubstr("last rank"));
  ASSERT_OK_AND_ASSIGN(const int outside, psctl("5", "retire5"));
  EXPECT_EQ(outside, 1);
  EXPECT_THAT(log_of("retire5"), HasSubstr("not in the job"));
}

// A BSP job's seats need a job without backup workers, and its workers
// cannot leave for good (it grows but does not shrink).
TEST_F(ElasticWorkersTest, BspRefusesSeatsWithBackupsAndLeavingForGood) {
  const std::string dir = dir_ + "/bsp";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalClusterOptions o = SuiteCluster::Defaults();
  o.work_dir = dir;
  o.num_servers = 1;
  o.scheduler_flags = {"--consistency=bsp", "--num_workers=1",
                       "--backup_workers=1", "--elastic_workers=1"};
  const absl::StatusOr<std::unique_ptr<LocalCluster>> refused =
      LocalCluster::Start(o);
  EXPECT_FALSE(refused.ok());

  o.scheduler_flags = {"--consistency=bsp", "--num_workers=1"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalCluster> bsp,
                       LocalCluster::Start(o));
  JobMemberOptions mo;
  mo.scheduler_address = bsp->scheduler_address();
  mo.name = "a";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<JobMember> a, JobMember::Join(mo));
  const absl::Status left = a->LeaveForGood("test", absl::Seconds(10));
  EXPECT_THAT(left, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(left.message()), HasSubstr("BSP"));
  // Still in the job: its clock report goes through.
  ClockReport report;
  report.clock = 1;
  ASSERT_OK(a->ReportClock(report));
  EXPECT_OK(a->Flush(absl::Seconds(30)));
  a.reset();
  EXPECT_OK(bsp->Stop());
}

// The gradient of worker `rank` at step `clock` for parameters `w`: a
// function of all three, so that a step averaged over the wrong ranks, at
// the wrong clock or from other parameters ends elsewhere.
std::vector<float> BspGradient(absl::Span<const float> w, int rank,
                               Clock clock) {
  std::vector<float> g(w.size());
  const float a = 0.5f + 0.25f * static_cast<float>(rank);
  for (size_t j = 0; j < w.size(); ++j) {
    const int b = static_cast<int>((j * 7 + rank * 13 + clock * 5) % 17) - 8;
    g[j] = a * w[j] + static_cast<float>(b) / 8.0f;
  }
  return g;
}

// A BSP job grows from 2 to 3 workers at the step the scheduler announces
// (one beyond the gating clock when the third registers): every step below
// it is the mean of ranks 0 and 1, every step from it the mean of 0, 1 and
// 2, on both servers. The parameters equal, bit for bit, a reference that
// does exactly that by construction: a table without BSP, to which the test
// pushes each step's mean, summed in rank order as the servers sum it, and
// the same handler applies it.
TEST_F(ElasticWorkersTest, BspGrowsAtTheAnnouncedStepBitForBit) {
  constexpr int kWeights = 1000;  // split over the two servers
  constexpr Clock kSteps = 16;
  const std::string dir = dir_ + "/bsp_grow";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalClusterOptions o = SuiteCluster::Defaults();  // two servers
  o.work_dir = dir;
  o.scheduler_flags = {"--consistency=bsp", "--num_workers=2",
                       "--elastic_workers=1"};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalCluster> cluster,
                       LocalCluster::Start(o));
  SchedulerClient sched(cluster->scheduler_address());

  auto join = [&](const std::string& name) -> absl::StatusOr<Worker> {
    JobMemberOptions mo;
    mo.scheduler_address = cluster->scheduler_address();
    mo.name = name;
    Worker w;
    DP_ASSIGN_OR_RETURN(w.member, JobMember::Join(mo));
    ClientOptions co;
    co.scheduler_address = cluster->scheduler_address();
    DP_ASSIGN_OR_RETURN(w.client, Client::Connect(co));
    w.clock = w.member->start_clock();
    return w;
  };
  TableOptions to;
  to.num_keys = kWeights;
  to.init = "uniform";
  to.init_a = -1;
  to.init_b = 1;
  to.init_seed = 7;
  to.handler = "adagrad";
  to.handler_params = {{"learning_rate", 0.1}};
  ASSERT_OK_AND_ASSIGN(Worker a, join("a"));
  ASSERT_OK_AND_ASSIGN(Worker b, join("b"));
  {
    TableOptions w = to;
    w.name = "w";
    w.follows_job = true;
    ASSERT_OK(a.client->CreateTable(w).status());
  }

  // Each worker runs its steps in a thread of its own: a BSP push is
  // answered once the step is complete.
  std::atomic<Clock> a_clock{0};
  auto run = [&](Worker* w, std::atomic<Clock>* progress) -> absl::Status {
    DP_ASSIGN_OR_RETURN(Table t, w->client->OpenTable("w"));
    std::vector<float> values(kWeights);
    for (; w->clock < kSteps; ++w->clock) {
      DP_RETURN_IF_ERROR(
          w->member->WaitClock(w->clock, absl::Seconds(60)).status());
      w->client->SetWorkerClock(w->member->rank(), w->clock);
      DP_RETURN_IF_ERROR(w->client->PullSync(t, Keys::Range(0, kWeights),
                                             absl::MakeSpan(values)));
      DP_RETURN_IF_ERROR(w->client->PushSync(
          t, Keys::Range(0, kWeights),
          BspGradient(values, w->member->rank(), w->clock)));
      ClockReport report;
      report.clock = w->clock + 1;
      DP_RETURN_IF_ERROR(w->member->ReportClock(report));
      if (progress != nullptr) progress->store(w->clock + 1);
    }
    return w->member->Flush(absl::Seconds(30));
  };
  absl::Status a_done, b_done, c_done;
  std::thread ta([&] { a_done = run(&a, &a_clock); });
  std::thread tb([&] { b_done = run(&b, nullptr); });
  // The third worker registers once the job is under way.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (a_clock.load() < 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  absl::StatusOr<Worker> joined = join("c");
  Clock grow_at = -1;
  std::thread tc;
  if (joined.ok()) {
    grow_at = joined->member->start_clock();
    tc = std::thread([&] { c_done = run(&*joined, nullptr); });
  }
  ta.join();
  tb.join();
  if (tc.joinable()) tc.join();
  ASSERT_OK(joined.status());
  ASSERT_OK(a_done);
  ASSERT_OK(b_done);
  ASSERT_OK(c_done);
  EXPECT_EQ(joined->member->rank(), 2);
  EXPECT_EQ(joined->member->first_clock(), grow_at);
  // One beyond the gating clock, which was at least 3 (a had reported 4).
  EXPECT_GE(grow_at, 4);
  EXPECT_LT(grow_at, kSteps);
  ASSERT_OK_AND_ASSIGN(proto::ClusterMap map, sched.GetClusterMap());
  EXPECT_THAT(map.seat_clocks(), ElementsAre(grow_at));
  ASSERT_EQ(map.seat_epochs_size(), 1);
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, sched.GetJobStatus());
  ASSERT_EQ(status.workers_size(), 3);
  for (const proto::WorkerStatus& w : status.workers()) {
    EXPECT_EQ(w.clock(), kSteps) << "rank " << w.rank();
  }
  {
    Subprocess psctl(
        {RunfilePath("psctl/psctl"), "status",
         "--scheduler=" + cluster->scheduler_address(), "--interval_ms=0"},
        dir + "/psctl.log");
    ASSERT_OK(psctl.Start());
    ASSERT_OK_AND_ASSIGN(const int exit, psctl.Wait(absl::Seconds(60)));
    EXPECT_TRUE(WIFEXITED(exit) && WEXITSTATUS(exit) == 0);
    std::ifstream in(dir + "/psctl.log");
    const std::string out((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
    EXPECT_THAT(out, HasSubstr(absl::StrCat("+ 1 elastic (1 joined), grew at "
                                            "step ",
                                            grow_at)));
  }

  // The references, step by step: one grown where the job grew, one that
  // never grew (the run must equal the first, and the two must differ, or
  // the test could not tell).
  auto reference = [&](const std::string& name, Clock grown,
                       std::vector<float>* out) -> absl::Status {
    TableOptions ro = to;
    ro.name = name;  // applied on arrival
    DP_RETURN_IF_ERROR(a.client->CreateTable(ro).status());
    DP_ASSIGN_OR_RETURN(Table t, a.client->OpenTable(name));
    std::vector<float> values(kWeights), mean(kWeights);
    for (Clock c = 0; c < kSteps; ++c) {
      DP_RETURN_IF_ERROR(a.client->GetSync(t, Keys::Range(0, kWeights),
                                           absl::MakeSpan(values)));
      const int ranks = c < grown ? 2 : 3;
      std::fill(mean.begin(), mean.end(), 0.0f);
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float> g = BspGradient(values, r, c);
        for (int j = 0; j < kWeights; ++j) mean[j] += g[j];
      }
      for (float& v : mean) v /= static_cast<float>(ranks);
      DP_RETURN_IF_ERROR(a.client->PushSync(t, Keys::Range(0, kWeights), mean));
    }
    out->resize(kWeights);
    return a.client->GetSync(t, Keys::Range(0, kWeights), absl::MakeSpan(*out));
  };
  std::vector<float> want, never_grown;
  ASSERT_OK(reference("ref", grow_at, &want));
  ASSERT_OK(reference("ref_two", kSteps, &never_grown));
  std::vector<float> got(kWeights);
  ASSERT_OK_AND_ASSIGN(Table w, a.client->OpenTable("w"));
  ASSERT_OK(
      a.client->GetSync(w, Keys::Range(0, kWeights), absl::MakeSpan(got)));
  int differ = 0;
  for (int j = 0; j < kWeights; ++j) {
    if (std::memcmp(&got[j], &want[j], sizeof(float)) != 0 && ++differ <= 5) {
      ADD_FAILURE() << "weight " << j << ": " << got[j] << " against the "
                    << "reference's " << want[j];
    }
  }
  EXPECT_EQ(differ, 0) << "grown at step " << grow_at;
  EXPECT_NE(
      std::memcmp(got.data(), never_grown.data(), kWeights * sizeof(float)), 0);
  a.member.reset();
  b.member.reset();
  joined->member.reset();
  EXPECT_OK(cluster->Stop());
}

}  // namespace
}  // namespace downpour
