#include "scheduler/scheduler.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "scheduler/request_checks.h"

namespace downpour {
namespace {

proto::TableSpec DenseSpec(const std::string& name, uint64_t keys) {
  proto::TableSpec s;
  s.set_name(name);
  s.set_kind(proto::DENSE);
  s.set_width(2);
  s.set_num_keys(keys);
  s.mutable_handler()->set_name("sgd");
  return s;
}

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
    return DenseSpec(name, keys);
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
  EXPECT_THAT(client_->Heartbeat(999, 0),
              StatusIs(absl::StatusCode::kNotFound));
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
      if (n.id() == a) {
        EXPECT_EQ(n.state(), proto::ALIVE);
      }
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

// Balancing primaries through the scheduler: a server that died and came
// back is handed a range once it is in sync. A handover report from an
// older map is refused (the primary reports again on the current one), one
// never made is cancelled after --handover_timeout, and a report on the
// current map swaps primary and backup.
TEST(SchedulerHandOverTest, ARangeIsHandedBackOnlyOnAReportFromTheCurrentMap) {
  SchedulerOptions o;
  o.heartbeat_interval = absl::Milliseconds(50);
  o.dead_after = absl::Milliseconds(300);
  o.replicas = 2;
  o.handover_timeout = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scheduler> scheduler,
                       Scheduler::Create(o));
  SchedulerClient client(absl::StrCat("127.0.0.1:", scheduler->port()),
                         absl::Seconds(5));
  auto register_server = [&](const std::string& name, uint64_t incarnation) {
    proto::RegisterRequest r;
    r.set_role(proto::SERVER);
    r.set_name(name);
    r.set_data_endpoint("tcp://127.0.0.1:1");
    r.set_incarnation(incarnation);
    auto reply = client.Register(r, absl::Seconds(5));
    EXPECT_OK(reply);
    return reply.ok() ? reply->node_id() : kNoNode;
  };
  const NodeId a = register_server("s0", 1);
  const NodeId b = register_server("s1", 1);
  std::atomic<bool> stop{false}, b_alive{true};
  std::thread acker([&] {
    while (!stop) {
      const Epoch e = scheduler->CurrentMap().epoch();
      (void)client.Heartbeat(a, e);
      if (b_alive) (void)client.Heartbeat(b, e);
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  auto wait_for = [&](const std::function<bool(const proto::ClusterMap&)>& f) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!f(scheduler->CurrentMap()) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return f(scheduler->CurrentMap());
  };
  ASSERT_OK(client.CreateTable(DenseSpec("w", 10), absl::Seconds(5)));
  const TableId table = scheduler->CurrentMap().tables(0).spec().id();
  // b dies: a is primary of both ranges; b comes back as a new process and
  // catches up on both.
  b_alive = false;
  ASSERT_TRUE(wait_for([&](const proto::ClusterMap& m) {
    return m.tables(0).ranges(0).primary() == a &&
           m.tables(0).ranges(1).primary() == a;
  }));
  ASSERT_EQ(register_server("s1", 2), b);
  b_alive = true;
  ASSERT_TRUE(wait_for([&](const proto::ClusterMap& m) {
    return m.tables(0).ranges(0).catching_up_size() == 1 &&
           m.tables(0).ranges(1).catching_up_size() == 1;
  }));
  auto report = [&](Key begin, bool hand_over, Epoch epoch) {
    proto::ReplicaReadyRequest req;
    req.set_primary(a);
    req.set_table_id(table);
    req.set_range_begin(begin);
    req.set_backup(b);
    req.set_epoch(epoch);
    req.set_hand_over(hand_over);
    return client.ReplicaReady(req);
  };
  const Key second = scheduler->CurrentMap().tables(0).ranges(1).begin();
  // The first range in sync: it is to be handed to b.
  ASSERT_OK(report(0, false, scheduler->CurrentMap().epoch()));
  proto::ClusterMap map = scheduler->CurrentMap();
  ASSERT_EQ(map.tables(0).ranges(0).handing_to(), b);
  EXPECT_THAT(report(0, true, map.epoch() - 1),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Never reported: cancelled after the timeout, in a new map.
  ASSERT_TRUE(wait_for([&](const proto::ClusterMap& m) {
    return m.tables(0).ranges(0).handing_to() == kNoNode;
  }));
  EXPECT_GT(scheduler->CurrentMap().epoch(), map.epoch());
  EXPECT_EQ(scheduler->CurrentMap().tables(0).ranges(0).primary(), a);
  // The second range in sync starts a handover again; reported on the
  // current map, it completes.
  ASSERT_OK(report(second, false, scheduler->CurrentMap().epoch()));
  map = scheduler->CurrentMap();
  int handing = -1;
  for (int i = 0; i < 2; ++i) {
    if (map.tables(0).ranges(i).handing_to() == b) handing = i;
  }
  ASSERT_GE(handing, 0) << map.DebugString();
  const Key begin = map.tables(0).ranges(handing).begin();
  ASSERT_OK(report(begin, true, map.epoch()));
  map = scheduler->CurrentMap();
  const proto::RangeAssignment& r = map.tables(0).ranges(handing);
  EXPECT_EQ(r.primary(), b);
  ASSERT_EQ(r.replicas_size(), 1);
  EXPECT_EQ(r.replicas(0), a);
  EXPECT_EQ(r.handing_to(), kNoNode);
  EXPECT_EQ(map.tables(0).ranges(1 - handing).primary(), a);
  // Done: a repeat is refused.
  EXPECT_THAT(report(begin, true, map.epoch()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  stop = true;
  acker.join();
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
    (void)client_->Watch(0, 0,
                         [&](const proto::ClusterMap& m) { seen = m.epoch(); });
  });
  RegisterServer("w1");
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (seen.load() < 1 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(seen.load(), 1u);
  client_->CancelWatch();
  watcher.join();
}

// Acknowledges the current epoch for `ids` (AckEpoch) every 10 ms until
// destroyed, as servers applying each new map would, and keeps them alive
// (Heartbeat with applied epoch 0, which acknowledges nothing new).
class Acker {
 public:
  Acker(Scheduler* scheduler, SchedulerClient* client, std::vector<NodeId> ids)
      : thread_([=] {
          while (!stop_.HasBeenNotified()) {
            const Epoch e = scheduler->CurrentMap().epoch();
            for (NodeId id : ids) {
              (void)client->AckEpoch(id, e);
              (void)client->Heartbeat(id, 0);
            }
            stop_.WaitForNotificationWithTimeout(absl::Milliseconds(10));
          }
        }) {}
  ~Acker() {
    stop_.Notify();
    thread_.join();
  }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

TEST_F(SchedulerTest, RegisterAndHeartbeatDetails) {
  proto::RegisterRequest r;
  r.set_role(proto::SERVER);
  r.set_name("s");
  r.set_data_endpoint("tcp://127.0.0.1:1");
  auto reply = client_->Register(r, absl::Seconds(5));
  ASSERT_OK(reply);
  EXPECT_EQ(reply->node_id(), 1u);
  EXPECT_EQ(reply->heartbeat_interval_ms(), 50);
  EXPECT_EQ(reply->map().epoch(), 1u);
  ASSERT_EQ(reply->map().nodes_size(), 1);
  EXPECT_EQ(reply->map().nodes(0).state(), proto::ALIVE);
  EXPECT_EQ(reply->map().nodes(0).data_endpoint(), "tcp://127.0.0.1:1");
  auto hb = client_->Heartbeat(1, 0);
  ASSERT_OK(hb);
  EXPECT_EQ(hb->epoch(), 1u);

  proto::RegisterRequest no_endpoint;
  no_endpoint.set_role(proto::SERVER);
  no_endpoint.set_name("t");
  EXPECT_THAT(client_->Register(no_endpoint, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->AckEpoch(77, 1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(client_->AckEpoch(1, 1));
  EXPECT_EQ(scheduler_->address(),
            absl::StrCat("127.0.0.1:", scheduler_->port()));
}

// Tables that follow the job get their enforcement from the scheduler's
// policy, whoever declares them; a declaration that sets it by hand is
// refused.
TEST(SchedulerPolicyTest, TablesThatFollowTheJobGetItsEnforcement) {
  struct Case {
    const char* name;
    Clock staleness;
    uint32_t want_sync;
  };
  for (const Case& c :
       {Case{"bsp", 0, 2}, Case{"ssp", 3, 0}, Case{"asp", 0, 0}}) {
    SCOPED_TRACE(c.name);
    SchedulerOptions o;
    ASSERT_OK_AND_ASSIGN(o.policy,
                         ConsistencyPolicy::Parse(c.name, c.staleness, 2, 1));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scheduler> scheduler,
                         Scheduler::Create(o));
    SchedulerClient client(scheduler->address(), absl::Seconds(5));
    proto::RegisterRequest r;
    r.set_role(proto::SERVER);
    r.set_name("s");
    r.set_data_endpoint("tcp://127.0.0.1:1");
    ASSERT_OK_AND_ASSIGN(proto::RegisterReply reg,
                         client.Register(r, absl::Seconds(5)));
    Acker acker(scheduler.get(), &client, {reg.node_id()});

    proto::TableSpec spec = DenseSpec("w", 10);
    spec.set_follows_job(true);
    ASSERT_OK_AND_ASSIGN(proto::CreateTableReply created,
                         client.CreateTable(spec, absl::Seconds(5)));
    EXPECT_TRUE(created.created());
    EXPECT_TRUE(created.spec().follows_job());
    EXPECT_EQ(created.spec().sync_workers(), c.want_sync);
    EXPECT_EQ(created.spec().num_workers(), 3u);  // N + b
    // Every worker declares the same spec: the same table comes back.
    ASSERT_OK_AND_ASSIGN(proto::CreateTableReply again,
                         client.CreateTable(spec, absl::Seconds(5)));
    EXPECT_FALSE(again.created());
    EXPECT_EQ(again.spec().id(), created.spec().id());
    // A declaration that says how to enforce the job itself could
    // contradict it.
    proto::TableSpec by_hand = spec;
    by_hand.set_name("by_hand");
    by_hand.set_sync_workers(5);
    auto refused = client.CreateTable(by_hand, absl::Seconds(5));
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(refused.status().message()),
                ::testing::HasSubstr("'by_hand'"));
    by_hand.set_sync_workers(0);
    by_hand.set_num_workers(3);
    EXPECT_THAT(client.CreateTable(by_hand, absl::Seconds(5)),
                StatusIs(absl::StatusCode::kInvalidArgument));
    // The job's config carries the typed policy back to workers.
    ASSERT_OK_AND_ASSIGN(proto::JobStatus status, client.GetJobStatus());
    ASSERT_OK_AND_ASSIGN(ConsistencyPolicy back,
                         ConsistencyPolicy::FromJob(status.job()));
    EXPECT_EQ(back.ToString(), o.policy.ToString());
  }
}

// Keeps every node of the map alive (Heartbeat, applied epoch 0) every 20
// ms until destroyed.
class KeepAlive {
 public:
  KeepAlive(Scheduler* scheduler, SchedulerClient* client)
      : thread_([=] {
          while (!stop_.HasBeenNotified()) {
            const proto::ClusterMap map = scheduler->CurrentMap();
            for (const auto& n : map.nodes()) {
              (void)client->Heartbeat(n.id(), 0);
            }
            stop_.WaitForNotificationWithTimeout(absl::Milliseconds(20));
          }
        }) {}
  ~KeepAlive() {
    stop_.Notify();
    thread_.join();
  }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

TEST_F(SchedulerTest, ClientsHeartbeatOrAreForgotten) {
  proto::RegisterRequest r;
  r.set_role(proto::CLIENT);
  r.set_name("notebook");
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply reply,
                       client_->Register(r, absl::Seconds(5)));
  {
    KeepAlive alive(scheduler_.get(), client_.get());
    absl::SleepFor(absl::Milliseconds(600));  // twice dead_after
    const proto::ClusterMap map = scheduler_->CurrentMap();
    ASSERT_EQ(map.nodes_size(), 1);
    EXPECT_EQ(map.nodes(0).state(), proto::ALIVE);
    EXPECT_EQ(map.epoch(), 1u);
  }
  // Silent for dead_after: gone from the map (a new epoch), not kept DEAD.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (scheduler_->CurrentMap().nodes_size() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const proto::ClusterMap map = scheduler_->CurrentMap();
  EXPECT_EQ(map.nodes_size(), 0);
  EXPECT_EQ(map.epoch(), 2u);
  EXPECT_THAT(client_->Heartbeat(reply.node_id(), 0),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(SchedulerTest, DenseSplitIsExactAndOrderedByServerId) {
  std::vector<NodeId> ids = {RegisterServer("s0"), RegisterServer("s1"),
                             RegisterServer("s2")};
  Acker acker(scheduler_.get(), client_.get(), ids);
  auto reply = client_->CreateTable(Dense("w", 10), absl::Seconds(5));
  ASSERT_OK(reply);
  EXPECT_EQ(reply->spec().id(), 1u);
  EXPECT_EQ(reply->epoch(), scheduler_->CurrentMap().epoch());
  const proto::ClusterMap map = scheduler_->CurrentMap();
  ASSERT_EQ(map.tables_size(), 1);
  const auto& ranges = map.tables(0).ranges();
  ASSERT_EQ(ranges.size(), 3);
  std::vector<uint64_t> sizes;
  Key next = 0;
  for (int i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].begin(), next);
    EXPECT_EQ(ranges[i].primary(), ids[i]);
    sizes.push_back(ranges[i].end() - ranges[i].begin());
    next = ranges[i].end();
  }
  EXPECT_EQ(next, 10u);
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<uint64_t>{3, 3, 4}));

  // Fewer keys than servers: fewer ranges.
  auto small = client_->CreateTable(Dense("small", 2), absl::Seconds(5));
  ASSERT_OK(small);
  EXPECT_EQ(small->spec().id(), 2u);
  const proto::ClusterMap after = scheduler_->CurrentMap();
  const auto& two = after.tables(1).ranges();
  ASSERT_EQ(two.size(), 2);
  EXPECT_EQ(two[0].begin(), 0u);
  EXPECT_EQ(two[0].end(), 1u);
  EXPECT_EQ(two[1].begin(), 1u);
  EXPECT_EQ(two[1].end(), 2u);
}

TEST_F(SchedulerTest, SparseSplitCoversTheWholeKeySpace) {
  std::vector<NodeId> ids = {RegisterServer("s0"), RegisterServer("s1"),
                             RegisterServer("s2")};
  Acker acker(scheduler_.get(), client_.get(), ids);
  proto::TableSpec sparse = Dense("emb", 0);
  sparse.set_kind(proto::SPARSE);
  ASSERT_OK(client_->CreateTable(sparse, absl::Seconds(5)));
  const proto::ClusterMap map = scheduler_->CurrentMap();
  const auto& ranges = map.tables(0).ranges();
  ASSERT_EQ(ranges.size(), 3);
  Key next = 0;
  Key smallest = kKeySpaceEnd, largest = 0;
  for (const auto& r : ranges) {
    EXPECT_EQ(r.begin(), next);
    EXPECT_LT(r.begin(), r.end());
    smallest = std::min<Key>(smallest, r.end() - r.begin());
    largest = std::max<Key>(largest, r.end() - r.begin());
    next = r.end();
  }
  EXPECT_EQ(next, kKeySpaceEnd);
  EXPECT_LE(largest - smallest, 1u);
}

TEST_F(SchedulerTest, CreateTableNamesTheServerThatNeverAcks) {
  const NodeId good = RegisterServer("good");
  const NodeId silent = RegisterServer("silent");
  Acker acker(scheduler_.get(), client_.get(), {good});
  // Keep `silent` alive (heartbeats acknowledge nothing newer than epoch 0).
  std::atomic<bool> stop{false};
  std::thread heart([&] {
    while (!stop) {
      (void)client_->Heartbeat(silent, 0);
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  auto reply = client_->CreateTable(Dense("w", 10), absl::Milliseconds(300));
  stop = true;
  heart.join();
  EXPECT_THAT(reply, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(absl::StrContains(reply.status().message(),
                                absl::StrCat("servers ", silent, " ")))
      << reply.status();
  // The table stays declared.
  const proto::ClusterMap map = scheduler_->CurrentMap();
  ASSERT_EQ(map.tables_size(), 1);
  EXPECT_EQ(map.tables(0).spec().name(), "w");
}

// A table still being declared when the scheduler restarts stays pending
// (SchedulerState.pending_tables): a server that then reports it cannot
// create it rolls it back, as before the restart, instead of the table
// being taken for one in use.
TEST(SchedulerStateTest, APendingTableIsStillRolledBackAfterARestart) {
  SchedulerOptions o;
  o.heartbeat_interval = absl::Milliseconds(50);
  o.dead_after = absl::Seconds(5);
  o.state_dir = TestTmpDir() + "/pending_state";
  ASSERT_EQ(system(("rm -rf " + o.state_dir).c_str()), 0);
  NodeId good, silent;
  TableId id;
  Epoch epoch;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scheduler> s, Scheduler::Create(o));
    SchedulerClient c(absl::StrCat("127.0.0.1:", s->port()), absl::Seconds(5));
    auto reg = [&](const std::string& name) {
      proto::RegisterRequest r;
      r.set_role(proto::SERVER);
      r.set_name(name);
      r.set_data_endpoint("tcp://127.0.0.1:1");
      auto reply = c.Register(r, absl::Seconds(5));
      EXPECT_OK(reply);
      return reply.ok() ? reply->node_id() : 0;
    };
    good = reg("good");
    silent = reg("silent");
    {
      Acker acker(s.get(), &c, {good});
      EXPECT_THAT(c.CreateTable(DenseSpec("w", 10), absl::Milliseconds(300)),
                  StatusIs(absl::StatusCode::kDeadlineExceeded));
    }
    const proto::ClusterMap map = s->CurrentMap();
    ASSERT_EQ(map.tables_size(), 1);
    id = map.tables(0).spec().id();
    epoch = map.epoch();
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scheduler> s, Scheduler::Create(o));
  SchedulerClient c(absl::StrCat("127.0.0.1:", s->port()), absl::Seconds(5));
  ASSERT_EQ(s->CurrentMap().tables_size(), 1);
  proto::TableFailure f;
  f.set_table_id(id);
  f.set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  f.set_message("no room for it");
  ASSERT_OK(c.AckEpoch(silent, epoch, {f}));
  // Published once on disk.
  proto::ClusterMap after = s->CurrentMap();
  for (absl::Time deadline = absl::Now() + absl::Seconds(5);
       after.epoch() == epoch && absl::Now() < deadline;
       after = s->CurrentMap()) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GT(after.epoch(), epoch);
  EXPECT_EQ(after.tables_size(), 0) << "the failed declaration stayed";
}

TEST_F(SchedulerTest, InvalidSpecsFailAtOnceWithoutServers) {
  const absl::Time start = absl::Now();
  auto expect_invalid = [&](const proto::TableSpec& spec) {
    EXPECT_THAT(client_->CreateTable(spec, absl::Seconds(5)),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << spec.DebugString();
  };
  expect_invalid(Dense("", 10));
  expect_invalid(Dense("zero_keys", 0));
  proto::TableSpec no_kind = Dense("no_kind", 10);
  no_kind.set_kind(proto::TABLE_KIND_UNSPECIFIED);
  expect_invalid(no_kind);
  proto::TableSpec narrow = Dense("narrow", 10);
  narrow.set_width(0);
  expect_invalid(narrow);
  proto::TableSpec wide = Dense("wide", 10);
  wide.set_width((1u << 20) + 1);
  expect_invalid(wide);
  proto::TableSpec sparse_keys = Dense("sparse_keys", 10);
  sparse_keys.set_kind(proto::SPARSE);
  expect_invalid(sparse_keys);
  proto::TableSpec uniform = Dense("uniform", 10);
  uniform.mutable_init()->set_kind(proto::InitializerSpec::UNIFORM);
  uniform.mutable_init()->set_low(1);
  uniform.mutable_init()->set_high(0);
  expect_invalid(uniform);
  proto::TableSpec normal = Dense("normal", 10);
  normal.mutable_init()->set_kind(proto::InitializerSpec::NORMAL);
  normal.mutable_init()->set_stddev(-1);
  expect_invalid(normal);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // A valid spec with no server to hold it.
  EXPECT_THAT(client_->CreateTable(Dense("ok", 10), absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(scheduler_->CurrentMap().tables_size(), 0);
}

TEST_F(SchedulerTest, CreateTableWaitsForAServerToRegister) {
  std::atomic<NodeId> id{0};
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(200));
    id = RegisterServer("late");
    Acker acker(scheduler_.get(), client_.get(), {id.load()});
    absl::SleepFor(absl::Milliseconds(500));
  });
  auto reply = client_->CreateTable(Dense("w", 10), absl::Seconds(5));
  late.join();
  ASSERT_OK(reply);
  EXPECT_TRUE(reply->created());
  const proto::ClusterMap map = scheduler_->CurrentMap();
  const auto& ranges = map.tables(0).ranges();
  ASSERT_EQ(ranges.size(), 1);
  EXPECT_EQ(ranges[0].primary(), id.load());
}

TEST_F(SchedulerTest, BarrierReleasesExactlyAtCount) {
  for (int round = 0; round < 2; ++round) {
    std::atomic<int> returned{0};
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    auto arrive = [&](NodeId id) {
      threads.emplace_back([&, id] {
        if (client_->Barrier("sync", id, 3, absl::Seconds(5)).ok()) ok++;
        returned++;
      });
    };
    arrive(1);
    arrive(2);
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_EQ(returned.load(), 0) << "released with 2 of 3, round " << round;
    arrive(3);
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 3) << "round " << round;
  }
}

TEST_F(SchedulerTest, BarrierTimeoutRemovesTheNode) {
  EXPECT_THAT(client_->Barrier("t", 1, 2, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // Node 1 left when it timed out, so node 2 alone does not complete it.
  EXPECT_THAT(client_->Barrier("t", 2, 2, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The same node arriving twice counts once.
  std::thread first(
      [&] { EXPECT_OK(client_->Barrier("t", 1, 2, absl::Seconds(5))); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_OK(client_->Barrier("t", 2, 2, absl::Seconds(5)));
  first.join();
}

// A wait longer than the scheduler holds one call open is not refused: the
// SchedulerClient waits in calls of at most kMaxSchedulerWait, and the
// barrier passes when the last member comes.
TEST_F(SchedulerTest, ABarrierLongerThanOneCallWaits) {
  static_assert(kMaxSchedulerWait == kMaxWait,
                "the SDK's slices must be what the scheduler allows");
  absl::Status long_wait;
  std::thread first([&] {
    long_wait =
        client_->Barrier("long", 1, 2, kMaxSchedulerWait + absl::Minutes(5));
  });
  // Until the long wait has arrived, the second times out alone.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::Status second;
  do {
    second = client_->Barrier("long", 2, 2, absl::Milliseconds(200));
  } while (absl::IsDeadlineExceeded(second) && absl::Now() < deadline);
  first.join();
  EXPECT_OK(second);
  EXPECT_OK(long_wait);
}

TEST_F(SchedulerTest, WatchStartsAfterKnownEpoch) {
  proto::RegisterRequest c;
  c.set_role(proto::CLIENT);
  ASSERT_OK(client_->Register(c, absl::Seconds(5)));  // epoch 1
  // Clients that heartbeat stay, so the epoch moves only when we say.
  KeepAlive alive(scheduler_.get(), client_.get());
  std::vector<Epoch> seen;
  absl::Mutex mu;
  std::thread watcher([&] {
    (void)client_->Watch(0, 1, [&](const proto::ClusterMap& m) {
      absl::MutexLock lock(&mu);
      seen.push_back(m.epoch());
    });
  });
  absl::SleepFor(absl::Milliseconds(300));
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(seen.empty()) << "nothing newer than epoch 1 yet";
  }
  EXPECT_OK(client_->Register(c, absl::Seconds(5)));  // epoch 2
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool got = false;
  while (!got && absl::Now() < deadline) {
    {
      absl::MutexLock lock(&mu);
      got = !seen.empty();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  client_->CancelWatch();
  watcher.join();
  absl::MutexLock lock(&mu);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(), 2u);
}

TEST_F(SchedulerTest, ShutdownEndsWaitsPromptly) {
  std::thread watcher(
      [&] { (void)client_->Watch(0, 0, [](const proto::ClusterMap&) {}); });
  absl::Status barrier;
  std::thread waiter(
      [&] { barrier = client_->Barrier("never", 1, 2, absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  scheduler_->Shutdown();
  waiter.join();
  watcher.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_THAT(barrier, StatusIs(absl::StatusCode::kUnavailable));
  scheduler_->Shutdown();  // idempotent
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

// Workers that ask for a rank (a Kubernetes Indexed Job's completion index).
class SchedulerRankTest : public ::testing::Test {
 protected:
  // A job of three workers.
  void Start(absl::Duration dead_after) {
    SchedulerOptions o;
    o.heartbeat_interval = absl::Milliseconds(50);
    o.dead_after = dead_after;
    auto policy = ConsistencyPolicy::Parse("bsp", 0, 3, 0);
    ASSERT_OK(policy);
    o.policy = *policy;
    auto s = Scheduler::Create(o);
    ASSERT_OK(s);
    scheduler_ = std::move(*s);
    client_ = std::make_unique<SchedulerClient>(scheduler_->address(),
                                                absl::Seconds(5));
  }
  absl::StatusOr<proto::RegisterReply> Worker(const std::string& name,
                                              std::optional<int> rank) {
    proto::RegisterRequest r;
    r.set_role(proto::WORKER);
    r.set_name(name);
    if (rank.has_value()) r.set_requested_rank(*rank);
    return client_->Register(r, absl::Seconds(5));
  }
  // Waits until the scheduler has declared `id` dead.
  bool WaitDead(NodeId id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      const proto::ClusterMap map = scheduler_->CurrentMap();
      for (const auto& n : map.nodes()) {
        if (n.id() == id && n.state() == proto::DEAD) return true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<SchedulerClient> client_;
};

TEST_F(SchedulerRankTest, GrantsExactlyTheRequestedRank) {
  Start(absl::Seconds(30));
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply two, Worker("job-2-a", 2));
  EXPECT_EQ(two.rank(), 2);
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply zero, Worker("job-0-a", 0));
  EXPECT_EQ(zero.rank(), 0);
  // Without a request: the smallest rank nobody holds.
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply picked, Worker("plain", {}));
  EXPECT_EQ(picked.rank(), 1);
  EXPECT_THAT(Worker("one-too-many", {}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(Worker("job-3-a", 3),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Worker("job-minus", -1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Rank 2's holder is alive: a second pod of index 2 is refused.
  auto again = Worker("job-2-b", 2);
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_TRUE(absl::StrContains(again.status().message(), "job-2-a"))
      << again.status();
}

TEST_F(SchedulerRankTest, ReplacedWorkerTakesItsRankBack) {
  Start(absl::Milliseconds(300));
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply old, Worker("job-1-old", 1));
  ASSERT_EQ(old.rank(), 1);
  ASSERT_TRUE(WaitDead(old.node_id()));  // never heartbeats
  // The replacement pod: another name, the same completion index.
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply fresh, Worker("job-1-new", 1));
  EXPECT_EQ(fresh.rank(), 1);
  EXPECT_NE(fresh.node_id(), old.node_id());
  ASSERT_OK(client_->Heartbeat(fresh.node_id(), 0));
  // The old pod cannot come back to the rank it lost, asked for or not.
  EXPECT_THAT(Worker("job-1-old", {}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // A name keeps its rank: once dead, "job-1-new" gets its id and rank 1
  // back, and no other rank.
  ASSERT_TRUE(WaitDead(fresh.node_id()));
  EXPECT_THAT(Worker("job-1-new", 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply back, Worker("job-1-new", 1));
  EXPECT_EQ(back.rank(), 1);
  EXPECT_EQ(back.node_id(), fresh.node_id());
}

// A BSP job grows at the step after the gating clock when a worker takes
// a seat, and no worker starts that step until every live server has
// applied the map announcing it: a server still on the old map would
// complete the step without the joiner's push.
TEST_F(SchedulerRankTest, BspGrowsOnlyOnceEveryServerHasTheMap) {
  SchedulerOptions o;
  o.heartbeat_interval = absl::Milliseconds(50);
  o.dead_after = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(o.policy, ConsistencyPolicy::Parse("bsp", 0, 2, 0, 1));
  ASSERT_OK_AND_ASSIGN(scheduler_, Scheduler::Create(o));
  client_ = std::make_unique<SchedulerClient>(scheduler_->address(),
                                              absl::Seconds(5));
  proto::RegisterRequest sr;
  sr.set_role(proto::SERVER);
  sr.set_name("s");
  sr.set_data_endpoint("tcp://127.0.0.1:1");
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply server,
                       client_->Register(sr, absl::Seconds(5)));
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply w0, Worker("w0", {}));
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply w1, Worker("w1", {}));
  ASSERT_OK(
      client_->AckEpoch(server.node_id(), scheduler_->CurrentMap().epoch()));
  auto advance = [&](const proto::RegisterReply& w,
                     Clock clock) -> absl::StatusOr<proto::AdvanceClockReply> {
    proto::AdvanceClockRequest req;
    req.set_node_id(w.node_id());
    req.set_rank(w.rank());
    req.set_clock(clock);
    return client_->AdvanceClock(req);
  };
  ASSERT_OK(advance(w0, 1).status());
  ASSERT_OK(advance(w1, 1).status());
  ASSERT_OK(advance(w0, 2).status());  // w1 is still in step 1

  const Epoch before = scheduler_->CurrentMap().epoch();
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply w2, Worker("w2", {}));
  EXPECT_EQ(w2.rank(), 2);
  EXPECT_EQ(w2.start_clock(), 2);   // one beyond the gating clock, 1
  EXPECT_EQ(w2.gating_clock(), 1);  // not its start: the others are behind
  const proto::ClusterMap map = scheduler_->CurrentMap();
  EXPECT_THAT(map.seat_clocks(), ::testing::ElementsAre(2));
  ASSERT_EQ(map.seat_epochs_size(), 1);
  EXPECT_GT(map.seat_epochs(0), before);
  EXPECT_LE(map.seat_epochs(0), map.epoch());

  // Step 1 completes, but the server has not applied the map: nobody may
  // start step 2, and no reply lets a worker infer otherwise.
  ASSERT_OK_AND_ASSIGN(proto::AdvanceClockReply r1, advance(w1, 2));
  EXPECT_EQ(r1.gating_clock(), 1);
  EXPECT_LE(r1.others_min_clock(), 1);
  EXPECT_THAT(client_->WaitClock(w0.node_id(), 0, 2, absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_OK_AND_ASSIGN(proto::JobStatus status, client_->GetJobStatus());
  EXPECT_EQ(status.gating_clock(), 1);

  // Applied: step 2 opens, for the joiner too, and step 3 waits for it.
  ASSERT_OK(client_->AckEpoch(server.node_id(), map.epoch()));
  ASSERT_OK_AND_ASSIGN(
      const int64_t gating,
      client_->WaitClock(w0.node_id(), 0, 2, absl::Seconds(5)));
  EXPECT_EQ(gating, 2);
  ASSERT_OK(client_->WaitClock(w2.node_id(), 2, 2, absl::Seconds(5)).status());
  ASSERT_OK(advance(w0, 3).status());
  ASSERT_OK(advance(w1, 3).status());
  EXPECT_THAT(client_->WaitClock(w0.node_id(), 0, 3, absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_OK(advance(w2, 3).status());
  ASSERT_OK(client_->WaitClock(w0.node_id(), 0, 3, absl::Seconds(5)).status());
}

}  // namespace
}  // namespace downpour
