#include "storage/cold_store.h"

#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace downpour {
namespace storage {
namespace {

constexpr uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string RangePrefix(uint32_t table, uint64_t range_begin) {
  std::string p;
  AppendBigEndian32(&p, table);
  AppendBigEndian64(&p, range_begin);
  return p;
}

}  // namespace

uint32_t ColdBucket(uint64_t key) {
  return static_cast<uint32_t>(Mix(key) >> 44);  // 20 bits
}

absl::StatusOr<std::unique_ptr<ColdStore>> ColdStore::Open(
    const std::string& dir) {
  // What an earlier process left is stale: its ranges are gone with it.
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot empty the cold tier folder ", dir, ": ", ec.message()));
  }
  DatabaseOptions o;
  o.cold = true;
  auto db = Database::Open(dir, o);
  if (!db.ok()) return db.status();
  return std::unique_ptr<ColdStore>(new ColdStore(std::move(*db)));
}

absl::Status ColdStore::Snapshot(const std::string& dir) {
  return db_->CreateCheckpoint(dir);
}

absl::Status ColdStore::ReadSnapshot(
    const std::string& dir, uint32_t table, uint64_t range_begin,
    const std::function<absl::Status(uint64_t, absl::Span<const float>)>& fn) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("no cold tier copy at ", dir));
  }
  DatabaseOptions o;
  o.read_only = true;
  o.create_if_missing = false;
  auto db = Database::Open(dir, o);
  if (!db.ok()) return db.status();
  const std::string prefix = RangePrefix(table, range_begin);
  absl::Status inner;
  std::vector<float> row;
  absl::Status s =
      (*db)->Scan(prefix, [&](absl::string_view k, absl::string_view v) {
        if (k.size() != prefix.size() + 12 || v.size() % sizeof(float) != 0) {
          inner = absl::DataLossError(absl::StrCat(
              "cold tier copy ", dir, ": a malformed row of table ", table));
          return false;
        }
        row.resize(v.size() / sizeof(float));
        std::memcpy(row.data(), v.data(), v.size());
        inner = fn(ReadBigEndian64(k.substr(prefix.size() + 4)), row);
        return inner.ok();
      });
  return inner.ok() ? s : inner;
}

ColdRange::ColdRange(ColdStore* store, uint32_t table, uint64_t range_begin,
                     size_t row_floats)
    : store_(store),
      table_(table),
      range_begin_(range_begin),
      row_floats_(row_floats),
      prefix_(RangePrefix(table, range_begin)) {}

std::string ColdRange::Key(uint64_t key) const {
  std::string k = prefix_;
  AppendBigEndian32(&k, ColdBucket(key));
  AppendBigEndian64(&k, key);
  return k;
}

absl::Status ColdRange::Put(uint64_t key, absl::Span<const float> row) {
  return store_->db().Put(
      Key(key),
      absl::string_view(reinterpret_cast<const char*>(row.data()),
                        row.size() * sizeof(float)),
      {.sync = false, .wal = false});
}

absl::Status ColdRange::PutBatch(absl::Span<const uint64_t> keys,
                                 absl::Span<const float> rows) {
  WriteBatch batch;
  for (size_t i = 0; i < keys.size(); ++i) {
    batch.Put(Key(keys[i]),
              absl::string_view(
                  reinterpret_cast<const char*>(rows.data() + i * row_floats_),
                  row_floats_ * sizeof(float)));
  }
  return store_->db().Write(&batch, {.sync = false, .wal = false});
}

absl::Status ColdRange::GetBatch(absl::Span<const uint64_t> keys,
                                 absl::Span<float> rows,
                                 std::vector<bool>* found) {
  std::vector<std::string> k(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) k[i] = Key(keys[i]);
  found->assign(keys.size(), false);
  absl::Status bad;
  DP_RETURN_IF_ERROR(
      store_->db().MultiGet(k, [&](size_t i, absl::string_view v) {
        if (v.size() != row_floats_ * sizeof(float)) {
          bad = absl::DataLossError(absl::StrCat(
              "cold tier ", store_->dir(), ": row of key ", keys[i],
              " of table ", table_, " has ", v.size(), " bytes"));
          return;
        }
        std::memcpy(rows.data() + i * row_floats_, v.data(), v.size());
        (*found)[i] = true;
      }));
  return bad;
}

absl::StatusOr<bool> ColdRange::Get(uint64_t key, absl::Span<float> row) {
  absl::StatusOr<std::string> v = store_->db().Get(Key(key));
  if (absl::IsNotFound(v.status())) return false;
  if (!v.ok()) return v.status();
  if (v->size() != row.size() * sizeof(float)) {
    return absl::DataLossError(absl::StrCat(
        "cold tier ", store_->dir(), ": row of key ", key, " of table ", table_,
        " has ", v->size(), " bytes, expected ", row.size() * sizeof(float)));
  }
  std::memcpy(row.data(), v->data(), v->size());
  return true;
}

absl::Status ColdRange::Delete(uint64_t key) {
  return store_->db().Delete(Key(key), {.sync = false, .wal = false});
}

absl::Status ColdRange::Clear() {
  std::string end = prefix_;
  AppendBigEndian32(&end, 0xffffffffu);
  return store_->db().Reclaim(prefix_, end);
}

absl::StatusOr<std::optional<uint32_t>> ColdRange::Scan(
    uint32_t bucket, size_t max_rows, std::vector<uint64_t>* keys,
    std::vector<float>* rows) {
  std::string start = prefix_;
  AppendBigEndian32(&start, bucket);
  size_t added = 0;
  std::optional<uint32_t> next;
  absl::Status bad;
  absl::Status s = store_->db().ScanFrom(
      prefix_, start, [&](absl::string_view k, absl::string_view v) {
        if (k.size() != prefix_.size() + 12 ||
            v.size() != row_floats_ * sizeof(float)) {
          bad = absl::DataLossError(absl::StrCat("cold tier ", store_->dir(),
                                                 ": a malformed row of table ",
                                                 table_));
          return false;
        }
        const uint32_t b = ReadBigEndian32(k.substr(prefix_.size(), 4));
        // Whole buckets only: stop at the first row of a new bucket once
        // enough rows are in.
        if (added >= max_rows && b != bucket) {
          next = b;
          return false;
        }
        bucket = b;
        keys->push_back(ReadBigEndian64(k.substr(prefix_.size() + 4)));
        const size_t at = rows->size();
        rows->resize(at + row_floats_);
        std::memcpy(rows->data() + at, v.data(), v.size());
        ++added;
        return true;
      });
  if (!bad.ok()) return bad;
  if (!s.ok()) return s;
  return next;
}

}  // namespace storage
}  // namespace downpour
