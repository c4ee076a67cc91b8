// The cold tier of a server's bounded sparse tables (TableSpec.bounds
// .cold_tier): rows evicted from memory, kept in one RocksDB under the
// server's --data_dir until they are written again.
//
//   auto cold = ColdStore::Open(data_dir + "/cold");  // starts empty
//   ColdRange r(cold->get(), table_id, range_begin, row_floats);
//   DP_RETURN_IF_ERROR(r.Put(key, row));              // values, then state
//   absl::StatusOr<bool> found = r.Get(key, row);
//
// The tier extends memory, it is not durable: writes skip the log and are
// never synced, and Open deletes whatever an earlier process left (a new
// process holds no rows; its ranges are copied from a live holder or
// restored from a checkpoint). Checkpoints take a hard-linked copy of the
// whole tier (Snapshot) instead of copying its rows; a restore reads a
// range's rows back from that copy (ReadSnapshot).
//
// Layout: [u32 table][u64 range begin][u32 bucket][u64 key] -> row floats,
// big-endian numbers; the bucket (ColdBucket: 20 bits of a hash of the key)
// lets a copy walk a range a bucket at a time with a small cursor.
//
// Thread-safe (RocksDB is); a ColdRange belongs to one thread.
#ifndef DOWNPOUR_STORAGE_COLD_STORE_H_
#define DOWNPOUR_STORAGE_COLD_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "storage/database.h"

namespace downpour {
namespace storage {

constexpr uint32_t kColdBuckets = 1u << 20;
// The bucket of `key` in [0, kColdBuckets).
uint32_t ColdBucket(uint64_t key);

class ColdStore {
 public:
  // Opens (creating, or emptying what a previous process left) the tier in
  // `dir`. Errors as Database::Open (kFailedPrecondition: in use).
  static absl::StatusOr<std::unique_ptr<ColdStore>> Open(
      const std::string& dir);

  Database& db() { return *db_; }
  const std::string& dir() const { return db_->path(); }
  // A hard-linked copy of the whole tier in the new folder `dir`.
  absl::Status Snapshot(const std::string& dir);
  // Calls fn(key, row) for every row of (table, range begin) in a copy made
  // by Snapshot. kNotFound if there is no copy in `dir`.
  static absl::Status ReadSnapshot(
      const std::string& dir, uint32_t table, uint64_t range_begin,
      const std::function<absl::Status(uint64_t, absl::Span<const float>)>& fn);

 private:
  explicit ColdStore(std::unique_ptr<Database> db) : db_(std::move(db)) {}
  std::unique_ptr<Database> db_;
};

// The rows of one range in the tier, each `row_floats` floats.
class ColdRange {
 public:
  // `store` must outlive it.
  ColdRange(ColdStore* store, uint32_t table, uint64_t range_begin,
            size_t row_floats);

  absl::Status Put(uint64_t key, absl::Span<const float> row);
  // Puts of `keys.size()` rows (rows: one after another) as one write.
  absl::Status PutBatch(absl::Span<const uint64_t> keys,
                        absl::Span<const float> rows);
  // Gets of several rows at once (one MultiGet): row i into
  // rows[i * row_floats ...] and found[i]. kDataLoss for a stored row of
  // the wrong size.
  absl::Status GetBatch(absl::Span<const uint64_t> keys, absl::Span<float> rows,
                        std::vector<bool>* found);
  // False if absent. kDataLoss for a stored row of the wrong size.
  absl::StatusOr<bool> Get(uint64_t key, absl::Span<float> row);
  absl::Status Delete(uint64_t key);
  // Every row of the range.
  absl::Status Clear();
  // Appends the rows of buckets `bucket`, `bucket` + 1, ... (whole buckets)
  // until at least `max_rows` rows are appended or the range ends. Returns
  // the next bucket, or nullopt at the end.
  absl::StatusOr<std::optional<uint32_t>> Scan(uint32_t bucket, size_t max_rows,
                                               std::vector<uint64_t>* keys,
                                               std::vector<float>* rows);

 private:
  std::string Key(uint64_t key) const;
  ColdStore* const store_;
  const uint32_t table_;
  const uint64_t range_begin_;
  const size_t row_floats_;
  std::string prefix_;
  std::string scratch_;
};

}  // namespace storage
}  // namespace downpour

#endif  // DOWNPOUR_STORAGE_COLD_STORE_H_
