// A randomized model test in LevelDB's manner: several clients send random
// sequences of put, get, add, push, pull, push-pull and vector commands to
// the real daemons (a scheduler and three servers on 127.0.0.1), and every
// answer is compared, exactly, with a trivial in-memory model of the tables.
//
// Keeping the model exact with concurrent clients:
//  - each client owns a slice of every table's keys: only it writes them,
//    one operation at a time, so every read of its slice is checked at once;
//  - all clients also add and push (with linear handlers: "sum", "sgd") into
//    a shared slice, several operations in flight, whose order does not
//    matter; the shared slice is checked at the end;
//  - one client alone runs vector commands on the vectors table;
//  - values are small integers and halves, so float sums are exact in any
//    order and the model's double arithmetic rounds like the servers'.
//
// The seed is printed and fixed by default, so a failure reproduces (the
// sequences, not the interleaving of the clients): DOWNPOUR_TEST_SEED=<n>
// runs seed n, DOWNPOUR_TEST_SEED=random a fresh one.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/vector_op.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace {

constexpr uint32_t kDefaultSeed = 20240611;
constexpr int kClients = 3;
constexpr int kSteps = 250;  // per client

uint32_t TestSeed() {
  const char* env = std::getenv("DOWNPOUR_TEST_SEED");
  uint32_t seed = kDefaultSeed;
  if (env != nullptr && std::string(env) == "random") {
    seed = std::random_device()();
  } else if (env != nullptr && !absl::SimpleAtoi(env, &seed)) {
    ADD_FAILURE() << "DOWNPOUR_TEST_SEED=" << env
                  << " is neither a number nor 'random'";
  }
  std::cerr << "model_test seed " << seed << " (DOWNPOUR_TEST_SEED=" << seed
            << " runs it again)\n";
  return seed;
}

// One table's model: rows by key (absent rows read as `init`), and how the
// table's handler applies a pushed gradient.
struct TableModel {
  uint32_t width = 0;
  float init = 0;
  double push_scale = 1;  // "sum": v += g; "sgd" lr 0.5: v += -0.5 g
  std::map<Key, std::vector<float>> rows;

  std::vector<float>& Row(Key k) {
    auto it = rows.find(k);
    if (it == rows.end())
      it = rows.emplace(k, std::vector<float>(width, init)).first;
    return it->second;
  }
  std::vector<float> Read(const std::vector<Key>& keys) const {
    std::vector<float> out;
    for (Key k : keys) {
      auto it = rows.find(k);
      if (it == rows.end()) {
        out.insert(out.end(), width, init);
      } else {
        out.insert(out.end(), it->second.begin(), it->second.end());
      }
    }
    return out;
  }
  void Put(const std::vector<Key>& keys, const std::vector<float>& v) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::copy(v.begin() + i * width, v.begin() + (i + 1) * width,
                Row(keys[i]).begin());
    }
  }
  // Repeated keys in one batch apply once per occurrence.
  void Add(const std::vector<Key>& keys, const std::vector<float>& v,
           double scale) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<float>& row = Row(keys[i]);
      for (uint32_t j = 0; j < width; ++j) {
        row[j] = static_cast<float>(row[j] + scale * v[i * width + j]);
      }
    }
  }
};

// A key space split into per-client slices and a shared one.
struct KeySpace {
  bool sparse;
  uint64_t num_keys;  // dense
  // Dense: key k belongs to client k % (kClients + 1); the last slot is
  // shared. Sparse: client c's keys have c + 1 in their top 8 bits, shared
  // ones 0xfe.
  Key Pick(std::mt19937_64& rng, int owner) const {
    if (!sparse) {
      const uint64_t per_slot = num_keys / (kClients + 1);
      return (rng() % per_slot) * (kClients + 1) + owner;
    }
    const uint64_t top = owner == kClients ? 0xfe : owner + 1;
    return (top << 56) | (rng() % 200);  // below kKeySpaceEnd
  }
};

struct Shared {
  TableModel model;  // of the shared slice: built from every client's log
  std::mutex mu;
};

std::string Describe(const char* op, const Table& t,
                     const std::vector<Key>& keys, bool range) {
  if (range) {
    return absl::StrCat(op, " '", t.name, "' [", keys.front(), ", ",
                        keys.back() + 1, ")");
  }
  return absl::StrCat(op, " '", t.name, "' keys {", absl::StrJoin(keys, ","),
                      "}");
}

class ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LocalClusterOptions o;
    o.bin_dir = RunfilePath("");
    o.work_dir = TestTmpDir();
    o.num_servers = 3;
    o.server_flags = {"--max_message_mb=8"};
    ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));
    cluster_ = cluster.release();
  }
  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      EXPECT_OK(cluster_->Stop());
    }
    delete cluster_;
    cluster_ = nullptr;
  }
  static std::unique_ptr<Client> NewClient() {
    ClientOptions co;
    co.scheduler_address = cluster_->scheduler_address();
    co.op_timeout = absl::Seconds(60);
    auto c = Client::Connect(co);
    EXPECT_OK(c);
    return c.ok() ? std::move(*c) : nullptr;
  }
  static LocalCluster* cluster_;
};
LocalCluster* ModelTest::cluster_ = nullptr;

// One client's random walk over the dense and sparse tables.
class Walker {
 public:
  Walker(int id, uint32_t seed, Client* client, std::vector<Table> tables,
         std::vector<KeySpace> spaces, std::vector<TableModel> models,
         std::vector<Shared*> shared)
      : id_(id),
        rng_(seed * 7919ull + id),
        client_(client),
        tables_(std::move(tables)),
        spaces_(std::move(spaces)),
        own_(std::move(models)),
        shared_(std::move(shared)) {}

  // Runs `steps` operations; stops at the first mismatch or error, which it
  // returns with the step and the operation.
  absl::Status Run(int steps) {
    std::vector<Ticket> in_flight;
    // Buffers of shared-slice operations in flight (the SDK borrows them
    // until they complete; a deque never moves its elements).
    std::deque<std::pair<std::vector<Key>, std::vector<float>>> held;
    for (int step = 0; step < steps; ++step) {
      const size_t ti = rng_() % tables_.size();
      const Table& t = tables_[ti];
      TableModel& m = own_[ti];
      const KeySpace& space = spaces_[ti];
      const bool shared = rng_() % 4 == 0;
      // A batch of keys, repeats allowed (applied once per occurrence).
      const int n = 1 + static_cast<int>(rng_() % 12);
      std::vector<Key> keys(n);
      for (Key& k : keys) k = space.Pick(rng_, shared ? kClients : id_);
      std::vector<float> values(keys.size() * t.width);
      for (float& v : values)
        v = static_cast<float>(static_cast<int>(rng_() % 9) - 4);

      if (shared) {
        // Commutative only, several in flight; folded into the shared model.
        const bool push = rng_() % 2 == 0;
        held.emplace_back(keys, values);
        const auto& [k, v] = held.back();
        in_flight.push_back(push ? client_->Push(t, k, v)
                                 : client_->Add(t, k, v));
        {
          std::lock_guard<std::mutex> lock(shared_[ti]->mu);
          shared_[ti]->model.Add(keys, values, push ? m.push_scale : 1.0);
        }
        if (in_flight.size() >= 8 || step + 1 == steps) {
          for (Ticket tk : in_flight) {
            if (absl::Status s = client_->Wait(tk); !s.ok()) {
              return Annotate(s, absl::StrCat("step ", step, ": shared ",
                                              push ? "push" : "add"));
            }
          }
          in_flight.clear();
          held.clear();
        }
        continue;
      }

      // This client's slice: one operation at a time, every read checked.
      std::vector<float> out(keys.size() * t.width);
      std::vector<float> expected;
      const char* op;
      absl::Status s;
      switch (rng_() % 6) {
        case 0:
          op = "put";
          // A put with repeated keys leaves one of the rows: keep them
          // distinct so that the model knows which.
          std::sort(keys.begin(), keys.end());
          keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
          values.resize(keys.size() * t.width);
          s = client_->PutSync(t, keys, values);
          m.Put(keys, values);
          break;
        case 1:
          op = "add";
          s = client_->AddSync(t, keys, values);
          m.Add(keys, values, 1.0);
          break;
        case 2:
          op = "push";
          s = client_->PushSync(t, keys, values);
          m.Add(keys, values, m.push_scale);
          break;
        case 3:
          op = "push_pull";
          s = client_->PushPullSync(t, keys, values, absl::MakeSpan(out));
          m.Add(keys, values, m.push_scale);
          expected = m.Read(keys);
          break;
        case 4:
          op = "get";
          s = client_->GetSync(t, keys, absl::MakeSpan(out));
          expected = m.Read(keys);
          break;
        default:
          op = "pull";
          s = client_->PullSync(t, keys, absl::MakeSpan(out));
          expected = m.Read(keys);
          break;
      }
      if (!s.ok()) {
        return Annotate(
            s, absl::StrCat("step ", step, ": ", Describe(op, t, keys, false)));
      }
      if (!expected.empty() && out != expected) {
        return absl::InternalError(absl::StrCat(
            "step ", step, ": ", Describe(op, t, keys, false), " read {",
            absl::StrJoin(out, ","), "}, the model says {",
            absl::StrJoin(expected, ","), "}"));
      }
    }
    return absl::OkStatus();
  }

  const std::vector<TableModel>& own() const { return own_; }

 private:
  const int id_;
  std::mt19937_64 rng_;
  Client* const client_;
  const std::vector<Table> tables_;
  const std::vector<KeySpace> spaces_;
  std::vector<TableModel> own_;
  std::vector<Shared*> shared_;
};

// Vector commands and reads of named vectors against the model, from one
// client (commands act on every row, so nobody else writes this table).
absl::Status VectorWalk(Client* client, const Table& table, uint64_t num_keys,
                        uint32_t seed, int steps) {
  std::mt19937_64 rng(seed * 104729ull + 99);
  const uint32_t w = table.width;
  const size_t nv = table.vectors.size();
  std::vector<std::vector<float>> ref(nv, std::vector<float>(num_keys * w, 0));
  auto view = [&](uint32_t v) {
    Table t = table;
    t.vector = v;
    return t;
  };
  // |scalar| <= 1: at most doubling per command (AXPY, LINCOMB), far from
  // overflow in a few hundred steps.
  const double kScalars[] = {0.5, -0.5, -1.0, 0.25, 1.0};
  for (int step = 0; step < steps; ++step) {
    const uint32_t v = static_cast<uint32_t>(rng() % nv);
    Key begin = rng() % num_keys;
    Key end = begin + 1 + rng() % (num_keys - begin);
    const std::vector<Key> bounds = {begin, end - 1};
    const size_t n = (end - begin) * w;
    absl::Status s;
    std::string what;
    switch (rng() % 4) {
      case 0: {  // put a range of one vector
        std::vector<float> vals(n);
        for (float& x : vals)
          x = static_cast<float>(static_cast<int>(rng() % 9) - 4);
        what = Describe("put", view(v), bounds, true);
        s = client->PutSync(view(v), Keys::Range(begin, end), vals);
        std::copy(vals.begin(), vals.end(), ref[v].begin() + begin * w);
        break;
      }
      case 1: {  // read it back
        std::vector<float> got(n);
        what = Describe("get", view(v), bounds, true);
        s = client->GetSync(view(v), Keys::Range(begin, end),
                            absl::MakeSpan(got));
        const std::vector<float> want(ref[v].begin() + begin * w,
                                      ref[v].begin() + end * w);
        if (s.ok() && got != want) {
          return absl::InternalError(absl::StrCat(
              "vector step ", step, ": ", what, " differs from the model"));
        }
        break;
      }
      default: {  // a command on [begin, end) with a dot product
        using proto::VectorCommand;
        VectorCommand c;
        const auto update = static_cast<VectorCommand::Update>(1 + rng() % 5);
        c.set_update(update);
        c.set_dst(v);
        c.set_a(static_cast<uint32_t>(rng() % nv));
        c.set_b(static_cast<uint32_t>(rng() % nv));
        c.set_alpha(kScalars[rng() % 5]);
        c.set_beta(kScalars[rng() % 5]);
        c.set_begin(begin);
        c.set_end(end);
        const uint32_t dx = static_cast<uint32_t>(rng() % nv);
        const uint32_t dy = static_cast<uint32_t>(rng() % nv);
        c.add_dot_x(dx);
        c.add_dot_y(dy);
        what = absl::StrCat("vector command ", c.ShortDebugString());
        auto dots = VectorOp(*client, table, c);
        s = dots.status();
        if (!s.ok()) break;
        float* dst = ref[v].data();
        const float* a = ref[c.a()].data();
        const float* b = ref[c.b()].data();
        // In the servers' arithmetic (handlers/vector_kernel.h): double,
        // rounded to float once, so the vectors match bit for bit.
        for (size_t i = begin * w; i < end * w; ++i) {
          switch (update) {
            case VectorCommand::ZERO:
              dst[i] = 0;
              break;
            case VectorCommand::COPY:
              dst[i] = a[i];
              break;
            case VectorCommand::SCALE:
              dst[i] = static_cast<float>(c.alpha() * dst[i]);
              break;
            case VectorCommand::AXPY:
              dst[i] = static_cast<float>(dst[i] + c.alpha() * a[i]);
              break;
            default:
              dst[i] = static_cast<float>(c.alpha() * a[i] + c.beta() * b[i]);
          }
        }
        double dot = 0;
        for (size_t i = begin * w; i < end * w; ++i) {
          dot += static_cast<double>(ref[dx][i]) * ref[dy][i];
        }
        // The servers add partial sums per server: equal up to the rounding
        // of a different grouping.
        if (dots->size() != 1 ||
            std::abs((*dots)[0] - dot) > 1e-12 * std::max(1.0, std::abs(dot))) {
          return absl::InternalError(absl::StrCat(
              "vector step ", step, ": ", what, " gave dot ",
              dots->empty() ? -1.0 : (*dots)[0], ", the model says ", dot));
        }
        break;
      }
    }
    if (!s.ok())
      return Annotate(s, absl::StrCat("vector step ", step, ": ", what));
  }
  // Every vector, whole.
  for (uint32_t v = 0; v < nv; ++v) {
    std::vector<float> got(num_keys * w);
    DP_RETURN_IF_ERROR(client->GetSync(view(v), Keys::Range(0, num_keys),
                                       absl::MakeSpan(got)));
    if (got != ref[v]) {
      return absl::InternalError(
          absl::StrCat("vector ", v, " differs at the end"));
    }
  }
  return absl::OkStatus();
}

TEST_F(ModelTest, RandomOperationsFromSeveralClientsMatchTheModel) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::unique_ptr<Client> admin = NewClient();
  ASSERT_NE(admin, nullptr);

  // Dense "sum" over three servers, sparse "sgd" (lr 0.5, constant init:
  // absent rows read as 0.5), and a vectors table.
  TableOptions dense;
  dense.name = "model_dense";
  dense.width = 3;
  dense.num_keys = 4 * 150;
  dense.handler = "sum";
  TableOptions sparse;
  sparse.name = "model_sparse";
  sparse.sparse = true;
  sparse.width = 2;
  sparse.init = "constant";
  sparse.init_a = 0.5f;
  sparse.handler = "sgd";
  sparse.handler_params = {{"learning_rate", 0.5}};
  TableOptions vectors;
  vectors.name = "model_vectors";
  vectors.width = 2;
  vectors.num_keys = 90;
  vectors.handler = "assign";
  vectors.vectors = {"x", "g", "d"};
  ASSERT_OK_AND_ASSIGN(Table d, admin->CreateTable(dense));
  ASSERT_OK_AND_ASSIGN(Table s, admin->CreateTable(sparse));
  ASSERT_OK_AND_ASSIGN(Table v, admin->CreateTable(vectors));

  TableModel dense_model, sparse_model;
  dense_model.width = 3;
  dense_model.push_scale = 1.0;
  sparse_model.width = 2;
  sparse_model.init = 0.5f;
  sparse_model.push_scale = -0.5;
  const std::vector<KeySpace> spaces = {{false, dense.num_keys}, {true, 0}};
  Shared shared_dense, shared_sparse;
  shared_dense.model = dense_model;
  shared_sparse.model = sparse_model;

  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Walker>> walkers;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(NewClient());
    ASSERT_NE(clients.back(), nullptr);
    walkers.push_back(std::make_unique<Walker>(
        c, seed, clients.back().get(), std::vector<Table>{d, s}, spaces,
        std::vector<TableModel>{dense_model, sparse_model},
        std::vector<Shared*>{&shared_dense, &shared_sparse}));
  }
  std::vector<absl::Status> results(kClients + 1);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] { results[c] = walkers[c]->Run(kSteps); });
  }
  threads.emplace_back([&] {
    results[kClients] =
        VectorWalk(admin.get(), v, vectors.num_keys, seed, kSteps);
  });
  for (auto& t : threads) t.join();
  for (int c = 0; c <= kClients; ++c) {
    EXPECT_OK(results[c]) << (c < kClients ? absl::StrCat("client ", c)
                                           : std::string("vector client"));
  }

  // Whole tables against the models: every client's slice, and the shared
  // slice that all of them added into.
  TableModel all_dense = shared_dense.model, all_sparse = shared_sparse.model;
  for (const auto& w : walkers) {
    for (const auto& [k, row] : w->own()[0].rows) all_dense.rows[k] = row;
    for (const auto& [k, row] : w->own()[1].rows) all_sparse.rows[k] = row;
  }
  std::vector<Key> all_keys(dense.num_keys);
  for (Key k = 0; k < dense.num_keys; ++k) all_keys[k] = k;
  std::vector<float> got(dense.num_keys * 3);
  ASSERT_OK(
      admin->GetSync(d, Keys::Range(0, dense.num_keys), absl::MakeSpan(got)));
  EXPECT_EQ(got, all_dense.Read(all_keys)) << "dense table at the end";
  std::vector<Key> sparse_keys;
  for (const auto& [k, row] : all_sparse.rows) sparse_keys.push_back(k);
  sparse_keys.push_back((Key{0xfd} << 56) | 7);  // never touched
  std::vector<float> sgot(sparse_keys.size() * 2);
  ASSERT_OK(admin->PullSync(s, sparse_keys, absl::MakeSpan(sgot)));
  EXPECT_EQ(sgot, all_sparse.Read(sparse_keys)) << "sparse table at the end";
  std::cerr << "model_test: " << kClients << " clients x " << kSteps
            << " steps and " << kSteps << " vector steps; "
            << all_dense.rows.size() << " dense and " << all_sparse.rows.size()
            << " sparse rows touched\n";
}

}  // namespace
}  // namespace downpour
