// The dispatcher's validation and execution, without the network: each bad
// request gets its exact error code and leaves the table unchanged.
#include "server/internal/dispatcher.h"

#include <limits>
#include <tuple>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace server_internal {
namespace {

constexpr NodeId kSelf = 2;

proto::ClusterMap MakeMap() {
  proto::ClusterMap map;
  map.set_epoch(5);
  proto::TableMap* dense = map.add_tables();
  dense->mutable_spec()->set_name("dense");
  dense->mutable_spec()->set_id(1);
  dense->mutable_spec()->set_kind(proto::DENSE);
  dense->mutable_spec()->set_width(2);
  dense->mutable_spec()->set_num_keys(100);
  dense->mutable_spec()->mutable_handler()->set_name("sum");
  for (auto [b, e, p] :
       {std::tuple<Key, Key, NodeId>{0, 50, 1}, {50, 100, kSelf}}) {
    auto* r = dense->add_ranges();
    r->set_begin(b);
    r->set_end(e);
    r->set_primary(p);
  }
  proto::TableMap* sparse = map.add_tables();
  sparse->mutable_spec()->set_name("sparse");
  sparse->mutable_spec()->set_id(2);
  sparse->mutable_spec()->set_kind(proto::SPARSE);
  sparse->mutable_spec()->set_width(3);
  sparse->mutable_spec()->mutable_handler()->set_name("sgd");
  (*sparse->mutable_spec()
        ->mutable_handler()
        ->mutable_params())["learning_rate"] = 0.5;
  auto* r = sparse->add_ranges();
  r->set_begin(0);
  r->set_end(kKeySpaceEnd);
  r->set_primary(kSelf);
  return map;
}

class DispatcherTest : public ::testing::Test {
 protected:
  DispatcherTest() : dispatcher_(kSelf, 1 << 20, &pool_, &plugins_) {}
  void SetUp() override { ASSERT_OK(dispatcher_.ApplyMap(MakeMap())); }

  // Runs one request; returns the reply header and fills `out`.
  proto::DataHeader Run(proto::Op op, TableId table, uint32_t width,
                        std::vector<Key> keys, std::vector<float> values,
                        std::vector<float>* out = nullptr) {
    IncomingMessage req;
    req.header.set_op(op);
    req.header.set_table_id(table);
    req.header.set_width(width);
    req.header.set_num_keys(keys.size());
    req.header.set_epoch(5);
    req.keys = keys;
    req.values = values;
    OutgoingReply reply;
    std::vector<DeferredReply> released;
    dispatcher_.Handle(req, &reply, &released);
    EXPECT_FALSE(reply.deferred);
    EXPECT_TRUE(released.empty());
    if (out != nullptr) {
      const float* f = static_cast<const float*>(reply.values.data());
      out->assign(f, f + reply.values.size() / sizeof(float));
    }
    return reply.header;
  }
  std::vector<float> GetDense(std::vector<Key> keys) {
    std::vector<float> out;
    proto::DataHeader h = Run(proto::GET, 1, 2, keys, {}, &out);
    EXPECT_EQ(h.status_code(), 0) << h.status_message();
    return out;
  }

  BufferPool pool_;
  PluginRegistry plugins_;
  Dispatcher dispatcher_;
  std::vector<DeferredReply> released_;
};

absl::StatusCode Code(const proto::DataHeader& h) {
  return static_cast<absl::StatusCode>(h.status_code());
}

// A range the map says is lost: DATA_LOSS for a request of that map or an
// older one; a request from a newer map is asked again (UNAVAILABLE), since
// a newer map can serve the range again, as a restore's does once loaded.
TEST_F(DispatcherTest, ALostRangeIsDataLossUnlessTheRequestsMapIsNewer) {
  proto::ClusterMap map = MakeMap();
  map.set_epoch(6);
  map.mutable_tables(1)->mutable_ranges(0)->set_lost(true);
  ASSERT_OK(dispatcher_.ApplyMap(map));
  auto get = [&](Epoch epoch) {
    IncomingMessage req;
    req.header.set_op(proto::GET);
    req.header.set_table_id(2);
    req.header.set_width(3);
    req.header.set_num_keys(1);
    req.header.set_epoch(epoch);
    const std::vector<Key> k = {42};
    req.keys = k;
    OutgoingReply reply;
    dispatcher_.Handle(req, &reply, &released_);
    return reply.header;
  };
  EXPECT_EQ(Code(get(6)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Code(get(5)), absl::StatusCode::kDataLoss);
  const proto::DataHeader newer = get(7);
  EXPECT_EQ(Code(newer), absl::StatusCode::kUnavailable);
  EXPECT_EQ(newer.server_epoch(), 6u);
  map.set_epoch(7);
  map.mutable_tables(1)->mutable_ranges(0)->set_lost(false);
  ASSERT_OK(dispatcher_.ApplyMap(map));
  EXPECT_EQ(Code(get(7)), absl::StatusCode::kOk);
}

TEST_F(DispatcherTest, PutAddGetPushOnDenseKeys) {
  EXPECT_EQ(Run(proto::PUT, 1, 2, {60, 51}, {1, 2, 3, 4}).status_code(), 0);
  EXPECT_EQ(Run(proto::ADD, 1, 2, {60, 60}, {1, 1, 10, 10}).status_code(), 0);
  EXPECT_EQ(GetDense({51, 60, 52}), (std::vector<float>{3, 4, 12, 13, 0, 0}));
  // "sum" handler: push adds.
  std::vector<float> out;
  EXPECT_EQ(Run(proto::PUSH_PULL, 1, 2, {52}, {0.5, 0.25}, &out).status_code(),
            0);
  EXPECT_EQ(out, (std::vector<float>{0.5, 0.25}));
}

// Neighbours this server holds, merged (RangeAssignment.merge): fenced
// while marked, then joined in place with their rows. A key batch across
// both, cut on the merged map before this server has it, is asked again;
// from the map this server has, it is the caller's error.
TEST_F(DispatcherTest, MergedNeighboursAreJoinedInPlace) {
  proto::ClusterMap map = MakeMap();
  map.set_epoch(6);
  map.mutable_tables(0)->mutable_ranges(0)->set_primary(kSelf);
  ASSERT_OK(dispatcher_.ApplyMap(map));
  ASSERT_EQ(Run(proto::PUT, 1, 2, {10}, {1, 2}).status_code(), 0);
  ASSERT_EQ(Run(proto::PUT, 1, 2, {60}, {3, 4}).status_code(), 0);
  const std::vector<Key> keys = {10, 60};
  const std::vector<float> ones(4, 1.0f);
  auto add = [&](Epoch epoch, size_t n) {
    IncomingMessage req;
    req.header.set_op(proto::ADD);
    req.header.set_table_id(1);
    req.header.set_width(2);
    req.header.set_num_keys(n);
    req.header.set_epoch(epoch);
    req.keys = absl::MakeConstSpan(keys).first(n);
    req.values = absl::MakeConstSpan(ones).first(2 * n);
    OutgoingReply reply;
    std::vector<DeferredReply> released;
    dispatcher_.Handle(req, &reply, &released);
    return ReplyStatus(reply.header);
  };
  absl::Status s = add(6, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = add(5, 2);
  EXPECT_EQ(ReasonOf(s), ErrorReason::kNotOwner) << s;
  s = add(7, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(ReasonOf(s), ErrorReason::kServerBehind) << s;
  // Marked for the merge: fenced.
  map.set_epoch(7);
  map.mutable_tables(0)->mutable_ranges(0)->set_merge(
      proto::RangeAssignment::MERGE_WITH_NEXT);
  map.mutable_tables(0)->mutable_ranges(1)->set_merge(
      proto::RangeAssignment::MERGE_WITH_PREVIOUS);
  ASSERT_OK(dispatcher_.ApplyMap(map));
  s = add(7, 1);
  EXPECT_EQ(ReasonOf(s), ErrorReason::kHandingOver) << s;
  // Merged: one range, with both halves' rows.
  map.set_epoch(8);
  proto::TableMap* dense = map.mutable_tables(0);
  dense->mutable_ranges(0)->set_end(100);
  dense->mutable_ranges(0)->clear_merge();
  dense->mutable_ranges()->DeleteSubrange(1, 1);
  ASSERT_OK(dispatcher_.ApplyMap(map));
  EXPECT_OK(add(8, 2));
  EXPECT_EQ(GetDense({10, 60}), (std::vector<float>{2, 3, 4, 5}));
}

TEST_F(DispatcherTest, SparseRowsAreCreatedOnTouchAndHandlerApplies) {
  std::vector<float> out;
  const Key big = kKeySpaceEnd - 1;
  EXPECT_EQ(Run(proto::PUSH, 2, 3, {big, 7}, {1, 2, 3, 4, 5, 6}).status_code(),
            0);
  EXPECT_EQ(Run(proto::PULL, 2, 3, {7, big, 8}, {}, &out).status_code(), 0);
  // sgd with learning rate 0.5 from zeros.
  EXPECT_EQ(out, (std::vector<float>{-2, -2.5, -3, -0.5, -1, -1.5, 0, 0, 0}));
}

TEST_F(DispatcherTest, RangeOperations) {
  IncomingMessage req;
  req.header.set_op(proto::PUT);
  req.header.set_table_id(1);
  req.header.set_width(2);
  req.header.set_is_range(true);
  req.header.set_range_begin(60);
  req.header.set_range_end(63);
  req.header.set_num_keys(3);
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  req.values = v;
  OutgoingReply reply;
  dispatcher_.Handle(req, &reply, &released_);
  EXPECT_EQ(reply.header.status_code(), 0) << reply.header.status_message();
  EXPECT_EQ(GetDense({62, 60}), (std::vector<float>{5, 6, 1, 2}));
  // A range that runs past what this server owns.
  req.header.set_range_begin(45);
  req.header.set_range_end(48);
  OutgoingReply r2;
  dispatcher_.Handle(req, &r2, &released_);
  EXPECT_EQ(Code(r2.header), absl::StatusCode::kAborted);
}

// A raw peer (not the SDK, which checks too) pushing a non-finite
// gradient: refused, naming table and key, before anything changes.
TEST_F(DispatcherTest, NonFinitePushesAreRefusedAndAPutResetsState) {
  ASSERT_EQ(Run(proto::PUT, 1, 2, {70, 71}, {9, 9, 9, 9}).status_code(), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  proto::DataHeader h = Run(proto::PUSH, 1, 2, {70, 71}, {1, 1, 1, nan});
  EXPECT_EQ(Code(h), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status_message(), ::testing::HasSubstr("key 71"));
  EXPECT_THAT(h.status_message(), ::testing::HasSubstr("'dense'"));
  h = Run(proto::PUSH_PULL, 1, 2, {70},
          {std::numeric_limits<float>::infinity(), 0});
  EXPECT_EQ(Code(h), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetDense({70, 71}), (std::vector<float>{9, 9, 9, 9}));
  // An add is a plain value operation, not a gradient: not checked.
  EXPECT_EQ(Run(proto::ADD, 1, 2, {72}, {1, nan}).status_code(), 0);
}

TEST_F(DispatcherTest, BadRequestsGetExactCodesAndChangeNothing) {
  ASSERT_EQ(Run(proto::PUT, 1, 2, {70}, {9, 9}).status_code(), 0);
  struct Case {
    proto::DataHeader h;
    absl::StatusCode code;
  };
  std::vector<Case> cases;
  cases.push_back(
      {Run(proto::PUT, 99, 2, {70}, {1, 1}), absl::StatusCode::kNotFound});
  cases.push_back({Run(proto::PUT, 1, 3, {70}, {1, 1, 1}),
                   absl::StatusCode::kInvalidArgument});
  cases.push_back(
      {Run(proto::PUT, 1, 2, {70}, {1}), absl::StatusCode::kInvalidArgument});
  cases.push_back({Run(proto::PUT, 1, 2, {70, 100}, {1, 1, 1, 1}),
                   absl::StatusCode::kOutOfRange});
  cases.push_back({Run(proto::PUT, 1, 2, {70, 10}, {1, 1, 1, 1}),
                   absl::StatusCode::kAborted});
  cases.push_back({Run(static_cast<proto::Op>(42), 1, 2, {70}, {1, 1}),
                   absl::StatusCode::kInvalidArgument});
  cases.push_back({Run(proto::GET, 1, 2, {70}, {1, 1}),
                   absl::StatusCode::kInvalidArgument});
  for (const Case& c : cases) {
    EXPECT_EQ(Code(c.h), c.code) << c.h.status_message();
    EXPECT_FALSE(c.h.status_message().empty());
  }
  EXPECT_THAT(cases[4].h.status_message(), ::testing::HasSubstr("not owner"));
  EXPECT_EQ(cases[4].h.server_epoch(), 5u);
  // Key count disagreeing with the header.
  IncomingMessage req;
  req.header.set_op(proto::PUT);
  req.header.set_table_id(1);
  req.header.set_width(2);
  req.header.set_num_keys(2);
  std::vector<Key> k = {70};
  std::vector<float> v = {1, 1};
  req.keys = k;
  req.values = v;
  OutgoingReply reply;
  dispatcher_.Handle(req, &reply, &released_);
  EXPECT_EQ(Code(reply.header), absl::StatusCode::kInvalidArgument);
  // A request from a newer epoch for a table not yet known: retry later.
  req.header.set_table_id(7);
  req.header.set_epoch(9);
  req.header.set_num_keys(1);
  OutgoingReply behind;
  dispatcher_.Handle(req, &behind, &released_);
  EXPECT_EQ(Code(behind.header), absl::StatusCode::kUnavailable);
  // A reply larger than the message limit.
  IncomingMessage huge;
  huge.header.set_op(proto::GET);
  huge.header.set_table_id(2);
  huge.header.set_width(3);
  huge.header.set_is_range(true);
  huge.header.set_range_begin(0);
  huge.header.set_range_end(uint64_t{1} << 40);
  huge.header.set_num_keys(uint64_t{1} << 40);
  OutgoingReply big;
  dispatcher_.Handle(huge, &big, &released_);
  EXPECT_EQ(Code(big.header), absl::StatusCode::kResourceExhausted);

  EXPECT_EQ(GetDense({70}), (std::vector<float>{9, 9}));
}

// BSP on a sparse table: each rank's key batch (possibly empty) is held
// until sync_workers ranks pushed the clock; then every key gets the mean
// of the ranks' gradients, summed in rank order whatever the arrival
// order. The gradients are chosen so that float addition in another order
// gives another result: rank order (1e8 - 1e8) + 1 = 1, but 1e8 arriving
// after 1 absorbs it.
proto::ClusterMap SyncedSparseMap() {
  proto::ClusterMap map;
  map.set_epoch(5);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_name("synced");
  t->mutable_spec()->set_id(3);
  t->mutable_spec()->set_kind(proto::SPARSE);
  t->mutable_spec()->set_width(1);
  t->mutable_spec()->set_sync_workers(4);
  t->mutable_spec()->set_num_workers(4);
  t->mutable_spec()->mutable_handler()->set_name("sum");
  auto* r = t->add_ranges();
  r->set_begin(0);
  r->set_end(kKeySpaceEnd);
  r->set_primary(kSelf);
  return map;
}

// A synced push is answered once its step is applied: held ones are
// deferred, and the push that completes the step releases their replies.
// `held` (if given) is set to whether this push was held; `released_tokens`
// gets the reply tokens this push released. A key batch names `stretch` if
// it is given.
proto::DataHeader SyncedPush(Dispatcher& d, int rank, int64_t clock,
                             std::vector<Key> keys, std::vector<float> grads,
                             bool range = false, bool* held = nullptr,
                             std::vector<uint64_t>* released_tokens = nullptr,
                             uint64_t token = 1, KeyRange stretch = {0, 0}) {
  IncomingMessage req;
  req.header.set_op(proto::PUSH);
  req.header.set_table_id(3);
  req.header.set_width(1);
  req.header.set_num_keys(keys.size());
  req.header.set_epoch(5);
  req.header.set_worker_rank(rank);
  req.header.set_worker_clock(clock);
  if (range) {
    req.header.set_is_range(true);
    req.header.set_range_begin(keys.front());
    req.header.set_range_end(keys.back() + 1);
  } else {
    req.keys = keys;
    if (stretch.end > 0) {
      req.header.set_batch_range_begin(stretch.begin);
      req.header.set_batch_range_end(stretch.end);
    }
  }
  req.values = grads;
  req.reply_token = token;
  OutgoingReply reply;
  std::vector<DeferredReply> released;
  d.Handle(req, &reply, &released);
  if (held != nullptr) *held = reply.deferred;
  for (const DeferredReply& r : released) {
    if (released_tokens != nullptr) released_tokens->push_back(r.reply_token);
  }
  return reply.header;
}

std::vector<float> GetSynced(Dispatcher& d, std::vector<Key> keys) {
  IncomingMessage req;
  req.header.set_op(proto::GET);
  req.header.set_table_id(3);
  req.header.set_width(1);
  req.header.set_num_keys(keys.size());
  req.header.set_epoch(5);
  req.keys = keys;
  OutgoingReply reply;
  std::vector<DeferredReply> released;
  d.Handle(req, &reply, &released);
  EXPECT_EQ(reply.header.status_code(), 0) << reply.header.status_message();
  const float* f = static_cast<const float*>(reply.values.data());
  return std::vector<float>(f, f + reply.values.size() / sizeof(float));
}

TEST(SyncedSparseTest, KeyBatchesAreAveragedInRankOrderOnceAllRanksPushed) {
  struct Push {
    int rank;
    std::vector<Key> keys;
    std::vector<float> grads;
  };
  // Key 7: ranks 0, 1, 2 push 1e8, -1e8, 1 (rank 3 nothing): mean 1 / 4.
  // Key 9: rank 3 alone, 8: mean 2. Rank 2 sends key 7 and no other.
  const std::vector<Push> pushes = {
      {0, {7}, {1e8f}}, {1, {9, 7}, {0, -1e8f}}, {2, {7}, {1}}, {3, {9}, {8}}};
  for (const std::vector<int>& order : std::vector<std::vector<int>>{
           {0, 1, 2, 3}, {2, 3, 0, 1}, {3, 2, 1, 0}}) {
    BufferPool pool;
    PluginRegistry plugins;
    Dispatcher d(kSelf, 1 << 20, &pool, &plugins);
    ASSERT_OK(d.ApplyMap(SyncedSparseMap()));
    std::vector<uint64_t> released;
    for (size_t i = 0; i < order.size(); ++i) {
      const Push& p = pushes[order[i]];
      bool held;
      proto::DataHeader h = SyncedPush(d, p.rank, 0, p.keys, p.grads, false,
                                       &held, &released, 100 + i);
      ASSERT_EQ(h.status_code(), 0) << h.status_message();
      // Held pushes are answered with the step, not before: an answered
      // gradient must not be lost with the server before it is applied.
      EXPECT_EQ(held, i + 1 < order.size());
      if (i + 1 < order.size()) {
        // Held: nothing applied yet ("sum" handler from zeros).
        EXPECT_EQ(GetSynced(d, {7, 9}), (std::vector<float>{0, 0}));
        EXPECT_TRUE(released.empty());
      }
    }
    std::sort(released.begin(), released.end());
    EXPECT_EQ(released, (std::vector<uint64_t>{100, 101, 102}));
    EXPECT_EQ(GetSynced(d, {7, 9}), (std::vector<float>{0.25f, 2.0f}))
        << "arrival order " << order[0] << order[1] << order[2] << order[3];
    // A late push for the applied clock is acknowledged and dropped; an
    // empty batch counts as the rank's push for the next clock.
    EXPECT_TRUE(SyncedPush(d, 1, 0, {7}, {5}).discarded());
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(SyncedPush(d, r, 1, {}, {}).status_code(), 0);
    }
    EXPECT_EQ(GetSynced(d, {7}), (std::vector<float>{0.25f}));
    EXPECT_EQ(SyncedPush(d, 3, 1, {7}, {4}).status_code(), 0);
    EXPECT_EQ(GetSynced(d, {7}), (std::vector<float>{1.25f}));
  }
}

// A merged range of a table that aggregates BSP steps keeps its halves'
// steps apart (RangeAssignment.step_cuts): each stretch counts its ranks
// on its own, and a synced batch names its stretch.
TEST(SyncedSparseTest, StretchesBetweenStepCutsAggregateApart) {
  BufferPool pool;
  PluginRegistry plugins;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins);
  proto::ClusterMap map = SyncedSparseMap();
  map.mutable_tables(0)->mutable_spec()->set_sync_workers(2);
  map.mutable_tables(0)->mutable_spec()->set_num_workers(2);
  map.mutable_tables(0)->mutable_ranges(0)->add_step_cuts(100);
  ASSERT_OK(d.ApplyMap(map));
  auto push = [&](int rank, int64_t clock, std::vector<Key> keys,
                  std::vector<float> grads, Key begin, Key end,
                  bool* held = nullptr) {
    return SyncedPush(d, rank, clock, std::move(keys), std::move(grads), false,
                      held, nullptr, 7, KeyRange{begin, end});
  };
  bool held = false;
  // The lower stretch completes clock 0 on its own.
  ASSERT_EQ(push(0, 0, {7}, {2}, 0, 100, &held).status_code(), 0);
  EXPECT_TRUE(held);
  ASSERT_EQ(push(0, 0, {200}, {8}, 100, kKeySpaceEnd, &held).status_code(), 0);
  EXPECT_TRUE(held);
  ASSERT_EQ(push(1, 0, {7}, {4}, 0, 100, &held).status_code(), 0);
  EXPECT_FALSE(held);
  EXPECT_EQ(GetSynced(d, {7, 200}), (std::vector<float>{3, 0}));
  // The upper one once rank 1 pushes it (nothing of its own: an empty
  // batch).
  ASSERT_EQ(push(1, 0, {}, {}, 100, kKeySpaceEnd, &held).status_code(), 0);
  EXPECT_FALSE(held);
  EXPECT_EQ(GetSynced(d, {7, 200}), (std::vector<float>{3, 4}));
  // A batch that names no stretch, one across the cut, and a key outside
  // the stretch named.
  const proto::DataHeader unnamed = SyncedPush(d, 0, 1, {7}, {1});
  EXPECT_EQ(unnamed.status_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(unnamed.status_message(), ::testing::HasSubstr("stretch"));
  EXPECT_EQ(push(0, 1, {7}, {1}, 0, 200).status_code(),
            static_cast<int>(absl::StatusCode::kAborted));  // not owner
  // The whole range, named as before the cut: not a stretch of it.
  EXPECT_EQ(push(0, 1, {7}, {1}, 0, kKeySpaceEnd).status_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(push(0, 1, {150}, {1}, 0, 100).status_code(), 0);
  EXPECT_EQ(GetSynced(d, {7, 150, 200}), (std::vector<float>{3, 0, 4}));
}

TEST(SyncedSparseTest, RangePushToASyncedSparseTableIsRejected) {
  BufferPool pool;
  PluginRegistry plugins;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins);
  ASSERT_OK(d.ApplyMap(SyncedSparseMap()));
  proto::DataHeader h = SyncedPush(d, 0, 0, {4, 5}, {1, 1}, /*range=*/true);
  EXPECT_EQ(Code(h), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status_message(), ::testing::HasSubstr("push key batches"));
}

// BSP tables: sync_workers = N averages N ranks' pushes of a (range, clock);
// `backups` more ranks may push late.
proto::ClusterMap BspMap(int sync_workers, int backups) {
  proto::ClusterMap map;
  map.set_epoch(5);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_name("bsp");
  t->mutable_spec()->set_id(3);
  t->mutable_spec()->set_kind(proto::DENSE);
  t->mutable_spec()->set_width(2);
  t->mutable_spec()->set_num_keys(4);
  t->mutable_spec()->set_sync_workers(sync_workers);
  t->mutable_spec()->set_num_workers(sync_workers + backups);
  t->mutable_spec()->mutable_init()->set_kind(proto::InitializerSpec::CONSTANT);
  t->mutable_spec()->mutable_init()->set_value(1.0f);
  t->mutable_spec()->mutable_handler()->set_name("sgd");
  (*t->mutable_spec()->mutable_handler()->mutable_params())["learning_rate"] =
      1.0;
  auto* r = t->add_ranges();
  r->set_begin(0);
  r->set_end(4);
  r->set_primary(kSelf);
  return map;
}

// A clocked push or push-pull of the range [0, 4) of table "bsp".
struct BspCall {
  OutgoingReply reply;
  std::vector<DeferredReply> released;
  uint64_t token = 0;
};
BspCall HandleBsp(Dispatcher& d, proto::Op op, int rank, int64_t clock,
                  std::vector<float> grads, uint64_t token, Key begin = 0,
                  Key end = 4) {
  IncomingMessage req;
  req.header.set_op(op);
  req.header.set_table_id(3);
  req.header.set_width(2);
  req.header.set_epoch(5);
  req.header.set_is_range(true);
  req.header.set_range_begin(begin);
  req.header.set_range_end(end);
  req.header.set_num_keys(end - begin);
  req.header.set_worker_rank(rank);
  req.header.set_worker_clock(clock);
  req.values = grads;
  req.reply_token = token;
  BspCall c;
  c.token = token;
  d.Handle(req, &c.reply, &c.released);
  return c;
}
// The same, expecting it to be accepted.
BspCall CallBsp(Dispatcher& d, proto::Op op, int rank, int64_t clock,
                std::vector<float> grads, uint64_t token, Key begin = 0,
                Key end = 4) {
  BspCall c =
      HandleBsp(d, op, rank, clock, std::move(grads), token, begin, end);
  EXPECT_EQ(c.reply.header.status_code(), 0) << c.reply.header.status_message();
  return c;
}
std::vector<float> Values(const OutgoingReply& r) {
  const float* f = static_cast<const float*>(r.values.data());
  return std::vector<float>(f, f + r.values.size() / sizeof(float));
}

TEST(DispatcherBspTest, OneWorkerPushPullReturnsThePostUpdateValuesAtOnce) {
  BufferPool pool;
  PluginRegistry plugins;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins);
  ASSERT_OK(d.ApplyMap(BspMap(1, 0)));
  BspCall c = CallBsp(d, proto::PUSH_PULL, 0, 0, {1, 2, 3, 4, 5, 6, 7, 8}, 11);
  EXPECT_FALSE(c.reply.deferred);
  EXPECT_TRUE(c.released.empty());
  EXPECT_FALSE(c.reply.header.discarded());
  EXPECT_EQ(c.reply.header.staleness(), 0);
  EXPECT_EQ(Values(c.reply),
            (std::vector<float>{0, -1, -2, -3, -4, -5, -6, -7}));
  // The next clock sees that update and adds its own.
  c = CallBsp(d, proto::PUSH_PULL, 0, 1, {1, 1, 1, 1, 1, 1, 1, 1}, 12);
  EXPECT_EQ(Values(c.reply),
            (std::vector<float>{-1, -2, -3, -4, -5, -6, -7, -8}));
  // A repeated clock is late: acknowledged as discarded, nothing applied,
  // and the values are the current ones.
  c = CallBsp(d, proto::PUSH_PULL, 0, 1, {9, 9, 9, 9, 9, 9, 9, 9}, 13);
  EXPECT_TRUE(c.reply.header.discarded());
  EXPECT_EQ(Values(c.reply),
            (std::vector<float>{-1, -2, -3, -4, -5, -6, -7, -8}));
}

// Workers cut a large table into parts and push each part as its own
// PushPull; the server aggregates each part on its own, also when several
// parts lie in one of its ranges.
TEST(DispatcherBspTest, PartsOfOneRangeAggregateOnTheirOwn) {
  for (int workers : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << workers << " workers");
    BufferPool pool;
    PluginRegistry plugins;
    Dispatcher d(kSelf, 1 << 20, &pool, &plugins);
    ASSERT_OK(d.ApplyMap(BspMap(workers, 0)));
    std::vector<BspCall> calls;
    for (int rank = 0; rank < workers; ++rank) {
      // Rank r pushes 1 + r to every float of both halves of [0, 4).
      const float g = 1.0f + rank;
      calls.push_back(CallBsp(d, proto::PUSH_PULL, rank, 0,
                              std::vector<float>(4, g), 30 + 2 * rank, 0, 2));
      calls.push_back(CallBsp(d, proto::PUSH_PULL, rank, 0,
                              std::vector<float>(4, g), 31 + 2 * rank, 2, 4));
    }
    // The last rank's pushes completed each half; nothing was discarded.
    // SGD with rate 1 from initial values of 1.
    const float mean = workers == 1 ? 1.0f : 1.5f;
    const float expected = 1.0f - mean;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_FALSE(calls[i].reply.header.discarded()) << i;
    }
    const BspCall& last_low = calls[calls.size() - 2];
    const BspCall& last_high = calls.back();
    EXPECT_FALSE(last_low.reply.deferred);
    EXPECT_FALSE(last_high.reply.deferred);
    EXPECT_EQ(Values(last_low.reply), std::vector<float>(4, expected));
    EXPECT_EQ(Values(last_high.reply), std::vector<float>(4, expected));
    if (workers == 2) {
      // Rank 0's halves waited, each for its own half.
      ASSERT_EQ(last_low.released.size(), 1u);
      EXPECT_EQ(last_low.released[0].reply_token, 30u);
      ASSERT_EQ(last_high.released.size(), 1u);
      EXPECT_EQ(last_high.released[0].reply_token, 31u);
      EXPECT_EQ(Values(last_high.released[0].reply),
                std::vector<float>(4, expected));
    }
  }
}

TEST(DispatcherBspTest, PushPullWaitsForTheRoundAndLatePushesAreDiscarded) {
  BufferPool pool;
  PluginRegistry plugins;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins);
  ASSERT_OK(d.ApplyMap(BspMap(2, 1)));  // N = 2, one backup
  // Rank 2 (the backup) comes first: held, its reply deferred.
  BspCall first =
      CallBsp(d, proto::PUSH_PULL, 2, 0, {4, 4, 4, 4, 4, 4, 4, 4}, 21);
  EXPECT_TRUE(first.reply.deferred);
  EXPECT_TRUE(first.released.empty());
  // A plain push of the same clock by rank 0 completes the round (N = 2):
  // the mean is applied, and the waiting PushPull is released with the
  // post-update values. Its own reply carries no values.
  BspCall second = CallBsp(d, proto::PUSH, 0, 0, {2, 2, 2, 2, 2, 2, 2, 2}, 22);
  EXPECT_FALSE(second.reply.deferred);
  EXPECT_EQ(second.reply.values.size(), 0u);
  ASSERT_EQ(second.released.size(), 1u);
  EXPECT_EQ(second.released[0].reply_token, 21u);
  EXPECT_EQ(Values(second.released[0].reply),
            (std::vector<float>(8, 1.0f - 3.0f)));
  EXPECT_EQ(second.released[0].reply.header.num_keys(), 4u);
  EXPECT_EQ(second.released[0].reply.header.server_id(), kSelf);
  // Rank 1 is late for clock 0: discarded, answered at once with the
  // current values.
  BspCall late =
      CallBsp(d, proto::PUSH_PULL, 1, 0, {8, 8, 8, 8, 8, 8, 8, 8}, 23);
  EXPECT_FALSE(late.reply.deferred);
  EXPECT_TRUE(late.reply.header.discarded());
  EXPECT_EQ(Values(late.reply), (std::vector<float>(8, -2.0f)));
  // Clock 1 with two PushPulls: the first waits, the second completes the
  // round; both get the same values, the mean of rank 0's and 1's
  // gradients summed in rank order.
  BspCall a = CallBsp(d, proto::PUSH_PULL, 1, 1, {1, 2, 3, 4, 5, 6, 7, 8}, 24);
  EXPECT_TRUE(a.reply.deferred);
  BspCall b = CallBsp(d, proto::PUSH_PULL, 0, 1, {3, 2, 1, 0, 1, 2, 3, 4}, 25);
  EXPECT_FALSE(b.reply.deferred);
  const std::vector<float> want = {-4, -4, -4, -4, -5, -6, -7, -8};
  EXPECT_EQ(Values(b.reply), want);
  ASSERT_EQ(b.released.size(), 1u);
  EXPECT_EQ(b.released[0].reply_token, 24u);
  EXPECT_EQ(Values(b.released[0].reply), want);
  EXPECT_EQ(b.released[0].reply.header.staleness(), 0);
}

// Records the deferred replies the dispatcher sends outside a Handle call
// (no backups here, so nothing else is used).
class RecordingEnv : public ReplicationEnv {
 public:
  void SendToPeer(const std::string&, OutgoingRequest, PeerDone) override {
    ADD_FAILURE() << "no backups in this test";
  }
  void SendDeferred(DeferredReply reply) override {
    sent.push_back(std::move(reply));
  }
  std::shared_ptr<const RetainedRequest> Retain(
      const IncomingMessage&) override {
    ADD_FAILURE() << "no backups in this test";
    return nullptr;
  }
  void PostAfter(absl::Duration, std::function<void()>) override {}
  void ReplicaReady(TableId, Key, NodeId, Epoch) override {}
  void HandedOver(TableId table, Key begin, NodeId to, Epoch epoch) override {
    handed.push_back({table, begin, to, epoch});
  }
  void ReportUnreachable(NodeId, const std::string&) override {}
  std::vector<DeferredReply> sent;
  std::vector<std::tuple<TableId, Key, NodeId, Epoch>> handed;
};

// Balancing primaries: a range being handed to a backup refuses writes
// (the client retries), still serves reads, and is reported ready at once
// when nothing is outstanding. Handed over, it stays as an in-sync backup
// with its rows; a primary demoted into catching up starts over instead.
TEST(DispatcherHandOverTest, AHandedOverRangeKeepsItsRows) {
  BufferPool pool;
  PluginRegistry plugins;
  RecordingEnv env;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins, {}, &env);
  proto::ClusterMap map;
  map.set_epoch(3);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_name("dense");
  t->mutable_spec()->set_id(1);
  t->mutable_spec()->set_kind(proto::DENSE);
  t->mutable_spec()->set_width(2);
  t->mutable_spec()->set_num_keys(4);
  t->mutable_spec()->mutable_handler()->set_name("sum");
  proto::RangeAssignment* r = t->add_ranges();
  r->set_begin(0);
  r->set_end(4);
  r->set_primary(kSelf);
  ASSERT_OK(d.ApplyMap(map));
  auto run = [&](proto::Op op, std::vector<float> values,
                 std::vector<float>* out = nullptr) {
    IncomingMessage req;
    req.header.set_op(op);
    req.header.set_table_id(1);
    req.header.set_width(2);
    req.header.set_is_range(true);
    req.header.set_range_begin(0);
    req.header.set_range_end(4);
    req.header.set_num_keys(4);
    req.values = values;
    OutgoingReply reply;
    std::vector<DeferredReply> released;
    d.Handle(req, &reply, &released);
    if (out != nullptr) {
      const float* f = static_cast<const float*>(reply.values.data());
      out->assign(f, f + reply.values.size() / sizeof(float));
    }
    return reply.header;
  };
  const std::vector<float> put = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(run(proto::PUT, put).status_code(), 0);

  map.set_epoch(4);
  r->add_replicas(7);
  r->set_handing_to(7);
  ASSERT_OK(d.ApplyMap(map));
  ASSERT_EQ(env.handed.size(), 1u);
  EXPECT_EQ(env.handed[0],
            std::make_tuple(TableId{1}, Key{0}, NodeId{7}, Epoch{4}));
  proto::DataHeader refused = run(proto::ADD, std::vector<float>(8, 1));
  EXPECT_EQ(Code(refused), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status_message(),
              ::testing::HasSubstr("being handed to server 7"));
  std::vector<float> out;
  ASSERT_EQ(run(proto::GET, {}, &out).status_code(), 0);
  EXPECT_EQ(out, put);
  // The same handover in the next map is reported again (for that epoch).
  map.set_epoch(5);
  ASSERT_OK(d.ApplyMap(map));
  ASSERT_EQ(env.handed.size(), 2u);
  EXPECT_EQ(std::get<3>(env.handed[1]), Epoch{5});

  // Swapped: this server is an in-sync backup and serves nothing.
  map.set_epoch(6);
  r->set_primary(7);
  r->clear_replicas();
  r->add_replicas(kSelf);
  r->clear_handing_to();
  ASSERT_OK(d.ApplyMap(map));
  EXPECT_EQ(Code(run(proto::GET, {})), absl::StatusCode::kAborted);
  // Promoted back (server 7 died): the rows it kept are there.
  map.set_epoch(7);
  r->set_primary(kSelf);
  r->clear_replicas();
  ASSERT_OK(d.ApplyMap(map));
  ASSERT_EQ(run(proto::GET, {}, &out).status_code(), 0);
  EXPECT_EQ(out, put);
  EXPECT_EQ(env.handed.size(), 2u);

  // A primary demoted into catching up (a failover, not a handover) may
  // hold writes its successor lacks: it starts over.
  map.set_epoch(8);
  r->set_primary(7);
  r->add_catching_up(kSelf);
  ASSERT_OK(d.ApplyMap(map));
  map.set_epoch(9);
  r->set_primary(kSelf);
  r->clear_catching_up();
  ASSERT_OK(d.ApplyMap(map));
  ASSERT_EQ(run(proto::GET, {}, &out).status_code(), 0);
  EXPECT_EQ(out, std::vector<float>(8, 0.0f));
}

// RecordingEnv with a backup: keeps what the replicator sends it, with the
// acknowledgements for the test to give.
class HoldingEnv : public RecordingEnv {
 public:
  void SendToPeer(const std::string&, OutgoingRequest request,
                  PeerDone done) override {
    to_backup.push_back({std::move(request), std::move(done)});
  }
  std::shared_ptr<const RetainedRequest> Retain(
      const IncomingMessage&) override {
    return std::make_shared<RetainedRequest>();
  }
  void PostAfter(absl::Duration, std::function<void()> fn) override {
    posted.push_back(std::move(fn));
  }
  // The backup takes everything sent so far.
  void AckAll() {
    std::vector<std::pair<OutgoingRequest, PeerDone>> msgs =
        std::move(to_backup);
    to_backup.clear();
    for (auto& [request, done] : msgs) {
      proto::DataHeader ok;
      done(absl::OkStatus(), &ok);
    }
    std::vector<std::function<void()>> fns = std::move(posted);
    posted.clear();
    for (auto& fn : fns) fn();
  }
  std::vector<std::pair<OutgoingRequest, PeerDone>> to_backup;
  std::vector<std::function<void()>> posted;
};

// A map of epoch 3 with server 7 alive beside this one and table "lbfgs"
// (id 1, dense, width 1, handler "sum", `vectors`) with no ranges yet.
proto::ClusterMap LbfgsMap(uint64_t num_keys,
                           const std::vector<std::string>& vectors) {
  proto::ClusterMap map;
  map.set_epoch(3);
  proto::NodeInfo* other = map.add_nodes();
  other->set_id(7);
  other->set_role(proto::SERVER);
  other->set_state(proto::ALIVE);
  other->set_data_endpoint("tcp://127.0.0.1:1");
  proto::TableSpec* spec = map.add_tables()->mutable_spec();
  spec->set_name("lbfgs");
  spec->set_id(1);
  spec->set_kind(proto::DENSE);
  spec->set_width(1);
  spec->set_num_keys(num_keys);
  spec->mutable_handler()->set_name("sum");
  for (const std::string& v : vectors) spec->add_vectors(v);
  return map;
}

// Sandblaster's exactly-once task adds on a replicated range: a repeat of a
// task in its round (a backup task's copy) is dropped, and its answer waits
// until the backup holds the copy applied before it. Answered at once, the
// coordinator would count the task added while only this primary had it,
// and a failover then would lose the task's gradient.
TEST(DispatcherReplicationTest, ARepeatedTaskAddWaitsForTheBackups) {
  BufferPool pool;
  PluginRegistry plugins;
  HoldingEnv env;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins, {}, &env);
  proto::ClusterMap map = LbfgsMap(4, {"x", "g"});
  proto::RangeAssignment* r = map.mutable_tables(0)->add_ranges();
  r->set_begin(0);
  r->set_end(4);
  r->set_primary(kSelf);
  r->add_replicas(7);
  ASSERT_OK(d.ApplyMap(map));
  const std::vector<float> grad = {1, 2, 3, 4};
  uint64_t token = 0;
  auto send = [&](proto::DataHeader h) {
    h.set_table_id(1);
    h.set_width(1);
    h.set_is_range(true);
    h.set_range_begin(0);
    h.set_range_end(4);
    h.set_num_keys(4);
    IncomingMessage req;
    req.header = h;
    req.reply_token = ++token;
    if (h.op() == proto::ADD) req.values = grad;
    OutgoingReply reply;
    std::vector<DeferredReply> released;
    d.Handle(req, &reply, &released);
    EXPECT_TRUE(released.empty());
    return reply;
  };
  // The coordinator opens round 1 of g (a replicated vector command).
  proto::DataHeader zero;
  zero.set_op(proto::VECTOR);
  zero.mutable_vector_command()->set_update(proto::VectorCommand::ZERO);
  zero.mutable_vector_command()->set_dst(1);
  zero.mutable_vector_command()->set_open_round(1);
  EXPECT_TRUE(send(zero).deferred);
  env.AckAll();
  ASSERT_EQ(env.sent.size(), 1u);
  EXPECT_EQ(env.sent[0].reply.header.status_code(), 0);
  env.sent.clear();

  proto::DataHeader add;
  add.set_op(proto::ADD);
  add.set_vector_id(1);
  add.set_round(1);
  add.set_task_id(5);
  // Task 5's first copy: applied, forwarded, held for the backup.
  EXPECT_TRUE(send(add).deferred);
  ASSERT_EQ(env.to_backup.size(), 1u);
  // Its backup copy: dropped as a repeat, and held too.
  const OutgoingReply repeat = send(add);
  EXPECT_TRUE(repeat.deferred);
  EXPECT_TRUE(env.sent.empty());
  EXPECT_EQ(env.to_backup.size(), 1u);  // the repeat is not forwarded
  env.AckAll();
  ASSERT_EQ(env.sent.size(), 2u);
  EXPECT_EQ(env.sent[0].reply_token, 2u);
  EXPECT_FALSE(env.sent[0].reply.header.discarded());
  EXPECT_EQ(env.sent[1].reply_token, 3u);
  EXPECT_TRUE(env.sent[1].reply.header.discarded());
  // Applied once.
  proto::DataHeader get;
  get.set_op(proto::GET);
  get.set_vector_id(1);
  const OutgoingReply got = send(get);
  EXPECT_FALSE(got.deferred);
  EXPECT_EQ(Values(got), grad);
  // With nothing outstanding, a repeat is answered at once.
  env.sent.clear();
  const OutgoingReply late = send(add);
  EXPECT_FALSE(late.deferred);
  EXPECT_TRUE(late.header.discarded());
}

// A vector command is applied only where this server is the primary: a
// part it holds as a backup (a retry that reached the backup before it
// applied the map promoting it) or not at all is refused so that the
// client sends it again, never answered as done with nothing applied.
TEST(DispatcherVectorTest, APartNotServedHereAsPrimaryIsRefused) {
  BufferPool pool;
  PluginRegistry plugins;
  HoldingEnv env;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins, {}, &env);
  proto::ClusterMap map = LbfgsMap(8, {"x"});
  proto::TableMap* t = map.mutable_tables(0);
  proto::RangeAssignment* mine = t->add_ranges();
  mine->set_begin(0);
  mine->set_end(4);
  mine->set_primary(kSelf);
  proto::RangeAssignment* backed = t->add_ranges();
  backed->set_begin(4);
  backed->set_end(8);
  backed->set_primary(7);
  backed->add_replicas(kSelf);
  ASSERT_OK(d.ApplyMap(map));
  uint64_t token = 0;
  auto handle = [&](IncomingMessage req) {
    req.header.set_table_id(1);
    req.reply_token = ++token;
    OutgoingReply reply;
    std::vector<DeferredReply> released;
    d.Handle(req, &reply, &released);
    return reply;
  };
  IncomingMessage put;
  put.header.set_op(proto::PUT);
  put.header.set_width(1);
  put.header.set_is_range(true);
  put.header.set_range_begin(0);
  put.header.set_range_end(4);
  put.header.set_num_keys(4);
  const std::vector<float> ones(4, 1.0f);
  put.values = ones;
  ASSERT_EQ(handle(put).header.status_code(), 0);
  // x := x + x on [begin, end).
  auto double_x = [&](Key begin, Key end, Epoch epoch) {
    IncomingMessage req;
    req.header.set_op(proto::VECTOR);
    req.header.set_epoch(epoch);
    req.header.set_client_id(42);
    req.header.set_seq(token + 1);
    proto::VectorCommand* c = req.header.mutable_vector_command();
    c->set_update(proto::VectorCommand::AXPY);
    c->set_alpha(1);
    c->set_begin(begin);
    c->set_end(end);
    return ReplyStatus(handle(req).header);
  };
  // Held here as a backup: refused, the client's map is stale (ABORTED) or
  // this server's is (UNAVAILABLE); the client sends both again.
  absl::Status s = double_x(4, 8, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(ReasonOf(s), ErrorReason::kNotOwner) << s;
  s = double_x(4, 8, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(ReasonOf(s), ErrorReason::kServerBehind) << s;
  // Spanning the range served here and one that is not: refused whole.
  s = double_x(0, 8, 3);
  EXPECT_EQ(ReasonOf(s), ErrorReason::kNotOwner) << s;
  // The range served here: applied, once.
  EXPECT_OK(double_x(0, 4, 3));
  IncomingMessage get = put;
  get.header.set_op(proto::GET);
  get.values = {};
  const OutgoingReply got = handle(get);
  ASSERT_EQ(got.header.status_code(), 0);
  EXPECT_EQ(Values(got), std::vector<float>(4, 2.0f));
}

// --on_worker_loss=continue under BSP: a map that retires a rank completes
// the steps held for it with the ranks left, and refuses its pushes.
TEST(DispatcherBspTest, RetiredRanksNoLongerHoldTheStep) {
  BufferPool pool;
  PluginRegistry plugins;
  RecordingEnv env;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins, {}, &env);
  proto::ClusterMap map = BspMap(3, 0);
  map.mutable_tables(0)->mutable_spec()->set_follows_job(true);
  ASSERT_OK(d.ApplyMap(map));
  // Clock 0: rank 2 (about to be lost) and rank 0 push; both wait.
  BspCall lost = CallBsp(d, proto::PUSH, 2, 0, std::vector<float>(8, 9), 41);
  BspCall r0 = CallBsp(d, proto::PUSH_PULL, 0, 0, std::vector<float>(8, 1), 42);
  EXPECT_TRUE(lost.reply.deferred);
  EXPECT_TRUE(r0.reply.deferred);

  map.set_epoch(6);
  map.add_retired_ranks(2);
  ASSERT_OK(d.ApplyMap(map));
  // Rank 2's held push is answered with an error; the step needs 2 now.
  ASSERT_EQ(env.sent.size(), 1u);
  EXPECT_EQ(env.sent[0].reply_token, 41u);
  EXPECT_EQ(Code(env.sent[0].reply.header),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      env.sent[0].reply.header.status_message(),
      ::testing::HasSubstr("lost and not replaced, or it left for good"));
  // Rank 1 completes clock 0 with rank 0: the mean of 1 and 3, without
  // rank 2's 9 (SGD with rate 1 from 1).
  BspCall r1 = CallBsp(d, proto::PUSH_PULL, 1, 0, std::vector<float>(8, 3), 43);
  EXPECT_FALSE(r1.reply.deferred);
  EXPECT_EQ(Values(r1.reply), std::vector<float>(8, -1.0f));
  ASSERT_EQ(r1.released.size(), 1u);
  EXPECT_EQ(r1.released[0].reply_token, 42u);
  EXPECT_EQ(r1.released[0].reply.header.staleness(), 0);

  // A retired rank's later push is refused.
  BspCall refused =
      HandleBsp(d, proto::PUSH, 2, 1, std::vector<float>(8, 9), 44);
  EXPECT_EQ(Code(refused.reply.header), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.reply.header.status_message(),
              ::testing::HasSubstr("worker rank 2 was retired"));

  // Clock 1: rank 0 waits; rank 1 is retired too, so its step is applied
  // at once with rank 0's gradient alone, and rank 0 gets the values.
  BspCall alone =
      CallBsp(d, proto::PUSH_PULL, 0, 1, std::vector<float>(8, 2), 45);
  EXPECT_TRUE(alone.reply.deferred);
  map.set_epoch(7);
  map.add_retired_ranks(1);
  ASSERT_OK(d.ApplyMap(map));
  ASSERT_EQ(env.sent.size(), 2u);
  EXPECT_EQ(env.sent[1].reply_token, 45u);
  EXPECT_EQ(env.sent[1].reply.header.status_code(), 0);
  EXPECT_EQ(env.sent[1].reply.header.server_epoch(), 7u);
  EXPECT_EQ(Values(env.sent[1].reply), std::vector<float>(8, -3.0f));
  // From now on one rank is a step.
  BspCall next =
      CallBsp(d, proto::PUSH_PULL, 0, 2, std::vector<float>(8, 1), 46);
  EXPECT_FALSE(next.reply.deferred);
  EXPECT_EQ(Values(next.reply), std::vector<float>(8, -4.0f));
  EXPECT_EQ(next.reply.header.staleness(), 0);
}

// The same for a sparse table's key batches: the held step is applied
// with the ranks left, each key's mean over them.
TEST(DispatcherBspTest, RetiredRanksCompleteASparseStep) {
  BufferPool pool;
  PluginRegistry plugins;
  RecordingEnv env;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins, {}, &env);
  proto::ClusterMap map = SyncedSparseMap();  // 4 ranks, "sum" handler
  map.mutable_tables(0)->mutable_spec()->set_follows_job(true);
  ASSERT_OK(d.ApplyMap(map));
  bool held;
  EXPECT_EQ(
      SyncedPush(d, 0, 0, {7}, {1}, false, &held, nullptr, 51).status_code(),
      0);
  EXPECT_TRUE(held);
  EXPECT_EQ(SyncedPush(d, 1, 0, {7, 9}, {2, 6}, false, &held, nullptr, 52)
                .status_code(),
            0);
  EXPECT_TRUE(held);
  map.set_epoch(6);
  map.add_retired_ranks(2);
  map.add_retired_ranks(3);
  ASSERT_OK(d.ApplyMap(map));
  ASSERT_EQ(env.sent.size(), 2u);
  std::vector<uint64_t> tokens = {env.sent[0].reply_token,
                                  env.sent[1].reply_token};
  std::sort(tokens.begin(), tokens.end());
  EXPECT_EQ(tokens, (std::vector<uint64_t>{51, 52}));
  // Key 7: (1 + 2) / 2; key 9: 6 / 2 (rank 0 pushed no key 9).
  EXPECT_EQ(GetSynced(d, {7, 9}), (std::vector<float>{1.5f, 3.0f}));
  EXPECT_EQ(Code(SyncedPush(d, 3, 1, {7}, {1})),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DispatcherBspTest, SyncedPushPullOfKeyBatchIsRejected) {
  BufferPool pool;
  PluginRegistry plugins;
  Dispatcher d(kSelf, 1 << 20, &pool, &plugins);
  ASSERT_OK(d.ApplyMap(BspMap(2, 0)));
  IncomingMessage req;
  req.header.set_op(proto::PUSH_PULL);
  req.header.set_table_id(3);
  req.header.set_width(2);
  req.header.set_epoch(5);
  req.header.set_num_keys(1);
  req.header.set_worker_rank(0);
  req.header.set_worker_clock(0);
  std::vector<Key> k = {1};
  std::vector<float> v = {1, 1};
  req.keys = k;
  req.values = v;
  req.reply_token = 1;
  OutgoingReply reply;
  std::vector<DeferredReply> released;
  d.Handle(req, &reply, &released);
  EXPECT_EQ(Code(reply.header), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(reply.deferred);
}

}  // namespace
}  // namespace server_internal
}  // namespace downpour
