// psctl's view of a cluster: the scheduler's map and job status, every
// server's stats sampled twice (rates), the gRPC health of each daemon,
// and per-table summaries; and the human tables psctl prints of it.
//
//   StatusOptions o;
//   o.scheduler_address = "127.0.0.1:7070";
//   DP_ASSIGN_OR_RETURN(psctl::ClusterStatus s, GatherStatus(o));
//   std::cout << FormatStatus(s);
//
// Thread-compatible.
#ifndef DOWNPOUR_PSCTL_CLUSTER_STATUS_H_
#define DOWNPOUR_PSCTL_CLUSTER_STATUS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "psctl/psctl.pb.h"

namespace downpour {

struct StatusOptions {
  std::string scheduler_address;
  ClusterAuth auth;  // the cluster secret, if it has one
  // Between the two samples of the servers' stats; zero: one sample and no
  // rates.
  absl::Duration interval = absl::Seconds(1);
  absl::Duration rpc_timeout = absl::Seconds(5);
};

// Errors are the scheduler's (kUnavailable when it cannot be reached,
// kUnauthenticated without the right secret), with its address. A server
// that does not answer is reported in its ServerStatus (health
// UNREACHABLE, error), not as an error.
absl::StatusOr<psctl::ClusterStatus> GatherStatus(const StatusOptions& options);

// The tables `psctl status` prints: the cluster line, the job line, nodes
// (servers with health and rates, workers), ranges with primary, backups,
// catching-up backups and flags (lost, unavailable), and workers' clocks.
// `wide` (-o wide) adds the nodes' request rate, epoch, data endpoint and
// incarnation.
std::string FormatStatus(const psctl::ClusterStatus& status, bool wide = false);
// `psctl tables`: one line per table; `wide` adds value and state bytes,
// the initializer and the BSP steps aggregated.
std::string FormatTables(const psctl::ClusterStatus& status, bool wide = false);

// `psctl tables`' second part: one line per key range with its holders,
// a move under way, its rows, bytes and load (requests and rows per
// second at its primary).
std::string FormatRanges(const psctl::ClusterStatus& status);

// Rows of cells as aligned columns, the first row a header.
std::string TextTable(const std::vector<std::vector<std::string>>& rows);

}  // namespace downpour

#endif  // DOWNPOUR_PSCTL_CLUSTER_STATUS_H_
