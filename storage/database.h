// A small key-value database on local disk, the only code that uses RocksDB
// (docs/ARCHITECTURE.md, "Checkpoints and scheduler state"). The scheduler
// keeps its state in one (--state_dir), each server its checkpoints
// (--data_dir).
//
//   auto db = Database::Open("/var/lib/downpour/state", {});
//   DP_RETURN_IF_ERROR((*db)->Put("state", bytes, {.sync = true}));
//   absl::StatusOr<std::string> v = (*db)->Get("state");   // kNotFound
//   WriteBatch batch;
//   batch.Put(key, {header, payload});       // the parts are concatenated
//   (*db)->Write(&batch, {.wal = false});    // bulk: durable after Flush()
//   (*db)->Flush();
//
// Durability: a write with `sync` is on disk when it returns (its log is
// fsynced). A write with `wal = false` skips the log and is durable only
// after a later Flush() returns: the bulk path of checkpoints, which write
// hundreds of megabytes that a crash may lose anyway (the checkpoint is then
// incomplete and ignored).
//
// Errors: kFailedPrecondition when the directory is in use by another
// process (RocksDB's lock) or a read-only open finds no database there;
// kResourceExhausted when the disk is full; kDataLoss for corruption;
// kNotFound from Get for an absent key; kInternal or kUnavailable for other
// I/O errors. Each message names the directory. After a failed write the
// database refuses writes until Resume() succeeds (e.g. once space is
// freed).
//
// Thread-safe: any number of threads may call any method, except that a
// WriteBatch belongs to one thread.
#ifndef DOWNPOUR_STORAGE_DATABASE_H_
#define DOWNPOUR_STORAGE_DATABASE_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace downpour {
namespace storage {

struct DatabaseOptions {
  bool create_if_missing = true;
  // Opens without the lock and without writing (a tool reading the data dir
  // of a stopped server). kFailedPrecondition if there is no database.
  bool read_only = false;
  // Tuned for large bulk writes that are dropped whole (checkpoints): big
  // memtables, no compression, no automatic compaction (Reclaim compacts
  // what a drop freed). Otherwise: small values, RocksDB's defaults.
  bool bulk = false;
  // Fault injection (tests and the disk-full drill): every write to the
  // database's files fails with "no space left" once this many bytes have
  // been written through this handle (0: never), as a full disk would.
  uint64_t fail_after_bytes = 0;
};

struct WriteOptions {
  bool sync = false;  // fsync the log before returning
  bool wal = true;    // false: durable only after Flush()
};

// Writes applied together (all or none). Reuse one across writes: its
// buffer keeps its capacity.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(const WriteBatch&) = delete;
  WriteBatch& operator=(const WriteBatch&) = delete;

  void Put(absl::string_view key, absl::string_view value);
  // The value is the concatenation of `parts` (copied once, into the batch).
  void Put(absl::string_view key,
           std::initializer_list<absl::string_view> parts);
  void Delete(absl::string_view key);
  // Deletes every key in [begin, end).
  void DeleteRange(absl::string_view begin, absl::string_view end);
  void Clear();
  size_t bytes() const;

 private:
  friend class Database;
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

class Database {
 public:
  static absl::StatusOr<std::unique_ptr<Database>> Open(
      const std::string& path, const DatabaseOptions& options);
  ~Database();  // closes; pending unsynced writes may be lost
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  const std::string& path() const { return path_; }

  absl::Status Put(absl::string_view key, absl::string_view value,
                   const WriteOptions& options);
  absl::Status Delete(absl::string_view key, const WriteOptions& options);
  absl::Status Write(WriteBatch* batch, const WriteOptions& options);
  // kNotFound if absent.
  absl::StatusOr<std::string> Get(absl::string_view key);
  // Calls fn(key, value) for every key that starts with `prefix`, in key
  // order, until it returns false. The views are valid during the call
  // only.
  absl::Status Scan(
      absl::string_view prefix,
      const std::function<bool(absl::string_view, absl::string_view)>& fn);
  // Makes every write so far durable (memtables written to synced files).
  absl::Status Flush();
  // Deletes [begin, end) and gives its disk space back (whole files first,
  // then a compaction of what is left of the range).
  absl::Status Reclaim(absl::string_view begin, absl::string_view end);
  // After a failed write (e.g. the disk was full): try to accept writes
  // again. OK if the database is healthy.
  absl::Status Resume();

 private:
  struct Rep;
  Database(std::string path, std::unique_ptr<Rep> rep);
  absl::Status Convert(const void* rocksdb_status,
                       absl::string_view what) const;

  const std::string path_;
  std::unique_ptr<Rep> rep_;
};

// Big-endian encoding, so that keys sort by number.
void AppendBigEndian64(std::string* out, uint64_t v);
void AppendBigEndian32(std::string* out, uint32_t v);
uint64_t ReadBigEndian64(absl::string_view in);  // REQUIRES: 8 bytes
uint32_t ReadBigEndian32(absl::string_view in);  // REQUIRES: 4 bytes

}  // namespace storage
}  // namespace downpour

#endif  // DOWNPOUR_STORAGE_DATABASE_H_
