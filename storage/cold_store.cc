#include "storage/cold_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace downpour {
namespace storage {
namespace {

// A range's records live in chunk files of records_per_chunk records
// (chunk_bytes each, a whole number of pages). A record: the key, a tag,
// then the row's floats. Records are handed out in order. A snapshot is
// the chunks' hard links, `name`.<i>, and a header file `name` that counts
// the records.
constexpr size_t kRecordHeader = 16;  // key, tag
constexpr size_t kChunkTarget = 4 << 20;
constexpr char kMagic[8] = {'D', 'P', 'C', 'O', 'L', 'D', '2', '\0'};
// Tags: a record never written reads as 0 (a fresh chunk is zeros).
constexpr uint64_t kLive = 0x4556494c;     // "LIVE"
constexpr uint64_t kDeleted = 0x44414544;  // "DEAD"
// In the index: the key's record is not current (ColdRange::Forget).
constexpr uint64_t kStale = uint64_t{1} << 63;

struct FileHeader {
  char magic[8];
  uint32_t table;
  uint32_t reserved;
  uint64_t range_begin;
  uint64_t row_floats;
  uint64_t records_per_chunk;
  uint64_t chunk_bytes;
  uint64_t slots;
};

size_t RecordBytes(size_t row_floats) {
  return kRecordHeader + row_floats * sizeof(float);
}
size_t RecordsPerChunk(size_t record_bytes) {
  return std::max<size_t>(1, kChunkTarget / record_bytes);
}
size_t ChunkBytes(size_t record_bytes) {
  const size_t page = 4096;
  const size_t raw = RecordsPerChunk(record_bytes) * record_bytes;
  return (raw + page - 1) / page * page;
}

std::string SnapshotName(uint32_t table, uint64_t begin) {
  return absl::StrCat("t", table, "-r", begin, ".rows");
}

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  const std::string msg =
      absl::StrCat("cold tier: ", what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT || err == ENOMEM) {
    return absl::ResourceExhaustedError(msg);
  }
  return absl::InternalError(msg);
}

// Writes all of `n` bytes at `offset`.
absl::Status PWriteAll(int fd, const void* data, size_t n, off_t offset,
                       const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return absl::OkStatus();
}

// Reads all of `n` bytes at `offset`; kDataLoss if the file ends first.
absl::Status PReadAll(int fd, void* data, size_t n, off_t offset,
                      const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot read", path, errno);
    }
    if (r == 0) {
      return absl::DataLossError(
          absl::StrCat("cold tier copy ", path, ": the file ends early"));
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return absl::OkStatus();
}

// Copies the first `n` bytes of `from` into `to` (in the kernel where it
// can: a clone on file systems that share blocks).
absl::Status CopyPrefix(int from, int to, uint64_t n, const std::string& path) {
  loff_t in = 0, out = 0;
  while (n > 0) {
    const ssize_t c = ::copy_file_range(from, &in, to, &out, n, 0);
    if (c > 0) {
      n -= static_cast<uint64_t>(c);
      continue;
    }
    if (c < 0 && errno == EINTR) continue;
    if (c < 0 && errno != EXDEV && errno != ENOSYS && errno != EINVAL &&
        errno != EOPNOTSUPP) {
      return Errno("cannot copy", path, errno);
    }
    break;  // not supported here: copy through a buffer
  }
  if (n == 0) return absl::OkStatus();
  std::vector<char> buf(1 << 20);
  while (n > 0) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
    DP_RETURN_IF_ERROR(PReadAll(from, buf.data(), k, in, path));
    DP_RETURN_IF_ERROR(PWriteAll(to, buf.data(), k, out, path));
    in += k;
    out += k;
    n -= k;
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot sync", dir, err);
}

// A file opened for reading, closed when it goes.
struct ReadFile {
  explicit ReadFile(const std::string& path)
      : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~ReadFile() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ColdStore>> ColdStore::Open(
    const std::string& dir) {
  // What an earlier process left is stale: its ranges are gone with it.
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!ec) std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot empty the cold tier folder ", dir, ": ", ec.message()));
  }
  return std::unique_ptr<ColdStore>(new ColdStore(dir));
}

ColdStore::~ColdStore() = default;

std::string ColdStore::Register(ColdRange* range, uint32_t table,
                                uint64_t begin) {
  absl::MutexLock lock(&mu_);
  ranges_[{table, begin}] = range;
  // A name of its own: an older ColdRange of the same range (a store being
  // replaced) may still have its file mapped.
  return absl::StrCat(dir_, "/t", table, "-r", begin, "-", next_file_++,
                      ".rows");
}

void ColdStore::Unregister(ColdRange* range, uint32_t table, uint64_t begin) {
  absl::MutexLock lock(&mu_);
  auto it = ranges_.find({table, begin});
  if (it != ranges_.end() && it->second == range) ranges_.erase(it);
}

absl::Status ColdStore::Snapshot(
    const std::string& dir,
    absl::Span<const std::pair<uint32_t, uint64_t>> ranges) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cold tier: cannot make ", dir, ": ", ec.message()));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [table, begin] : ranges) {
    const auto it = ranges_.find({table, begin});
    if (it == ranges_.end()) continue;
    DP_RETURN_IF_ERROR(it->second->SnapshotTo(dir, SnapshotName(table, begin)));
  }
  return SyncDir(dir);
}

absl::Status ColdStore::ReadSnapshot(
    const std::string& dir, uint32_t table, uint64_t range_begin,
    const std::function<absl::Status(uint64_t, absl::Span<const float>)>& fn) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("no cold tier copy at ", dir));
  }
  const std::string path =
      absl::StrCat(dir, "/", SnapshotName(table, range_begin));
  ReadFile head(path);
  if (head.fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();  // no rows of this range
    return Errno("cannot open", path, errno);
  }
  FileHeader h;
  DP_RETURN_IF_ERROR(PReadAll(head.fd, &h, sizeof(h), 0, path));
  const size_t record = RecordBytes(h.row_floats);
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.table != table ||
      h.range_begin != range_begin || h.row_floats == 0 ||
      // Rows are at most a table's widest (2^20) with Adam's state.
      h.row_floats > (size_t{1} << 22) ||
      h.records_per_chunk != RecordsPerChunk(record) ||
      h.chunk_bytes != ChunkBytes(record)) {
    return absl::DataLossError(absl::StrCat(
        "cold tier copy ", path, ": not a copy of table ", table, " keys from ",
        range_begin, " (a damaged or foreign file)"));
  }
  std::vector<char> chunk(h.chunk_bytes);
  std::vector<float> row(h.row_floats);
  for (uint64_t first = 0; first < h.slots; first += h.records_per_chunk) {
    const uint64_t n = std::min<uint64_t>(h.records_per_chunk, h.slots - first);
    const std::string part =
        absl::StrCat(path, ".", first / h.records_per_chunk);
    ReadFile f(part);
    if (f.fd < 0) {
      if (errno == ENOENT) {
        return absl::DataLossError(
            absl::StrCat("cold tier copy ", part, " is missing"));
      }
      return Errno("cannot open", part, errno);
    }
    DP_RETURN_IF_ERROR(PReadAll(f.fd, chunk.data(), n * record, 0, part));
    for (uint64_t i = 0; i < n; ++i) {
      const char* rec = chunk.data() + i * record;
      uint64_t key, tag;
      std::memcpy(&key, rec, 8);
      std::memcpy(&tag, rec + 8, 8);
      if (tag == kDeleted) continue;
      if (tag != kLive) {
        return absl::DataLossError(absl::StrCat(
            "cold tier copy ", part, ": record ", first + i, " is damaged"));
      }
      std::memcpy(row.data(), rec + kRecordHeader, row.size() * sizeof(float));
      DP_RETURN_IF_ERROR(fn(key, row));
    }
  }
  return absl::OkStatus();
}

ColdRange::ColdRange(ColdStore* store, uint32_t table, uint64_t range_begin,
                     size_t row_floats)
    : store_(store),
      table_(table),
      range_begin_(range_begin),
      row_floats_(row_floats),
      record_bytes_(RecordBytes(row_floats)),
      records_per_chunk_(RecordsPerChunk(record_bytes_)),
      chunk_bytes_(ChunkBytes(record_bytes_)) {
  base_ = store_->Register(this, table, range_begin);
}

ColdRange::~ColdRange() {
  store_->Unregister(this, table_, range_begin_);
  for (Chunk& c : chunks_) Drop(c);
}

void ColdRange::Drop(Chunk& c) const {
  if (c.data != nullptr) ::munmap(c.data, chunk_bytes_);
  if (c.fd >= 0) ::close(c.fd);
  if (!c.path.empty()) ::unlink(c.path.c_str());
  c = Chunk();
}

char* ColdRange::Record(uint64_t slot) const {
  return chunks_[slot / records_per_chunk_].data +
         (slot % records_per_chunk_) * record_bytes_;
}

absl::StatusOr<ColdRange::Chunk> ColdRange::NewChunk(size_t index, int from) {
  Chunk c;
  c.path = absl::StrCat(base_, ".", index, ".", next_file_++);
  c.fd = ::open(c.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (c.fd < 0) {
    const int err = errno;
    c.path.clear();
    return Errno("cannot create", absl::StrCat(base_, ".", index), err);
  }
  // Blocks now, so that a full disk is an error here and not a SIGBUS at a
  // write through the mapping.
  int rc = ::posix_fallocate(c.fd, 0, chunk_bytes_);
  absl::Status s;
  if (rc != 0) s = Errno("cannot grow", c.path, rc);
  if (s.ok() && from >= 0) s = CopyPrefix(from, c.fd, chunk_bytes_, c.path);
  if (s.ok()) {
    void* m = ::mmap(nullptr, chunk_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED,
                     c.fd, 0);
    if (m == MAP_FAILED) {
      s = Errno("cannot map", c.path, errno);
    } else {
      c.data = static_cast<char*>(m);
      // Records are read back at random: no read-around of neighbours
      // when a page comes back from disk.
      ::madvise(m, chunk_bytes_, MADV_RANDOM);
    }
  }
  if (!s.ok()) {
    Drop(c);
    return s;
  }
  return c;
}

absl::Status ColdRange::Reserve(uint64_t slot) {
  while (chunks_.size() <= slot / records_per_chunk_) {
    DP_ASSIGN_OR_RETURN(Chunk c, NewChunk(chunks_.size(), -1));
    chunks_.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status ColdRange::Writable(uint64_t slot) {
  Chunk& c = chunks_[slot / records_per_chunk_];
  if (c.shared) {
    // A snapshot links this file: write to a copy. The copy reads through
    // the page cache, so it sees every write made through the mapping.
    DP_ASSIGN_OR_RETURN(Chunk copy, NewChunk(slot / records_per_chunk_, c.fd));
    Drop(c);
    c = std::move(copy);
  }
  c.dirty = true;
  return absl::OkStatus();
}

absl::Status ColdRange::SnapshotTo(const std::string& dir,
                                   const std::string& name) {
  if (chunks_.empty()) return absl::OkStatus();
  const std::string head = absl::StrCat(dir, "/", name);
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = chunks_[i];
    // What the mapping wrote reaches the disk before the checkpoint counts
    // on it (only chunks written since their last sync: a large tier is
    // mostly chunks a checkpoint linked before and nothing wrote since).
    if (c.dirty) {
      if (::fsync(c.fd) != 0) return Errno("cannot sync", c.path, errno);
      c.dirty = false;
    }
    const std::string to = absl::StrCat(head, ".", i);
    if (::link(c.path.c_str(), to.c_str()) != 0) {
      if (errno != EXDEV && errno != EPERM && errno != EMLINK) {
        return Errno("cannot link", to, errno);
      }
      // Another file system (or no hard links): a copy.
      const int fd =
          ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return Errno("cannot create", to, errno);
      absl::Status s = CopyPrefix(c.fd, fd, chunk_bytes_, to);
      if (s.ok() && ::fsync(fd) != 0) s = Errno("cannot sync", to, errno);
      ::close(fd);
      DP_RETURN_IF_ERROR(s);
      continue;
    }
    c.shared = true;
  }
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.table = table_;
  h.range_begin = range_begin_;
  h.row_floats = row_floats_;
  h.records_per_chunk = records_per_chunk_;
  h.chunk_bytes = chunk_bytes_;
  h.slots = slots_;
  const int fd =
      ::open(head.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", head, errno);
  absl::Status s = PWriteAll(fd, &h, sizeof(h), 0, head);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("cannot sync", head, errno);
  ::close(fd);
  return s;
}

bool ColdRange::Contains(uint64_t key) const {
  const auto it = slot_of_.find(key);
  return it != slot_of_.end() && !(it->second & kStale);
}

bool ColdRange::Forget(uint64_t key) {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end() || (it->second & kStale)) return false;
  it->second |= kStale;
  --current_;
  return true;
}

uint64_t ColdRange::index_bytes() const {
  // A slot per entry and a control byte (absl's flat map).
  return slot_of_.capacity() * (sizeof(uint64_t) * 2 + 1);
}

absl::Status ColdRange::Put(uint64_t key, absl::Span<const float> row) {
  return PutBatch(absl::MakeConstSpan(&key, 1), row);
}

absl::Status ColdRange::PutBatch(absl::Span<const uint64_t> keys,
                                 absl::Span<const float> rows) {
  if (rows.size() != keys.size() * row_floats_) {
    return absl::InvalidArgumentError(absl::StrCat("cold tier: ", rows.size(),
                                                   " floats for ", keys.size(),
                                                   " rows of ", row_floats_));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    // The index names the record only once it is written: an error on the
    // way leaves the key as it was.
    const auto it = slot_of_.find(keys[i]);
    const bool fresh = it == slot_of_.end();
    const uint64_t slot = fresh ? slots_ : (it->second & ~kStale);
    if (fresh) DP_RETURN_IF_ERROR(Reserve(slot));
    DP_RETURN_IF_ERROR(Writable(slot));
    char* rec = Record(slot);
    std::memcpy(rec, &keys[i], 8);
    std::memcpy(rec + 8, &kLive, 8);
    std::memcpy(rec + kRecordHeader, rows.data() + i * row_floats_,
                row_floats_ * sizeof(float));
    if (fresh) {
      slot_of_.emplace(keys[i], slot);
      ++slots_;
      ++current_;
    } else if (it->second & kStale) {
      it->second = slot;
      ++current_;
    }
  }
  return absl::OkStatus();
}

absl::Status ColdRange::GetBatch(absl::Span<const uint64_t> keys,
                                 absl::Span<float> rows,
                                 std::vector<bool>* found) {
  if (rows.size() < keys.size() * row_floats_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cold tier: room for ", rows.size(), " floats for ",
                     keys.size(), " rows of ", row_floats_));
  }
  found->assign(keys.size(), false);
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto it = slot_of_.find(keys[i]);
    if (it == slot_of_.end() || (it->second & kStale)) continue;
    std::memcpy(rows.data() + i * row_floats_,
                Record(it->second) + kRecordHeader,
                row_floats_ * sizeof(float));
    (*found)[i] = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ColdRange::Get(uint64_t key, absl::Span<float> row) {
  if (row.size() != row_floats_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cold tier: a row of ", row_floats_, " floats, not ", row.size()));
  }
  std::vector<bool> found;
  DP_RETURN_IF_ERROR(GetBatch(absl::MakeConstSpan(&key, 1), row, &found));
  return static_cast<bool>(found[0]);
}

absl::Status ColdRange::Delete(uint64_t key) {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return absl::OkStatus();
  const uint64_t slot = it->second & ~kStale;
  DP_RETURN_IF_ERROR(Writable(slot));
  // The record stays (a walk's positions do not move); a later put of the
  // key takes a new one.
  std::memcpy(Record(slot) + 8, &kDeleted, 8);
  if (!(it->second & kStale)) --current_;
  slot_of_.erase(it);
  return absl::OkStatus();
}

absl::Status ColdRange::Clear() {
  slot_of_.clear();
  slots_ = 0;
  current_ = 0;
  // The chunks stay for the next rows; records are rewritten before they
  // count again.
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint64_t>> ColdRange::Scan(
    uint64_t cursor, size_t max_rows, std::vector<uint64_t>* keys,
    std::vector<float>* rows) {
  size_t added = 0;
  uint64_t s = cursor;
  for (; s < slots_ && added < max_rows; ++s) {
    const char* rec = Record(s);
    uint64_t key, tag;
    std::memcpy(&key, rec, 8);
    std::memcpy(&tag, rec + 8, 8);
    if (tag != kLive || !Contains(key)) continue;
    keys->push_back(key);
    const size_t at = rows->size();
    rows->resize(at + row_floats_);
    std::memcpy(rows->data() + at, rec + kRecordHeader,
                row_floats_ * sizeof(float));
    ++added;
  }
  if (s < slots_) return std::optional<uint64_t>(s);
  return std::optional<uint64_t>();
}

}  // namespace storage
}  // namespace downpour
