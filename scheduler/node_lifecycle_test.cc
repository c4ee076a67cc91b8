#include "scheduler/node_lifecycle.h"

#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/test_util.h"
#include "common/types.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"
#include "scheduler/barriers.h"
#include "scheduler/checkpoint_coordinator.h"
#include "scheduler/durable_state.h"
#include "scheduler/job.h"
#include "scheduler/membership.h"
#include "scheduler/scheduler_mutex.h"
#include "scheduler/table_registry.h"

namespace downpour {
namespace {

class NoSource : public DurableState::Source {
 public:
  proto::SchedulerState Snapshot() const override { return {}; }
  proto::SchedulerClocks ClocksSnapshot() const override { return {}; }
};

JobOptions TwoWorkers() {
  JobOptions o;
  o.policy = *ConsistencyPolicy::Parse("bsp", 0, 2, 0);
  return o;
}

// Every part, without a state dir, as the scheduler wires them.
class NodeLifecycleTest : public ::testing::Test {
 protected:
  proto::RegisterReply Register(const std::string& name, proto::NodeRole role,
                                uint64_t incarnation = 1) {
    proto::RegisterRequest req;
    req.set_name(name);
    req.set_role(role);
    req.set_incarnation(incarnation);
    if (role == proto::SERVER) req.set_data_endpoint("tcp://127.0.0.1:1");
    proto::RegisterReply reply;
    absl::MutexLock l(&lock_.mu);
    EXPECT_OK(lifecycle_.Register(lock_, req, &reply));
    return reply;
  }
  // A table of one range held by `primary` with `backup` in sync.
  void Range(NodeId primary, NodeId backup) {
    proto::RangeAssignment* r = map_.add_tables()->add_ranges();
    r->set_primary(primary);
    if (backup != kNoNode) r->add_replicas(backup);
  }

  SchedulerMutex lock_;
  proto::ClusterMap map_;
  NoSource source_;
  DurableState durable_{&map_, &source_};
  Membership members_{MembershipOptions(), &map_};
  Job job_{TwoWorkers(), &map_, &members_, &durable_};
  Barriers barriers_{16, &job_, &durable_};
  TableRegistry tables_{TableRegistryOptions(), &map_, &members_, &durable_};
  CheckpointCoordinator checkpoints_{
      CheckpointOptions(), &map_, &members_, &tables_, &job_, &durable_};
  NodeLifecycle lifecycle_{
      absl::Milliseconds(200), &map_,    &members_, &job_, &barriers_, &tables_,
      &checkpoints_,           &durable_};
};

TEST_F(NodeLifecycleTest, ASweepFailsTheDeadOverInOneEpoch) {
  const absl::Time t0 = absl::Now();
  const NodeId a = Register("a", proto::SERVER).node_id();
  const NodeId b = Register("b", proto::SERVER).node_id();
  const proto::RegisterReply w = Register("w", proto::WORKER);
  EXPECT_EQ(w.rank(), 0);
  EXPECT_EQ(w.heartbeat_interval_ms(), 200);
  Range(a, b);
  // Well past dead_after (3 s) for a and w, well before forget_dead_after.
  const absl::Time later = t0 + absl::Minutes(5);
  members_.Heard(b, later);
  const Epoch before = map_.epoch();
  lifecycle_.Sweep(later);
  EXPECT_EQ(map_.epoch(), before + 1);
  EXPECT_EQ(durable_.published().epoch(), before + 1);
  EXPECT_EQ(map_.tables(0).ranges(0).primary(), b);
  EXPECT_EQ(members_.Find(a)->state(), proto::DEAD);
  proto::JobStatus status;
  job_.FillJobStatus(&status);
  EXPECT_TRUE(status.workers(0).lost());
  // Nothing more to do: no new epoch.
  lifecycle_.Sweep(later + absl::Seconds(1));
  EXPECT_EQ(map_.epoch(), before + 1);
}

TEST_F(NodeLifecycleTest, AServerBackAsANewProcessLosesWhatOnlyItHeld) {
  const NodeId a = Register("a", proto::SERVER, /*incarnation=*/1).node_id();
  Range(a, kNoNode);
  const proto::RegisterReply again =
      Register("a", proto::SERVER, /*incarnation=*/2);
  EXPECT_EQ(again.node_id(), a);
  EXPECT_TRUE(map_.tables(0).ranges(0).lost());
  EXPECT_EQ(tables_.ranges_lost(), 1);
  EXPECT_EQ(members_.servers_declared_dead(), 1);
  EXPECT_EQ(again.map().epoch(), map_.epoch());
  // The same process again (a retry) changes nothing.
  const Epoch epoch = map_.epoch();
  EXPECT_EQ(Register("a", proto::SERVER, 2).node_id(), a);
  EXPECT_EQ(map_.epoch(), epoch);
}

TEST_F(NodeLifecycleTest, AWorkerThatLeftFinishedIsNotLost) {
  const proto::RegisterReply w = Register("w", proto::WORKER);
  proto::LeaveRequest leave;
  leave.set_node_id(w.node_id());
  leave.set_finished(true);
  {
    absl::MutexLock l(&lock_.mu);
    EXPECT_OK(lifecycle_.Leave(lock_, leave));
  }
  EXPECT_EQ(members_.Find(w.node_id())->state(), proto::LEFT);
  proto::JobStatus status;
  job_.FillJobStatus(&status);
  EXPECT_TRUE(status.workers(0).finished());
  EXPECT_FALSE(status.workers(0).lost());
  leave.set_node_id(999);
  absl::MutexLock l(&lock_.mu);
  EXPECT_THAT(lifecycle_.Leave(lock_, leave),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace downpour
