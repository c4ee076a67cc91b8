#include "storage/checkpoint_store.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace downpour {
namespace storage {
namespace {

constexpr char kRows[] = "rows/";
constexpr char kPart[] = "part/";

std::string RowsPrefix(uint64_t id) {
  std::string k = kRows;
  AppendBigEndian64(&k, id);
  return k;
}

std::string RangePrefix(uint64_t id, uint32_t table, uint64_t begin) {
  std::string k = RowsPrefix(id);
  AppendBigEndian32(&k, table);
  AppendBigEndian64(&k, begin);
  return k;
}

std::string PartKey(uint64_t id) {
  std::string k = kPart;
  AppendBigEndian64(&k, id);
  return k;
}

absl::string_view Bytes(const void* p, size_t n) {
  return absl::string_view(static_cast<const char*>(p), n);
}

}  // namespace

absl::Status CheckpointStore::WriteChunk(uint64_t id, uint32_t table,
                                         uint64_t range_begin, uint64_t chunk,
                                         const proto::RowChunkInfo& info,
                                         absl::Span<const uint64_t> keys,
                                         absl::Span<const float> data) {
  key_ = RangePrefix(id, table, range_begin);
  AppendBigEndian64(&key_, chunk);
  header_.clear();
  AppendBigEndian32(&header_, static_cast<uint32_t>(info.ByteSizeLong()));
  info.AppendToString(&header_);
  AppendBigEndian64(&header_, keys.size());
  batch_.Clear();
  batch_.Put(key_, {header_, Bytes(keys.data(), keys.size() * sizeof(uint64_t)),
                    Bytes(data.data(), data.size() * sizeof(float))});
  return db_->Write(&batch_, {.sync = false, .wal = false});
}

absl::Status CheckpointStore::FinishPart(const proto::CheckpointPart& part) {
  DP_RETURN_IF_ERROR(db_->Flush(), "checkpoint ", part.id());
  return db_->Put(PartKey(part.id()), part.SerializeAsString(),
                  {.sync = true, .wal = true});
}

absl::StatusOr<proto::CheckpointPart> CheckpointStore::ReadPart(uint64_t id) {
  absl::StatusOr<std::string> bytes = db_->Get(PartKey(id));
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", id, " is not complete in ", db_->path()));
    }
    return bytes.status();
  }
  proto::CheckpointPart part;
  if (!part.ParseFromString(*bytes) || part.id() != id) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", id, " in ", db_->path(), ": unreadable part record"));
  }
  return part;
}

absl::StatusOr<std::vector<uint64_t>> CheckpointStore::FinishedParts() {
  std::vector<uint64_t> ids;
  DP_RETURN_IF_ERROR(
      db_->Scan(kPart, [&](absl::string_view k, absl::string_view) {
        if (k.size() == sizeof(kPart) - 1 + 8) {
          ids.push_back(ReadBigEndian64(k.substr(sizeof(kPart) - 1)));
        }
        return true;
      }));
  return ids;
}

absl::Status CheckpointStore::ReadChunks(
    uint64_t id, uint32_t table, uint64_t range_begin, uint64_t expected_chunks,
    const std::function<absl::Status(const StoredChunk&)>& fn) {
  const std::string prefix = RangePrefix(id, table, range_begin);
  const std::string where =
      absl::StrCat("checkpoint ", id, " table ", table, " range from key ",
                   range_begin, " in ", db_->path());
  uint64_t next = 0;
  absl::Status status;
  DP_RETURN_IF_ERROR(db_->Scan(prefix, [&](absl::string_view k,
                                           absl::string_view v) {
    auto bad = [&](absl::string_view why) {
      status =
          absl::DataLossError(absl::StrCat(where, ", chunk ", next, ": ", why));
      return false;
    };
    if (k.size() != prefix.size() + 8 ||
        ReadBigEndian64(k.substr(prefix.size())) != next) {
      return bad("missing");
    }
    if (v.size() < 4) return bad("truncated");
    const uint32_t n = ReadBigEndian32(v);
    if (v.size() < 4 + size_t{n}) return bad("truncated header");
    StoredChunk c;
    if (!c.info.ParseFromArray(v.data() + 4, static_cast<int>(n))) {
      return bad("unreadable header");
    }
    absl::string_view rest = v.substr(4 + n);
    if (rest.size() < 8) return bad("truncated key count");
    const uint64_t nkeys = ReadBigEndian64(rest);
    rest.remove_prefix(8);
    if (rest.size() / 8 < nkeys ||
        (rest.size() - nkeys * 8) % sizeof(float) != 0) {
      return bad("size does not match its header");
    }
    read_keys_.resize(nkeys);
    if (nkeys > 0) std::memcpy(read_keys_.data(), rest.data(), nkeys * 8);
    rest.remove_prefix(nkeys * 8);
    read_data_.resize(rest.size() / sizeof(float));
    if (!rest.empty()) {
      std::memcpy(read_data_.data(), rest.data(), rest.size());
    }
    c.keys = read_keys_;
    c.data = read_data_;
    status = fn(c);
    ++next;
    return status.ok();
  }));
  DP_RETURN_IF_ERROR(status);
  if (next != expected_chunks) {
    return absl::DataLossError(absl::StrCat(where, ": ", next, " chunks, ",
                                            expected_chunks, " expected"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::Drop(uint64_t id) {
  DP_RETURN_IF_ERROR(db_->Delete(PartKey(id), {.sync = true, .wal = true}));
  return db_->Reclaim(RowsPrefix(id), RowsPrefix(id + 1));
}

absl::Status CheckpointStore::DropBefore(uint64_t keep_from) {
  if (keep_from == 0) return absl::OkStatus();
  // Records first (synced): a crash in between leaves rows without a
  // record, which nothing reads and the next drop removes.
  WriteBatch batch;
  batch.DeleteRange(PartKey(0), PartKey(keep_from));
  DP_RETURN_IF_ERROR(db_->Write(&batch, {.sync = true, .wal = true}));
  return db_->Reclaim(RowsPrefix(0), RowsPrefix(keep_from));
}

}  // namespace storage
}  // namespace downpour
