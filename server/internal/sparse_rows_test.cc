#include "server/internal/sparse_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <list>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "handlers/handler.h"
#include "handlers/initializer.h"

namespace downpour {
namespace server_internal {
namespace {

constexpr size_t kWidth = 2;

struct Fixture {
  explicit Fixture(RangeBounds bounds, bool cold = false,
                   const std::string& handler = "sum") {
    proto::InitializerSpec init_spec;
    init_spec.set_kind(proto::InitializerSpec::CONSTANT);
    init_spec.set_value(0.5f);
    init = std::make_unique<Initializer>(*Initializer::Create(init_spec));
    proto::HandlerSpec h;
    h.set_name(handler);
    this->handler = *CreateHandler(h, nullptr);
    std::unique_ptr<storage::ColdRange> range;
    if (cold) {
      store = *storage::ColdStore::Open(
          absl::StrCat(TestTmpDir(), "/cold-", ++counter));
      range = std::make_unique<storage::ColdRange>(
          store.get(), 1, 0, kWidth + this->handler->StateWidth(kWidth));
    }
    rows =
        std::make_unique<SparseRows>(init.get(), this->handler.get(), kWidth, 0,
                                     kKeySpaceEnd, bounds, std::move(range));
  }
  // One write the way the dispatcher makes it: room first, then the rows.
  absl::Status Add(const std::vector<Key>& keys, float v,
                   SparseRows::Room* room = nullptr) {
    SparseRows::Room local;
    DP_RETURN_IF_ERROR(rows->Prepare(keys, SparseRows::Write::kAdd, nullptr,
                                     room != nullptr ? room : &local));
    for (Key k : keys) {
      SparseRows::Row r = rows->Touch(k, SparseRows::Write::kAdd);
      for (size_t j = 0; j < kWidth; ++j) r.values[j] += v;
    }
    return absl::OkStatus();
  }
  absl::Status Push(const std::vector<Key>& keys, float g,
                    const absl::flat_hash_set<Key>* pinned = nullptr,
                    SparseRows::Room* room = nullptr) {
    SparseRows::Room local;
    DP_RETURN_IF_ERROR(rows->Prepare(keys, SparseRows::Write::kPush, pinned,
                                     room != nullptr ? room : &local));
    for (Key k : keys) {
      SparseRows::Row r = rows->Touch(k, SparseRows::Write::kPush);
      if (!r) continue;
      for (size_t j = 0; j < kWidth; ++j) r.values[j] += g;
    }
    return absl::OkStatus();
  }
  float Value(Key k) {
    float out[kWidth];
    EXPECT_OK(rows->Read(k, out));
    return out[0];
  }
  static inline int counter = 0;
  std::unique_ptr<Initializer> init;
  std::unique_ptr<UpdateHandler> handler;
  std::unique_ptr<storage::ColdStore> store;
  std::unique_ptr<SparseRows> rows;
};

RangeBounds Cap(uint64_t rows, proto::SparseBounds::Eviction e) {
  RangeBounds b;
  b.max_rows = rows;
  b.eviction = e;
  b.max_pending = 1 << 20;
  return b;
}

// The index against a model: random inserts, reads and evictions of keys
// that collide on purpose (many share their low bits), with the range
// unbounded but rows removed through Evict; reads one key at a time and in
// batches (the pipelined lookup). Run with the index's tags, and with the
// tags dropped part way (as a range of 2^24 slots drops them).
void IndexAgreesWithAModel(uint32_t untag_at) {
  const uint32_t seed = TestSeed(11);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  RangeBounds b;
  Fixture f(b);
  f.rows->UntagAtForTesting(untag_at);
  std::map<Key, float> model;
  std::vector<Key> batch;
  std::vector<float> out;
  for (int i = 0; i < 20000; ++i) {
    const Key k = (rng() % 4000) << 20;  // low bits equal
    const int op = static_cast<int>(rng() % 11);
    if (op == 10) {
      batch.resize(1 + rng() % 200);
      for (Key& key : batch) key = (rng() % 4200) << 20;
      out.assign(batch.size() * kWidth, -1);
      ASSERT_OK(f.rows->ReadBatch(batch, out.data()));
      for (size_t j = 0; j < batch.size(); ++j) {
        auto it = model.find(batch[j]);
        ASSERT_EQ(out[j * kWidth], it == model.end() ? 0.5f : it->second)
            << "key " << batch[j];
      }
      continue;
    }
    if (op < 6) {
      ASSERT_OK(f.Add({k}, 1.0f));
      model.emplace(k, 0.5f).first->second += 1.0f;
    } else if (op < 8) {
      ASSERT_OK(f.rows->Evict(std::vector<Key>{k}));
      model.erase(k);
    } else if (op < 9) {
      // A new key, evicted at once: also the one whose insertion grew
      // the index (it must be indexed once).
      const Key fresh = (4000 + rng() % 100000) << 20;
      ASSERT_OK(f.Add({fresh}, 1.0f));
      ASSERT_OK(f.rows->Evict(std::vector<Key>{fresh}));
      ASSERT_FALSE(f.rows->Find(fresh)) << "key " << fresh;
    } else {
      auto it = model.find(k);
      ASSERT_EQ(f.Value(k), it == model.end() ? 0.5f : it->second)
          << "key " << k;
      ASSERT_EQ(static_cast<bool>(f.rows->Find(k)), it != model.end());
    }
    ASSERT_EQ(f.rows->rows(), model.size());
  }
  for (const auto& [k, v] : model) ASSERT_EQ(f.Value(k), v);
}

TEST(SparseRowsTest, TheIndexAgreesWithAModel) {
  IndexAgreesWithAModel(std::numeric_limits<uint32_t>::max());
}

TEST(SparseRowsTest, TheIndexAgreesWithAModelWhenItDropsItsTags) {
  IndexAgreesWithAModel(700);
}

// Keys whose index entries share their home and their tag (8 bits of the
// hash): a lookup must look past a matching tag to the key. The index
// starts with 16 entries, so equal low 4 bits of the hash share a home.
TEST(SparseRowsTest, KeysWhoseTagsCollideStayApart) {
  std::vector<Key> same;
  const uint64_t first = SplitMix64(1);
  for (Key k = 1; same.size() < 5; ++k) {
    const uint64_t h = SplitMix64(k);
    if ((h & 15) == (first & 15) && (h >> 56) == (first >> 56)) {
      same.push_back(k);
    }
  }
  Fixture f(RangeBounds{});
  for (size_t i = 0; i < 4; ++i) ASSERT_OK(f.Add({same[i]}, i + 1.0f));
  // Every order, and the fifth (absent) key among them.
  const std::vector<Key> batch = {same[3], same[0], same[4],
                                  same[2], same[1], same[3]};
  std::vector<float> out(batch.size() * kWidth);
  ASSERT_OK(f.rows->ReadBatch(batch, out.data()));
  const std::vector<float> want = {4.5f, 1.5f, 0.5f, 3.5f, 2.5f, 4.5f};
  for (size_t j = 0; j < batch.size(); ++j) {
    EXPECT_EQ(out[j * kWidth], want[j]) << "key " << batch[j];
  }
  EXPECT_FALSE(f.rows->Find(same[4]));
  // Removing the first of the chain moves the others up.
  ASSERT_OK(f.rows->Evict(std::vector<Key>{same[0]}));
  EXPECT_EQ(f.Value(same[0]), 0.5f);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(f.Value(same[i]), i + 1.5f);
  ASSERT_OK(f.Add({same[1], same[4]}, 10.0f));
  ASSERT_OK(f.rows->ReadBatch(batch, out.data()));
  const std::vector<float> later = {4.5f, 0.5f, 10.5f, 3.5f, 12.5f, 4.5f};
  for (size_t j = 0; j < batch.size(); ++j) {
    EXPECT_EQ(out[j * kWidth], later[j]) << "key " << batch[j];
  }
}

// LRU against an exact model: the row count never passes the cap, the
// least recently read or written row goes first, and an evicted row reads
// as its initial values.
TEST(SparseRowsTest, LruEvictsTheLeastRecentlyUsedRowAndKeepsTheCap) {
  const uint32_t seed = TestSeed(12);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr uint64_t kCap = 50;
  Fixture f(Cap(kCap, proto::SparseBounds::LRU));
  std::list<Key> order;  // most recent first
  std::map<Key, float> model;
  auto use = [&](Key k) {
    order.remove(k);
    order.push_front(k);
  };
  for (int i = 0; i < 5000; ++i) {
    const Key k = rng() % 200;
    if (rng() % 3 == 0) {
      const float v = f.Value(k);
      auto it = model.find(k);
      ASSERT_EQ(v, it == model.end() ? 0.5f : it->second);
      if (it != model.end()) use(k);
      continue;
    }
    SparseRows::Room room;
    ASSERT_OK(f.Add({k}, 1.0f, &room));
    std::vector<Key> want_gone;
    if (!model.count(k) && model.size() == kCap) {
      want_gone.push_back(order.back());
      model.erase(order.back());
      order.pop_back();
    }
    EXPECT_EQ(room.gone, want_gone) << "op " << i;
    model.emplace(k, 0.5f).first->second += 1.0f;
    use(k);
    ASSERT_LE(f.rows->rows(), kCap);
    ASSERT_EQ(f.rows->rows(), model.size());
  }
  EXPECT_GT(f.rows->evicted(), 1000u);
}

TEST(SparseRowsTest, NoEvictionRefusesABatchWholeAtTheCap) {
  Fixture f(Cap(4, proto::SparseBounds::EVICTION_NONE));
  ASSERT_OK(f.Add({1, 2, 3}, 1.0f));
  // Two new rows do not fit: neither is created, the old rows unchanged.
  absl::Status s = f.Add({3, 4, 5}, 1.0f);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(f.rows->rows(), 3u);
  EXPECT_EQ(f.Value(3), 1.5f);
  EXPECT_FALSE(f.rows->Find(4));
  EXPECT_EQ(f.rows->refused(), 1u);
  // Repeats of a key need one row; existing keys none.
  ASSERT_OK(f.Add({4, 4, 1}, 1.0f));
  EXPECT_EQ(f.Value(4), 2.5f);
}

TEST(SparseRowsTest, ABatchLargerThanTheCapIsRefusedAndPinnedRowsStay) {
  Fixture f(Cap(3, proto::SparseBounds::LRU));
  EXPECT_EQ(f.Add({1, 2, 3, 4}, 1.0f).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_OK(f.Add({1, 2, 3}, 1.0f));
  // 1 is the least recently used, but a held BSP step pins it.
  absl::flat_hash_set<Key> pinned = {1};
  SparseRows::Room room;
  ASSERT_OK(f.Push({9}, 1.0f, &pinned, &room));
  EXPECT_EQ(room.gone, std::vector<Key>({2}));
  EXPECT_TRUE(f.rows->Find(1));
  // Every other row pinned or in the batch: refused, nothing moves.
  pinned = {1, 3, 9};
  EXPECT_EQ(f.Push({7}, 1.0f, &pinned).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(f.rows->Find(9));
  EXPECT_EQ(f.rows->rows(), 3u);
}

TEST(SparseRowsTest, LfuKeepsTheOftenUsedRows) {
  Fixture f(Cap(100, proto::SparseBounds::LFU));
  // Keys 0..49 are used 20 times each; then a stream of once-used keys.
  for (int round = 0; round < 20; ++round) {
    std::vector<Key> hot;
    for (Key k = 0; k < 50; ++k) hot.push_back(k);
    ASSERT_OK(f.Add(hot, 1.0f));
  }
  for (Key k = 1000; k < 3000; ++k) {
    ASSERT_OK(f.Add({k}, 1.0f));
    ASSERT_LE(f.rows->rows(), 100u);
  }
  int hot_left = 0;
  for (Key k = 0; k < 50; ++k) hot_left += static_cast<bool>(f.rows->Find(k));
  // Sampling (8 of 100 rows) may miss: nearly all stay, and exactly.
  EXPECT_GE(hot_left, 45);
  for (Key k = 0; k < 50; ++k) {
    if (f.rows->Find(k)) {
      EXPECT_EQ(f.Value(k), 20.5f);
    }
  }
}

TEST(SparseRowsTest, AdmissionCountsPushesExactly) {
  RangeBounds b;
  b.admit_after = 3;
  b.max_pending = 4;
  Fixture f(b);
  // Two pushes are counted, the third creates the row and is applied.
  ASSERT_OK(f.Push({7}, 1.0f));
  ASSERT_OK(f.Push({7}, 1.0f));
  EXPECT_FALSE(f.rows->Find(7));
  EXPECT_EQ(f.Value(7), 0.5f);
  EXPECT_EQ(f.rows->PendingCount(7), 2u);
  ASSERT_OK(f.Push({7}, 1.0f));
  EXPECT_EQ(f.Value(7), 1.5f);
  EXPECT_EQ(f.rows->PendingCount(7), 0u);
  EXPECT_EQ(f.rows->admitted(), 1u);
  // Repeats in one batch count one by one: the third occurrence applies.
  ASSERT_OK(f.Push({8, 8, 8, 8}, 1.0f));
  EXPECT_EQ(f.Value(8), 2.5f);
  // A put or an add creates at once.
  ASSERT_OK(f.Add({9}, 1.0f));
  EXPECT_EQ(f.Value(9), 1.5f);
  // The counter table holds 4 ids: the one pushed least recently goes.
  for (Key k = 100; k < 105; ++k) ASSERT_OK(f.Push({k}, 1.0f));
  EXPECT_EQ(f.rows->pending_ids(), 4u);
  EXPECT_EQ(f.rows->PendingCount(100), 0u);
  EXPECT_EQ(f.rows->PendingCount(104), 1u);
}

TEST(SparseRowsTest, AdmissionAndACapPlanTogether) {
  RangeBounds b = Cap(2, proto::SparseBounds::LRU);
  b.admit_after = 2;
  Fixture f(b);
  ASSERT_OK(f.Push({1, 1, 2, 2}, 1.0f));  // both admitted by the batch
  EXPECT_EQ(f.rows->rows(), 2u);
  // 3 is only counted: nothing is evicted for it.
  SparseRows::Room room;
  ASSERT_OK(f.Push({3}, 1.0f, nullptr, &room));
  EXPECT_TRUE(room.gone.empty());
  EXPECT_EQ(f.rows->rows(), 2u);
  // Its second push admits it: the least recent row (1) goes.
  ASSERT_OK(f.Push({3}, 1.0f, nullptr, &room));
  EXPECT_EQ(room.gone, std::vector<Key>({1}));
}

TEST(SparseRowsTest, RowsIdleForTtlClocksExpire) {
  RangeBounds b;
  b.ttl_clocks = 3;
  Fixture f(b);
  f.rows->ObserveClock(0);
  ASSERT_OK(f.Add({1, 2}, 1.0f));
  f.rows->ObserveClock(2);
  ASSERT_OK(f.Add({2}, 1.0f));
  f.rows->ObserveClock(3);
  SparseRows::Room room;
  ASSERT_OK(f.rows->Expire(100, nullptr, &room));
  EXPECT_EQ(room.gone, std::vector<Key>({1}));  // idle 3 clocks
  EXPECT_EQ(f.rows->expired(), 1u);
  EXPECT_EQ(f.Value(1), 0.5f);
  f.rows->ObserveClock(5);
  room.clear();
  absl::flat_hash_set<Key> pinned = {2};
  ASSERT_OK(f.rows->Expire(100, &pinned, &room));
  EXPECT_TRUE(room.gone.empty()) << "a pinned row stays";
  ASSERT_OK(f.rows->Expire(100, nullptr, &room));
  EXPECT_EQ(room.gone, std::vector<Key>({2}));
}

TEST(SparseRowsTest, TheColdTierKeepsEvictedRowsAndGivesThemBack) {
  Fixture f(Cap(3, proto::SparseBounds::LRU), /*cold=*/true, "adagrad");
  ASSERT_OK(f.Add({1, 2, 3}, 1.0f));
  SparseRows::Room room;
  ASSERT_OK(f.Add({4}, 2.0f, &room));
  EXPECT_EQ(room.gone, std::vector<Key>({1}));
  EXPECT_TRUE(f.rows->IsCold(1));
  EXPECT_EQ(f.rows->cold_rows(), 1u);
  EXPECT_EQ(f.Value(1), 1.5f) << "a read serves the cold row";
  EXPECT_FALSE(f.rows->Find(1)) << "without bringing it back";
  // A write brings it back (making room), with its values and state.
  room.clear();
  ASSERT_OK(f.Add({1}, 1.0f, &room));
  EXPECT_EQ(room.back, std::vector<Key>({1}));
  EXPECT_EQ(room.gone, std::vector<Key>({2}));
  EXPECT_EQ(f.Value(1), 2.5f);
  EXPECT_FALSE(f.rows->IsCold(1));
  EXPECT_TRUE(f.rows->IsCold(2));
  EXPECT_EQ(f.rows->rows(), 3u);
}

// A copy (a backup catching up): rows in memory, admission counters and
// cold rows, exported from one store and imported into a fresh one, give
// the same state.
TEST(SparseRowsTest, ExportAndImportCopyEverything) {
  RangeBounds b = Cap(20, proto::SparseBounds::LRU);
  b.admit_after = 2;
  b.cold = true;
  Fixture a(b, /*cold=*/true);
  Fixture c(b, /*cold=*/true);
  for (Key k = 0; k < 60; ++k) ASSERT_OK(a.Push({k, k}, 1.0f * k));
  for (Key k = 100; k < 110; ++k) ASSERT_OK(a.Push({k}, 1.0f));  // pending
  ASSERT_EQ(a.rows->rows(), 20u);
  ASSERT_EQ(a.rows->cold_rows(), 40u);
  std::optional<uint64_t> cursor = 0;
  int chunks = 0;
  while (cursor.has_value()) {
    SparseRows::Chunk chunk;
    cursor = a.rows->Export(*cursor, 256, /*with_cold=*/true, &chunk);
    ASSERT_OK(c.rows->Import(chunk.kind, chunk.keys, chunk.data));
    ++chunks;
  }
  EXPECT_GT(chunks, 4);
  EXPECT_EQ(c.rows->rows(), 20u);
  EXPECT_EQ(c.rows->cold_rows(), 40u);
  EXPECT_EQ(c.rows->pending_ids(), 10u);
  for (Key k = 0; k < 60; ++k) {
    EXPECT_EQ(c.Value(k), a.Value(k)) << "key " << k;
    EXPECT_EQ(static_cast<bool>(c.rows->Find(k)),
              static_cast<bool>(a.rows->Find(k)));
  }
  for (Key k = 100; k < 110; ++k) EXPECT_EQ(c.rows->PendingCount(k), 1u);
  // Malformed chunks change nothing.
  std::vector<Key> keys = {1};
  std::vector<float> short_data = {1.0f};
  EXPECT_EQ(c.rows->Import(proto::RowChunkInfo::ROWS, keys, short_data).code(),
            absl::StatusCode::kDataLoss);
  std::vector<float> zero = {0.0f};
  EXPECT_EQ(c.rows->Import(proto::RowChunkInfo::PENDING, keys, zero).code(),
            absl::StatusCode::kDataLoss);
}

// What a row costs, the figure SparseRowBytes promises (about 32 bytes
// besides its floats), at width 16 with sgd (no state).
TEST(SparseRowsTest, ARowCostsItsFloatsAndAboutThirtyTwoBytes) {
  proto::InitializerSpec init_spec;
  Initializer init = *Initializer::Create(init_spec);
  proto::HandlerSpec h;
  h.set_name("sgd");
  auto handler = *CreateHandler(h, nullptr);
  RangeBounds b = Cap(1 << 20, proto::SparseBounds::LRU);
  SparseRows rows(&init, handler.get(), 16, 0, kKeySpaceEnd, b, nullptr);
  std::vector<Key> keys;
  for (Key k = 0; k < 200000; ++k) keys.push_back(k * 7919);
  SparseRows::Room room;
  ASSERT_OK(rows.Prepare(keys, SparseRows::Write::kPut, nullptr, &room));
  for (Key k : keys) rows.Touch(k, SparseRows::Write::kPut);
  const double per_row = static_cast<double>(rows.allocated_bytes()) / 200000;
  std::printf("bytes per row at width 16 (sgd): %.1f (floats 64)\n", per_row);
  EXPECT_LE(per_row, 64 * 1.5 + 4);  // the index doubles at 0.8 load
  EXPECT_GE(per_row, 64 + 16);
}

}  // namespace
}  // namespace server_internal
}  // namespace downpour
