// ps_export: writes a table's parameters to NumPy files (psctl/export.h),
// from a running cluster or from the data dirs of a checkpoint.
//
//   ps_export --scheduler=127.0.0.1:7070 --table=mlp/W0 --out=/tmp/w0
//   ps_export --data_dirs=/data/server-0,/data/server-1 --table=mlp/W0
//       --out=/tmp/w0 [--checkpoint=ID]          (one command line)
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/logging.h"
#include "psctl/export.h"

ABSL_FLAG(std::string, scheduler, "",
          "host:port of a running cluster's scheduler");
ABSL_FLAG(std::vector<std::string>, data_dirs, {},
          "instead: the servers' --data_dir folders (comma-separated)");
ABSL_FLAG(uint64_t, checkpoint, 0,
          "with --data_dirs: the checkpoint id (0: the newest holding the "
          "table)");
ABSL_FLAG(std::string, table, "", "the table's name");
ABSL_FLAG(std::string, out, "",
          "output prefix: <out>.npy (dense), or <out>.keys.npy and "
          "<out>.values.npy (sparse)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a table's parameters to NumPy .npy files");
  absl::ParseCommandLine(argc, argv);
  downpour::ExportOptions o;
  o.table = absl::GetFlag(FLAGS_table);
  o.out = absl::GetFlag(FLAGS_out);
  const std::string scheduler = absl::GetFlag(FLAGS_scheduler);
  const std::vector<std::string> dirs = absl::GetFlag(FLAGS_data_dirs);
  if (o.table.empty() || o.out.empty() || scheduler.empty() == dirs.empty()) {
    DP_LOG(ERROR) << "need --table, --out, and one of --scheduler or "
                     "--data_dirs";
    return 2;
  }
  absl::StatusOr<downpour::ExportResult> r;
  if (!scheduler.empty()) {
    auto auth = downpour::ClusterAuth::FromFlags(downpour::kGrpcClient);
    if (!auth.ok()) {
      DP_LOG(ERROR) << auth.status();
      return 2;
    }
    r = downpour::ExportFromCluster(scheduler, *auth, o);
  } else {
    r = downpour::ExportFromCheckpoint(dirs, absl::GetFlag(FLAGS_checkpoint),
                                       o);
  }
  if (!r.ok()) {
    DP_LOG(ERROR) << r.status();
    return 1;
  }
  DP_LOG(INFO) << "table '" << o.table << "': " << r->rows << " rows of width "
               << r->width
               << (r->checkpoint != 0
                       ? absl::StrCat(" from checkpoint ", r->checkpoint,
                                      " (clock ", r->clock, ")")
                       : std::string())
               << " -> " << absl::StrJoin(r->files, ", ");
  return 0;
}
