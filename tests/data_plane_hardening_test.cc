// The data plane against a careless or broken writer, over the real
// daemons: what a peer sends can fail its own requests, never poison a
// table or take memory it should not.
//  - A non-finite gradient is refused (naming table and key) and changes
//    nothing; a table may allow them.
//  - A put of a row resets its handler state, so a row poisoned through a
//    table that allows non-finite values is healed by a put.
//  - Repeated keys in one batch are applied once per occurrence (the
//    documented choice).
//  - A range read of absent sparse rows serves initial values and creates
//    no row.
//  - A synced batch larger than the servers take fails at once with
//    kResourceExhausted (no dropped connection, no timeout); other requests
//    are cut to the servers' limit.
//  - A push from a clock far in the future of a BSP table is refused and
//    does not block the honest step.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/auth.h"
#include "common/grpc_channel.h"
#include "common/test_util.h"
#include "grpcpp/grpcpp.h"
#include "launch/local_cluster.h"
#include "proto/downpour.grpc.pb.h"
#include "testing/suite_cluster.h"

namespace downpour {
namespace {

class DataPlaneHardeningTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LocalClusterOptions o = SuiteCluster::Defaults();
    // Small requests, so that the size limits are cheap to reach.
    o.server_flags = {"--max_message_mb=1"};
    ASSERT_OK(suite_.Start(o));
  }
  static void TearDownTestSuite() { EXPECT_OK(suite_.Stop()); }
  // Per-table figures summed over the servers.
  static proto::TableStats Stats(const std::string& table) {
    auto stats = suite_.TableStats(table);
    EXPECT_OK(stats);
    return stats.ok() ? *stats : proto::TableStats();
  }
  static SuiteCluster suite_;
};
SuiteCluster DataPlaneHardeningTest::suite_;

TEST_F(DataPlaneHardeningTest, NonFiniteGradientsAreRefusedAndChangeNothing) {
  TableOptions o;
  o.name = "finite";
  o.width = 2;
  o.num_keys = 10;
  o.init = "constant";
  o.init_a = 1;
  o.handler = "adagrad";
  o.handler_params = {{"learning_rate", 0.1}, {"initial_accumulator", 0.1}};
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<Key> keys = {2, 7, 3};
  for (float bad : {nan, inf, -inf}) {
    std::vector<float> g = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, bad};  // key 3
    absl::Status s = suite_.client().PushSync(t, keys, g);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("key 3"));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("'finite'"));
    std::vector<float> pp(6);
    EXPECT_THAT(suite_.client().PushPullSync(t, keys, g, absl::MakeSpan(pp)),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  std::vector<float> all(20);
  ASSERT_OK(
      suite_.client().GetSync(t, Keys::Range(0, 10), absl::MakeSpan(all)));
  EXPECT_EQ(all, std::vector<float>(20, 1.0f)) << "a refused push changed rows";
  // A finite push of the same batch still works.
  ASSERT_OK(suite_.client().PushSync(t, keys, std::vector<float>(6, 0.5f)));
}

TEST_F(DataPlaneHardeningTest, APutResetsTheRowsHandlerState) {
  TableOptions o;
  o.name = "poisoned";
  o.width = 1;
  o.num_keys = 4;
  o.handler = "adagrad";
  o.handler_params = {{"learning_rate", 0.1}, {"initial_accumulator", 0.1}};
  o.allow_non_finite = true;
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  o.name = "fresh";
  o.allow_non_finite = false;
  ASSERT_OK_AND_ASSIGN(Table fresh, suite_.client().CreateTable(o));
  // A NaN through a table that lets it in poisons the row and adagrad's
  // accumulator.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_OK(
      suite_.client().PushSync(t, Keys::Range(0, 1), std::vector<float>{nan}));
  std::vector<float> v(1);
  ASSERT_OK(suite_.client().GetSync(t, Keys::Range(0, 1), absl::MakeSpan(v)));
  EXPECT_TRUE(std::isnan(v[0]));
  // A put heals it: values and state start over, exactly like a row that
  // never saw the NaN.
  const std::vector<float> value = {2.0f}, grad = {0.5f};
  for (const Table* table : {&t, &fresh}) {
    ASSERT_OK(suite_.client().PutSync(*table, Keys::Range(0, 1), value));
    ASSERT_OK(suite_.client().PushSync(*table, Keys::Range(0, 1), grad));
  }
  std::vector<float> healed(1), expected(1);
  ASSERT_OK(
      suite_.client().GetSync(t, Keys::Range(0, 1), absl::MakeSpan(healed)));
  ASSERT_OK(suite_.client().GetSync(fresh, Keys::Range(0, 1),
                                    absl::MakeSpan(expected)));
  EXPECT_FALSE(std::isnan(healed[0]));
  EXPECT_EQ(healed, expected);
  EXPECT_LT(healed[0], 2.0f);
}

TEST_F(DataPlaneHardeningTest, RepeatedKeysInABatchApplyOncePerOccurrence) {
  TableOptions o;
  o.name = "repeats";
  o.width = 1;
  o.num_keys = 10;
  o.handler = "sum";
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  std::vector<Key> keys = {5, 5, 5, 6};
  ASSERT_OK(suite_.client().AddSync(t, keys, std::vector<float>{1, 1, 1, 1}));
  ASSERT_OK(suite_.client().PushSync(t, keys, std::vector<float>{2, 2, 2, 2}));
  std::vector<float> v(2);
  ASSERT_OK(suite_.client().GetSync(t, Keys::Range(5, 7), absl::MakeSpan(v)));
  EXPECT_EQ(v, (std::vector<float>{9, 3}));
}

TEST_F(DataPlaneHardeningTest, ReadingAbsentSparseRowsCreatesNone) {
  TableOptions o;
  o.name = "sparse_reads";
  o.sparse = true;
  o.width = 4;
  o.init = "constant";
  o.init_a = 0.25f;
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  const proto::TableStats before = Stats("sparse_reads");
  // 64K absent rows, read as a range (cut to the servers' 1 MiB limit).
  constexpr Key kRows = 1 << 16;
  std::vector<float> out(kRows * 4);
  ASSERT_OK(suite_.client().GetSync(t, Keys::Range(1000, 1000 + kRows),
                                    absl::MakeSpan(out)));
  EXPECT_EQ(out, std::vector<float>(kRows * 4, 0.25f));
  const proto::TableStats after = Stats("sparse_reads");
  EXPECT_EQ(after.rows(), 0u);
  EXPECT_EQ(after.allocated_bytes(), before.allocated_bytes());
}

TEST_F(DataPlaneHardeningTest, OversizeRequestsAreCutOrRefusedAtOnce) {
  // 1 MiB per request on the servers, 64 MiB in the client: a 4 MiB dense
  // push is cut into parts the servers take.
  TableOptions d;
  d.name = "cut";
  d.width = 256;
  d.num_keys = 4096;
  d.handler = "sum";
  ASSERT_OK_AND_ASSIGN(Table dense, suite_.client().CreateTable(d));
  std::vector<float> big(4096 * 256, 1.0f);
  ASSERT_OK(suite_.client().PushSync(dense, Keys::Range(0, 4096), big));
  std::vector<float> row(256);
  ASSERT_OK(suite_.client().GetSync(dense, Keys::Range(4095, 4096),
                                    absl::MakeSpan(row)));
  EXPECT_EQ(row, std::vector<float>(256, 1.0f));
  // A synced sparse batch is one message per range and clock: too large,
  // it fails at once instead of being dropped by the transport.
  TableOptions s;
  s.name = "synced_big";
  s.sparse = true;
  s.width = 64;
  s.handler = "sum";
  s.sync_workers = 1;
  s.tracked_workers = 1;
  ASSERT_OK_AND_ASSIGN(Table synced, suite_.client().CreateTable(s));
  std::vector<Key> keys(20000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;  // all in range 0
  std::vector<float> g(keys.size() * 64, 1.0f);
  suite_.client().SetWorkerClock(0, 0);
  const absl::Time start = absl::Now();
  absl::Status st = suite_.client().PushSync(synced, keys, g);
  suite_.client().SetWorkerClock(0, -1);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("synced_big"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(DataPlaneHardeningTest, AClockFromTheFutureIsRefusedAndBlocksNothing) {
  TableOptions o;
  o.name = "bsp_clocks";
  o.width = 1;
  o.num_keys = 8;
  o.handler = "sum";
  o.sync_workers = 2;
  o.tracked_workers = 2;
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  const std::vector<float> one(8, 1.0f);
  std::vector<float> out(8);
  suite_.client().SetWorkerClock(0, int64_t{1} << 62);
  absl::Status s = suite_.client().PushPullSync(t, Keys::Range(0, 8), one,
                                                absl::MakeSpan(out));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("ahead"));
  // The honest step 0 of both ranks completes and is applied once.
  suite_.client().SetWorkerClock(0, 0);
  Ticket first =
      suite_.client().PushPull(t, Keys::Range(0, 8), one, absl::MakeSpan(out));
  std::vector<float> out1(8);
  suite_.client().SetWorkerClock(1, 0);
  ASSERT_OK(suite_.client().PushPullSync(t, Keys::Range(0, 8), one,
                                         absl::MakeSpan(out1)));
  ASSERT_OK(suite_.client().Wait(first));
  suite_.client().SetWorkerClock(0, -1);
  EXPECT_EQ(out, std::vector<float>(8, 1.0f));  // the mean of 1 and 1
  EXPECT_EQ(out1, out);
}

}  // namespace
}  // namespace downpour
