// Zero-copy reads of a dense shard (TableShard::PinRange): a pinned reply is
// never torn by a write, writes to other rows do not wait, a pin that is
// never released makes the writer copy the array instead of stalling, and
// the pinned memory outlives the shard.
#include "server/internal/table_shard.h"

#include <atomic>
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

std::unique_ptr<TableShard> MakeShard(const PinOptions& pins,
                                      proto::TableSpec spec = DenseSpec()) {
  static PluginRegistry plugins;
  auto shard = TableShard::Create(spec, {KeyRange{0, kKeys}}, &plugins, pins);
  EXPECT_OK(shard);
  return std::move(shard).value();
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

std::vector<float> Snapshot(const TableShard::PinnedRows& p) {
  return std::vector<float>(p.data, p.data + p.bytes / sizeof(float));
}

TEST(TableShardPinTest, PinnedRowsAreTheTableAndReleaseUnpins) {
  auto shard = MakeShard(PinEverything());
  shard->PutRange(100, 200, Filled(100, 200, 3).data());
  std::optional<TableShard::PinnedRows> p = shard->PinRange(100, 200);
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

TEST(TableShardPinTest, SmallReadsAndSparseTablesAreCopied) {
  auto shard = MakeShard(PinOptions{});  // default: 256 KiB and more
  EXPECT_FALSE(shard->PinRange(0, 10).has_value());
  proto::TableSpec sparse = DenseSpec();
  sparse.set_kind(proto::SPARSE);
  sparse.set_num_keys(0);
  auto s = MakeShard(PinEverything(), sparse);
  EXPECT_FALSE(s->PinRange(0, 10).has_value());
}

TEST(TableShardPinTest, WriteToPinnedRowsWaitsForRelease) {
  auto shard = MakeShard(PinEverything());
  std::optional<TableShard::PinnedRows> p = shard->PinRange(100, 200);
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
  shard->GetRange(150, 160, out.data());
  EXPECT_EQ(out, Filled(150, 160, 7));
  EXPECT_EQ(shard->pin_waits(), 1u);
  EXPECT_EQ(shard->pin_copies(), 0u);
}

TEST(TableShardPinTest, BatchAndPushWritesWaitToo) {
  auto shard = MakeShard(PinEverything());
  for (int op = 0; op < 3; ++op) {
    std::optional<TableShard::PinnedRows> p = shard->PinRange(100, 200);
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
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_FALSE(written.load()) << "op " << op;
    EXPECT_EQ(Snapshot(*p), before) << "op " << op;
    p->release();
    writer.join();
  }
  EXPECT_EQ(shard->pin_waits(), 3u);
}

TEST(TableShardPinTest, WritesToOtherRowsDoNotWait) {
  auto shard = MakeShard(PinEverything(absl::Seconds(30)));
  std::optional<TableShard::PinnedRows> p = shard->PinRange(100, 200);
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

TEST(TableShardPinTest, AfterAWaitRepliesAreCopiedForAWhile) {
  PinOptions o = PinEverything();
  o.copy_after_wait = absl::Hours(1);
  auto shard = MakeShard(o);
  std::optional<TableShard::PinnedRows> p = shard->PinRange(0, 10);
  ASSERT_TRUE(p.has_value());
  std::thread writer([&] { shard->PutRange(0, 10, Filled(0, 10, 1).data()); });
  absl::SleepFor(absl::Milliseconds(50));
  p->release();
  writer.join();
  EXPECT_FALSE(shard->PinRange(0, 10).has_value());
}

TEST(TableShardPinTest, StuckPinMakesTheWriterCopyAndOutlivesTheShard) {
  auto shard = MakeShard(PinEverything(absl::Milliseconds(50)));
  shard->PutRange(0, kKeys, Filled(0, kKeys, 5).data());
  std::optional<TableShard::PinnedRows> p = shard->PinRange(0, kKeys);
  ASSERT_TRUE(p.has_value());
  const absl::Time start = absl::Now();
  shard->PutRange(10, 20, Filled(10, 20, 9).data());  // never released: copies
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(shard->pin_copies(), 1u);
  // The reply still sees the values from when it was pinned ...
  EXPECT_EQ(Snapshot(*p), Filled(0, kKeys, 5));
  // ... and the table has the write, on top of every other row.
  std::vector<float> out(kKeys * kWidth);
  shard->GetRange(0, kKeys, out.data());
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

}  // namespace
}  // namespace server_internal
}  // namespace downpour
