// Writes the parameters (vector 0) of one table to NumPy files anyone can
// read (psctl/npy.h): a dense table as <out>.npy, float32 of shape
// [num_keys, width]; a sparse one as <out>.keys.npy (uint64, [rows]) and
// <out>.values.npy (float32, [rows, width]), keys ascending.
//
//   ExportFromCluster("127.0.0.1:7070", auth, {"mlp/W0", "/tmp/w0"});
//   ExportFromCheckpoint({"/data/server-0", "/data/server-1"}, 0,
//                        {"mlp/W0", "/tmp/w0"});
//
// From a running cluster each range is read from its primary
// (ServerAdmin.ExportRows) a chunk at a time: not a snapshot while
// training goes on (take a checkpoint for that). From a checkpoint, the
// data dirs of the servers (stopped ones, or copies) are read directly:
// checkpoint 0 means the newest whose parts hold the whole table.
//
// Errors: kNotFound for an unknown table or a checkpoint that does not hold
// it whole (naming the keys missing), kDataLoss for a lost range, storage
// and RPC errors otherwise.
#ifndef DOWNPOUR_PSCTL_EXPORT_H_
#define DOWNPOUR_PSCTL_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth.h"

namespace downpour {

struct ExportOptions {
  std::string table;  // its name
  std::string out;    // file prefix
};

struct ExportResult {
  std::vector<std::string> files;
  uint64_t rows = 0;
  uint32_t width = 0;
  bool sparse = false;
  uint64_t checkpoint = 0;  // ExportFromCheckpoint: the one read
  int64_t clock = -1;       // and its clock
};

absl::StatusOr<ExportResult> ExportFromCluster(
    const std::string& scheduler_address, const ClusterAuth& auth,
    const ExportOptions& options);

absl::StatusOr<ExportResult> ExportFromCheckpoint(
    const std::vector<std::string>& data_dirs, uint64_t checkpoint,
    const ExportOptions& options);

}  // namespace downpour

#endif  // DOWNPOUR_PSCTL_EXPORT_H_
