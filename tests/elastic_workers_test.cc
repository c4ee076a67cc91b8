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
//    (worker/example_stream.h).
#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <string>
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
    o.scheduler_flags = {"--consistency=ssp",
                         absl::StrCat("--staleness=", kStaleness),
                         "--num_workers=2", "--elastic_workers=1"};
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
// worker ends cleanly.
TEST_F(ElasticWorkersTest, PsWorkersTrainEachEpochsExamplesOnce) {
  constexpr int kTrainExamples = 60000;
  auto start = [&](int i) -> std::unique_ptr<Subprocess> {
    auto p = std::make_unique<Subprocess>(
        std::vector<std::string>{RunfilePath("worker/ps_worker"),
                                 "--scheduler=" + cluster_->scheduler_address(),
                                 absl::StrCat("--name=w", i), "--model=softmax",
                                 "--batch=1000", "--steps=100", "--seed=7",
                                 "--eval_every=100000"},
        absl::StrCat(dir_, "/w", i, ".log"));
    EXPECT_OK(p->Start());
    return p;
  };
  auto log_of = [&](int i) {
    std::ifstream in(absl::StrCat(dir_, "/w", i, ".log"));
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
  procs.push_back(start(2));
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

// A BSP job has no seats to take, and its workers cannot leave for good.
TEST_F(ElasticWorkersTest, BspRefusesSeatsAndLeavingForGood) {
  const std::string dir = dir_ + "/bsp";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalClusterOptions o = SuiteCluster::Defaults();
  o.work_dir = dir;
  o.num_servers = 1;
  o.scheduler_flags = {"--consistency=bsp", "--num_workers=1",
                       "--elastic_workers=1"};
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

}  // namespace
}  // namespace downpour
