// A test fixture for cluster changes under load: a LocalCluster of real
// daemons, the exact tables of tests/exact_writes.h with their writers, and
// the map queries the elastic and split tests wait on. Shared by
// tests/elastic_test.cc and tests/split_test.cc; the tests that split a
// range of their own cluster use SplitAndAwait.
#ifndef DOWNPOUR_TESTS_CLUSTER_FIXTURE_H_
#define DOWNPOUR_TESTS_CLUSTER_FIXTURE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/types.h"
#include "gtest/gtest.h"
#include "launch/local_cluster.h"
#include "proto/downpour.pb.h"
#include "tests/exact_writes.h"

namespace downpour {

using MapPredicate = std::function<bool(const proto::ClusterMap&)>;

// The server named `name` ("server-2"), or nullptr.
const proto::NodeInfo* NodeNamed(const proto::ClusterMap& map,
                                 const std::string& name);
// Whether `id` is the range's primary, backup or a copy catching up.
bool Holds(const proto::RangeAssignment& r, NodeId id);
int RangesHeldBy(const proto::ClusterMap& map, NodeId id);
const proto::TableMap* TableNamed(const proto::ClusterMap& map,
                                  const std::string& name);
// The range of table `name` holding `key`, or nullptr.
const proto::RangeAssignment* RangeOf(const proto::ClusterMap& map,
                                      const std::string& name, Key key);
// No move, copy, handover, split or merge under way, and every range has
// `replicas` holders in sync.
bool Settled(const proto::ClusterMap& map, int replicas);

// Asks the scheduler to split table `table` at `key` and waits until a range
// begins there (at once if one does already). A split refused while the
// range is busy (UNAVAILABLE: a copy or handover under way) or called off by
// the scheduler (its servers' report came after the handover timeout) is
// asked again, as psctl's user would. Any other refusal, or no split within
// `timeout`, is the error.
absl::Status SplitAndAwait(SchedulerClient& sched, const std::string& table,
                           Key key, absl::Duration timeout);

// Asks the scheduler to merge the two ranges of table `table` that meet at
// `at` and waits until no range begins there (at once if none does). Busy
// refusals and merges called off are asked again, as in SplitAndAwait.
absl::Status MergeAndAwait(SchedulerClient& sched, const std::string& table,
                           Key at, absl::Duration timeout);

class ExactClusterTest : public ::testing::Test {
 protected:
  // Starts `servers` servers and a scheduler in a fresh directory named
  // after the test, connects client_, creates the exact tables and makes
  // (but does not start) the writers.
  void Start(int servers, std::vector<std::string> scheduler_flags,
             std::vector<std::string> server_flags = {}, bool durable = false);
  void TearDown() override;

  // The scheduler's current map (empty if it cannot be read).
  proto::ClusterMap Map();
  // Polls the map every 5 ms until `pred` holds; the error after `timeout`
  // names `what` and shows the last map.
  absl::StatusOr<proto::ClusterMap> AwaitMap(const std::string& what,
                                             const MapPredicate& pred,
                                             absl::Duration timeout);
  // Node id of server-`index`, or kNoNode; and the index of a node id, or -1.
  NodeId IdOf(int index);
  int IndexOf(NodeId id);
  // kill -9 of server-`index`, then reaps it.
  void Kill(int index);
  // Writers on, `more` row adds acknowledged past this point.
  void AwaitWrites(uint64_t more);
  // Stops the writers: none failed, every row exact.
  void StopAndCheck(const std::string& when);

  // Bounds of the exact "sparse" table, if set before Start.
  std::optional<TableOptions::Bounds> sparse_bounds_;
  std::string dir_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<SchedulerClient> sched_;
  std::unique_ptr<Client> client_;
  ExactTables tables_;
  std::unique_ptr<ExactWrites> writes_;
};

}  // namespace downpour

#endif  // DOWNPOUR_TESTS_CLUSTER_FIXTURE_H_
