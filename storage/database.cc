#include "storage/database.h"

#include <atomic>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace downpour {
namespace storage {
namespace {

rocksdb::Slice S(absl::string_view v) { return {v.data(), v.size()}; }

// A file system whose writes fail with "no space" once a byte budget is
// spent: a full disk, below the store (LevelDB's fault-injection idea).
class BudgetFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  BudgetFileSystem(const std::shared_ptr<rocksdb::FileSystem>& target,
                   uint64_t budget)
      : FileSystemWrapper(target), left_(static_cast<int64_t>(budget)) {}
  const char* Name() const override { return "DownpourBudgetFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& f,
                                    const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, &file, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(file), &left_);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(
      const std::string& f, const rocksdb::FileOptions& o,
      std::unique_ptr<rocksdb::FSWritableFile>* r,
      rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->ReopenWritableFile(f, o, &file, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(file), &left_);
    return s;
  }

 private:
  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> f, std::atomic<int64_t>* left)
        : FSWritableFileOwnerWrapper(std::move(f)), left_(left) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data,
                             const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (!Spend(data.size())) return Full();
      return target()->Append(data, o, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data,
                             const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& info,
                             rocksdb::IODebugContext* dbg) override {
      if (!Spend(data.size())) return Full();
      return target()->Append(data, o, info, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data,
                                       uint64_t offset,
                                       const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
      if (!Spend(data.size())) return Full();
      return target()->PositionedAppend(data, offset, o, dbg);
    }

   private:
    bool Spend(size_t n) {
      return left_->fetch_sub(static_cast<int64_t>(n)) >=
             static_cast<int64_t>(n);
    }
    static rocksdb::IOStatus Full() {
      return rocksdb::IOStatus::NoSpace("injected fault: the disk is full");
    }
    std::atomic<int64_t>* const left_;
  };

  std::atomic<int64_t> left_;
};

}  // namespace

struct WriteBatch::Rep {
  rocksdb::WriteBatch batch;
};

WriteBatch::WriteBatch() : rep_(std::make_unique<Rep>()) {}
WriteBatch::~WriteBatch() = default;

void WriteBatch::Put(absl::string_view key, absl::string_view value) {
  rep_->batch.Put(S(key), S(value));
}

void WriteBatch::Put(absl::string_view key,
                     std::initializer_list<absl::string_view> parts) {
  std::vector<rocksdb::Slice> slices;
  slices.reserve(parts.size());
  for (absl::string_view p : parts) slices.push_back(S(p));
  rocksdb::Slice k = S(key);
  rep_->batch.Put(
      rocksdb::SliceParts(&k, 1),
      rocksdb::SliceParts(slices.data(), static_cast<int>(slices.size())));
}

void WriteBatch::Delete(absl::string_view key) { rep_->batch.Delete(S(key)); }

void WriteBatch::DeleteRange(absl::string_view begin, absl::string_view end) {
  rep_->batch.DeleteRange(S(begin), S(end));
}

void WriteBatch::Clear() { rep_->batch.Clear(); }

size_t WriteBatch::bytes() const { return rep_->batch.GetDataSize(); }

struct Database::Rep {
  std::unique_ptr<rocksdb::Env> env;  // with the fault-injecting file system
  std::unique_ptr<rocksdb::DB> db;
  bool read_only = false;
};

Database::Database(std::string path, std::unique_ptr<Rep> rep)
    : path_(std::move(path)), rep_(std::move(rep)) {}

Database::~Database() {
  if (rep_->db != nullptr && !rep_->read_only) {
    // Best effort: an orderly close flushes nothing unsynced by itself.
    rep_->db->Close().PermitUncheckedError();
  }
}

absl::Status Database::Convert(const void* status,
                               absl::string_view what) const {
  const auto& s = *static_cast<const rocksdb::Status*>(status);
  if (s.ok()) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, " in database ", path_, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) {
    return absl::UnavailableError(msg);
  }
  if (s.IsInvalidArgument()) return absl::FailedPreconditionError(msg);
  return absl::InternalError(msg);
}

absl::StatusOr<std::unique_ptr<Database>> Database::Open(
    const std::string& path, const DatabaseOptions& o) {
  auto rep = std::make_unique<Rep>();
  rep->read_only = o.read_only;
  rocksdb::Options options;
  options.create_if_missing = o.create_if_missing && !o.read_only;
  // Our files only: the info log goes beside them, one file, kept small.
  options.keep_log_file_num = 2;
  options.max_log_file_size = 4 << 20;
  if (o.fail_after_bytes > 0) {
    auto fs = std::make_shared<BudgetFileSystem>(rocksdb::FileSystem::Default(),
                                                 o.fail_after_bytes);
    rep->env = rocksdb::NewCompositeEnv(fs);
    options.env = rep->env.get();
  }
  if (o.bulk) {
    // Checkpoints write each key once and drop whole checkpoints: values of
    // megabytes of floats, which do not compress, and compacting them would
    // only copy them again. So: large memtables flushed by two background
    // threads, no compression, no automatic compaction (Reclaim compacts a
    // dropped checkpoint's range), and no write stalls for many level-0
    // files (there is no compaction to wait for).
    options.write_buffer_size = 64 << 20;
    options.max_write_buffer_number = 4;
    options.max_background_jobs = 2;
    options.compression = rocksdb::kNoCompression;
    options.disable_auto_compactions = true;
    options.level0_slowdown_writes_trigger = 1 << 20;
    options.level0_stop_writes_trigger = 1 << 20;
    options.soft_pending_compaction_bytes_limit = 0;
    options.hard_pending_compaction_bytes_limit = 0;
    rocksdb::BlockBasedTableOptions table;
    table.block_size = 1 << 20;  // values are large; keep the index small
    options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  }
  if (options.create_if_missing) {
    // RocksDB makes the last folder only; a data dir may be a new path.
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the folder ", path, ": ", ec.message()));
    }
  }
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = o.read_only
                          ? rocksdb::DB::OpenForReadOnly(options, path, &db)
                          : rocksdb::DB::Open(options, path, &db);
  if (!s.ok()) {
    const std::string text = s.ToString();
    if (absl::StrContains(text, "lock") || absl::StrContains(text, "LOCK")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "database ", path,
          " is in use by another process (RocksDB's lock is held): ", text));
    }
    if (s.IsInvalidArgument() || s.IsPathNotFound() ||
        (o.read_only && s.IsIOError())) {
      return absl::FailedPreconditionError(
          absl::StrCat("no usable database at ", path, ": ", text));
    }
    Database tmp(path, std::make_unique<Rep>());
    return tmp.Convert(&s, "open");
  }
  rep->db.reset(db);
  return std::unique_ptr<Database>(new Database(path, std::move(rep)));
}

absl::Status Database::Put(absl::string_view key, absl::string_view value,
                           const WriteOptions& o) {
  rocksdb::WriteOptions w;
  w.sync = o.sync;
  w.disableWAL = !o.wal;
  rocksdb::Status s = rep_->db->Put(w, S(key), S(value));
  return Convert(&s, "put");
}

absl::Status Database::Delete(absl::string_view key, const WriteOptions& o) {
  rocksdb::WriteOptions w;
  w.sync = o.sync;
  w.disableWAL = !o.wal;
  rocksdb::Status s = rep_->db->Delete(w, S(key));
  return Convert(&s, "delete");
}

absl::Status Database::Write(WriteBatch* batch, const WriteOptions& o) {
  rocksdb::WriteOptions w;
  w.sync = o.sync;
  w.disableWAL = !o.wal;
  rocksdb::Status s = rep_->db->Write(w, &batch->rep_->batch);
  return Convert(&s, "write");
}

absl::StatusOr<std::string> Database::Get(absl::string_view key) {
  std::string value;
  rocksdb::Status s = rep_->db->Get(rocksdb::ReadOptions(), S(key), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("no key '", key, "' in database ", path_));
  }
  if (!s.ok()) return Convert(&s, "get");
  return value;
}

absl::Status Database::Scan(
    absl::string_view prefix,
    const std::function<bool(absl::string_view, absl::string_view)>& fn) {
  rocksdb::ReadOptions r;
  // A scan reads each block once (a checkpoint's rows, a restore): keep
  // them out of the block cache.
  r.fill_cache = false;
  r.readahead_size = 4 << 20;
  r.total_order_seek = true;
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(r));
  for (it->Seek(S(prefix)); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (!k.starts_with(S(prefix))) break;
    const rocksdb::Slice v = it->value();
    if (!fn(absl::string_view(k.data(), k.size()),
            absl::string_view(v.data(), v.size()))) {
      break;
    }
  }
  rocksdb::Status s = it->status();
  return Convert(&s, "scan");
}

absl::Status Database::Flush() {
  rocksdb::FlushOptions f;
  f.wait = true;
  rocksdb::Status s = rep_->db->Flush(f);
  if (!s.ok()) return Convert(&s, "flush");
  // The flushed files are synced by RocksDB; the log (holding synced small
  // writes) is synced here too, so that Flush means "everything so far".
  s = rep_->db->SyncWAL();
  if (s.IsNotSupported()) return absl::OkStatus();
  return Convert(&s, "sync log");
}

absl::Status Database::Reclaim(absl::string_view begin, absl::string_view end) {
  rocksdb::Slice b = S(begin), e = S(end);
  // Whole files inside the range go at once.
  rocksdb::Status s = rocksdb::DeleteFilesInRange(
      rep_->db.get(), rep_->db->DefaultColumnFamily(), &b, &e);
  if (!s.ok()) return Convert(&s, "delete files");
  rocksdb::WriteOptions w;
  s = rep_->db->DeleteRange(w, rep_->db->DefaultColumnFamily(), b, e);
  if (!s.ok()) return Convert(&s, "delete range");
  rocksdb::CompactRangeOptions c;
  c.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  s = rep_->db->CompactRange(c, &b, &e);
  return Convert(&s, "compact");
}

absl::Status Database::Resume() {
  rocksdb::Status s = rep_->db->Resume();
  return Convert(&s, "resume");
}

void AppendBigEndian64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void AppendBigEndian32(std::string* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t ReadBigEndian64(absl::string_view in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<uint8_t>(in[i]);
  return v;
}

uint32_t ReadBigEndian32(absl::string_view in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(in[i]);
  return v;
}

}  // namespace storage
}  // namespace downpour
