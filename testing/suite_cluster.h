// The cluster a test suite shares: a scheduler and servers as real
// processes (launch/local_cluster.h), started once for the suite, with a
// client connected to it and the figures tests read from the servers.
//
//   class MyTest : public ::testing::Test {
//    protected:
//     static void SetUpTestSuite() {
//       LocalClusterOptions o = SuiteCluster::Defaults();
//       o.server_flags = {"--max_message_mb=1"};
//       ASSERT_OK(suite_.Start(o));
//     }
//     static void TearDownTestSuite() { EXPECT_OK(suite_.Stop()); }
//     static SuiteCluster suite_;
//   };
//   SuiteCluster MyTest::suite_;
//   ... suite_.client().PutSync(...); suite_.cluster().server(0).Signal(...)
//
// Not thread-safe: the suite's set-up and tear-down use it; tests may share
// its client (which is thread-safe) across threads.
#ifndef DOWNPOUR_TESTING_SUITE_CLUSTER_H_
#define DOWNPOUR_TESTING_SUITE_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/auth.h"
#include "launch/local_cluster.h"
#include "proto/downpour.pb.h"

namespace downpour {

class SuiteCluster {
 public:
  // Binaries from the test's runfiles, logs under TEST_TMPDIR, two servers.
  static LocalClusterOptions Defaults();

  // Starts the cluster and, with `connect_client`, connects a client (its
  // operations time out after `op_timeout`; it authenticates with the
  // cluster's secret, if any). REQUIRES: not started.
  absl::Status Start(const LocalClusterOptions& options,
                     bool connect_client = true,
                     absl::Duration op_timeout = absl::Seconds(20));
  // Closes the client and stops every process (SIGTERM; the exit statuses
  // are checked: killed processes are skipped). OK if never started.
  absl::Status Stop();

  LocalCluster& cluster() { return *cluster_; }
  // REQUIRES: started with connect_client.
  Client& client() { return *client_; }
  const std::string& scheduler_address() const {
    return cluster_->scheduler_address();
  }
  // The cluster's own credentials: its secret, or none.
  const ClusterAuth& auth() const { return auth_; }

  // The scheduler's current map.
  absl::StatusOr<proto::ClusterMap> Map() const;
  // Every live server's admin statistics, in the map's order.
  absl::StatusOr<std::vector<proto::ServerStats>> ServerStats() const;
  // Table `name`'s figures summed over the servers (rows, bytes, counters).
  absl::StatusOr<proto::TableStats> TableStats(const std::string& name) const;

 private:
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
  ClusterAuth auth_;
};

}  // namespace downpour

#endif  // DOWNPOUR_TESTING_SUITE_CLUSTER_H_
