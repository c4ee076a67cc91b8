#include "storage/checkpoint_store.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace storage {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = TestTmpDir() + "/" + name;
  EXPECT_EQ(system(("rm -rf " + dir).c_str()), 0);
  return dir;
}

proto::RowChunkInfo Info(uint64_t first, uint64_t count) {
  proto::RowChunkInfo info;
  info.set_first_key(first);
  info.set_count(count);
  return info;
}

// Writes checkpoint `id`: one dense range [0, 6) of table 3 in two chunks
// and one sparse range of table 4, values offset by `base`.
absl::Status WritePart(CheckpointStore& store, uint64_t id, float base) {
  std::vector<float> a = {base + 0, base + 1, base + 2, base + 3};
  std::vector<float> b = {base + 4, base + 5};
  if (auto s = store.WriteChunk(id, 3, 0, 0, Info(0, 4), {}, a); !s.ok()) {
    return s;
  }
  if (auto s = store.WriteChunk(id, 3, 0, 1, Info(4, 2), {}, b); !s.ok()) {
    return s;
  }
  std::vector<uint64_t> keys = {uint64_t{1} << 60, 7};
  std::vector<float> c = {base - 1, base - 2};
  if (auto s = store.WriteChunk(id, 4, 0, 0, Info(0, 2), keys, c); !s.ok()) {
    return s;
  }
  proto::CheckpointPart part;
  part.set_id(id);
  part.set_clock(10 * id);
  part.set_server("server-0");
  auto* r = part.add_ranges();
  r->mutable_spec()->set_id(3);
  r->set_begin(0);
  r->set_end(6);
  r->set_chunks(2);
  r = part.add_ranges();
  r->mutable_spec()->set_id(4);
  r->set_chunks(1);
  return store.FinishPart(part);
}

std::vector<float> ReadRange(CheckpointStore& store, uint64_t id,
                             uint32_t table, uint64_t chunks,
                             std::vector<uint64_t>* keys = nullptr) {
  std::vector<float> out;
  EXPECT_OK(store.ReadChunks(id, table, 0, chunks, [&](const StoredChunk& c) {
    out.insert(out.end(), c.data.begin(), c.data.end());
    if (keys != nullptr)
      keys->insert(keys->end(), c.keys.begin(), c.keys.end());
    return absl::OkStatus();
  }));
  return out;
}

TEST(CheckpointStoreTest, APartReadsBackExactly) {
  const std::string dir = FreshDir("roundtrip");
  {
    ASSERT_OK_AND_ASSIGN(auto db, Database::Open(dir, {.bulk = true}));
    CheckpointStore store(db.get());
    ASSERT_OK(WritePart(store, 5, 100));
  }
  ASSERT_OK_AND_ASSIGN(auto db, Database::Open(dir, {.read_only = true}));
  CheckpointStore store(db.get());
  ASSERT_OK_AND_ASSIGN(proto::CheckpointPart part, store.ReadPart(5));
  EXPECT_EQ(part.clock(), 50);
  EXPECT_EQ(part.server(), "server-0");
  EXPECT_EQ(ReadRange(store, 5, 3, 2),
            (std::vector<float>{100, 101, 102, 103, 104, 105}));
  std::vector<uint64_t> keys;
  EXPECT_EQ(ReadRange(store, 5, 4, 1, &keys), (std::vector<float>{99, 98}));
  EXPECT_EQ(keys, (std::vector<uint64_t>{uint64_t{1} << 60, 7}));
  // A chunk count that disagrees with what is stored is data loss.
  EXPECT_THAT(
      store.ReadChunks(5, 3, 0, 3,
                       [](const StoredChunk&) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kDataLoss));
}

TEST(CheckpointStoreTest, AnUnfinishedPartIsAbsentAndDropsRemoveParts) {
  ASSERT_OK_AND_ASSIGN(auto db,
                       Database::Open(FreshDir("drop"), {.bulk = true}));
  CheckpointStore store(db.get());
  ASSERT_OK(WritePart(store, 1, 0));
  ASSERT_OK(WritePart(store, 2, 10));
  // Rows of a third checkpoint whose part record was never written.
  ASSERT_OK(
      store.WriteChunk(3, 3, 0, 0, Info(0, 1), {}, std::vector<float>{1}));
  EXPECT_THAT(store.ReadPart(3), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> ids, store.FinishedParts());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2}));
  ASSERT_OK(store.DropBefore(2));
  ASSERT_OK_AND_ASSIGN(ids, store.FinishedParts());
  EXPECT_EQ(ids, (std::vector<uint64_t>{2}));
  EXPECT_EQ(ReadRange(store, 2, 3, 2),
            (std::vector<float>{10, 11, 12, 13, 14, 15}));
  ASSERT_OK(store.Drop(2));
  ASSERT_OK_AND_ASSIGN(ids, store.FinishedParts());
  EXPECT_TRUE(ids.empty());
}

// LevelDB-style: the disk fills up below the store in the middle of a
// checkpoint. The checkpoint fails cleanly (no part record) and the one
// before it still reads back.
TEST(CheckpointStoreTest, AFullDiskFailsThePartAndKeepsThePreviousOne) {
  const std::string dir = FreshDir("full");
  {
    ASSERT_OK_AND_ASSIGN(
        auto db,
        Database::Open(dir, {.bulk = true, .fail_after_bytes = 2 << 20}));
    CheckpointStore store(db.get());
    ASSERT_OK(WritePart(store, 1, 0));
    std::vector<float> big(1 << 18, 1.5f);  // 1 MiB per chunk
    absl::Status s;
    for (int i = 0; i < 8 && s.ok(); ++i) {
      s = store.WriteChunk(2, 3, 0, i, Info(0, big.size()), {}, big);
    }
    if (s.ok()) {
      proto::CheckpointPart part;
      part.set_id(2);
      s = store.FinishPart(part);
    }
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(store.ReadPart(2), StatusIs(absl::StatusCode::kNotFound));
  }
  ASSERT_OK_AND_ASSIGN(auto db, Database::Open(dir, {.bulk = true}));
  CheckpointStore store(db.get());
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> ids, store.FinishedParts());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1}));
  EXPECT_EQ(ReadRange(store, 1, 3, 2), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace storage
}  // namespace downpour
