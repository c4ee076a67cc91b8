#include "storage/cold_store.h"

#include <gtest/gtest.h>

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

TEST(ColdStoreTest, AScanByBucketsSeesEveryRowOnce) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold2"));
  ColdRange r(store.get(), 1, 0, 2);
  std::mt19937_64 rng(TestSeed(5));
  std::map<uint64_t, std::vector<float>> want;
  for (int i = 0; i < 3000; ++i) {
    const uint64_t k = rng();
    want[k] = Row(k % 1000, 2);
    ASSERT_OK(r.Put(k, want[k]));
  }
  std::map<uint64_t, std::vector<float>> got;
  std::optional<uint32_t> bucket = 0;
  int calls = 0;
  while (bucket.has_value()) {
    std::vector<uint64_t> keys;
    std::vector<float> rows;
    ASSERT_OK_AND_ASSIGN(bucket, r.Scan(*bucket, 100, &keys, &rows));
    ASSERT_EQ(rows.size(), keys.size() * 2);
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_TRUE(
          got.emplace(keys[i], std::vector<float>(rows.begin() + 2 * i,
                                                  rows.begin() + 2 * i + 2))
              .second)
          << "key " << keys[i] << " twice";
    }
    ++calls;
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(calls, 10);
  ASSERT_OK(r.Clear());
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  ASSERT_OK(r.Scan(0, 100, &keys, &rows).status());
  EXPECT_TRUE(keys.empty());
}

TEST(ColdStoreTest, ASnapshotIsAConsistentCopyReadBackByRange) {
  ASSERT_OK_AND_ASSIGN(auto store, ColdStore::Open(TestTmpDir() + "/cold3"));
  ColdRange a(store.get(), 1, 0, 3), b(store.get(), 1, 500, 3);
  for (uint64_t k = 0; k < 50; ++k) ASSERT_OK(a.Put(k, Row(k, 3)));
  for (uint64_t k = 500; k < 520; ++k) ASSERT_OK(b.Put(k, Row(k, 3)));
  const std::string snap = TestTmpDir() + "/cold3-snap";
  ASSERT_OK(store->Snapshot(snap));
  // Later changes are not in the copy.
  ASSERT_OK(a.Delete(3));
  ASSERT_OK(a.Put(60, Row(60, 3)));
  std::map<uint64_t, std::vector<float>> got;
  ASSERT_OK(ColdStore::ReadSnapshot(
      snap, 1, 0, [&](uint64_t k, absl::Span<const float> row) {
        got[k] = std::vector<float>(row.begin(), row.end());
        return absl::OkStatus();
      }));
  ASSERT_EQ(got.size(), 50u);
  EXPECT_EQ(got[3], Row(3, 3));
  EXPECT_EQ(got.count(60), 0u);
  EXPECT_TRUE(absl::IsNotFound(ColdStore::ReadSnapshot(
      TestTmpDir() + "/nowhere", 1, 0,
      [](uint64_t, absl::Span<const float>) { return absl::OkStatus(); })));
}

}  // namespace
}  // namespace storage
}  // namespace downpour
