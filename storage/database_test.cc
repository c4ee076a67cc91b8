#include "storage/database.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/test_util.h"

namespace downpour {
namespace storage {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = TestTmpDir() + "/" + name;
  EXPECT_EQ(system(("rm -rf " + dir).c_str()), 0);
  return dir;
}

TEST(DatabaseTest, PutGetDeleteAndScanInKeyOrder) {
  ASSERT_OK_AND_ASSIGN(auto db, Database::Open(FreshDir("basic"), {}));
  ASSERT_OK(db->Put("b/2", "two", {.sync = true}));
  ASSERT_OK(db->Put("b/1", "one", {}));
  ASSERT_OK(db->Put("a", "x", {}));
  ASSERT_OK(db->Put("c", "y", {}));
  ASSERT_OK_AND_ASSIGN(std::string v, db->Get("b/2"));
  EXPECT_EQ(v, "two");
  EXPECT_THAT(db->Get("nope"), StatusIs(absl::StatusCode::kNotFound));
  std::vector<std::string> seen;
  ASSERT_OK(db->Scan("b/", [&](absl::string_view k, absl::string_view v) {
    seen.push_back(absl::StrCat(k, "=", v));
    return true;
  }));
  EXPECT_EQ(seen, (std::vector<std::string>{"b/1=one", "b/2=two"}));
  ASSERT_OK(db->Delete("b/1", {}));
  EXPECT_THAT(db->Get("b/1"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(DatabaseTest, BatchPartsAreConcatenatedAndSurviveReopen) {
  const std::string dir = FreshDir("batch");
  {
    ASSERT_OK_AND_ASSIGN(auto db, Database::Open(dir, {.bulk = true}));
    WriteBatch batch;
    batch.Put("k", {"ab", "", "cde"});
    batch.Put("gone", "1");
    batch.Delete("gone");
    ASSERT_OK(db->Write(&batch, {.wal = false}));
    ASSERT_OK(db->Flush());  // durable without the log
  }
  ASSERT_OK_AND_ASSIGN(auto db, Database::Open(dir, {.bulk = true}));
  ASSERT_OK_AND_ASSIGN(std::string v, db->Get("k"));
  EXPECT_EQ(v, "abcde");
  EXPECT_THAT(db->Get("gone"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(DatabaseTest, ASecondOpenOfTheSameDirectoryIsRefused) {
  const std::string dir = FreshDir("locked");
  ASSERT_OK_AND_ASSIGN(auto first, Database::Open(dir, {}));
  auto second = Database::Open(dir, {});
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(second.status().message().find("in use by another process"),
            std::string::npos)
      << second.status();
  // A reader of a stopped server's directory takes no lock.
  ASSERT_OK(first->Put("k", "v", {.sync = true}));
  ASSERT_OK_AND_ASSIGN(auto reader, Database::Open(dir, {.read_only = true}));
  ASSERT_OK_AND_ASSIGN(std::string v, reader->Get("k"));
  EXPECT_EQ(v, "v");
}

TEST(DatabaseTest, ReadOnlyOpenOfAMissingDatabaseFails) {
  auto db = Database::Open(FreshDir("missing"), {.read_only = true});
  EXPECT_THAT(db, StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(DatabaseTest, AFullDiskFailsWritesWithResourceExhausted) {
  const std::string dir = FreshDir("full");
  // Room for the database's own files and a little more.
  ASSERT_OK_AND_ASSIGN(
      auto db,
      Database::Open(dir, {.bulk = true, .fail_after_bytes = 256 << 10}));
  ASSERT_OK(db->Put("small", "kept", {.sync = true}));
  const std::string big(64 << 10, 'x');
  absl::Status s;
  for (int i = 0; i < 64 && s.ok(); ++i) {
    s = db->Put(absl::StrCat("big/", i), big, {.sync = true});
  }
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(s.message().find(dir), std::string::npos) << s;
  db.reset();
  // What was synced before the disk filled is intact.
  ASSERT_OK_AND_ASSIGN(auto again, Database::Open(dir, {}));
  ASSERT_OK_AND_ASSIGN(std::string v, again->Get("small"));
  EXPECT_EQ(v, "kept");
}

TEST(DatabaseTest, ReclaimDeletesTheRange) {
  ASSERT_OK_AND_ASSIGN(auto db,
                       Database::Open(FreshDir("reclaim"), {.bulk = true}));
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(db->Put(absl::StrCat("r/", i), std::string(1000, 'a' + i),
                      {.wal = false}));
  }
  ASSERT_OK(db->Flush());
  ASSERT_OK(db->Reclaim("r/2", "r/7"));
  int left = 0;
  ASSERT_OK(db->Scan("r/", [&](absl::string_view, absl::string_view) {
    ++left;
    return true;
  }));
  EXPECT_EQ(left, 5);
  EXPECT_THAT(db->Get("r/3"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(db->Get("r/7"));
}

TEST(DatabaseTest, BigEndianKeysSortByNumber) {
  std::string a, b;
  AppendBigEndian64(&a, 255);
  AppendBigEndian64(&b, 256);
  EXPECT_LT(a, b);
  EXPECT_EQ(ReadBigEndian64(b), 256u);
  std::string c;
  AppendBigEndian32(&c, 0x01020304);
  EXPECT_EQ(ReadBigEndian32(c), 0x01020304u);
}

}  // namespace
}  // namespace storage
}  // namespace downpour
