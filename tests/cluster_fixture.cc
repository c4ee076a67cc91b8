#include "tests/cluster_fixture.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <iostream>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/test_util.h"

namespace downpour {

const proto::NodeInfo* NodeNamed(const proto::ClusterMap& map,
                                 const std::string& name) {
  for (const auto& n : map.nodes()) {
    if (n.name() == name && n.role() == proto::SERVER) return &n;
  }
  return nullptr;
}

bool Holds(const proto::RangeAssignment& r, NodeId id) {
  auto has = [id](const google::protobuf::RepeatedField<uint64_t>& f) {
    return std::find(f.begin(), f.end(), id) != f.end();
  };
  return r.primary() == id || has(r.replicas()) || has(r.catching_up());
}

int RangesHeldBy(const proto::ClusterMap& map, NodeId id) {
  int n = 0;
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) n += Holds(r, id);
  }
  return n;
}

const proto::TableMap* TableNamed(const proto::ClusterMap& map,
                                  const std::string& name) {
  for (const auto& t : map.tables()) {
    if (t.spec().name() == name) return &t;
  }
  return nullptr;
}

const proto::RangeAssignment* RangeOf(const proto::ClusterMap& map,
                                      const std::string& name, Key key) {
  const proto::TableMap* t = TableNamed(map, name);
  if (t == nullptr) return nullptr;
  for (const auto& r : t->ranges()) {
    if (r.begin() <= key && key < r.end()) return &r;
  }
  return nullptr;
}

bool Settled(const proto::ClusterMap& map, int replicas) {
  if (map.tables_size() == 0) return false;
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) {
      if (r.move_to() != kNoNode || r.handing_to() != kNoNode ||
          r.split_at() != 0 || r.merge() != proto::RangeAssignment::NO_MERGE ||
          r.catching_up_size() > 0 || r.lost() ||
          1 + r.replicas_size() != replicas) {
        return false;
      }
    }
  }
  return true;
}

namespace {

// Asks the scheduler for `req` (a split or a merge) until the map shows it
// `done` at key `watch`, or refuses it for good. Busy refusals
// (UNAVAILABLE) and changes called off (no longer `under_way`) are asked
// again. FAILED_PRECONDITION is also the answer when the change is done
// already: the map says which.
absl::Status AskAndAwait(
    SchedulerClient& sched, const proto::SplitRangeRequest& req,
    const std::string& what, Key watch,
    absl::FunctionRef<bool(const proto::RangeAssignment&)> done,
    absl::FunctionRef<bool(const proto::RangeAssignment&)> under_way,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  proto::ClusterMap map;  // the last one read; `watched` points into it
  auto watched = [&]() -> absl::StatusOr<const proto::RangeAssignment*> {
    DP_ASSIGN_OR_RETURN(map, sched.GetClusterMap());
    const proto::RangeAssignment* r = RangeOf(map, req.table(), watch);
    if (r == nullptr) {
      return absl::NotFoundError(absl::StrCat(what, ": no range holds it"));
    }
    return r;
  };
  DP_ASSIGN_OR_RETURN(const proto::RangeAssignment* first, watched());
  if (done(*first)) return absl::OkStatus();
  while (absl::Now() < deadline) {
    const absl::Status asked = sched.SplitRange(req).status();
    if (asked.code() == absl::StatusCode::kUnavailable) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    if (!asked.ok() && asked.code() != absl::StatusCode::kFailedPrecondition) {
      return asked;
    }
    for (;;) {
      DP_ASSIGN_OR_RETURN(const proto::RangeAssignment* r, watched());
      if (done(*r)) return absl::OkStatus();
      if (!asked.ok()) return asked;
      if (!under_way(*r)) break;  // called off
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            what, ": not done within ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    std::cout << what << " called off; asking again" << std::endl;
  }
  return absl::DeadlineExceededError(
      absl::StrCat(what, ": still refused as busy or called off after ",
                   absl::FormatDuration(timeout)));
}

}  // namespace

absl::Status MergeAndAwait(SchedulerClient& sched, const std::string& table,
                           Key at, absl::Duration timeout) {
  proto::SplitRangeRequest req;
  req.set_table(table);
  req.set_key(at - 1);
  req.set_merge(true);
  return AskAndAwait(
      sched, req, absl::StrCat("the merge of '", table, "' at ", at), at,
      [&](const proto::RangeAssignment& r) { return r.begin() != at; },
      [](const proto::RangeAssignment& r) {
        return r.merge() == proto::RangeAssignment::MERGE_WITH_PREVIOUS;
      },
      timeout);
}

absl::Status SplitAndAwait(SchedulerClient& sched, const std::string& table,
                           Key key, absl::Duration timeout) {
  proto::SplitRangeRequest req;
  req.set_table(table);
  req.set_key(key);
  return AskAndAwait(
      sched, req, absl::StrCat("the split of '", table, "' at ", key), key,
      [&](const proto::RangeAssignment& r) { return r.begin() == key; },
      [&](const proto::RangeAssignment& r) { return r.split_at() == key; },
      timeout);
}

void ExactClusterTest::Start(int servers,
                             std::vector<std::string> scheduler_flags,
                             std::vector<std::string> server_flags,
                             bool durable) {
  dir_ = TestTmpDir() + "/" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
  ASSERT_EQ(system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str()), 0);
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir_;
  o.num_servers = servers;
  o.scheduler_flags = std::move(scheduler_flags);
  o.server_flags = std::move(server_flags);
  o.durable = durable;
  ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(o));
  sched_ = std::make_unique<SchedulerClient>(cluster_->scheduler_address());
  ClientOptions co;
  co.scheduler_address = cluster_->scheduler_address();
  ASSERT_OK_AND_ASSIGN(client_, Client::Connect(co));
  ASSERT_OK_AND_ASSIGN(
      tables_, CreateExactTables(client_.get(), 3000, 500, sparse_bounds_));
  writes_ =
      std::make_unique<ExactWrites>(cluster_->scheduler_address(), tables_);
}

void ExactClusterTest::TearDown() {
  if (writes_ != nullptr) (void)writes_->Stop();
  client_.reset();
  if (cluster_ != nullptr) {
    EXPECT_OK(cluster_->Stop());
  }
}

proto::ClusterMap ExactClusterTest::Map() {
  auto map = sched_->GetClusterMap();
  return map.ok() ? *map : proto::ClusterMap();
}

absl::StatusOr<proto::ClusterMap> ExactClusterTest::AwaitMap(
    const std::string& what, const MapPredicate& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  proto::ClusterMap map;
  while (absl::Now() < deadline) {
    auto m = sched_->GetClusterMap();
    if (m.ok()) {
      map = *std::move(m);
      if (pred(map)) return map;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no map where ", what, " within ", absl::FormatDuration(timeout),
      "; last:\n", map.DebugString()));
}

NodeId ExactClusterTest::IdOf(int index) {
  const proto::ClusterMap map = Map();
  const proto::NodeInfo* n = NodeNamed(map, absl::StrCat("server-", index));
  return n == nullptr ? kNoNode : n->id();
}

int ExactClusterTest::IndexOf(NodeId id) {
  const proto::ClusterMap map = Map();
  for (const auto& n : map.nodes()) {
    if (n.id() == id) return std::stoi(n.name().substr(7));
  }
  return -1;
}

void ExactClusterTest::Kill(int index) {
  std::cout << "kill -9 server-" << index << std::endl;
  cluster_->server(index).Signal(SIGKILL);
  EXPECT_OK(cluster_->server(index).Wait(absl::Seconds(10)));
}

void ExactClusterTest::AwaitWrites(uint64_t more) {
  ASSERT_OK(writes_->AwaitProgress(more, absl::Seconds(60)));
}

void ExactClusterTest::StopAndCheck(const std::string& when) {
  EXPECT_OK(writes_->Stop()) << when;
  EXPECT_OK(writes_->Check(client_.get())) << when;
  std::cout << when << ": " << writes_->acknowledged()
            << " row adds, all exact; longest wait for an add "
            << absl::FormatDuration(writes_->longest_wait()) << std::endl;
}

}  // namespace downpour
