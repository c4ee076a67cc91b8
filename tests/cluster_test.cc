// Integration tests: the real ps_scheduler and ps_server processes on
// 127.0.0.1, driven through the client SDK and through raw ZeroMQ frames.
#include <signal.h>
#include <zmq.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "client/vector_op.h"
#include "cluster/scheduler_client.h"
#include "common/grpc_channel.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "grpcpp/grpcpp.h"
#include "launch/local_cluster.h"
#include "proto/downpour.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "testing/suite_cluster.h"

namespace downpour {
namespace {

// `dead_after_ms`: how long a silent server lives on. Only the failure
// test kills one; the others' servers must not be declared dead when a
// loaded machine (TSan, two runs at a time) stalls them for a second.
LocalClusterOptions ClusterOptions(int servers, const std::string& dir,
                                   int dead_after_ms) {
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = servers;
  o.scheduler_flags = {"--heartbeat_interval_ms=100",
                       absl::StrCat("--dead_after_ms=", dead_after_ms)};
  o.server_flags = {
      "--max_message_mb=8",
      "--handler_plugins=" + RunfilePath("handlers/libclipped_sgd.so")};
  return o;
}

// The distinct keys of `keys` in first-seen order, and each one's rows of
// `width` summed in batch order: what a table that sums repeats applies.
void SumByHand(const std::vector<Key>& keys, const std::vector<float>& rows,
               uint32_t width, std::vector<Key>* distinct,
               std::vector<float>* sums) {
  absl::flat_hash_map<Key, size_t> place;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = place.emplace(keys[i], distinct->size());
    if (fresh) {
      distinct->push_back(keys[i]);
      sums->insert(sums->end(), rows.begin() + i * width,
                   rows.begin() + (i + 1) * width);
    } else {
      for (uint32_t c = 0; c < width; ++c) {
        (*sums)[it->second * width + c] += rows[i * width + c];
      }
    }
  }
}

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_OK(suite_.Start(ClusterOptions(3, TestTmpDir(), 30000)));
  }
  static void TearDownTestSuite() { EXPECT_OK(suite_.Stop()); }
  // Clients of their own for worker ranks 0 .. n-1, at clock 0.
  static absl::StatusOr<std::vector<std::unique_ptr<Client>>> RankClients(
      int n) {
    std::vector<std::unique_ptr<Client>> ranks;
    for (int r = 0; r < n; ++r) {
      ClientOptions co;
      co.scheduler_address = suite_.cluster().scheduler_address();
      co.op_timeout = absl::Seconds(20);
      DP_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(co));
      c->SetWorkerClock(r, 0);
      ranks.push_back(std::move(c));
    }
    return ranks;
  }
  static SuiteCluster suite_;
};
SuiteCluster ClusterTest::suite_;

// Random operations from many threads against a reference model. Values are
// small integers (and halves), so float sums are exact in any order.
TEST_F(ClusterTest, ConcurrentRandomOperationsMatchReference) {
  const uint32_t seed = TestSeed(1);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int kThreads = 4, kOpsPerThread = 150;
  constexpr uint64_t kDenseKeys = 3000;
  constexpr uint32_t kWidth = 4, kSparseWidth = 8;

  TableOptions dense;
  dense.name = "random_dense";
  dense.width = kWidth;
  dense.num_keys = kDenseKeys;
  dense.handler = "sum";
  auto d = suite_.client().CreateTable(dense);
  ASSERT_OK(d);
  TableOptions sparse;
  sparse.name = "random_sparse";
  sparse.sparse = true;
  sparse.width = kSparseWidth;
  sparse.handler = "sgd";
  sparse.handler_params = {{"learning_rate", 0.5}};
  auto s = suite_.client().CreateTable(sparse);
  ASSERT_OK(s);

  // Phase 1: each thread puts its own dense keys (k % kThreads == t).
  std::vector<float> ref_dense(kDenseKeys * kWidth, 0);
  for (int t = 0; t < kThreads; ++t) {
    std::vector<Key> keys;
    std::vector<float> vals;
    for (Key k = t; k < kDenseKeys; k += kThreads) {
      keys.push_back(k);
      for (uint32_t j = 0; j < kWidth; ++j) {
        vals.push_back(static_cast<float>((k + j) % 17));
        ref_dense[k * kWidth + j] = vals.back();
      }
    }
    ASSERT_OK(suite_.client().PutSync(*d, keys, vals));
  }

  // Phase 2: random adds and pushes (commutative), with pulls in between.
  std::vector<std::vector<std::pair<Key, std::vector<float>>>> dense_log(
      kThreads),
      sparse_log(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      std::vector<Ticket> pending;
      for (int i = 0; i < kOpsPerThread; ++i) {
        const int n = 1 + rng() % 64;
        std::vector<Key> keys(n);
        const bool on_dense = rng() % 2;
        const uint32_t w = on_dense ? kWidth : kSparseWidth;
        for (Key& k : keys) {
          k = on_dense ? rng() % kDenseKeys
                       : (rng() % 500) * 0x9E3779B97F4A7C15ull % kKeySpaceEnd;
        }
        std::vector<float> vals(n * w);
        for (float& v : vals)
          v = static_cast<float>(static_cast<int>(rng() % 9) - 4);
        for (int j = 0; j < n; ++j) {
          auto& log = on_dense ? dense_log[t] : sparse_log[t];
          log.emplace_back(keys[j],
                           std::vector<float>(vals.begin() + j * w,
                                              vals.begin() + (j + 1) * w));
        }
        const Table& table = on_dense ? *d : *s;
        absl::Status st;
        switch (rng() % 3) {
          case 0:
            st = on_dense ? suite_.client().AddSync(table, keys, vals)
                          : suite_.client().PushSync(table, keys, vals);
            break;
          case 1:
            st = suite_.client().PushSync(table, keys, vals);
            break;
          default: {
            std::vector<float> out(n * w);
            st = suite_.client().PushPullSync(table, keys, vals,
                                              absl::MakeSpan(out));
          }
        }
        if (!st.ok()) {
          ADD_FAILURE() << st;
          failures++;
          return;
        }
        if (rng() % 4 == 0) {
          std::vector<float> out(n * w);
          absl::Status p =
              suite_.client().PullSync(table, keys, absl::MakeSpan(out));
          if (!p.ok()) failures++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);

  // Reference: dense "sum" adds the value; sparse "sgd" subtracts 0.5 * g.
  for (const auto& log : dense_log) {
    for (const auto& [k, v] : log) {
      for (uint32_t j = 0; j < kWidth; ++j) ref_dense[k * kWidth + j] += v[j];
    }
  }
  absl::flat_hash_map<Key, std::vector<float>> ref_sparse;
  for (const auto& log : sparse_log) {
    for (const auto& [k, v] : log) {
      auto& row = ref_sparse[k];
      row.resize(kSparseWidth, 0);
      for (uint32_t j = 0; j < kSparseWidth; ++j) row[j] -= 0.5f * v[j];
    }
  }
  std::vector<float> got(kDenseKeys * kWidth);
  ASSERT_OK(suite_.client().GetSync(*d, Keys::Range(0, kDenseKeys),
                                    absl::MakeSpan(got)));
  EXPECT_EQ(got, ref_dense);
  std::vector<Key> skeys;
  std::vector<float> sref;
  for (const auto& [k, row] : ref_sparse) {
    skeys.push_back(k);
    sref.insert(sref.end(), row.begin(), row.end());
  }
  std::vector<float> sgot(sref.size());
  ASSERT_OK(suite_.client().PullSync(*s, skeys, absl::MakeSpan(sgot)));
  EXPECT_EQ(sgot, sref);
}

TEST_F(ClusterTest, RangeOperationsSpanServers) {
  TableOptions o;
  o.name = "ranges";
  o.width = 3;
  o.num_keys = 1000;
  o.handler = "sgd";
  o.handler_params = {{"learning_rate", 1.0}};
  o.init = "constant";
  o.init_a = 2.0f;
  auto t = suite_.client().CreateTable(o);
  ASSERT_OK(t);
  std::vector<float> out(1000 * 3);
  ASSERT_OK(
      suite_.client().PullSync(*t, Keys::Range(0, 1000), absl::MakeSpan(out)));
  EXPECT_EQ(out, std::vector<float>(3000, 2.0f));
  std::vector<float> v(600 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  ASSERT_OK(suite_.client().PutSync(*t, Keys::Range(200, 800), v));
  std::vector<float> g(600 * 3, 1.0f);
  ASSERT_OK(suite_.client().PushSync(*t, Keys::Range(200, 800), g));
  ASSERT_OK(suite_.client().AddSync(*t, Keys::Range(200, 800), g));
  std::vector<float> back(600 * 3);
  ASSERT_OK(
      suite_.client().GetSync(*t, Keys::Range(200, 800), absl::MakeSpan(back)));
  EXPECT_EQ(back, v);  // -1 by the sgd push, +1 by the add
  // Scattered batch read in the caller's order, across all three servers.
  std::vector<Key> keys = {999, 0, 500, 201, 999};
  std::vector<float> b(keys.size() * 3);
  ASSERT_OK(suite_.client().GetSync(*t, keys, absl::MakeSpan(b)));
  EXPECT_EQ(b[0], 2.0f);
  EXPECT_EQ(b[3], 2.0f);
  EXPECT_EQ(b[6], v[300 * 3]);
  EXPECT_EQ(b[9], v[1 * 3]);
  EXPECT_EQ(b[12], 2.0f);
}

// Batches cut into parts of a few keys (ClientOptions::part_bytes): runs
// of consecutive keys go as key ranges, scattered keys are gathered, keys
// may repeat; every operation must land as if applied key by key in the
// caller's order (a put of a key twice keeps the second), and every read
// must come back in the caller's order. Checked against a model after each
// operation.
TEST_F(ClusterTest, BatchesInSmallPartsKeepTheCallersOrder) {
  const uint32_t seed = TestSeed(7);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr uint32_t kWidth = 2;
  constexpr uint64_t kDenseKeys = 300;  // three ranges of 100
  ClientOptions co;
  co.scheduler_address = suite_.cluster().scheduler_address();
  co.part_bytes = 4 * (sizeof(Key) + kWidth * sizeof(float));  // 4 keys
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(co));
  TableOptions o;
  o.name = "small_parts_dense";
  o.width = kWidth;
  o.num_keys = kDenseKeys;
  o.handler = "sum";
  ASSERT_OK_AND_ASSIGN(Table dense, client->CreateTable(o));
  o.name = "small_parts_sparse";
  o.sparse = true;
  o.num_keys = 0;
  ASSERT_OK_AND_ASSIGN(Table sparse, client->CreateTable(o));
  std::mt19937_64 rng(seed);
  absl::flat_hash_map<Key, std::vector<float>> model[2];
  auto sparse_key = [](uint64_t i) {
    return i * 0x9E3779B97F4A7C15ull % kKeySpaceEnd;
  };
  // A batch: runs of consecutive keys, scattered keys and repeats.
  auto batch = [&](bool on_sparse) {
    std::vector<Key> keys;
    const int pieces = 1 + rng() % 4;
    for (int p = 0; p < pieces; ++p) {
      const uint64_t start = rng() % kDenseKeys;
      const int n = 1 + rng() % 40;
      const bool run = rng() % 2;
      for (int i = 0; i < n; ++i) {
        const uint64_t id = run ? (start + i) % kDenseKeys : rng() % kDenseKeys;
        keys.push_back(on_sparse ? sparse_key(id) : id);
      }
    }
    if (rng() % 2 == 0) std::sort(keys.begin(), keys.end());
    return keys;
  };
  for (int step = 0; step < 120; ++step) {
    const bool on_sparse = rng() % 2;
    const Table& t = on_sparse ? sparse : dense;
    auto& m = model[on_sparse];
    const std::vector<Key> keys = batch(on_sparse);
    std::vector<float> vals(keys.size() * kWidth);
    for (float& v : vals) v = static_cast<float>(static_cast<int>(rng() % 9));
    const int op = rng() % 4;
    absl::Status st;
    std::vector<float> out(vals.size(), -1);
    switch (op) {
      case 0:
        st = client->PutSync(t, keys, vals);
        break;
      case 1:
        st = client->AddSync(t, keys, vals);
        break;
      case 2:
        st = client->PushSync(t, keys, vals);
        break;
      default:
        st = client->PullSync(t, keys, absl::MakeSpan(out));
    }
    ASSERT_OK(st) << "step " << step << " op " << op;
    std::vector<float> want;
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<float>& row = m[keys[i]];
      row.resize(kWidth, 0.0f);
      for (uint32_t j = 0; j < kWidth; ++j) {
        const float v = vals[i * kWidth + j];
        if (op == 0) row[j] = v;
        if (op == 1 || op == 2) row[j] += v;
        if (op == 3) want.push_back(row[j]);
      }
    }
    if (op == 3) {
      EXPECT_EQ(out, want) << "step " << step;
    }
  }
  // Every key touched, read back in one batch per table.
  for (int on_sparse = 0; on_sparse < 2; ++on_sparse) {
    std::vector<Key> keys;
    std::vector<float> want;
    for (const auto& [k, row] : model[on_sparse]) {
      keys.push_back(k);
      want.insert(want.end(), row.begin(), row.end());
    }
    std::vector<float> got(want.size());
    ASSERT_OK(
        client->GetSync(on_sparse ? sparse : dense, keys, absl::MakeSpan(got)));
    EXPECT_EQ(got, want);
  }
}

// Sorted batches on a dense table that the server reads without a row
// lookup per key: runs of consecutive keys, and keys every 2 or 3 rows
// (and repeats), each read from one pass over their span.
TEST_F(ClusterTest, SortedBatchesReadTheirRows) {
  constexpr uint32_t kWidth = 3;
  constexpr uint64_t kKeys = 12000;  // three ranges of 4000
  TableOptions o;
  o.name = "sorted_reads";
  o.width = kWidth;
  o.num_keys = kKeys;
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  std::vector<float> all(kKeys * kWidth);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i);
  ASSERT_OK(suite_.client().PutSync(t, Keys::Range(0, kKeys), all));
  for (const uint64_t stride : {1, 2, 3}) {
    std::vector<Key> keys;
    for (Key k = 5; k < kKeys; k += stride) {
      keys.push_back(k);
      if (k % 1000 == 7) keys.push_back(k);  // a repeat now and then
    }
    // Runs of consecutive keys with gaps between them.
    if (stride == 1) {
      keys.erase(std::remove_if(keys.begin(), keys.end(),
                                [](Key k) { return k % 100 < 3; }),
                 keys.end());
    }
    std::vector<float> got(keys.size() * kWidth), want;
    for (Key k : keys) {
      for (uint32_t j = 0; j < kWidth; ++j) want.push_back(all[k * kWidth + j]);
    }
    ASSERT_OK(suite_.client().PullSync(t, keys, absl::MakeSpan(got)));
    EXPECT_EQ(got, want) << "stride " << stride;
  }
}

// A read batch whose keys repeat asks the servers for each key once, and
// every repeat gets its row; a batch without repeats is sent whole.
TEST_F(ClusterTest, ReadsAskForRepeatedKeysOnce) {
  constexpr uint32_t kWidth = 4;
  constexpr uint64_t kIds = 500;
  TableOptions o;
  o.name = "repeated_reads";
  o.width = kWidth;
  o.sparse = true;
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  auto key_of = [](uint64_t id) { return id * 0x9E3779B97F4A7C15ull; };
  std::vector<Key> ids(kIds);
  std::vector<float> rows(kIds * kWidth);
  for (uint64_t i = 0; i < kIds; ++i) {
    ids[i] = key_of(i);
    for (uint32_t j = 0; j < kWidth; ++j) rows[i * kWidth + j] = i * 10.0f + j;
  }
  ASSERT_OK(suite_.client().PutSync(t, ids, rows));
  std::mt19937_64 rng(TestSeed(11));
  for (const bool get : {false, true}) {
    // 20000 draws of 500 ids, over the three servers.
    std::vector<Key> keys(20000);
    std::vector<float> want;
    for (Key& k : keys) {
      const uint64_t id = rng() % kIds;
      k = key_of(id);
      want.insert(want.end(), rows.begin() + id * kWidth,
                  rows.begin() + (id + 1) * kWidth);
    }
    std::vector<float> got(keys.size() * kWidth, -1);
    const TrafficStats before = suite_.client().traffic();
    ASSERT_OK(get ? suite_.client().GetSync(t, keys, absl::MakeSpan(got))
                  : suite_.client().PullSync(t, keys, absl::MakeSpan(got)));
    const TrafficStats after = suite_.client().traffic();
    EXPECT_EQ(got, want) << (get ? "get" : "pull");
    // At most the 500 distinct keys went out and their rows came back (and
    // headers): far below the batch's 160 kB of keys and 320 kB of rows.
    EXPECT_LT(after.bytes_sent - before.bytes_sent, 500 * sizeof(Key) + 4096);
    EXPECT_LT(after.bytes_received - before.bytes_received,
              500 * kWidth * sizeof(float) + 4096);
  }
  // Distinct keys: every key goes out.
  std::vector<Key> keys(ids.begin(), ids.end());
  std::shuffle(keys.begin(), keys.end(), rng);
  std::vector<float> got(keys.size() * kWidth);
  const TrafficStats before = suite_.client().traffic();
  ASSERT_OK(suite_.client().PullSync(t, keys, absl::MakeSpan(got)));
  const TrafficStats after = suite_.client().traffic();
  EXPECT_GE(after.bytes_sent - before.bytes_sent, kIds * sizeof(Key));
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t id =
        std::find(ids.begin(), ids.end(), keys[i]) - ids.begin();
    for (uint32_t j = 0; j < kWidth; ++j) {
      ASSERT_EQ(got[i * kWidth + j], rows[id * kWidth + j]) << i;
    }
  }
}

// A table that sums repeats applies each distinct key of a push or add once,
// with the sum of its rows in batch order: the same, bit for bit, as a push
// of the distinct keys with those sums, and not what applying Adagrad to
// each occurrence gives. Only the distinct keys go on the wire.
TEST_F(ClusterTest, PushesToATableThatSumsRepeatsApplyEachKeyOnce) {
  constexpr uint32_t kWidth = 4;
  constexpr uint64_t kIds = 500;
  auto declare = [&](const std::string& name, bool sum,
                     const std::string& handler) {
    TableOptions o;
    o.name = name;
    o.width = kWidth;
    o.sparse = true;
    o.handler = handler;
    if (handler == "adagrad") o.handler_params = {{"learning_rate", 0.5}};
    o.sum_repeats = sum;
    return suite_.client().CreateTable(o);
  };
  std::mt19937_64 rng(TestSeed(12));
  std::uniform_real_distribution<float> u(-1, 1);
  auto key_of = [](uint64_t id) { return id * 0x9E3779B97F4A7C15ull; };
  // 20000 draws of 500 ids (over the three servers) and their gradients;
  // then the distinct keys in first-seen order and their sums.
  std::vector<Key> keys(20000);
  std::vector<float> grads(keys.size() * kWidth);
  for (Key& k : keys) k = key_of(rng() % kIds);
  for (float& g : grads) g = u(rng) + u(rng) * 1e-4f;
  std::vector<Key> distinct;
  std::vector<float> sums;
  SumByHand(keys, grads, kWidth, &distinct, &sums);
  ASSERT_LT(distinct.size(), keys.size());
  auto pull = [&](const Table& t) {
    std::vector<float> out(distinct.size() * kWidth);
    EXPECT_OK(suite_.client().PullSync(t, distinct, absl::MakeSpan(out)));
    return out;
  };
  for (const std::string handler : {"adagrad", "sum"}) {
    SCOPED_TRACE(handler);
    ASSERT_OK_AND_ASSIGN(Table summed,
                         declare("summed_" + handler, true, handler));
    ASSERT_OK_AND_ASSIGN(Table by_hand,
                         declare("by_hand_" + handler, false, handler));
    ASSERT_OK_AND_ASSIGN(Table each,
                         declare("each_" + handler, false, handler));
    EXPECT_TRUE(summed.sum_repeats);
    EXPECT_FALSE(each.sum_repeats);
    const TrafficStats before = suite_.client().traffic();
    ASSERT_OK(suite_.client().PushSync(summed, keys, grads));
    const TrafficStats after = suite_.client().traffic();
    EXPECT_LT(after.bytes_sent - before.bytes_sent,
              kIds * (sizeof(Key) + kWidth * sizeof(float)) + 4096);
    ASSERT_OK(suite_.client().PushSync(by_hand, distinct, sums));
    ASSERT_OK(suite_.client().PushSync(each, keys, grads));
    const std::vector<float> got = pull(summed);
    EXPECT_EQ(got, pull(by_hand));
    if (handler == "adagrad") {
      EXPECT_NE(got, pull(each));
    }
    // An Add sums alike; a Put still applies each occurrence in turn.
    ASSERT_OK(suite_.client().AddSync(summed, keys, grads));
    ASSERT_OK(suite_.client().AddSync(by_hand, distinct, sums));
    EXPECT_EQ(pull(summed), pull(by_hand));
  }
  ASSERT_OK_AND_ASSIGN(Table put, declare("summed_put", true, "sgd"));
  const std::vector<Key> twice = {key_of(1), key_of(2), key_of(1)};
  const std::vector<float> rows = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  ASSERT_OK(suite_.client().PutSync(put, twice, rows));
  std::vector<float> out(2 * kWidth);
  const std::vector<Key> once = {key_of(1), key_of(2)};
  ASSERT_OK(suite_.client().GetSync(put, once, absl::MakeSpan(out)));
  EXPECT_EQ(out, std::vector<float>({3, 3, 3, 3, 2, 2, 2, 2}));
  // Declaring it again without the flag is another table.
  EXPECT_THAT(declare("summed_put", false, "sgd").status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

// Server-side vector algebra (Sandblaster): every command on vectors spread
// over the three servers, against the same arithmetic done here.
TEST_F(ClusterTest, VectorCommandsMatchReference) {
  constexpr uint64_t kKeys = 1000;
  constexpr uint32_t kWidth = 3;
  constexpr size_t kN = kKeys * kWidth;
  TableOptions o;
  o.name = "vectors";
  o.width = kWidth;
  o.num_keys = kKeys;
  o.vectors = {"x", "g", "d"};
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  ASSERT_EQ(t.vectors.size(), 3u);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  std::vector<std::vector<float>> ref(3, std::vector<float>(kN));
  for (uint32_t v = 0; v < 3; ++v) {
    for (float& x : ref[v]) x = dist(rng);
    ASSERT_OK_AND_ASSIGN(Table tv, t.WithVector(o.vectors[v]));
    ASSERT_OK(suite_.client().PutSync(tv, Keys::Range(0, kKeys), ref[v]));
  }
  auto check_all = [&](const std::string& what) {
    for (uint32_t v = 0; v < 3; ++v) {
      Table tv = t;
      tv.vector = v;
      std::vector<float> got(kN);
      ASSERT_OK(suite_.client().GetSync(tv, Keys::Range(0, kKeys),
                                        absl::MakeSpan(got)));
      ASSERT_EQ(got, ref[v]) << what << ", vector " << v;
    }
  };
  auto dot = [&](uint32_t a, uint32_t b, Key lo, Key hi) {
    double sum = 0;
    for (size_t i = lo * kWidth; i < hi * kWidth; ++i) {
      sum += static_cast<double>(ref[a][i]) * ref[b][i];
    }
    return sum;
  };
  using proto::VectorCommand;
  // LINCOMB d = 0.5 x - 2 g, fused with d.d and x.d over all keys.
  VectorCommand c;
  c.set_update(VectorCommand::LINCOMB);
  c.set_dst(2);
  c.set_a(0);
  c.set_b(1);
  c.set_alpha(0.5);
  c.set_beta(-2.0);
  c.add_dot_x(2);
  c.add_dot_y(2);
  c.add_dot_x(0);
  c.add_dot_y(2);
  ASSERT_OK_AND_ASSIGN(std::vector<double> dots,
                       VectorOp(suite_.client(), t, c));
  for (size_t i = 0; i < kN; ++i) {
    ref[2][i] = static_cast<float>(0.5 * ref[0][i] + -2.0 * ref[1][i]);
  }
  ASSERT_EQ(dots.size(), 2u);
  EXPECT_NEAR(dots[0], dot(2, 2, 0, kKeys), 1e-9 * dots[0]);
  EXPECT_NEAR(dots[1], dot(0, 2, 0, kKeys), 1e-9 * std::abs(dots[1]) + 1e-9);
  check_all("lincomb");
  // AXPY g += -0.25 d on keys [100, 900) only, across server boundaries.
  c.Clear();
  c.set_update(VectorCommand::AXPY);
  c.set_dst(1);
  c.set_a(2);
  c.set_alpha(-0.25);
  c.set_begin(100);
  c.set_end(900);
  c.add_dot_x(1);
  c.add_dot_y(1);
  ASSERT_OK_AND_ASSIGN(dots, VectorOp(suite_.client(), t, c));
  for (size_t i = 100 * kWidth; i < 900 * kWidth; ++i) {
    ref[1][i] = static_cast<float>(ref[1][i] + -0.25 * ref[2][i]);
  }
  EXPECT_NEAR(dots[0], dot(1, 1, 100, 900), 1e-9 * dots[0]);
  check_all("axpy on a range");
  // SCALE, COPY, ZERO; then a dot-only command.
  c.Clear();
  c.set_update(VectorCommand::SCALE);
  c.set_dst(0);
  c.set_alpha(3.0);
  ASSERT_OK(VectorOp(suite_.client(), t, c));
  for (float& x : ref[0]) x = static_cast<float>(3.0 * x);
  c.Clear();
  c.set_update(VectorCommand::COPY);
  c.set_dst(2);
  c.set_a(0);
  ASSERT_OK(VectorOp(suite_.client(), t, c));
  ref[2] = ref[0];
  c.Clear();
  c.set_update(VectorCommand::ZERO);
  c.set_dst(1);
  c.set_begin(0);
  c.set_end(500);
  ASSERT_OK(VectorOp(suite_.client(), t, c));
  std::fill(ref[1].begin(), ref[1].begin() + 500 * kWidth, 0.0f);
  check_all("scale, copy, zero");
  c.Clear();
  c.add_dot_x(0);
  c.add_dot_y(1);
  ASSERT_OK_AND_ASSIGN(dots, VectorOp(suite_.client(), t, c));
  EXPECT_NEAR(dots[0], dot(0, 1, 0, kKeys), 1e-9 * std::abs(dots[0]) + 1e-9);
  // Only commands and scalars travel: far fewer bytes than one vector.
  const TrafficStats before = suite_.client().traffic();
  ASSERT_OK(VectorOp(suite_.client(), t, c));
  const TrafficStats after = suite_.client().traffic();
  EXPECT_LT(after.bytes_sent + after.bytes_received - before.bytes_sent -
                before.bytes_received,
            1000u);
  EXPECT_EQ(after.requests - before.requests, 3u);  // one per server
}

// BSP PushPull over the wire, N = 2 plus one backup: a PushPull waits for
// its step's last gradient, then every participant gets exactly the
// post-update values; the backup's late PushPull is discarded and answered
// at once with the current values.
TEST_F(ClusterTest, BspPushPullWaitsForTheRound) {
  TableOptions o;
  o.name = "bsp_push_pull";
  o.width = 4;
  o.num_keys = 30;  // spans the three servers
  o.init = "constant";
  o.init_a = 1;
  o.handler = "sgd";
  o.handler_params = {{"learning_rate", 1.0}};
  o.sync_workers = 2;
  o.tracked_workers = 3;
  ASSERT_OK_AND_ASSIGN(Table table, suite_.client().CreateTable(o));
  ASSERT_OK_AND_ASSIGN(std::vector<std::unique_ptr<Client>> ranks,
                       RankClients(3));
  const size_t n = 30 * 4;
  std::vector<float> g0(n), g1(n), g2(n, 100.0f);
  for (size_t i = 0; i < n; ++i) {
    g0[i] = static_cast<float>(i % 7);
    g1[i] = static_cast<float>(i % 5) + 0.5f;
  }
  std::vector<float> out0(n, -1), out1(n, -1), out2(n, -1);
  const Ticket waiting =
      ranks[0]->PushPull(table, Keys::Range(0, 30), g0, absl::MakeSpan(out0));
  // Rank 1 has not pushed: the round is open and rank 0's reply waits.
  EXPECT_EQ(ranks[0]->Wait(waiting, absl::Milliseconds(300)).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_OK(ranks[1]->PushPullSync(table, Keys::Range(0, 30), g1,
                                   absl::MakeSpan(out1)));
  ASSERT_OK(ranks[0]->Wait(waiting, absl::Seconds(10)));
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = 1.0f - (0.0f + g0[i] + g1[i]) / 2.0f;
  EXPECT_EQ(out0, want);
  EXPECT_EQ(out1, want);
  EXPECT_EQ(ranks[0]->discarded_pushes(), 0u);
  // The backup is late for clock 0.
  ASSERT_OK(ranks[2]->PushPullSync(table, Keys::Range(0, 30), g2,
                                   absl::MakeSpan(out2)));
  EXPECT_GT(ranks[2]->discarded_pushes(), 0u);
  EXPECT_EQ(out2, want);
  std::vector<float> now(n);
  ASSERT_OK(
      suite_.client().GetSync(table, Keys::Range(0, 30), absl::MakeSpan(now)));
  EXPECT_EQ(now, want);
}

// Under BSP a synced sparse table that sums repeats averages, per key, the
// workers' summed rows: the same as each worker pushing its distinct keys
// with the sums made by hand.
TEST_F(ClusterTest, BspPushesSumTheirRepeatsBeforeTheRound) {
  constexpr uint32_t kWidth = 2;
  constexpr uint64_t kIds = 50;
  auto declare = [&](const std::string& name, bool sum) {
    TableOptions o;
    o.name = name;
    o.width = kWidth;
    o.sparse = true;
    o.init = "constant";
    o.init_a = 1;
    o.handler = "sgd";
    o.handler_params = {{"learning_rate", 1.0}};
    o.sync_workers = 2;
    o.tracked_workers = 2;
    o.sum_repeats = sum;
    return suite_.client().CreateTable(o);
  };
  ASSERT_OK_AND_ASSIGN(Table summed, declare("bsp_summed", true));
  ASSERT_OK_AND_ASSIGN(Table by_hand, declare("bsp_by_hand", false));
  std::mt19937_64 rng(TestSeed(13));
  std::uniform_real_distribution<float> u(-1, 1);
  auto key_of = [](uint64_t id) { return id * 0x9E3779B97F4A7C15ull; };
  std::vector<Key> ids(kIds);
  for (uint64_t i = 0; i < kIds; ++i) ids[i] = key_of(i);
  ASSERT_OK_AND_ASSIGN(std::vector<std::unique_ptr<Client>> ranks,
                       RankClients(2));
  // Each rank's batch holds every id at least once, repeats and all.
  std::vector<std::vector<Key>> keys(2), distinct(2);
  std::vector<std::vector<float>> grads(2), sums(2);
  for (int r = 0; r < 2; ++r) {
    keys[r] = ids;
    for (int i = 0; i < 200; ++i) keys[r].push_back(ids[rng() % kIds]);
    std::shuffle(keys[r].begin(), keys[r].end(), rng);
    grads[r].resize(keys[r].size() * kWidth);
    for (float& g : grads[r]) g = u(rng);
    SumByHand(keys[r], grads[r], kWidth, &distinct[r], &sums[r]);
  }
  // Both ranks' pushes of clock 0, then the round applies.
  std::vector<Ticket> tickets;
  for (int r = 0; r < 2; ++r) {
    tickets.push_back(ranks[r]->Push(summed, keys[r], grads[r]));
    tickets.push_back(ranks[r]->Push(by_hand, distinct[r], sums[r]));
  }
  for (size_t i = 0; i < tickets.size(); ++i) {
    ASSERT_OK(ranks[i / 2]->Wait(tickets[i], absl::Seconds(20)));
  }
  std::vector<float> got(kIds * kWidth), want(kIds * kWidth);
  ASSERT_OK(suite_.client().GetSync(summed, ids, absl::MakeSpan(got)));
  ASSERT_OK(suite_.client().GetSync(by_hand, ids, absl::MakeSpan(want)));
  EXPECT_EQ(got, want);
  EXPECT_NE(got, std::vector<float>(kIds * kWidth, 1.0f)) << "not applied";
}

TEST_F(ClusterTest, TaskAddsCountOncePerRound) {
  TableOptions o;
  o.name = "accumulate";
  o.width = 2;
  o.num_keys = 600;
  o.vectors = {"x", "g"};
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  ASSERT_OK_AND_ASSIGN(Table g, t.WithVector("g"));
  auto open = [&](int64_t round) {
    proto::VectorCommand c;
    c.set_update(proto::VectorCommand::ZERO);
    c.set_dst(1);
    c.set_open_round(round);
    return VectorOp(suite_.client(), t, c).status();
  };
  std::vector<float> ones(600 * 2, 1.0f), twos(600 * 2, 2.0f);
  auto read = [&] {
    std::vector<float> out(600 * 2);
    EXPECT_OK(
        suite_.client().GetSync(g, Keys::Range(0, 600), absl::MakeSpan(out)));
    return out;
  };
  // A round not yet opened is an error, not a silent add.
  EXPECT_THAT(suite_.client().Wait(
                  suite_.client().AddOnce(g, Keys::Range(0, 600), ones, 1, 0)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(open(1));
  const uint64_t dropped_before = suite_.client().discarded_pushes();
  ASSERT_OK(suite_.client().Wait(
      suite_.client().AddOnce(g, Keys::Range(0, 600), ones, 1, 7)));
  // A backup copy of task 7, and task 8 once.
  ASSERT_OK(suite_.client().Wait(
      suite_.client().AddOnce(g, Keys::Range(0, 600), ones, 1, 7)));
  ASSERT_OK(suite_.client().Wait(
      suite_.client().AddOnce(g, Keys::Range(0, 600), twos, 1, 8)));
  EXPECT_EQ(read(), std::vector<float>(1200, 3.0f));
  EXPECT_EQ(suite_.client().discarded_pushes() - dropped_before,
            3u);  // 3 servers
  // Sparse batches (a sparse gradient) are deduplicated the same way.
  std::vector<Key> keys = {599, 3, 250};
  std::vector<float> v(6, 10.0f);
  ASSERT_OK(suite_.client().Wait(suite_.client().AddOnce(g, keys, v, 1, 9)));
  ASSERT_OK(suite_.client().Wait(suite_.client().AddOnce(g, keys, v, 1, 9)));
  std::vector<float> expect(1200, 3.0f);
  for (Key k : keys) expect[k * 2] = expect[k * 2 + 1] = 13.0f;
  EXPECT_EQ(read(), expect);
  // The next round zeroes; a late add of round 1 is dropped.
  ASSERT_OK(open(2));
  ASSERT_OK(suite_.client().Wait(
      suite_.client().AddOnce(g, Keys::Range(0, 600), ones, 1, 10)));
  EXPECT_EQ(read(), std::vector<float>(1200, 0.0f));
  ASSERT_OK(suite_.client().Wait(
      suite_.client().AddOnce(g, Keys::Range(0, 600), ones, 2, 7)));
  EXPECT_EQ(read(), std::vector<float>(1200, 1.0f));
}

TEST_F(ClusterTest, VectorErrorsAreClear) {
  TableOptions o;
  o.name = "vector_errors";
  o.width = 1;
  o.num_keys = 100;
  o.vectors = {"x", "g"};
  ASSERT_OK_AND_ASSIGN(Table t, suite_.client().CreateTable(o));
  EXPECT_THAT(t.WithVector("nope"), StatusIs(absl::StatusCode::kNotFound));
  proto::VectorCommand c;
  c.set_update(proto::VectorCommand::AXPY);
  c.set_dst(1);
  c.set_a(5);  // no vector 5
  absl::Status s = VectorOp(suite_.client(), t, c).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("vector_errors"));
  c.set_a(0);
  c.set_begin(50);
  c.set_end(200);  // beyond the key space
  EXPECT_THAT(VectorOp(suite_.client(), t, c),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Push applies the handler to the parameters only.
  ASSERT_OK_AND_ASSIGN(Table g, t.WithVector("g"));
  std::vector<float> v(10, 1.0f);
  EXPECT_THAT(suite_.client().PushSync(g, Keys::Range(0, 10), v),
              StatusIs(absl::StatusCode::kInvalidArgument));
  Table bad = t;
  bad.vector = 9;
  EXPECT_THAT(suite_.client().PutSync(bad, Keys::Range(0, 10), v),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Named vectors need a dense table.
  TableOptions sparse;
  sparse.name = "sparse_vectors";
  sparse.sparse = true;
  sparse.vectors = {"x", "g"};
  EXPECT_THAT(suite_.client().CreateTable(sparse),
              StatusIs(absl::StatusCode::kInvalidArgument));
  TableOptions twice = o;
  twice.name = "twice";
  twice.vectors = {"x", "x"};
  EXPECT_THAT(suite_.client().CreateTable(twice),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ClusterTest, ClientRejectsBadArgumentsWithClearErrors) {
  TableOptions o;
  o.name = "client_errors";
  o.width = 2;
  o.num_keys = 10;
  auto t = suite_.client().CreateTable(o);
  ASSERT_OK(t);
  std::vector<Key> keys = {1, 2};
  std::vector<float> wrong(3);
  EXPECT_THAT(suite_.client().PutSync(*t, keys, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<Key> outside = {1, 10};
  std::vector<float> four(4);
  absl::Status s = suite_.client().PutSync(*t, outside, four);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("client_errors"));
  EXPECT_THAT(suite_.client().OpenTable("no_such_table"),
              StatusIs(absl::StatusCode::kNotFound));
  // Same name, different spec.
  o.width = 3;
  EXPECT_THAT(suite_.client().CreateTable(o),
              StatusIs(absl::StatusCode::kAlreadyExists));
  o.width = 2;
  EXPECT_OK(suite_.client().CreateTable(o));  // identical: fine
  o.name = "bad_handler";
  o.handler = "no_such_rule";
  EXPECT_THAT(suite_.client().CreateTable(o),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ClusterTest, PluginHandlerRunsOnServers) {
  TableOptions o;
  o.name = "plugin";
  o.width = 2;
  o.num_keys = 30;
  o.handler = "plugin:clipped_sgd";
  o.handler_params = {{"learning_rate", 0.5}, {"clip", 1.0}};
  auto t = suite_.client().CreateTable(o);
  ASSERT_OK(t);
  std::vector<Key> keys = {0, 29};
  std::vector<float> g = {4, -0.5, -3, 0.25};
  ASSERT_OK(suite_.client().PushSync(*t, keys, g));
  std::vector<float> out(4);
  ASSERT_OK(suite_.client().PullSync(*t, keys, absl::MakeSpan(out)));
  // Clipped to [-1, 1], then w -= 0.5 * g.
  EXPECT_EQ(out, (std::vector<float>{-0.5, 0.25, 0.5, -0.125}));
}

// Raw frames to one server: every malformed request gets an error reply and
// the server keeps serving with its data unchanged.
TEST_F(ClusterTest, ServerRejectsBadRequestsOverTheWire) {
  TableOptions o;
  o.name = "wire_errors";
  o.width = 2;
  o.num_keys = 3;  // three servers: one key each
  o.handler = "sum";
  auto t = suite_.client().CreateTable(o);
  ASSERT_OK(t);
  std::vector<Key> k0 = {0};
  std::vector<float> v0 = {5, 6};
  ASSERT_OK(suite_.client().PutSync(*t, k0, v0));

  SchedulerClient sched(suite_.cluster().scheduler_address());
  auto map = sched.GetClusterMap();
  ASSERT_OK(map);
  std::string endpoint;
  NodeId owner = 0;
  for (const auto& tm : map->tables()) {
    if (tm.spec().name() == "wire_errors") owner = tm.ranges(0).primary();
  }
  for (const auto& n : map->nodes()) {
    if (n.id() == owner) endpoint = n.data_endpoint();
  }
  ASSERT_FALSE(endpoint.empty());

  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  int timeout = 5000;
  zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  ASSERT_EQ(zmq_connect(sock, endpoint.c_str()), 0);
  auto request = [&](proto::DataHeader h, const std::string& keys,
                     const std::string& values, int frames = 3) {
    std::string hb = h.SerializeAsString();
    std::vector<std::string> parts = {hb, keys, values};
    parts.resize(frames);
    for (int i = 0; i < frames; ++i) {
      zmq_send(sock, parts[i].data(), parts[i].size(),
               i + 1 < frames ? ZMQ_SNDMORE : 0);
    }
    proto::DataHeader reply;
    zmq_msg_t m;
    zmq_msg_init(&m);
    int more = 1;
    bool first = true;
    while (more) {
      if (zmq_msg_recv(&m, sock, 0) < 0) {
        reply.set_status_message("NO REPLY");
        break;
      }
      if (first) reply.ParseFromArray(zmq_msg_data(&m), zmq_msg_size(&m));
      first = false;
      more = zmq_msg_more(&m);
    }
    zmq_msg_close(&m);
    return reply;
  };
  auto keys_of = [](std::vector<Key> k) {
    return std::string(reinterpret_cast<const char*>(k.data()), k.size() * 8);
  };
  auto floats_of = [](std::vector<float> f) {
    return std::string(reinterpret_cast<const char*>(f.data()), f.size() * 4);
  };
  proto::DataHeader good;
  good.set_op(proto::ADD);
  good.set_table_id(t->id);
  good.set_width(2);
  good.set_num_keys(1);
  good.set_epoch(map->epoch());

  auto code = [](const proto::DataHeader& h) {
    return static_cast<absl::StatusCode>(h.status_code());
  };
  proto::DataHeader h = good;
  h.set_table_id(9999);
  EXPECT_EQ(code(request(h, keys_of({0}), floats_of({1, 1}))),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(code(request(good, keys_of({3}), floats_of({1, 1}))),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code(request(good, keys_of({1}), floats_of({1, 1}))),
            absl::StatusCode::kAborted);
  h = good;
  h.set_width(3);
  EXPECT_EQ(code(request(h, keys_of({0}), floats_of({1, 1, 1}))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(request(good, keys_of({0}), floats_of({1}))),
            absl::StatusCode::kInvalidArgument);
  h = good;
  h.set_num_keys(2);
  EXPECT_EQ(code(request(h, keys_of({0}), floats_of({1, 1}))),
            absl::StatusCode::kInvalidArgument);
  h = good;
  h.set_op(static_cast<proto::Op>(77));
  EXPECT_EQ(code(request(h, keys_of({0}), floats_of({1, 1}))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(request(good, keys_of({0}), "", 2)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(request(good, "abc", floats_of({1, 1}))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(request(good, keys_of({0}), "abcdef")),
            absl::StatusCode::kInvalidArgument);
  // Over the server's 8 MiB limit (--max_message_mb=8).
  EXPECT_EQ(code(request(good, keys_of({0}), std::string(9 << 20, '\0'))),
            absl::StatusCode::kResourceExhausted);
  // Garbage header.
  std::string junk = "\x0a\xff\xff\xff";
  zmq_send(sock, junk.data(), junk.size(), 0);
  zmq_msg_t m;
  zmq_msg_init(&m);
  ASSERT_GE(zmq_msg_recv(&m, sock, 0), 0);
  proto::DataHeader jr;
  jr.ParseFromArray(zmq_msg_data(&m), zmq_msg_size(&m));
  EXPECT_EQ(code(jr), absl::StatusCode::kInvalidArgument);
  while (zmq_msg_more(&m)) zmq_msg_recv(&m, sock, 0);
  zmq_msg_close(&m);
  zmq_close(sock);
  zmq_ctx_term(ctx);

  std::vector<float> out(2);
  ASSERT_OK(suite_.client().GetSync(*t, k0, absl::MakeSpan(out)));
  EXPECT_EQ(out, v0);  // nothing rejected changed the table
}

TEST_F(ClusterTest, AdminStatsAndHealthService) {
  SchedulerClient sched(suite_.cluster().scheduler_address());
  auto map = sched.GetClusterMap();
  ASSERT_OK(map);
  int checked = 0;
  for (const auto& n : map->nodes()) {
    if (n.role() != proto::SERVER) continue;
    auto channel = NewGrpcChannel(n.admin_address(), ClusterAuth());
    grpc::ClientContext hctx;
    hctx.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest hreq;
    grpc::health::v1::HealthCheckResponse hresp;
    ASSERT_TRUE(grpc::health::v1::Health::NewStub(channel)
                    ->Check(&hctx, hreq, &hresp)
                    .ok());
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    grpc::ClientContext sctx;
    sctx.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    proto::ServerStats stats;
    ASSERT_TRUE(proto::ServerAdmin::NewStub(channel)
                    ->GetStats(&sctx, proto::StatsRequest(), &stats)
                    .ok());
    EXPECT_EQ(stats.node_id(), n.id());
    EXPECT_GE(stats.epoch(), 1u);
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

// Threads that each keep many operations in flight and wait for the
// oldest (the waits take the replies themselves, one thread at a time),
// beside a thread whose operations have callbacks: every add lands once.
TEST_F(ClusterTest, PipelinedWaitsBesideCallbacksApplyEveryAdd) {
  constexpr int kPipelined = 3, kAdds = 3000, kDepth = 16;
  constexpr uint64_t kKeysPerThread = 1000;
  TableOptions o;
  o.name = "pipelined";
  o.num_keys = (kPipelined + 1) * kKeysPerThread;
  o.handler = "sum";
  auto t = suite_.client().CreateTable(o);
  ASSERT_OK(t);
  const std::vector<float> one = {1.0f};
  std::atomic<int> failures{0};
  absl::Mutex first_mu;
  std::string first_failure;  // the first failure's status, for the report
  auto fail = [&](const absl::Status& s) {
    if (failures++ == 0) {
      absl::MutexLock lock(&first_mu);
      first_failure = s.ToString();
    }
  };
  std::vector<std::thread> threads;
  for (int th = 0; th < kPipelined; ++th) {
    threads.emplace_back([&, th] {
      std::vector<std::vector<Key>> keys(kDepth, std::vector<Key>(1));
      std::vector<Ticket> inflight(kDepth);
      for (int i = 0; i < kAdds + kDepth; ++i) {
        const int slot = i % kDepth;
        if (i >= kDepth) {
          const absl::Status s = suite_.client().Wait(inflight[slot]);
          if (!s.ok()) fail(s);
        }
        if (i >= kAdds) continue;
        keys[slot][0] = th * kKeysPerThread + i % kKeysPerThread;
        inflight[slot] = suite_.client().Add(*t, keys[slot], one);
      }
    });
  }
  // One callback operation at a time: the pipelined waits pump while none
  // is in flight, and leave the replies to the I/O thread while one is.
  threads.emplace_back([&] {
    for (int i = 0; i < kAdds; ++i) {
      const Key key = kPipelined * kKeysPerThread + i % kKeysPerThread;
      absl::Notification done;
      suite_.client().Add(*t, absl::MakeConstSpan(&key, 1), one,
                          [&](const absl::Status& s) {
                            if (!s.ok()) fail(s);
                            done.Notify();
                          });
      if (!done.WaitForNotificationWithTimeout(absl::Seconds(60))) {
        fail(absl::DeadlineExceededError("a callback not run in 60 s"));
        return;
      }
    }
  });
  for (auto& th : threads) th.join();
  {
    absl::MutexLock lock(&first_mu);
    ASSERT_EQ(failures.load(), 0) << "the first: " << first_failure;
  }
  std::vector<float> got(o.num_keys);
  ASSERT_OK(suite_.client().GetSync(*t, Keys::Range(0, o.num_keys),
                                    absl::MakeSpan(got)));
  const float per_key = static_cast<float>(kAdds / kKeysPerThread);
  EXPECT_EQ(got, std::vector<float>(o.num_keys, per_key));
}

// SpinUntil, which Python's Operation.wait calls before it sleeps, spins as
// a lone Wait does: only with spin_wait set, and after a spin that ran out
// the next lone waits sleep at once (1 after the first, 2 after the
// second, ...), until a spin catches its reply. And a real lone pull
// through it completes with the right values.
TEST_F(ClusterTest, SpinUntilSpinsOnlyWhenAskedAndBacksOff) {
  ClientOptions co;
  co.scheduler_address = suite_.scheduler_address();
  auto spinning = Client::Connect(co);
  ASSERT_OK(spinning);
  co.spin_wait = absl::ZeroDuration();
  auto still = Client::Connect(co);
  ASSERT_OK(still);

  const auto never = [] { return false; };
  EXPECT_FALSE((*still)->SpinUntil(never));
  EXPECT_EQ((*still)->traffic().spins, 0u);

  // Spins at calls 1, 3 and 6; each runs out.
  const std::vector<uint64_t> want = {1, 1, 2, 2, 2, 3, 3, 3, 3, 3};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_FALSE((*spinning)->SpinUntil(never));
    EXPECT_EQ((*spinning)->traffic().spins, want[i]) << "call " << i + 1;
  }
  EXPECT_EQ((*spinning)->traffic().spins_caught, 0u);
  // The 11th spins and is answered on its third look.
  int looks = 0;
  EXPECT_TRUE((*spinning)->SpinUntil([&looks] { return ++looks >= 3; }));
  EXPECT_EQ((*spinning)->traffic().spins, 4u);
  EXPECT_EQ((*spinning)->traffic().spins_caught, 1u);
  // Caught: the next spins again.
  EXPECT_FALSE((*spinning)->SpinUntil(never));
  EXPECT_EQ((*spinning)->traffic().spins, 5u);

  TableOptions o;
  o.name = "spin_until";
  o.num_keys = 4;
  o.width = 1;
  auto t = (*spinning)->CreateTable(o);
  ASSERT_OK(t);
  const std::vector<Key> keys = {0, 1, 2, 3};
  const std::vector<float> ones(4, 1.0f);
  ASSERT_OK((*spinning)->AddSync(*t, keys, ones));
  std::vector<float> got(4);
  absl::Notification done;
  absl::Status status;
  (*spinning)->Pull(*t, keys, absl::MakeSpan(got), [&](const absl::Status& s) {
    status = s;
    done.Notify();
  });
  (*spinning)->SpinUntil([&done] { return done.HasBeenNotified(); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_OK(status);
  EXPECT_EQ(got, ones);
}

// A table handle made by another client works at once, before this
// client's map watch has brought the table (Python's client_test saw
// NOT_FOUND "unknown table" there): routing asks the scheduler once before
// it calls a table unknown. Many tables, since the watch wins most races.
TEST_F(ClusterTest, AHandleFromAnotherClientWorksAtOnce) {
  ClientOptions co;
  co.scheduler_address = suite_.scheduler_address();
  auto maker = Client::Connect(co);
  ASSERT_OK(maker);
  auto user = Client::Connect(co);
  ASSERT_OK(user);
  const std::vector<Key> keys = {0, 1};
  const std::vector<float> ones(2, 1.0f);
  for (int i = 0; i < 30; ++i) {
    TableOptions o;
    o.name = absl::StrCat("handed_over_", i);
    o.num_keys = 2;
    o.width = 1;
    auto t = (*maker)->CreateTable(o);
    ASSERT_OK(t);
    ASSERT_OK((*user)->AddSync(*t, keys, ones)) << o.name;
    std::vector<float> got(2);
    ASSERT_OK((*maker)->GetSync(*t, keys, absl::MakeSpan(got)));
    EXPECT_EQ(got, ones) << o.name;
  }
  // A table that no one made is still unknown (after the one refresh).
  Table ghost = *(*maker)->OpenTable("handed_over_0");
  ghost.id += 1000;
  ghost.name = "ghost";
  const absl::Status s = (*user)->AddSync(ghost, keys, ones);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("unknown table"));
}

// A spin before a wait sleeps is bounded: a negative one or one above
// kMaxSpinWait is refused before anything connects.
TEST(ClientOptionsTest, SpinWaitOutOfRangeIsRefused) {
  for (absl::Duration spin :
       {absl::Microseconds(-1), kMaxSpinWait + absl::Nanoseconds(1),
        absl::InfiniteDuration()}) {
    ClientOptions co;
    co.scheduler_address = "127.0.0.1:1";
    co.spin_wait = spin;
    auto client = Client::Connect(co);
    EXPECT_THAT(client.status(), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(client.status().message()),
                ::testing::HasSubstr("spin_wait"));
  }
}

// A server killed with SIGKILL is declared dead; its keys become unavailable
// with a clear error, the others keep working.
TEST(ClusterFailureTest, KilledServerIsDeclaredDead) {
  const std::string dir = TestTmpDir() + "/failure";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  auto cluster = LocalCluster::Start(ClusterOptions(2, dir, 1000));
  ASSERT_OK(cluster);
  ClientOptions co;
  co.scheduler_address = (*cluster)->scheduler_address();
  co.op_timeout = absl::Seconds(5);
  auto client = Client::Connect(co);
  ASSERT_OK(client);
  TableOptions o;
  o.name = "t";
  o.num_keys = 100;
  auto t = (*client)->CreateTable(o);
  ASSERT_OK(t);
  const Epoch before = (*client)->map_epoch();

  (*cluster)->server(1).Signal(SIGKILL);
  ASSERT_OK((*cluster)->server(1).Wait(absl::Seconds(5)));
  SchedulerClient sched((*cluster)->scheduler_address());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool dead = false;
  Key live_begin = 0, live_end = 0;
  while (!dead && absl::Now() < deadline) {
    auto map = sched.GetClusterMap();
    ASSERT_OK(map);
    for (const auto& n : map->nodes()) {
      if (n.name() == "server-1" && n.state() == proto::DEAD) {
        dead = true;
        EXPECT_GT(map->epoch(), before);
        for (const auto& r : map->tables(0).ranges()) {
          if (r.primary() != n.id()) {
            live_begin = r.begin();
            live_end = r.end();
          }
        }
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(dead) << "server-1 not declared dead in time";
  // Wait for the client's watch to see it, then: the dead server's half is
  // unavailable, the live half works.
  const absl::Time seen = absl::Now() + absl::Seconds(5);
  while ((*client)->map_epoch() == before && absl::Now() < seen) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::vector<float> out(100);
  absl::Status s =
      (*client)->GetSync(*t, Keys::Range(0, 100), absl::MakeSpan(out));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("dead"));
  ASSERT_EQ(live_end - live_begin, 50u);
  std::vector<float> half(50);
  EXPECT_OK((*client)->GetSync(*t, Keys::Range(live_begin, live_end),
                               absl::MakeSpan(half)));
  client->reset();
  EXPECT_OK((*cluster)->Stop());
}

}  // namespace
}  // namespace downpour
