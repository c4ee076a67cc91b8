#include "scheduler/scheduler.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"

namespace downpour {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerOptions o;
    o.heartbeat_interval = absl::Milliseconds(50);
    o.dead_after = absl::Milliseconds(300);
    auto s = Scheduler::Create(o);
    ASSERT_OK(s);
    scheduler_ = std::move(*s);
    client_ = std::make_unique<SchedulerClient>(
        absl::StrCat("127.0.0.1:", scheduler_->port()), absl::Seconds(5));
  }
  NodeId RegisterServer(const std::string& name) {
    proto::RegisterRequest r;
    r.set_role(proto::SERVER);
    r.set_name(name);
    r.set_data_endpoint("tcp://127.0.0.1:1");
    auto reply = client_->Register(r, absl::Seconds(5));
    EXPECT_OK(reply);
    return reply.ok() ? reply->node_id() : 0;
  }
  proto::TableSpec Dense(const std::string& name, uint64_t keys) {
    proto::TableSpec s;
    s.set_name(name);
    s.set_kind(proto::DENSE);
    s.set_width(2);
    s.set_num_keys(keys);
    s.mutable_handler()->set_name("sgd");
    return s;
  }

  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<SchedulerClient> client_;
};

TEST_F(SchedulerTest, MembershipEpochsAndDeath) {
  const NodeId a = RegisterServer("a");
  const NodeId b = RegisterServer("b");
  EXPECT_NE(a, b);
  auto map = client_->GetClusterMap();
  ASSERT_OK(map);
  EXPECT_EQ(map->epoch(), 2u);
  EXPECT_THAT(client_->Heartbeat(999, 0), StatusIs(absl::StatusCode::kNotFound));
  proto::RegisterRequest dup;
  dup.set_role(proto::SERVER);
  dup.set_name("a");
  dup.set_data_endpoint("tcp://x:1");
  EXPECT_THAT(client_->Register(dup, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kAlreadyExists));
  proto::RegisterRequest no_role;
  EXPECT_THAT(client_->Register(no_role, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Keep a alive; b goes silent and is declared dead.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool b_dead = false;
  while (!b_dead && absl::Now() < deadline) {
    ASSERT_OK(client_->Heartbeat(a, 0));
    const proto::ClusterMap now = scheduler_->CurrentMap();
    for (const auto& n : now.nodes()) {
      if (n.id() == b && n.state() == proto::DEAD) b_dead = true;
      if (n.id() == a) EXPECT_EQ(n.state(), proto::ALIVE);
    }
    absl::SleepFor(absl::Milliseconds(40));
  }
  ASSERT_TRUE(b_dead);
  EXPECT_GT(scheduler_->CurrentMap().epoch(), 2u);
  EXPECT_THAT(client_->Heartbeat(b, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Re-registering by name gives the old id back.
  EXPECT_EQ(RegisterServer("b"), b);
}

TEST_F(SchedulerTest, CreateTableSplitsRangesAndWaitsForAcks) {
  std::vector<NodeId> ids = {RegisterServer("s0"), RegisterServer("s1"),
                             RegisterServer("s2")};
  std::atomic<bool> stop{false};
  std::thread acker([&] {
    while (!stop) {
      const Epoch e = scheduler_->CurrentMap().epoch();
      for (NodeId id : ids) (void)client_->Heartbeat(id, e);
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  auto reply = client_->CreateTable(Dense("w", 10), absl::Seconds(5));
  ASSERT_OK(reply);
  EXPECT_TRUE(reply->created());
  EXPECT_GE(reply->spec().id(), 1u);
  const auto map = scheduler_->CurrentMap();
  ASSERT_EQ(map.tables_size(), 1);
  Key next = 0;
  for (const auto& r : map.tables(0).ranges()) {
    EXPECT_EQ(r.begin(), next);
    EXPECT_GE(r.end() - r.begin(), 3u);
    next = r.end();
  }
  EXPECT_EQ(next, 10u);
  proto::TableSpec sparse = Dense("s", 0);
  sparse.set_kind(proto::SPARSE);
  ASSERT_OK(client_->CreateTable(sparse, absl::Seconds(5)));
  const proto::ClusterMap after = scheduler_->CurrentMap();
  const auto& sr = after.tables(1).ranges();
  ASSERT_EQ(sr.size(), 3);
  EXPECT_EQ(sr[0].begin(), 0u);
  EXPECT_EQ(sr[2].end(), kKeySpaceEnd);
  EXPECT_EQ(sr[0].end(), sr[1].begin());
  // Identical again: not created; different: already exists; invalid specs.
  auto again = client_->CreateTable(Dense("w", 10), absl::Seconds(5));
  ASSERT_OK(again);
  EXPECT_FALSE(again->created());
  EXPECT_THAT(client_->CreateTable(Dense("w", 11), absl::Seconds(5)),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(client_->CreateTable(Dense("", 11), absl::Seconds(5)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->CreateTable(Dense("z", 0), absl::Seconds(5)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  proto::TableSpec bad_handler = Dense("h", 5);
  bad_handler.mutable_handler()->set_name("plugin:missing");
  EXPECT_THAT(client_->CreateTable(bad_handler, absl::Seconds(5)),
              StatusIs(absl::StatusCode::kNotFound));
  stop = true;
  acker.join();
  // Nobody acks now: the declaration times out naming the servers.
  EXPECT_THAT(client_->CreateTable(Dense("late", 10), absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(SchedulerTest, BarrierReleasesWhenCountArrivesAndIsReusable) {
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> threads;
    std::atomic<int> ok{0};
    for (NodeId id = 1; id <= 3; ++id) {
      threads.emplace_back([&, id] {
        if (client_->Barrier("b", id, 3, absl::Seconds(5)).ok()) ok++;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 3);
  }
  EXPECT_THAT(client_->Barrier("lonely", 1, 2, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(client_->Barrier("zero", 1, 0, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(SchedulerTest, WatchDeliversNewMaps) {
  std::atomic<Epoch> seen{0};
  std::thread watcher([&] {
    (void)client_->Watch(0, 0, [&](const proto::ClusterMap& m) { seen = m.epoch(); });
  });
  RegisterServer("w1");
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (seen.load() < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(seen.load(), 1u);
  client_->CancelWatch();
  watcher.join();
}

}  // namespace
}  // namespace downpour
