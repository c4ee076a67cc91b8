#include "scheduler/membership.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/test_util.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

MembershipOptions Options() {
  MembershipOptions o;
  o.dead_after = absl::Seconds(3);
  o.suspect_grace = absl::Milliseconds(400);
  o.forget_dead_after = absl::Seconds(60);
  o.max_nodes = 8;
  return o;
}

proto::RegisterRequest Request(const std::string& name, proto::NodeRole role) {
  proto::RegisterRequest req;
  req.set_name(name);
  req.set_role(role);
  req.set_incarnation(7);
  if (role == proto::SERVER) req.set_data_endpoint("tcp://127.0.0.1:1");
  return req;
}

class MembershipTest : public ::testing::Test {
 protected:
  NodeId Join(const std::string& name, proto::NodeRole role, absl::Time now) {
    proto::NodeInfo* n = members_.Add(kNoNode);
    members_.Admit(n, Request(name, role), now);
    return n->id();
  }
  proto::NodeState State(NodeId id) { return members_.Find(id)->state(); }

  proto::ClusterMap map_;
  Membership members_{Options(), &map_};
};

TEST_F(MembershipTest, ASilentServerOrWorkerDiesAfterDeadAfterNotBefore) {
  const NodeId s = Join("s", proto::SERVER, kT0);
  const NodeId w = Join("w", proto::WORKER, kT0);
  EXPECT_THAT(members_.SweepDead(kT0 + absl::Seconds(3)), IsEmpty());
  members_.Heard(w, kT0 + absl::Seconds(2));
  EXPECT_THAT(
      members_.SweepDead(kT0 + absl::Seconds(3) + absl::Milliseconds(1)),
      ElementsAre(s));
  EXPECT_EQ(State(s), proto::DEAD);
  EXPECT_EQ(State(w), proto::ALIVE);
  // Declared once.
  EXPECT_THAT(members_.SweepDead(kT0 + absl::Seconds(10)), ElementsAre(w));
  EXPECT_THAT(members_.SweepDead(kT0 + absl::Seconds(20)), IsEmpty());
  EXPECT_EQ(members_.servers_declared_dead(), 1);
  EXPECT_EQ(members_.workers_declared_dead(), 1);
}

TEST_F(MembershipTest, ASuspectDiesAfterTheGraceUnlessHeardFrom) {
  const NodeId a = Join("a", proto::SERVER, kT0);
  const NodeId b = Join("b", proto::SERVER, kT0);
  members_.Suspect(a, "stream broke", kT0 + absl::Milliseconds(100));
  members_.Suspect(b, "stream broke", kT0 + absl::Milliseconds(100));
  // b is heard from after the report: the report is stale.
  members_.Heard(b, kT0 + absl::Milliseconds(200));
  EXPECT_THAT(members_.SweepDead(kT0 + absl::Milliseconds(500)), IsEmpty());
  EXPECT_THAT(members_.SweepDead(kT0 + absl::Milliseconds(501)),
              ElementsAre(a));
  EXPECT_EQ(State(b), proto::ALIVE);
}

TEST_F(MembershipTest, ASecondReportDoesNotRestartTheGrace) {
  const NodeId a = Join("a", proto::WORKER, kT0);
  members_.Suspect(a, "first", kT0 + absl::Milliseconds(100));
  members_.Suspect(a, "second", kT0 + absl::Milliseconds(400));
  EXPECT_THAT(members_.SweepDead(kT0 + absl::Milliseconds(501)),
              ElementsAre(a));
}

// A scheduler that stops sweeping (starved of CPU, SIGSTOP) heard nobody
// meanwhile: the gap is nobody's silence, and silence and graces resume
// where they were. Sweeps 50 ms apart are no stall.
TEST(MembershipStallTest, AStallOfTheSchedulerIsNobodysSilence) {
  proto::ClusterMap map;
  MembershipOptions o = Options();
  o.sweep_stall = absl::Milliseconds(200);
  Membership members(o, &map);
  auto join = [&](const std::string& name) {
    proto::NodeInfo* n = members.Add(kNoNode);
    members.Admit(n, Request(name, proto::SERVER), kT0);
    return n->id();
  };
  const NodeId quiet = join("quiet");
  const NodeId suspect = join("suspect");
  const NodeId live = join("live");
  absl::Time t = kT0;
  auto sweep_until = [&](absl::Time until) {
    std::vector<NodeId> dead;
    for (; t < until; t += absl::Milliseconds(50)) {
      members.Heard(live, t);
      for (NodeId id : members.SweepDead(t)) dead.push_back(id);
    }
    return dead;
  };
  EXPECT_THAT(sweep_until(kT0 + absl::Seconds(1)), IsEmpty());
  members.Suspect(suspect, "its stream broke", t);  // 300 ms of grace left
  EXPECT_THAT(sweep_until(t + absl::Milliseconds(100)), IsEmpty());
  // Ten seconds without a sweep: without the credit, all three die here.
  t += absl::Seconds(10);
  EXPECT_THAT(members.SweepDead(t), IsEmpty());
  members.Heard(live, t);
  const absl::Time resumed = t;
  // The suspect's grace resumes: 300 ms left (a slice more, at most).
  EXPECT_THAT(sweep_until(resumed + absl::Milliseconds(250)), IsEmpty());
  EXPECT_THAT(sweep_until(resumed + absl::Milliseconds(500)),
              ElementsAre(suspect));
  // The quiet one had been silent 1.1 s: 1.9 s more.
  EXPECT_THAT(sweep_until(resumed + absl::Milliseconds(1800)), IsEmpty());
  EXPECT_THAT(sweep_until(resumed + absl::Milliseconds(2200)),
              ElementsAre(quiet));
  EXPECT_EQ(members.Find(live)->state(), proto::ALIVE);
}

TEST_F(MembershipTest, ClientsAreForgottenNotDeclaredDead) {
  const NodeId c = Join("c", proto::CLIENT, kT0);
  members_.Suspect(c, "ignored for clients", kT0);
  EXPECT_THAT(members_.SweepDead(kT0 + absl::Seconds(4)), IsEmpty());
  EXPECT_THAT(members_.ForgetSilent(kT0 + absl::Seconds(3)), IsEmpty());
  EXPECT_THAT(members_.ForgetSilent(kT0 + absl::Seconds(4)), ElementsAre(c));
  EXPECT_EQ(members_.Find(c), nullptr);
}

TEST_F(MembershipTest, TheDeadAreForgottenOnceNoRangeNamesThem) {
  const NodeId s = Join("s", proto::SERVER, kT0);
  const NodeId w = Join("w", proto::WORKER, kT0);
  proto::RangeAssignment* r = map_.add_tables()->add_ranges();
  r->set_primary(s);
  r->set_lost(true);
  members_.RecordApplied(s, 5);
  ASSERT_THAT(members_.SweepDead(kT0 + absl::Seconds(4)), ElementsAre(s, w));
  EXPECT_THAT(members_.ForgetSilent(kT0 + absl::Seconds(60)), IsEmpty());
  EXPECT_THAT(members_.ForgetSilent(kT0 + absl::Seconds(61)), ElementsAre(w));
  map_.clear_tables();
  EXPECT_THAT(members_.ForgetSilent(kT0 + absl::Seconds(61)), ElementsAre(s));
  EXPECT_EQ(map_.nodes_size(), 0);
  EXPECT_EQ(members_.applied(s), 0);
}

TEST_F(MembershipTest, APreviousIdComesBackOnlyIfFree) {
  const NodeId first = Join("a", proto::SERVER, kT0);
  EXPECT_EQ(first, 1);
  EXPECT_EQ(members_.Add(first)->id(), 2);  // held: a fresh id
  EXPECT_EQ(members_.Add(9)->id(), 9);
  EXPECT_EQ(members_.Add(kNoNode)->id(), 10);  // never below a given one
}

TEST_F(MembershipTest, RegistrationFindsTheSameNameAndRoleOnly) {
  const NodeId s = Join("n", proto::SERVER, kT0);
  EXPECT_EQ(members_.Registered(Request("n", proto::SERVER))->id(), s);
  EXPECT_EQ(members_.Registered(Request("n", proto::WORKER)), nullptr);
  EXPECT_EQ(members_.Registered(Request("", proto::SERVER)), nullptr);
  proto::RegisterRequest again = Request("n", proto::SERVER);
  EXPECT_TRUE(Membership::SameProcess(members_.Find(s), again));
  again.set_incarnation(8);
  EXPECT_FALSE(Membership::SameProcess(members_.Find(s), again));
  again.set_incarnation(0);
  EXPECT_FALSE(Membership::SameProcess(members_.Find(s), again));
}

TEST_F(MembershipTest, TheNodeCapCountsNewNodesOnly) {
  for (int i = 0; i < 8; ++i) Join(absl::StrCat("n", i), proto::WORKER, kT0);
  EXPECT_THAT(members_.CheckRoom(Request("new", proto::WORKER), nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(
      members_.CheckRoom(Request("n0", proto::WORKER),
                         members_.Registered(Request("n0", proto::WORKER))));
}

TEST_F(MembershipTest,
       RecoveredServersAreUnconfirmedUntilHeardAndGetAFullDeadAfter) {
  const NodeId s = Join("s", proto::SERVER, kT0);
  Join("w", proto::WORKER, kT0);
  Membership recovered(Options(), &map_);
  const absl::Time restart = kT0 + absl::Minutes(5);
  recovered.Recovered(/*next_node_id=*/5, restart);
  EXPECT_EQ(recovered.unconfirmed(), 1);
  EXPECT_THAT(recovered.SweepDead(restart + absl::Seconds(3)), IsEmpty());
  recovered.Heard(s, restart + absl::Seconds(1));
  EXPECT_EQ(recovered.unconfirmed(), 0);
  EXPECT_EQ(recovered.Add(kNoNode)->id(), 5);
}

TEST_F(MembershipTest, AppliedEpochsOnlyGrow) {
  const NodeId s = Join("s", proto::SERVER, kT0);
  members_.RecordApplied(s, 4);
  members_.RecordApplied(s, 3);
  EXPECT_EQ(members_.applied(s), 4);
  EXPECT_EQ(members_.applied(99), 0);
}

}  // namespace
}  // namespace downpour
