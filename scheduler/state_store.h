// What ps_scheduler keeps in its --state_dir, so that a restarted scheduler
// resumes with the same nodes, ids, tables, map, ranks and checkpoints
// (docs/ARCHITECTURE.md, "Scheduler state"):
//   "state"            SchedulerState: written synced before every change of
//                      membership, tables, the map, ranks or ids is
//                      published
//   "clocks"           SchedulerClocks: the workers' clocks, written every few
//                      hundred milliseconds, not synced (lower bounds: the
//                      workers' next reports raise them)
//   "manifest/" id     CheckpointManifest: synced, once a checkpoint is
//                      complete
//
// Errors: kFailedPrecondition from Open when another scheduler holds the
// directory; the storage codes (storage/database.h) otherwise, each naming
// the directory.
//
// Thread-safe.
#ifndef DOWNPOUR_SCHEDULER_STATE_STORE_H_
#define DOWNPOUR_SCHEDULER_STATE_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/downpour.pb.h"
#include "storage/database.h"

namespace downpour {

class StateStore {
 public:
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(
      const std::string& dir);

  const std::string& dir() const { return db_->path(); }

  // nullopt for a directory that holds no state yet.
  absl::StatusOr<std::optional<proto::SchedulerState>> LoadState();
  absl::StatusOr<proto::SchedulerClocks> LoadClocks();  // empty if none
  // Oldest first.
  absl::StatusOr<std::vector<proto::CheckpointManifest>> LoadManifests();

  // A serialized SchedulerState; synced.
  absl::Status SaveState(const std::string& state);
  absl::Status SaveClocks(const proto::SchedulerClocks& clocks);  // unsynced
  absl::Status SaveManifest(const proto::CheckpointManifest& manifest);
  absl::Status DeleteManifest(uint64_t id);

 private:
  explicit StateStore(std::unique_ptr<storage::Database> db)
      : db_(std::move(db)) {}
  std::unique_ptr<storage::Database> db_;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_STATE_STORE_H_
