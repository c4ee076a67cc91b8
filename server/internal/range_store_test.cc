// RangeStore: zero-copy reads of a dense range (PinRows: a pinned reply is
// never torn by a write, writes to other rows do not wait, a pin that is
// never released makes the writer copy the array instead of stalling, and
// the pinned memory outlives the store), and copying a range elsewhere
// (ExportRows / ImportRows) while writes go on.
#include "server/internal/range_store.h"

#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/test_util.h"

namespace downpour {
namespace server_internal {
namespace {

constexpr size_t kWidth = 4;
constexpr Key kKeys = 1000;

proto::TableSpec DenseSpec() {
  proto::TableSpec spec;
  spec.set_name("dense");
  spec.set_id(1);
  spec.set_kind(proto::DENSE);
  spec.set_width(kWidth);
  spec.set_num_keys(kKeys);
  spec.mutable_handler()->set_name("sum");
  return spec;
}

// A store of keys [0, kKeys) that owns its layout.
struct TestStore {
  std::unique_ptr<const TableLayout> layout;
  std::unique_ptr<RangeStore> store;
  RangeStore* operator->() { return store.get(); }
  void reset() { store.reset(); }
};

TestStore MakeShard(const PinOptions& pins,
                    proto::TableSpec spec = DenseSpec()) {
  static PluginRegistry plugins;
  auto layout = TableLayout::Create(spec, &plugins, pins);
  EXPECT_OK(layout);
  TestStore t;
  t.layout = std::move(layout).value();
  const Key end = spec.kind() == proto::DENSE ? kKeys : kKeySpaceEnd;
  t.store = std::make_unique<RangeStore>(t.layout.get(), KeyRange{0, end});
  return t;
}

PinOptions PinEverything(absl::Duration wait = absl::Seconds(30)) {
  PinOptions o;
  o.min_bytes = 0;
  o.wait = wait;
  o.copy_after_wait = absl::ZeroDuration();
  return o;
}

std::vector<float> Filled(Key begin, Key end, float v) {
  return std::vector<float>((end - begin) * kWidth, v);
}

std::vector<float> Snapshot(const RangeStore::PinnedRows& p) {
  return std::vector<float>(p.data, p.data + p.bytes / sizeof(float));
}

TEST(RangeStorePinTest, PinnedRowsAreTheTableAndReleaseUnpins) {
  auto shard = MakeShard(PinEverything());
  shard->PutRange(100, 200, Filled(100, 200, 3).data());
  std::optional<RangeStore::PinnedRows> p = shard->PinRows(100, 200);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->bytes, 100 * kWidth * sizeof(float));
  EXPECT_EQ(Snapshot(*p), Filled(100, 200, 3));
  EXPECT_EQ(shard->pinned_replies(), 1);
  EXPECT_EQ(shard->zero_copy_replies(), 1u);
  p->release();
  EXPECT_EQ(shard->pinned_replies(), 0);
  // Unpinned: a write does not wait.
  shard->PutRange(100, 200, Filled(100, 200, 4).data());
  EXPECT_EQ(shard->pin_waits(), 0u);
}

TEST(RangeStorePinTest, SmallReadsAndSparseTablesAreCopied) {
  auto shard = MakeShard(PinOptions{});  // default: 256 KiB and more
  EXPECT_FALSE(shard->PinRows(0, 10).has_value());
  proto::TableSpec sparse = DenseSpec();
  sparse.set_kind(proto::SPARSE);
  sparse.set_num_keys(0);
  auto s = MakeShard(PinEverything(), sparse);
  EXPECT_FALSE(s->PinRows(0, 10).has_value());
}

TEST(RangeStorePinTest, WriteToPinnedRowsWaitsForRelease) {
  auto shard = MakeShard(PinEverything());
  std::optional<RangeStore::PinnedRows> p = shard->PinRows(100, 200);
  ASSERT_TRUE(p.has_value());
  const std::vector<float> before = Snapshot(*p);
  std::atomic<bool> written{false};
  // The shard is handed to the writer thread (one thread at a time uses
  // it); only the release runs concurrently, as it does on ZeroMQ's thread.
  std::thread writer([&] {
    shard->PutRange(150, 160, Filled(150, 160, 7).data());
    written = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(written.load());
  EXPECT_EQ(Snapshot(*p), before) << "a pinned reply was modified";
  p->release();
  writer.join();
  EXPECT_TRUE(written.load());
  std::vector<float> out((160 - 150) * kWidth);
  ASSERT_OK(shard->GetRange(150, 160, out.data()));
  EXPECT_EQ(out, Filled(150, 160, 7));
  EXPECT_EQ(shard->pin_waits(), 1u);
  EXPECT_EQ(shard->pin_copies(), 0u);
}

TEST(RangeStorePinTest, BatchAndPushWritesWaitToo) {
  auto shard = MakeShard(PinEverything());
  for (int op = 0; op < 3; ++op) {
    std::optional<RangeStore::PinnedRows> p = shard->PinRows(100, 200);
    ASSERT_TRUE(p.has_value());
    const std::vector<float> before = Snapshot(*p);
    std::atomic<bool> written{false};
    std::thread writer([&] {
      const std::vector<Key> keys = {120, 110};
      const std::vector<float> v = Filled(0, 2, 1);
      if (op == 0) shard->Put(keys, v.data());
      if (op == 1) shard->Add(keys, v.data());
      if (op == 2) shard->Push(keys, v.data());
      written = true;
    });
    // Until the writer is blocked on the pin (on a loaded machine the
    // thread may take a while to start; a fixed sleep raced with it).
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (shard->pin_waits() < static_cast<uint64_t>(op + 1) &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_FALSE(written.load()) << "op " << op;
    EXPECT_EQ(Snapshot(*p), before) << "op " << op;
    p->release();
    writer.join();
    EXPECT_EQ(shard->pin_waits(), static_cast<uint64_t>(op + 1)) << "op " << op;
  }
}

TEST(RangeStorePinTest, WritesToOtherRowsDoNotWait) {
  auto shard = MakeShard(PinEverything(absl::Seconds(30)));
  std::optional<RangeStore::PinnedRows> p = shard->PinRows(100, 200);
  ASSERT_TRUE(p.has_value());
  const absl::Time start = absl::Now();
  shard->PutRange(200, 300, Filled(200, 300, 1).data());
  shard->PutRange(0, 100, Filled(0, 100, 1).data());
  const std::vector<Key> keys = {300, 999};
  shard->Push(keys, Filled(0, 2, 1).data());
  shard->PushRange(500, 600, Filled(500, 600, 1).data());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(shard->pin_waits(), 0u);
  p->release();
}

TEST(RangeStorePinTest, AfterAWaitRepliesAreCopiedForAWhile) {
  PinOptions o = PinEverything();
  o.copy_after_wait = absl::Hours(1);
  auto shard = MakeShard(o);
  std::optional<RangeStore::PinnedRows> p = shard->PinRows(0, 10);
  ASSERT_TRUE(p.has_value());
  std::thread writer([&] { shard->PutRange(0, 10, Filled(0, 10, 1).data()); });
  absl::SleepFor(absl::Milliseconds(50));
  p->release();
  writer.join();
  EXPECT_FALSE(shard->PinRows(0, 10).has_value());
}

TEST(RangeStorePinTest, StuckPinMakesTheWriterCopyAndOutlivesTheShard) {
  auto shard = MakeShard(PinEverything(absl::Milliseconds(50)));
  shard->PutRange(0, kKeys, Filled(0, kKeys, 5).data());
  std::optional<RangeStore::PinnedRows> p = shard->PinRows(0, kKeys);
  ASSERT_TRUE(p.has_value());
  const absl::Time start = absl::Now();
  shard->PutRange(10, 20, Filled(10, 20, 9).data());  // never released: copies
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(shard->pin_copies(), 1u);
  // The reply still sees the values from when it was pinned ...
  EXPECT_EQ(Snapshot(*p), Filled(0, kKeys, 5));
  // ... and the table has the write, on top of every other row.
  std::vector<float> out(kKeys * kWidth);
  ASSERT_OK(shard->GetRange(0, kKeys, out.data()));
  std::vector<float> expected = Filled(0, kKeys, 5);
  std::fill(expected.begin() + 10 * kWidth, expected.begin() + 20 * kWidth, 9);
  EXPECT_EQ(out, expected);
  // Later writes go to the copy without waiting.
  shard->PutRange(30, 40, Filled(30, 40, 1).data());
  EXPECT_EQ(shard->pin_waits(), 1u);
  // The pinned memory stays valid after the shard is gone (ASan checks).
  shard.reset();
  EXPECT_EQ(Snapshot(*p), Filled(0, kKeys, 5));
  p->release();
}

// A put of the parameters starts the update rule over for those rows: the
// handler state is reset, dense and sparse, batch and range.
TEST(RangeStoreTest, APutResetsTheHandlerStateOfItsRows) {
  for (bool dense : {true, false}) {
    SCOPED_TRACE(dense ? "dense" : "sparse");
    proto::TableSpec spec = DenseSpec();
    spec.set_width(1);
    spec.mutable_handler()->set_name("adagrad");
    (*spec.mutable_handler()->mutable_params())["learning_rate"] = 1.0;
    (*spec.mutable_handler()->mutable_params())["initial_accumulator"] = 1.0;
    if (!dense) {
      spec.set_kind(proto::SPARSE);
      spec.set_num_keys(0);
    }
    TestStore t = MakeShard(PinOptions{}, spec);
    TestStore fresh = MakeShard(PinOptions{}, spec);
    const std::vector<Key> keys = {3, 4};
    const std::vector<float> big = {100, 100}, g = {1, 1}, v = {5, 5};
    t->Push(keys, big.data());  // the accumulator grows to 1 + 100^2
    t->Put(keys, v.data());
    fresh->Put(keys, v.data());
    t->Push(keys, g.data());
    fresh->Push(keys, g.data());
    std::vector<float> a(2), b(2);
    ASSERT_OK(t->Get(keys, a.data()));
    ASSERT_OK(fresh->Get(keys, b.data()));
    EXPECT_EQ(a, b);
    t->PutRange(3, 5, v.data());
    t->Push(keys, g.data());
    fresh->PutRange(3, 5, v.data());
    fresh->Push(keys, g.data());
    ASSERT_OK(t->Get(keys, a.data()));
    ASSERT_OK(fresh->Get(keys, b.data()));
    EXPECT_EQ(a, b);
  }
}

// --- Copying a range: ExportRows / ImportRows ---

// Every row's values, handler state and named vectors, by key, as the
// export reads them: two stores hold the same range exactly when their
// dumps are equal (compared as bits, since NaN != NaN).
std::map<Key, std::vector<uint32_t>> Dump(const RangeStore& store) {
  std::map<Key, std::vector<uint32_t>> rows;
  const size_t w = store.layout().width, sw = store.layout().state_width;
  RowChunk c;
  std::optional<uint64_t> cursor = 0;
  while (cursor) {
    cursor = store.ExportRows(*cursor, 1000, &c);
    const size_t n = c.count;
    for (size_t i = 0; i < n; ++i) {
      const Key key = c.keys.empty() ? c.first_key + i : c.keys[i];
      std::vector<uint32_t>& row = rows[key];
      auto append = [&](const float* block, size_t stride) {
        const uint32_t* b = reinterpret_cast<const uint32_t*>(block);
        row.insert(row.end(), b + i * stride, b + (i + 1) * stride);
      };
      const float* block = c.data.data();
      append(block, w);
      block += n * w;
      // Blocks left out stand for their initial contents.
      if (c.has_state) {
        append(block, sw);
        block += n * sw;
      } else if (sw > 0) {
        std::vector<float> init(sw);
        store.layout().handler->InitState(init.data(), 1, w);
        row.insert(row.end(), reinterpret_cast<uint32_t*>(init.data()),
                   reinterpret_cast<uint32_t*>(init.data()) + sw);
      }
      size_t next = 0;
      for (uint32_t v = 1; v < store.layout().num_vectors; ++v) {
        if (next < c.vectors.size() && c.vectors[next] == v) {
          append(block, w);
          block += n * w;
          ++next;
        } else {
          row.insert(row.end(), w, 0u);  // zeros
        }
      }
    }
  }
  return rows;
}

proto::TableSpec AdamSpec(bool dense) {
  proto::TableSpec spec;
  spec.set_name(dense ? "dense-adam" : "sparse-adam");
  spec.set_id(2);
  spec.set_kind(dense ? proto::DENSE : proto::SPARSE);
  spec.set_width(3);
  if (dense) {
    spec.set_num_keys(kKeys);
    spec.add_vectors("x");
    spec.add_vectors("g");
    spec.add_vectors("d");
  }
  spec.mutable_handler()->set_name("adam");
  spec.mutable_init()->set_kind(proto::InitializerSpec::NORMAL);
  spec.mutable_init()->set_stddev(0.1f);
  spec.mutable_init()->set_seed(7);
  return spec;
}

// Applies one random write to `stores` (the same write to each).
void RandomWrite(std::mt19937_64& rng, bool dense,
                 std::vector<RangeStore*> stores) {
  const size_t w = 3;
  std::uniform_int_distribution<int> kind(0, 4);
  std::uniform_real_distribution<float> value(-1, 1);
  const int k = kind(rng);
  // Sparse keys come from a small pool, so rows get written again.
  auto key = [&] { return dense ? rng() % kKeys : rng() % 3000 * 7919; };
  if (dense && k == 4) {
    const Key b = rng() % kKeys, e = std::min<Key>(kKeys, b + 1 + rng() % 50);
    std::vector<float> g((e - b) * w);
    for (float& f : g) f = value(rng);
    for (RangeStore* s : stores) s->PushRange(b, e, g.data());
    return;
  }
  std::vector<Key> keys(1 + rng() % 20);
  for (Key& kk : keys) kk = key();
  std::vector<float> v(keys.size() * w);
  for (float& f : v) f = value(rng);
  const uint32_t vector = dense ? rng() % 3 : 0;  // x, g, d
  for (RangeStore* s : stores) {
    if (k == 0) s->Put(keys, v.data(), vector);
    if (k == 1) s->Add(keys, v.data(), vector);
    if (k >= 2) s->Push(keys, v.data());
  }
}

class RangeCopyTest : public ::testing::TestWithParam<bool> {};

TEST_P(RangeCopyTest, ACopyMadeWhileWritesGoOnEndsExact) {
  const bool dense = GetParam();
  static PluginRegistry plugins;
  auto layout = TableLayout::Create(AdamSpec(dense), &plugins);
  ASSERT_OK(layout);
  const KeyRange range{0, dense ? kKeys : kKeySpaceEnd};
  RangeStore source(layout->get(), range);
  const uint64_t seed = 20261123;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int i = 0; i < 300; ++i) RandomWrite(rng, dense, {&source});

  // The replica applies every write after the copy started, also to rows
  // whose chunk has not arrived yet (those hold junk until it does).
  // A replica starts from a fresh store; a dense one then holds junk in
  // rows whose chunk has not come (here: a write the source never saw).
  RangeStore replica(layout->get(), range);
  if (dense) RandomWrite(rng, dense, {&replica});
  RowChunk chunk;
  std::optional<uint64_t> cursor = 0;
  int chunks = 0;
  while (cursor) {
    cursor = source.ExportRows(*cursor, 2000, &chunk);
    ASSERT_OK(replica.ImportRows(chunk));
    ++chunks;
    for (int i = 0; i < 5; ++i) RandomWrite(rng, dense, {&source, &replica});
  }
  EXPECT_GT(chunks, 5);
  EXPECT_EQ(Dump(replica), Dump(source));
  EXPECT_EQ(replica.rows(), source.rows());
}

TEST_P(RangeCopyTest, MalformedChunksAreDataLossAndChangeNothing) {
  const bool dense = GetParam();
  static PluginRegistry plugins;
  auto layout = TableLayout::Create(AdamSpec(dense), &plugins);
  ASSERT_OK(layout);
  const KeyRange range{0, dense ? Key{500} : Key{1000000}};
  RangeStore source(layout->get(), range);
  std::mt19937_64 rng(3);
  std::vector<Key> keys = {1, 2, 3};
  std::vector<float> g(9, 0.5f);
  source.Push(keys, g.data());
  RangeStore target(layout->get(), range);
  const auto before = Dump(target);
  RowChunk good;
  ASSERT_FALSE(source.ExportRows(0, 1 << 20, &good).has_value());

  RowChunk c = good;
  c.data.pop_back();
  EXPECT_THAT(target.ImportRows(c), StatusIs(absl::StatusCode::kDataLoss));
  c = good;
  c.count += 1;
  EXPECT_THAT(target.ImportRows(c), StatusIs(absl::StatusCode::kDataLoss));
  c = good;
  if (dense) {
    c.first_key = 450;  // runs past the range's end
    c.count = 100;
    c.data.resize(c.ExpectedFloats(3, layout.value()->state_width));
  } else {
    c.keys[0] = 2000000;  // outside the range
  }
  EXPECT_THAT(target.ImportRows(c), StatusIs(absl::StatusCode::kDataLoss));
  c = good;
  c.vectors = {9};
  c.data.resize(c.ExpectedFloats(3, layout.value()->state_width));
  EXPECT_THAT(target.ImportRows(c), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(Dump(target), before);
  ASSERT_OK(target.ImportRows(good));
  EXPECT_EQ(Dump(target), Dump(source));
}

INSTANTIATE_TEST_SUITE_P(DenseAndSparse, RangeCopyTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Dense" : "Sparse";
                         });

}  // namespace
}  // namespace server_internal
}  // namespace downpour
