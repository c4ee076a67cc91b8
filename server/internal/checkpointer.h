// A server's part of checkpoints, restores and export (docs/ARCHITECTURE.md,
// "Checkpoints"): what the admin service's CheckpointPart, DropCheckpoints,
// Restore and ExportRows do.
//
// Write (CheckpointPart WRITE, from the scheduler): every range this server
// serves as primary is cut on the data thread, where it lives: a range of a
// table that aggregates BSP steps once every part of it has applied step
// clock - 1 and not step clock (at once if it already has, or as soon as
// the request completing that step is handled: AfterRequest), any other
// range at once. The cut copies the range (RangeStore::ExportRows into
// pooled chunks, reused across checkpoints: fresh pages are ~40x slower on
// these machines) with its ledgers; the calling (gRPC) thread writes the
// copies to the data dir (storage/checkpoint_store.h) while the data thread
// goes on, then records the part. Errors: kAborted when a part is already
// past the clock (the scheduler retries with a later one) or a range moved
// during the cut, kDataLoss for a lost range, kDeadlineExceeded when a
// range never reaches the clock (a step that does not complete: a worker
// missing), kFailedPrecondition without a data dir or while another
// checkpoint is being written, storage errors (kResourceExhausted: disk
// full) otherwise.
//
// Restore: loads the named ranges of a finished part into the ranges this
// server holds as primaries (the map must assign them first:
// kFailedPrecondition until then), chunk by chunk on the data thread.
// kNotFound when the part or a range is not in the data dir.
//
// Thread-safe: the blocking calls run on any thread (not the data thread);
// AfterRequest runs on the data thread only.
#ifndef DOWNPOUR_SERVER_INTERNAL_CHECKPOINTER_H_
#define DOWNPOUR_SERVER_INTERNAL_CHECKPOINTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/downpour.pb.h"
#include "server/internal/dispatcher.h"
#include "storage/checkpoint_store.h"
#include "storage/cold_store.h"
#include "storage/database.h"
#include "transport/frames.h"

namespace downpour {
namespace server_internal {

// How the checkpointer reaches the data thread.
struct DataThread {
  // Runs the closure on the data thread, between requests (never blocks).
  std::function<void(std::function<void()>)> post;
  // Sends a deferred reply; on the data thread only.
  std::function<void(DeferredReply)> send_deferred;
};

class Checkpointer {
 public:
  // `db` may be null (no data dir: checkpoints fail with
  // kFailedPrecondition; export still works). `cold` (may be null) is the
  // server's cold tier: a checkpoint takes a hard-linked copy of it in the
  // folder beside it, `<cold dir>-checkpoints/<id>/<n>`, rather than copy
  // its rows. `dispatcher`, `db` and `cold` must outlive the checkpointer.
  Checkpointer(std::string server_name, storage::Database* db,
               const Dispatcher* dispatcher, DataThread data,
               size_t chunk_bytes = size_t{4} << 20,
               storage::ColdStore* cold = nullptr);
  ~Checkpointer();

  absl::StatusOr<proto::CheckpointPartReply> CheckpointPart(
      const proto::CheckpointPartRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DropCheckpoints(const proto::DropCheckpointsRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<proto::RestoreReply> Restore(const proto::RestoreRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<proto::ExportRowsReply> ExportRows(
      const proto::ExportRowsRequest& req) ABSL_LOCKS_EXCLUDED(mu_);

  // Data thread: after each request. Cuts the ranges that were waiting for
  // the step this request may have completed. Does nothing (no lock) while
  // no checkpoint waits.
  void AfterRequest();

  // For a server stopping on SIGTERM: waits until a checkpoint that starts
  // after `since` has completed (the scheduler's DropCheckpoints names it),
  // for at most `grace`; returns at once if none starts within
  // `start_wait`. True if one completed.
  bool AwaitCheckpointAfter(absl::Time since, absl::Duration start_wait,
                            absl::Duration grace) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocking calls in progress return kUnavailable; later ones too. Call
  // before the data thread stops.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Captured;
  struct Cut;
  struct Call;
  struct Waiting;

  // Runs fn on the data thread and waits for it (or Stop). fn must own
  // what it touches (the wait may end first, at Stop).
  absl::Status OnDataThread(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // Data thread.
  void StartCut(const std::shared_ptr<Cut>& cut);
  void CheckWaiting();
  std::unique_ptr<Captured> Capture(TableId id, const TableShard& shard,
                                    TableShard::Range& range);
  std::unique_ptr<RowChunk> TakeChunk() ABSL_LOCKS_EXCLUDED(mu_);
  void ReturnChunks(std::vector<std::unique_ptr<RowChunk>> chunks)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<proto::CheckpointPartReply> Probe();
  absl::StatusOr<proto::CheckpointPartReply> Write(
      const proto::CheckpointPartRequest& req);

  const std::string name_;
  storage::Database* const db_;
  storage::ColdStore* const cold_;
  // Takes a copy of the cold tier for the ranges of `captured` that keep
  // one (data thread: at their cut). Records it in each.
  absl::Status SnapshotCold(uint64_t checkpoint,
                            std::vector<std::unique_ptr<Captured>>& captured);
  std::string ColdSnapshotDir(const std::string& name) const;
  // Loads the cold rows of range `kr` of `table` from copy `snapshot`.
  absl::Status RestoreCold(const std::string& snapshot, TableId table,
                           KeyRange kr, size_t width,
                           proto::RestoreReply* reply);
  uint64_t cold_snapshots_ = 0;  // data thread only
  const Dispatcher* const dispatcher_;
  const DataThread data_;
  const size_t chunk_bytes_;
  std::unique_ptr<storage::CheckpointStore> store_;  // null without db_

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool restoring_ ABSL_GUARDED_BY(mu_) = false;
  // Copies of ranges, reused across checkpoints and restores.
  std::vector<std::unique_ptr<RowChunk>> free_chunks_ ABSL_GUARDED_BY(mu_);
  // Draining: when the last checkpoint request came, and the newest
  // checkpoint the scheduler reported complete.
  absl::Time last_request_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t last_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;

  // Data thread only: the cut waiting for ranges to reach its clock.
  std::shared_ptr<Cut> pending_;
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_CHECKPOINTER_H_
