#include "storage/cold_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace storage {
namespace {

std::vector<float> Row(uint64_t key, size_t floats) {
  std::vector<float> r(floats);
  for (size_t i = 0; i < floats; ++i) r[i] = static_cast<float>(key * 10 + i);
  return r;
}

TEST(ColdStoreTest, PutGetDeleteAndAStaleTierIsEmptiedAtOpen) {
  const std::string dir = TestTmpDir() + "/cold1";
  {
    ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(dir));
    ColdRange r(store.get(), 3, 1000, 4);
    ASSERT_OK(r.Put(1234, Row(1234, 4)));
    std::vector<float> out(4);
    ASSERT_OK_AND_ASSIGN(bool found, r.Get(1234, absl::MakeSpan(out)));
    EXPECT_TRUE(found);
    EXPECT_EQ(out, Row(1234, 4));
    ASSERT_OK_AND_ASSIGN(found, r.Get(99, absl::MakeSpan(out)));
    EXPECT_FALSE(found);
    // Another range of the same table does not see it.
    ColdRange other(store.get(), 3, 2000, 4);
    ASSERT_OK_AND_ASSIGN(found, other.Get(1234, absl::MakeSpan(out)));
    EXPECT_FALSE(found);
    ASSERT_OK(r.Delete(1234));
    ASSERT_OK_AND_ASSIGN(found, r.Get(1234, absl::MakeSpan(out)));
    EXPECT_FALSE(found);
    ASSERT_OK(r.Put(7, Row(7, 4)));
  }
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(dir));
  ColdRange r(store.get(), 3, 1000, 4);
  std::vector<float> out(4);
  ASSERT_OK_AND_ASSIGN(bool found, r.Get(7, absl::MakeSpan(out)));
  EXPECT_FALSE(found) << "a new process holds no rows";
}

// Rows put while a walk runs (new keys, and old ones written again) do not
// make it miss or repeat a row, across chunks of the file.
TEST(ColdStoreTest, AScanSeesEveryRowOnceWhileRowsArePut) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold2"));
  // 200k rows of 2 floats: 24-byte records, several 4 MiB chunks.
  ColdRange r(store.get(), 1, 0, 2);
  std::mt19937_64 rng(TestSeed(5));
  std::map<uint64_t, std::vector<float>> want;
  std::vector<uint64_t> keys(200000);
  std::vector<float> rows;
  for (uint64_t& k : keys) {
    k = rng();
    want[k] = Row(k % 1000, 2);
  }
  for (uint64_t k : keys) {
    rows.insert(rows.end(), want[k].begin(), want[k].end());
  }
  ASSERT_OK(r.PutBatch(keys, rows));
  const std::map<uint64_t, std::vector<float>> at_start = want;
  std::map<uint64_t, std::vector<float>> got;
  std::optional<uint64_t> cursor = 0;
  int calls = 0;
  while (cursor.has_value()) {
    std::vector<uint64_t> k;
    std::vector<float> v;
    ASSERT_OK_AND_ASSIGN(cursor, r.Scan(*cursor, 5000, &k, &v));
    ASSERT_EQ(v.size(), k.size() * 2);
    for (size_t i = 0; i < k.size(); ++i) {
      EXPECT_TRUE(got.emplace(k[i], std::vector<float>(v.begin() + 2 * i,
                                                       v.begin() + 2 * i + 2))
                      .second)
          << "key " << k[i] << " twice";
    }
    // Between calls: an old key written again, and a new one.
    const uint64_t old_key = keys[(calls * 7919) % keys.size()];
    want[old_key] = Row(old_key % 1000 + 1, 2);
    ASSERT_OK(r.Put(old_key, want[old_key]));
    const uint64_t new_key = rng();
    want[new_key] = Row(new_key % 1000, 2);
    ASSERT_OK(r.Put(new_key, want[new_key]));
    ++calls;
  }
  EXPECT_GT(calls, 30);
  // Every row present at the start, once; rows put meanwhile with either
  // value; new rows at most once.
  for (const auto& [k, v] : at_start) {
    ASSERT_EQ(got.count(k), 1u) << "key " << k << " missed";
    EXPECT_TRUE(got[k] == v || got[k] == want[k]) << "key " << k;
  }
  for (const auto& [k, v] : got) {
    EXPECT_TRUE(want.count(k)) << "key " << k << " was never put";
  }
  // The tier reads back what was put last.
  std::vector<uint64_t> all;
  for (const auto& [k, v] : want) all.push_back(k);
  std::vector<float> out(all.size() * 2);
  std::vector<bool> found;
  ASSERT_OK(r.GetBatch(all, absl::MakeSpan(out), &found));
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_TRUE(found[i]) << "key " << all[i];
    EXPECT_EQ(std::vector<float>(out.begin() + 2 * i, out.begin() + 2 * i + 2),
              want[all[i]]);
  }
  ASSERT_OK(r.Clear());
  std::vector<uint64_t> k;
  std::vector<float> v;
  ASSERT_OK(r.Scan(0, 100, &k, &v).status());
  EXPECT_TRUE(k.empty());
  ASSERT_OK_AND_ASSIGN(bool present,
                       r.Get(keys[0], absl::MakeSpan(out.data(), 2)));
  EXPECT_FALSE(present) << "cleared";
}

TEST(ColdStoreTest, ASnapshotIsAConsistentCopyReadBackByRange) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold3"));
  ColdRange a(store.get(), 1, 0, 3), b(store.get(), 1, 500, 3);
  for (uint64_t k = 0; k < 50; ++k) ASSERT_OK(a.Put(k, Row(k, 3)));
  for (uint64_t k = 500; k < 520; ++k) ASSERT_OK(b.Put(k, Row(k, 3)));
  ASSERT_OK(a.Delete(7));
  const std::string snap = TestTmpDir() + "/cold3-snap";
  ASSERT_OK(store->Snapshot(snap, {{1, 0}, {1, 500}, {2, 0}}));
  // Later changes are not in the copy.
  ASSERT_OK(a.Delete(3));
  ASSERT_OK(a.Put(60, Row(60, 3)));
  ASSERT_OK(a.Put(4, Row(99, 3)));
  std::map<uint64_t, std::vector<float>> got;
  ASSERT_OK(ColdStore::ReadSnapshot(
      snap, 1, 0, [&](uint64_t k, absl::Span<const float> row) {
        got[k] = std::vector<float>(row.begin(), row.end());
        return absl::OkStatus();
      }));
  ASSERT_EQ(got.size(), 49u);
  EXPECT_EQ(got.count(7), 0u) << "deleted before the copy";
  EXPECT_EQ(got[3], Row(3, 3));
  EXPECT_EQ(got[4], Row(4, 3));
  EXPECT_EQ(got.count(60), 0u);
  size_t in_b = 0;
  ASSERT_OK(ColdStore::ReadSnapshot(
      snap, 1, 500, [&](uint64_t k, absl::Span<const float> row) {
        EXPECT_EQ(std::vector<float>(row.begin(), row.end()), Row(k, 3));
        ++in_b;
        return absl::OkStatus();
      }));
  EXPECT_EQ(in_b, 20u);
  // A range with no rows in the tier: no file, no rows.
  ASSERT_OK(ColdStore::ReadSnapshot(
      snap, 2, 0, [](uint64_t, absl::Span<const float>) {
        return absl::InternalError("no row expected");
      }));
  EXPECT_TRUE(absl::IsNotFound(ColdStore::ReadSnapshot(
      TestTmpDir() + "/nowhere", 1, 0,
      [](uint64_t, absl::Span<const float>) { return absl::OkStatus(); })));
}

// A store replaced by a new one for the same range (a backup copying its
// range afresh) starts empty; the old one keeps its rows until it goes,
// and a snapshot copies the new one.
TEST(ColdStoreTest, ANewRangeOfTheSameKeysIsSeparate) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold4"));
  auto old_range = std::make_unique<ColdRange>(store.get(), 1, 0, 2);
  ASSERT_OK(old_range->Put(5, Row(5, 2)));
  ColdRange fresh(store.get(), 1, 0, 2);
  std::vector<float> out(2);
  ASSERT_OK_AND_ASSIGN(bool found, fresh.Get(5, absl::MakeSpan(out)));
  EXPECT_FALSE(found);
  ASSERT_OK(fresh.Put(6, Row(6, 2)));
  ASSERT_OK_AND_ASSIGN(found, old_range->Get(5, absl::MakeSpan(out)));
  EXPECT_TRUE(found);
  old_range.reset();
  const std::string snap = TestTmpDir() + "/cold4-snap";
  ASSERT_OK(store->Snapshot(snap, {{1, 0}}));
  std::vector<uint64_t> keys;
  ASSERT_OK(ColdStore::ReadSnapshot(snap, 1, 0,
                                    [&](uint64_t k, absl::Span<const float>) {
                                      keys.push_back(k);
                                      return absl::OkStatus();
                                    }));
  EXPECT_EQ(keys, std::vector<uint64_t>{6});
}

// A snapshot links the chunks; the range copies a linked chunk before it
// writes to it again, and only that chunk: the snapshot keeps its values.
TEST(ColdStoreTest, ASnapshotLinksChunksAndWritesCopyThemFirst) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold7"));
  // 24-byte records: 174,762 to a 4 MiB chunk; 400k rows make 3 chunks.
  ColdRange r(store.get(), 1, 0, 2);
  std::vector<uint64_t> keys(400000);
  std::vector<float> rows;
  for (uint64_t k = 0; k < keys.size(); ++k) {
    keys[k] = k;
    const std::vector<float> row = Row(k, 2);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_OK(r.PutBatch(keys, rows));
  EXPECT_EQ(r.files_made(), 3u);
  const std::string snap = TestTmpDir() + "/cold7-snap";
  ASSERT_OK(store->Snapshot(snap, {{1, 0}}));
  EXPECT_EQ(r.files_made(), 3u) << "a snapshot copies nothing";
  // Writes to the first chunk: one copy of it, the others untouched.
  for (uint64_t k = 0; k < 100; ++k) ASSERT_OK(r.Put(k, Row(k + 1, 2)));
  ASSERT_OK(r.Delete(5));
  EXPECT_EQ(r.files_made(), 4u);
  ASSERT_OK(r.Put(399999, Row(7, 2)));
  EXPECT_EQ(r.files_made(), 5u);
  // A second snapshot links the copies; a write after it copies again.
  const std::string snap2 = TestTmpDir() + "/cold7-snap2";
  ASSERT_OK(store->Snapshot(snap2, {{1, 0}}));
  ASSERT_OK(r.Put(1, Row(50, 2)));
  EXPECT_EQ(r.files_made(), 6u);
  size_t seen = 0;
  ASSERT_OK(ColdStore::ReadSnapshot(
      snap, 1, 0, [&](uint64_t k, absl::Span<const float> row) {
        ++seen;
        EXPECT_EQ(std::vector<float>(row.begin(), row.end()), Row(k, 2))
            << "key " << k;
        return absl::OkStatus();
      }));
  EXPECT_EQ(seen, 400000u);
  std::map<uint64_t, std::vector<float>> second;
  ASSERT_OK(ColdStore::ReadSnapshot(
      snap2, 1, 0, [&](uint64_t k, absl::Span<const float> row) {
        if (k < 100 || k == 399999) {
          second[k] = std::vector<float>(row.begin(), row.end());
        }
        return absl::OkStatus();
      }));
  EXPECT_EQ(second.size(), 100u) << "99 rewritten rows and the last one";
  EXPECT_EQ(second.count(5), 0u) << "deleted before the second snapshot";
  EXPECT_EQ(second[1], Row(2, 2));
  EXPECT_EQ(second[399999], Row(7, 2));
  std::vector<float> out(2);
  ASSERT_OK_AND_ASSIGN(bool found, r.Get(1, absl::MakeSpan(out)));
  EXPECT_TRUE(found);
  EXPECT_EQ(out, Row(50, 2));
}

// A row brought back into memory (Forget) is skipped by gets and walks
// until its key is put again, into the same record.
TEST(ColdStoreTest, AForgottenRowIsSkippedAndItsRecordReused) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold6"));
  ColdRange r(store.get(), 1, 0, 2);
  for (uint64_t k = 10; k < 20; ++k) ASSERT_OK(r.Put(k, Row(k, 2)));
  EXPECT_EQ(r.size(), 10u);
  EXPECT_TRUE(r.Forget(12));
  EXPECT_FALSE(r.Forget(12)) << "already forgotten";
  EXPECT_FALSE(r.Forget(99)) << "never put";
  EXPECT_FALSE(r.Contains(12));
  EXPECT_TRUE(r.Contains(13));
  EXPECT_EQ(r.size(), 9u);
  std::vector<float> out(2);
  ASSERT_OK_AND_ASSIGN(bool found, r.Get(12, absl::MakeSpan(out)));
  EXPECT_FALSE(found);
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  ASSERT_OK(r.Scan(0, 100, &keys, &rows).status());
  EXPECT_EQ(keys.size(), 9u);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), 12u), 0);
  const uint64_t records = r.records();
  ASSERT_OK(r.Put(12, Row(120, 2)));
  EXPECT_EQ(r.records(), records) << "the key's record is reused";
  EXPECT_EQ(r.size(), 10u);
  ASSERT_OK_AND_ASSIGN(found, r.Get(12, absl::MakeSpan(out)));
  EXPECT_TRUE(found);
  EXPECT_EQ(out, Row(120, 2));
}

// Damage and misuse are errors, not crashes.
TEST(ColdStoreTest, BadInputIsAnError) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold5"));
  ColdRange r(store.get(), 1, 0, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(r.PutBatch({1, 2}, Row(1, 3))));
  std::vector<float> small(1);
  EXPECT_TRUE(
      absl::IsInvalidArgument(r.Get(1, absl::MakeSpan(small)).status()));
  for (uint64_t k = 0; k < 10; ++k) ASSERT_OK(r.Put(k, Row(k, 2)));
  const std::string snap = TestTmpDir() + "/cold5-snap";
  ASSERT_OK(store->Snapshot(snap, {{1, 0}}));
  auto none = [](uint64_t, absl::Span<const float>) {
    return absl::OkStatus();
  };
  // The copy read as another range's: refused.
  {
    std::error_code ec;
    std::filesystem::copy_file(snap + "/t1-r0.rows", snap + "/t1-r8.rows", ec);
    ASSERT_FALSE(ec) << ec.message();
  }
  EXPECT_TRUE(absl::IsDataLoss(ColdStore::ReadSnapshot(snap, 1, 8, none)));
  // A damaged record, a cut chunk, a missing chunk (copies of the linked
  // files, so that the live range is not touched).
  const std::string chunk = snap + "/t1-r0.rows.0";
  {
    std::error_code ec;
    std::filesystem::copy_file(chunk, chunk + ".tmp", ec);
    ASSERT_FALSE(ec) << ec.message();
    std::filesystem::rename(chunk + ".tmp", chunk, ec);
    ASSERT_FALSE(ec) << ec.message();
    std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24 * 3 + 8);
    f.write("junkjunk", 8);
  }
  EXPECT_TRUE(absl::IsDataLoss(ColdStore::ReadSnapshot(snap, 1, 0, none)));
  std::filesystem::resize_file(chunk, 30);
  EXPECT_TRUE(absl::IsDataLoss(ColdStore::ReadSnapshot(snap, 1, 0, none)));
  std::filesystem::remove(chunk);
  EXPECT_TRUE(absl::IsDataLoss(ColdStore::ReadSnapshot(snap, 1, 0, none)));
  // The live range was not touched by any of it.
  std::vector<float> out(2);
  ASSERT_OK_AND_ASSIGN(bool found, r.Get(3, absl::MakeSpan(out)));
  EXPECT_TRUE(found);
  EXPECT_EQ(out, Row(3, 2));
  // A tier whose folder cannot be made.
  const std::string file = TestTmpDir() + "/cold5-file";
  { std::ofstream(file) << "x"; }
  EXPECT_FALSE(ColdStore::Open(file + "/sub").ok());
}

}  // namespace
}  // namespace storage
}  // namespace downpour
