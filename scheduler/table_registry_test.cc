#include "scheduler/table_registry.h"

#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/test_util.h"
#include "common/types.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"
#include "scheduler/durable_state.h"
#include "scheduler/membership.h"
#include "scheduler/scheduler_mutex.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

class NoSource : public DurableState::Source {
 public:
  proto::SchedulerState Snapshot() const override { return {}; }
  proto::SchedulerClocks ClocksSnapshot() const override { return {}; }
};

proto::TableSpec Dense(const std::string& name) {
  proto::TableSpec s;
  s.set_name(name);
  s.set_kind(proto::DENSE);
  s.set_width(2);
  s.set_num_keys(100);
  s.mutable_handler()->set_name("sgd");
  return s;
}

class TableRegistryTest : public ::testing::Test {
 protected:
  TableRegistryTest() : tables_(Options(), &map_, &members_, &durable_) {}

  static TableRegistryOptions Options() {
    TableRegistryOptions o;
    o.replicas = 2;
    o.handover_timeout = absl::Seconds(2);
    return o;
  }
  NodeId Server(const std::string& name) {
    proto::RegisterRequest req;
    req.set_name(name);
    req.set_role(proto::SERVER);
    req.set_data_endpoint("tcp://127.0.0.1:1");
    proto::NodeInfo* n = members_.Add(kNoNode);
    members_.Admit(n, req, kT0);
    return n->id();
  }
  // Declares `spec` with a deadline already passed: it enters the map and
  // the call does not wait for the servers.
  absl::Status Declare(const proto::TableSpec& spec,
                       proto::CreateTableReply* reply) {
    absl::MutexLock l(&lock_.mu);
    return tables_.Create(lock_, spec, absl::Now(), absl::ZeroDuration(),
                          reply);
  }

  SchedulerMutex lock_;
  proto::ClusterMap map_;
  NoSource source_;
  DurableState durable_{&map_, &source_};
  Membership members_{MembershipOptions(), &map_};
  TableRegistry tables_;
};

TEST_F(TableRegistryTest, ARefusalRollsAPendingDeclarationBack) {
  const NodeId a = Server("a");
  const NodeId b = Server("b");
  proto::CreateTableReply reply;
  EXPECT_THAT(Declare(Dense("t"), &reply),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_EQ(map_.tables_size(), 1);
  const TableId id = map_.tables(0).spec().id();
  const Epoch declared = map_.epoch();
  members_.RecordApplied(a, declared);
  tables_.ResolvePending();  // b has not acknowledged: still pending
  proto::SchedulerState state;
  tables_.Export(&state);
  ASSERT_EQ(state.pending_tables_size(), 1);
  EXPECT_EQ(state.pending_tables(0).id(), id);
  proto::TableFailure failure;
  failure.set_table_id(id);
  failure.set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  failure.set_message("no memory");
  tables_.TableFailed(b, failure);
  EXPECT_EQ(map_.tables_size(), 0);
  EXPECT_EQ(map_.epoch(), declared + 1);
  EXPECT_EQ(durable_.published().epoch(), declared + 1);
}

TEST_F(TableRegistryTest, AnAcknowledgedTableIsDeclaredAndARefusalLaterIsKept) {
  const NodeId a = Server("a");
  const NodeId b = Server("b");
  proto::CreateTableReply reply;
  ASSERT_THAT(Declare(Dense("t"), &reply),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  const TableId id = map_.tables(0).spec().id();
  members_.RecordApplied(a, map_.epoch());
  members_.RecordApplied(b, map_.epoch());
  {
    absl::MutexLock l(&lock_.mu);
    tables_.ResolvePending();
  }
  // Declared: the same spec is answered at once, another one refused.
  EXPECT_OK(Declare(Dense("t"), &reply));
  EXPECT_FALSE(reply.created());
  EXPECT_EQ(reply.spec().id(), id);
  proto::TableSpec wider = Dense("t");
  wider.set_width(3);
  EXPECT_THAT(Declare(wider, &reply),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // A refusal now does not remove it; the refusal is part of the state.
  proto::TableFailure failure;
  failure.set_table_id(id);
  failure.set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  tables_.TableFailed(b, failure);
  EXPECT_EQ(map_.tables_size(), 1);
  proto::SchedulerState state;
  tables_.Export(&state);
  ASSERT_EQ(state.refusals_size(), 1);
  EXPECT_EQ(state.refusals(0).node(), b);
  EXPECT_EQ(state.pending_tables_size(), 0);
  tables_.ForgetRefusals(b);
  proto::SchedulerState after;
  tables_.Export(&after);
  EXPECT_EQ(after.refusals_size(), 0);
}

TEST_F(TableRegistryTest, TooFewServersIsUnavailable) {
  proto::CreateTableReply reply;
  EXPECT_THAT(Declare(Dense("t"), &reply),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(map_.tables_size(), 0);
}

TEST_F(TableRegistryTest, SlowHandOversAreCancelledAfterTheTimeout) {
  proto::RangeAssignment* r = map_.add_tables()->add_ranges();
  r->set_primary(1);
  r->add_replicas(2);
  r->set_handing_to(2);
  EXPECT_FALSE(tables_.CancelSlowHandOvers(kT0));  // the clock starts
  EXPECT_FALSE(tables_.CancelSlowHandOvers(kT0 + absl::Seconds(2)));
  EXPECT_TRUE(tables_.CancelSlowHandOvers(kT0 + absl::Seconds(2) +
                                          absl::Milliseconds(1)));
  EXPECT_EQ(map_.tables(0).ranges(0).handing_to(), 0);
  // A new handover gets a full timeout again.
  map_.mutable_tables(0)->mutable_ranges(0)->set_handing_to(2);
  EXPECT_FALSE(tables_.CancelSlowHandOvers(kT0 + absl::Seconds(3)));
  EXPECT_FALSE(tables_.CancelSlowHandOvers(kT0 + absl::Seconds(5)));
}

// A dense table "t" of two ranges, both on servers a (primary) and b.
void TwoRangesOnTwoServers(proto::ClusterMap* map, NodeId a, NodeId b) {
  proto::TableMap* t = map->add_tables();
  *t->mutable_spec() = Dense("t");
  t->mutable_spec()->set_id(1);
  for (Key begin : {0, 50}) {
    proto::RangeAssignment* r = t->add_ranges();
    r->set_begin(begin);
    r->set_end(begin + 50);
    r->set_primary(a);
    r->add_replicas(b);
  }
}

// A merge of table "t"'s two ranges, as psctl merge asks for it.
proto::SplitRangeRequest MergeOfT() {
  proto::SplitRangeRequest req;
  req.set_table("t");
  req.set_key(10);
  req.set_merge(true);
  return req;
}

// `primary`'s report that the range of table 1 from `begin` is quiet.
proto::ReplicaReadyRequest Quiet(NodeId primary, Key begin, Epoch epoch) {
  proto::ReplicaReadyRequest quiet;
  quiet.set_hand_over(true);
  quiet.set_table_id(1);
  quiet.set_epoch(epoch);
  quiet.set_primary(primary);
  quiet.set_backup(primary);
  quiet.set_range_begin(begin);
  return quiet;
}

TEST_F(TableRegistryTest, AYoungBoundaryIsNotMergedAway) {
  TwoRangesOnTwoServers(&map_, Server("a"), Server("b"));
  // This scheduler has just started: for all it knows, a write cut on a
  // map without the boundary may still be retried.
  absl::Status young = tables_.Split(MergeOfT()).status();
  EXPECT_EQ(young.code(), absl::StatusCode::kFailedPrecondition) << young;
  EXPECT_THAT(std::string(young.message()), HasSubstr("--merge_min_age_s"));
  EXPECT_EQ(MergesUnderWay(map_), 0);
}

TEST_F(TableRegistryTest, AMergeEndsOnceBothNeighboursReportedQuiet) {
  TableRegistryOptions o = Options();
  o.merge_min_age = absl::ZeroDuration();
  TableRegistry tables(o, &map_, &members_, &durable_);
  const NodeId a = Server("a"), b = Server("b");
  TwoRangesOnTwoServers(&map_, a, b);
  absl::StatusOr<proto::SplitRangeReply> r = tables.Split(MergeOfT());
  ASSERT_OK(r.status());
  EXPECT_EQ(r->begin(), 0u);
  EXPECT_EQ(r->split_at(), 50u);
  EXPECT_EQ(r->end(), 100u);
  const Epoch started = map_.epoch();
  // Only the range's primary reports it quiet.
  EXPECT_EQ(tables.ReplicaReady(Quiet(b, 50, started)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(tables.ReplicaReady(Quiet(a, 50, started)));
  // One neighbour is not enough.
  EXPECT_EQ(map_.epoch(), started);
  EXPECT_EQ(map_.tables(0).ranges_size(), 2);
  ASSERT_OK(tables.ReplicaReady(Quiet(a, 0, started)));
  EXPECT_EQ(map_.epoch(), started + 1);
  ASSERT_EQ(map_.tables(0).ranges_size(), 1);
  EXPECT_EQ(map_.tables(0).ranges(0).end(), 100u);
  EXPECT_EQ(map_.tables(0).ranges(0).merge(), proto::RangeAssignment::NO_MERGE);
  EXPECT_EQ(tables.merges_started(), 1u);
  EXPECT_EQ(tables.merges_done(), 1u);
}

// A failover during a merge: the old primary's quiet report does not count
// for the new primary, which reports the range itself.
TEST_F(TableRegistryTest, AQuietReportCountsOnlyWhileItsServerIsThePrimary) {
  TableRegistryOptions o = Options();
  o.merge_min_age = absl::ZeroDuration();
  TableRegistry tables(o, &map_, &members_, &durable_);
  const NodeId a = Server("a"), b = Server("b");
  TwoRangesOnTwoServers(&map_, a, b);
  ASSERT_OK(tables.Split(MergeOfT()).status());
  const Epoch epoch = map_.epoch();
  ASSERT_OK(tables.ReplicaReady(Quiet(a, 0, epoch)));
  // b takes the lower range over (its holders stay a and b).
  proto::RangeAssignment* lower = map_.mutable_tables(0)->mutable_ranges(0);
  lower->set_primary(b);
  lower->set_replicas(0, a);
  ASSERT_OK(tables.ReplicaReady(Quiet(a, 50, epoch)));
  EXPECT_EQ(map_.tables(0).ranges_size(), 2) << "a's report counted for b";
  ASSERT_OK(tables.ReplicaReady(Quiet(b, 0, epoch)));
  ASSERT_EQ(map_.tables(0).ranges_size(), 1);
  EXPECT_EQ(map_.tables(0).ranges(0).primary(), b);
}

TEST(SpecToDeclareTest, ATableThatFollowsTheJobGetsItsEnforcement) {
  const ConsistencyPolicy bsp = *ConsistencyPolicy::Parse("bsp", 0, 4, 1);
  proto::TableSpec spec = Dense("t");
  spec.set_id(9);
  spec.set_follows_job(true);
  ASSERT_OK_AND_ASSIGN(proto::TableSpec declared, SpecToDeclare(spec, bsp));
  EXPECT_EQ(declared.id(), 0);
  EXPECT_EQ(declared.sync_workers(), 4);
  EXPECT_EQ(declared.num_workers(), 5);
  spec.set_sync_workers(2);
  EXPECT_THAT(SpecToDeclare(spec, bsp),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(SpecToDeclare(spec, bsp).status().message()),
              HasSubstr("leave both 0"));
  proto::TableSpec no_width = Dense("t");
  no_width.set_width(0);
  EXPECT_THAT(SpecToDeclare(no_width, bsp),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// With elastic seats the servers track every seat; a BSP table is refused
// in an SSP job (its joiners start mid-step) and declared in a BSP job.
TEST(SpecToDeclareTest, ElasticSeatsAndTheirTables) {
  const ConsistencyPolicy ssp = *ConsistencyPolicy::Parse("ssp", 2, 2, 0, 3);
  proto::TableSpec spec = Dense("t");
  spec.set_follows_job(true);
  ASSERT_OK_AND_ASSIGN(proto::TableSpec declared, SpecToDeclare(spec, ssp));
  EXPECT_EQ(declared.sync_workers(), 0);
  EXPECT_EQ(declared.num_workers(), 5);
  spec.set_consistency(proto::BSP);
  const absl::StatusOr<proto::TableSpec> bsp = SpecToDeclare(spec, ssp);
  EXPECT_THAT(bsp, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bsp.status().message()),
              HasSubstr("elastic worker seats"));
  const ConsistencyPolicy bsp_job =
      *ConsistencyPolicy::Parse("bsp", 0, 2, 0, 1);
  ASSERT_OK_AND_ASSIGN(declared, SpecToDeclare(spec, bsp_job));
  EXPECT_EQ(declared.sync_workers(), 2);
  EXPECT_EQ(declared.num_workers(), 3);
}

}  // namespace
}  // namespace downpour
