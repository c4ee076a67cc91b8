// One server's checkpoints in its data directory (ps_server --data_dir): the
// format, shared by the server (writing and restoring), the export tool
// (reading a stopped server's directory) and tests.
//
//   CheckpointStore store(db);
//   store.WriteChunk(id, table, range_begin, 0, info, keys, floats);  // ...
//   store.FinishPart(part);          // rows durable, then the part record
//   auto part = store.ReadPart(id);  // kNotFound unless finished
//   store.ReadChunks(id, table, range_begin, [](const StoredChunk& c) {...});
//
// Layout (keys sort by number: big-endian):
//   "rows/" id table range_begin chunk -> [u32 n][RowChunkInfo (n bytes)]
//                                          [u64 k][k keys (sparse ranges)]
//                                          [floats, little-endian]
//   "part/" id                         -> CheckpointPart, written last
// A part whose record is absent is incomplete (a crash, a failed write) and
// is never read; DropBefore and Drop remove its rows too.
//
// Durability: rows are written without the log (a checkpoint is hundreds of
// megabytes) and made durable by one Flush before the part record, which
// is written synced. So after a crash a part is complete or absent.
//
// Thread-compatible: one thread writes a part at a time; reads may run on
// other threads.
#ifndef DOWNPOUR_STORAGE_CHECKPOINT_STORE_H_
#define DOWNPOUR_STORAGE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/downpour.pb.h"
#include "storage/database.h"

namespace downpour {
namespace storage {

// A chunk of a range's rows as stored (see RowChunkInfo: the floats hold
// the values, then the handler state if has_state, then each named vector).
struct StoredChunk {
  proto::RowChunkInfo info;
  absl::Span<const uint64_t> keys;  // sparse rows' keys; empty for dense
  absl::Span<const float> data;
};

class CheckpointStore {
 public:
  // `db` must outlive the store.
  explicit CheckpointStore(Database* db) : db_(db) {}

  // Stores chunk number `chunk` (0, 1, ... in order) of the range of
  // `table` that begins at `range_begin`, for checkpoint `id`. Not durable
  // until FinishPart.
  absl::Status WriteChunk(uint64_t id, uint32_t table, uint64_t range_begin,
                          uint64_t chunk, const proto::RowChunkInfo& info,
                          absl::Span<const uint64_t> keys,
                          absl::Span<const float> data);
  // Makes every chunk written durable, then records `part` (synced).
  absl::Status FinishPart(const proto::CheckpointPart& part);

  // The record of a finished part; kNotFound if it is absent (never
  // written, unfinished or dropped), kDataLoss if unreadable.
  absl::StatusOr<proto::CheckpointPart> ReadPart(uint64_t id);
  // Ids of the finished parts, ascending.
  absl::StatusOr<std::vector<uint64_t>> FinishedParts();
  // Calls fn on each stored chunk of a range, in order; the chunk's views
  // are valid during the call. Stops at fn's first error. kDataLoss for a
  // malformed chunk or a gap in the numbering, or when fewer than
  // `expected_chunks` are found.
  absl::Status ReadChunks(
      uint64_t id, uint32_t table, uint64_t range_begin,
      uint64_t expected_chunks,
      const std::function<absl::Status(const StoredChunk&)>& fn);

  // Removes checkpoint `id` (its record first, then its rows).
  absl::Status Drop(uint64_t id);
  // Removes every checkpoint with an id below `keep_from`.
  absl::Status DropBefore(uint64_t keep_from);

 private:
  Database* const db_;
  WriteBatch batch_;  // reused: its buffer keeps its capacity
  std::string key_;
  std::string header_;
  // ReadChunks copies values here (RocksDB's are not aligned for floats).
  std::vector<uint64_t> read_keys_;
  std::vector<float> read_data_;
};

}  // namespace storage
}  // namespace downpour

#endif  // DOWNPOUR_STORAGE_CHECKPOINT_STORE_H_
