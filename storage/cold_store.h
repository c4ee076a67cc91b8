// The cold tier of a server's bounded sparse tables (TableSpec.bounds
// .cold_tier): rows evicted from memory, kept in files under the server's
// --data_dir until they are written again.
//
//   auto cold = ColdStore::Open(data_dir + "/cold");  // starts empty
//   ColdRange r(cold->get(), table_id, range_begin, row_floats);
//   DP_RETURN_IF_ERROR(r.PutBatch(keys, rows));      // values, then state
//   DP_RETURN_IF_ERROR(r.GetBatch(keys, out, &found));
//
// Layout: a range's rows are fixed-size records (the key, a tag, the
// row's floats) in chunk files of about 4 MiB, each mapped into memory. A
// key keeps its record once written: a later put overwrites it in place.
// So a put or get is a copy; the kernel keeps the records in use in its
// page cache and writes the others to disk (the server's own memory stays
// bounded; its resident mapped pages are cache the kernel reclaims). The
// index, key to record, is in memory: 16 to 32 bytes a cold key. Growing
// reserves a chunk's blocks first, so that a full disk is an error at a
// put; an I/O error reading a record back is a fault (SIGBUS), as in any
// mapped store.
//
// Why records and not RocksDB (what the tier was first): rows cycle
// between memory and the tier at the rate of the training's batches, and
// there each row moved cost about 4 us (a memtable insert on the way out,
// a MultiGet through memtables and level-0 files on the way back), four
// times the whole in-memory step. Rows are one size per range and are only
// put, got and walked, which records do with a copy each.
//
// The tier extends memory, it is not durable: nothing is synced until a
// checkpoint, Open deletes whatever an earlier process left (a new process
// holds no rows; its ranges are copied from a live holder or restored from
// a checkpoint), and a ColdRange deletes its files when it goes.
// Checkpoints take a range's chunks as hard links (Snapshot: the chunks
// are synced and linked, nothing is copied), and the range copies a linked
// chunk before its next write to it (copy on write, a chunk at a time); a
// restore reads the copy back (ReadSnapshot).
//
// Thread-compatible: a ColdRange belongs to one thread; Snapshot must not
// run while the ranges it copies are written (the server calls both on its
// data thread). ColdRange's constructor and destructor, and Snapshot, may
// run on different threads (the store's registry is locked).
#ifndef DOWNPOUR_STORAGE_COLD_STORE_H_
#define DOWNPOUR_STORAGE_COLD_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace downpour {
namespace storage {

class ColdRange;

class ColdStore {
 public:
  // Opens (creating, or emptying what a previous process left) the tier in
  // `dir`. kFailedPrecondition if the folder cannot be emptied or made.
  static absl::StatusOr<std::unique_ptr<ColdStore>> Open(
      const std::string& dir);
  ~ColdStore();

  const std::string& dir() const { return dir_; }

  // Takes the rows of `ranges` ((table, range begin) pairs) into the new
  // folder `dir`, synced: hard links of their chunks (ColdRange::
  // SnapshotTo). A range with no rows in the tier gets no file.
  absl::Status Snapshot(const std::string& dir,
                        absl::Span<const std::pair<uint32_t, uint64_t>> ranges);
  // Calls fn(key, row) for every row of (table, range begin) in a copy made
  // by Snapshot (none if the copy holds no rows of that range). kNotFound if
  // there is no copy in `dir`; kDataLoss for a damaged file.
  static absl::Status ReadSnapshot(
      const std::string& dir, uint32_t table, uint64_t range_begin,
      const std::function<absl::Status(uint64_t, absl::Span<const float>)>& fn);

 private:
  friend class ColdRange;
  explicit ColdStore(std::string dir) : dir_(std::move(dir)) {}
  // The newest ColdRange of (table, begin) registers (and gets the prefix
  // of its files' names); an older one that goes later does not
  // unregister it.
  std::string Register(ColdRange* range, uint32_t table, uint64_t begin);
  void Unregister(ColdRange* range, uint32_t table, uint64_t begin);

  const std::string dir_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, ColdRange*> ranges_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_file_ ABSL_GUARDED_BY(mu_) = 0;
};

// The rows of one range in the tier, each `row_floats` floats.
class ColdRange {
 public:
  // `store` must outlive it. Files are made at the first put.
  ColdRange(ColdStore* store, uint32_t table, uint64_t range_begin,
            size_t row_floats);
  ~ColdRange();
  ColdRange(const ColdRange&) = delete;
  ColdRange& operator=(const ColdRange&) = delete;

  // Errors of the files (a full disk: kResourceExhausted) change nothing
  // already stored; rows put before the error in the same call are in.
  absl::Status Put(uint64_t key, absl::Span<const float> row);
  // Puts of `keys.size()` rows (rows: one after another).
  absl::Status PutBatch(absl::Span<const uint64_t> keys,
                        absl::Span<const float> rows);
  // Row i into rows[i * row_floats ...] and found[i] (current rows only,
  // as below).
  absl::Status GetBatch(absl::Span<const uint64_t> keys, absl::Span<float> rows,
                        std::vector<bool>* found);
  // False if absent. kInvalidArgument for a row of the wrong size.
  absl::StatusOr<bool> Get(uint64_t key, absl::Span<float> row);
  absl::Status Delete(uint64_t key);
  // Every row of the range.
  absl::Status Clear();

  // A row the tier holds is current until Forget: the caller brought it
  // back into memory, so the tier's copy is stale. Gets and walks skip it;
  // its record stays for the key's next put (which makes it current
  // again), and a Snapshot takes it (a restore finds the key in memory
  // too). Forget is false if the row was not current.
  bool Contains(uint64_t key) const;
  bool Forget(uint64_t key);
  // Current rows.
  uint64_t size() const { return current_; }
  // Memory the index takes.
  uint64_t index_bytes() const;
  // Appends the rows from position `cursor` on (0 for the first call) until
  // `max_rows` rows are appended or the range ends; returns the cursor of
  // the next call, or nullopt at the end. A key keeps its position, and new
  // keys come after the others: a walk sees once every row current when it
  // started and still current when it passes, whatever is put meanwhile.
  absl::StatusOr<std::optional<uint64_t>> Scan(uint64_t cursor, size_t max_rows,
                                               std::vector<uint64_t>* keys,
                                               std::vector<float>* rows);

  // Links the range's chunks (synced) and a header counting their records
  // into the folder `dir`, as `name` and `name`.<chunk>; the range copies
  // a linked chunk before it next writes to it. Nothing if no row was ever
  // put.
  absl::Status SnapshotTo(const std::string& dir, const std::string& name);
  uint64_t records() const { return slots_; }
  // Chunk files made so far (copies on write included); for tests.
  uint64_t files_made() const { return next_file_; }

 private:
  struct Chunk {
    char* data = nullptr;  // mapped, chunk_bytes_
    int fd = -1;
    std::string path;
    bool shared = false;  // linked into a snapshot: copied before a write
    bool dirty = false;   // written since it was last synced
  };
  // The record of `slot`. REQUIRES: its chunk exists (Reserve).
  char* Record(uint64_t slot) const;
  // Makes the chunks up to that of `slot`.
  absl::Status Reserve(uint64_t slot);
  // The chunk of `slot` may be written: copied first if shared; marked
  // dirty.
  absl::Status Writable(uint64_t slot);
  // A new file for chunk `index`: blocks reserved, mapped, and filled from
  // the file `from` (-1: zeros).
  absl::StatusOr<Chunk> NewChunk(size_t index, int from);
  // Unmaps and closes `c`, and unlinks its file (a snapshot keeps its own
  // link).
  void Drop(Chunk& c) const;

  ColdStore* const store_;
  const uint32_t table_;
  const uint64_t range_begin_;
  const size_t row_floats_;
  const size_t record_bytes_;
  const size_t records_per_chunk_;
  const size_t chunk_bytes_;
  std::string base_;  // the chunk files' names without their suffix
  uint64_t next_file_ = 0;
  std::vector<Chunk> chunks_;
  uint64_t slots_ = 0;  // records handed out, in order
  // Every key with a record: its slot, kStale set while it is not current.
  absl::flat_hash_map<uint64_t, uint64_t> slot_of_;
  uint64_t current_ = 0;
};

}  // namespace storage
}  // namespace downpour

#endif  // DOWNPOUR_STORAGE_COLD_STORE_H_
