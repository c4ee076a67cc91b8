// embedding_bench: bounded sparse tables (TableSpec.bounds) on real
// daemons.
//
//   bazel build -c opt //bench:embedding_bench //server:ps_server
//       //scheduler:ps_scheduler  (one command line)
//   bazel-bin/bench/embedding_bench                  # both sections
//   bazel-bin/bench/embedding_bench --sections=cold --ids=4000000
//
// Sections:
//  - memory: bytes a row costs a server (its storage's own count, and the
//    server's RSS growth) at width 16, for sgd (no state), row-wise Adagrad
//    (one float) and Adagrad (a float per element), against the row's
//    floats plus its handler state.
//  - cold: a table ten times larger than its memory budget (a row cap of
//    ids / 10 with LRU eviction to the cold tier) against the same table
//    held wholly in memory, trained on the same Zipf(s) stream of ids
//    (batches of draws; each distinct id pulled then pushed once, Adagrad);
//    every id is written once first, so the capped table holds 90% of
//    its rows in the cold tier. The goal: the capped table at half the
//    speed or better.
//  - store: the cold section's stream on one range's row store
//    (server_internal::SparseRows) in this process, no network: the
//    store's own cost per key, in memory and capped (the capped read's
//    preparation, which evicts and brings rows back, apart), steadier than
//    the cold section on a shared machine.
//  - lookups: ps_bench's sparse batches (bench/sparse_draws.h: 1M hashed
//    ids, 100k draws a batch, uniform, Zipf(1.1), and uniform over the
//    1000 most frequent ids) on the row store of the first of two servers'
//    ranges, in this process: nanoseconds a key for a push (the batch's
//    lookups and Adagrad) and a read, widths 8 and 64, the best of
//    --lookup_passes passes; the server's share of a sparse batch, without
//    the network and the other processes that share the cores; and the
//    same updates and copies through rows found beforehand (no index),
//    the floor that a faster index could approach.
//  - sums: the SDK's summing of a batch's repeats (SumRepeats, for tables
//    with sum_repeats) on the same batches, nanoseconds a key against
//    memcpy of the batch's rows.
// Every loop is bounded; progress lines go to stderr.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/sparse_draws.h"
#include "clicklog/zipf.h"
#include "client/client.h"
#include "client/internal/sum_repeats.h"
#include "cluster/scheduler_client.h"
#include "cluster/server_admin_client.h"
#include "common/malloc_tuning.h"
#include "common/random.h"
#include "handlers/handler.h"
#include "handlers/initializer.h"
#include "launch/local_cluster.h"
#include "server/internal/sparse_rows.h"
#include "storage/cold_store.h"

ABSL_FLAG(std::string, bin_dir, "", "folder with scheduler/ and server/");
ABSL_FLAG(std::string, work_dir, "/tmp/embedding_bench", "daemons' files");
ABSL_FLAG(std::string, sections, "memory,cold", "what to run");
ABSL_FLAG(int64_t, rows, 1000000, "memory: rows written");
ABSL_FLAG(int64_t, ids, 2000000, "cold: distinct ids of the table");
ABSL_FLAG(int, batch, 10000,
          "cold: ids drawn a batch (each distinct one pulled and pushed once)");
ABSL_FLAG(double, zipf, 1.1, "cold: the ids' power law");
ABSL_FLAG(double, seconds, 10,
          "cold, store: training time per table and round");
ABSL_FLAG(int, rounds, 2, "cold, store: in-memory and capped, alternated");
ABSL_FLAG(int, servers, 2, "servers");
ABSL_FLAG(int, lookup_passes, 5, "lookups, sums: passes over the batches");

namespace downpour {
namespace {

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

Key IdKey(uint64_t id) { return SplitMix64(id) % (kKeySpaceEnd - 1); }

std::unique_ptr<LocalCluster> StartCluster(const std::string& name,
                                           bool durable) {
  LocalClusterOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                  ? BinDirOfThisProgram()
                  : absl::GetFlag(FLAGS_bin_dir);
  o.work_dir = absl::GetFlag(FLAGS_work_dir) + "/" + name;
  std::system(("rm -rf " + o.work_dir + " && mkdir -p " + o.work_dir).c_str());
  o.num_servers = absl::GetFlag(FLAGS_servers);
  o.durable = durable;
  o.server_flags = {"--max_table_bytes=0", "--minloglevel=1"};
  o.scheduler_flags = {"--minloglevel=1"};
  auto c = LocalCluster::Start(o);
  Check(c.status(), "start cluster");
  return std::move(*c);
}

uint64_t Rss(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/statm"));
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

proto::TableStats Stats(LocalCluster& c, const std::string& table) {
  SchedulerClient sched(c.scheduler_address());
  auto map = sched.GetClusterMap();
  Check(map.status(), "map");
  proto::TableStats sum;
  for (const auto& n : map->nodes()) {
    if (n.role() != proto::SERVER) continue;
    ServerAdminClient admin(n.admin_address());
    auto stats = admin.GetStats(absl::Seconds(10));
    Check(stats.status(), "stats");
    for (const auto& t : stats->tables()) {
      if (t.name() != table) continue;
      sum.set_rows(sum.rows() + t.rows());
      sum.set_allocated_bytes(sum.allocated_bytes() + t.allocated_bytes());
      sum.set_cold_rows(sum.cold_rows() + t.cold_rows());
      sum.set_evicted_rows(sum.evicted_rows() + t.evicted_rows());
    }
  }
  return sum;
}

void MemorySection() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  std::printf(
      "\n## Memory per row (width 16, %lld rows over %d servers, a bounded "
      "table with LRU, every row written)\n\n",
      static_cast<long long>(rows), absl::GetFlag(FLAGS_servers));
  std::printf(
      "| handler | floats + state (bytes) | storage bytes/row | RSS "
      "bytes/row | storage / (floats + state) |\n|---|---|---|---|---|\n");
  for (const auto& [handler, state] : std::vector<std::pair<std::string, int>>{
           {"sgd", 0}, {"rowwise_adagrad", 1}, {"adagrad", 16}}) {
    auto cluster = StartCluster("memory-" + handler, false);
    std::vector<uint64_t> before;
    for (int i = 0; i < cluster->num_servers(); ++i) {
      before.push_back(Rss(cluster->server(i).pid()));
    }
    ClientOptions co;
    co.scheduler_address = cluster->scheduler_address();
    auto client = Client::Connect(co);
    Check(client.status(), "connect");
    TableOptions o;
    o.name = "emb";
    o.sparse = true;
    o.width = 16;
    o.handler = handler;
    TableOptions::Bounds b;
    b.max_rows = rows * 2;
    b.eviction = "lru";
    o.bounds = b;
    auto t = (*client)->CreateTable(o);
    Check(t.status(), "create");
    std::vector<Key> keys(10000);
    std::vector<float> g(keys.size() * 16, 0.01f);
    for (int64_t r = 0; r < rows; r += keys.size()) {
      for (size_t i = 0; i < keys.size(); ++i) keys[i] = IdKey(r + i);
      Check((*client)->PushSync(*t, keys, g), "push");
    }
    const proto::TableStats s = Stats(*cluster, "emb");
    uint64_t rss = 0;
    for (int i = 0; i < cluster->num_servers(); ++i) {
      rss += Rss(cluster->server(i).pid()) - before[i];
    }
    const double floats = (16 + state) * 4.0;
    const double per_row = static_cast<double>(s.allocated_bytes()) / s.rows();
    std::printf("| %s | %.0f | %.1f | %.1f | %.2f |\n", handler.c_str(), floats,
                per_row, static_cast<double>(rss) / s.rows(), per_row / floats);
    std::fflush(stdout);
    client->reset();
    Check(cluster->Stop(), "stop");
  }
}

// Pull-then-push training of `batches` batches (or until the time is up)
// on `t`; keys/s over both.
double Train(Client& client, const Table& t, std::mt19937_64& rng,
             const clicklog::ZipfSampler& zipf, absl::Duration budget) {
  const int batch = absl::GetFlag(FLAGS_batch);
  std::vector<Key> keys;
  std::vector<float> values, grads;
  absl::flat_hash_set<uint64_t> seen;
  uint64_t done = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < budget) {
    // `batch` draws of the stream; each distinct id once (as the embedding
    // layers pull and push).
    keys.clear();
    seen.clear();
    for (int i = 0; i < batch; ++i) {
      const uint64_t id = zipf.Sample(rng(), [&] { return rng(); });
      if (seen.insert(id).second) keys.push_back(IdKey(id));
    }
    values.resize(keys.size() * 16);
    grads.assign(keys.size() * 16, 0.01f);
    Check(client.PullSync(t, keys, absl::MakeSpan(values)), "pull");
    Check(client.PushSync(t, keys, grads), "push");
    done += 2 * keys.size();
  }
  return done / absl::ToDoubleSeconds(absl::Now() - start);
}

void ColdSection() {
  const int64_t ids = absl::GetFlag(FLAGS_ids);
  const double s = absl::GetFlag(FLAGS_zipf);
  std::printf(
      "\n## The cold tier (%lld ids, width 16, Adagrad, Zipf(%.2f) batches "
      "of %d draws, each distinct id pulled then pushed; capped: a cap of "
      "ids/10 rows, LRU, the rest in the cold tier)\n\n",
      static_cast<long long>(ids), s, absl::GetFlag(FLAGS_batch));
  std::printf(
      "| round | in memory (keys/s) | capped + cold tier (keys/s) | capped / "
      "in memory | rows in memory | cold rows |\n|---|---|---|---|---|---|\n");
  clicklog::ZipfSampler zipf(ids, s);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    double rate[2] = {0, 0};
    proto::TableStats capped_stats;
    for (int capped = 0; capped < 2; ++capped) {
      auto cluster = StartCluster(capped ? "capped" : "memory", capped);
      ClientOptions co;
      co.scheduler_address = cluster->scheduler_address();
      auto client = Client::Connect(co);
      Check(client.status(), "connect");
      TableOptions o;
      o.name = "emb";
      o.sparse = true;
      o.width = 16;
      o.handler = "adagrad";
      if (capped) {
        TableOptions::Bounds b;
        b.max_rows = ids / 10;
        b.eviction = "lru";
        b.cold_tier = true;
        o.bounds = b;
      }
      auto t = (*client)->CreateTable(o);
      Check(t.status(), "create");
      // Every id once (in batches smaller than a range's cap).
      std::vector<Key> keys(std::min<int64_t>(10000, ids / 40));
      std::vector<float> g(keys.size() * 16, 0.01f);
      for (int64_t r = 0; r < ids; r += keys.size()) {
        const size_t n = std::min<int64_t>(keys.size(), ids - r);
        keys.resize(n);
        for (size_t i = 0; i < n; ++i) keys[i] = IdKey(r + i);
        g.resize(n * 16);
        Check((*client)->PushSync(*t, keys, g), "fill");
        if (r % 500000 == 0) {
          std::fprintf(stderr, "  cold: %s, filled %lld of %lld ids\n",
                       capped ? "capped" : "in memory",
                       static_cast<long long>(r), static_cast<long long>(ids));
        }
      }
      std::mt19937_64 rng(round * 7 + 1);
      rate[capped] = Train(**client, *t, rng, zipf,
                           absl::Seconds(absl::GetFlag(FLAGS_seconds)));
      if (capped) capped_stats = Stats(*cluster, "emb");
      std::fprintf(stderr, "  cold: round %d, %s: %.2fM keys/s\n", round,
                   capped ? "capped" : "in memory", rate[capped] / 1e6);
      client->reset();
      Check(cluster->Stop(), "stop");
    }
    std::printf("| %d | %.2fM | %.2fM | %.2f | %llu | %llu |\n", round,
                rate[0] / 1e6, rate[1] / 1e6, rate[1] / rate[0],
                static_cast<unsigned long long>(capped_stats.rows()),
                static_cast<unsigned long long>(capped_stats.cold_rows()));
    std::fflush(stdout);
  }
}

// An initializer of `kind` and Adagrad: the rows of the store sections.
struct RowParts {
  Initializer init;
  std::unique_ptr<UpdateHandler> handler;
};
RowParts AdagradRows(proto::InitializerSpec::Kind kind) {
  proto::InitializerSpec init_spec;
  init_spec.set_kind(kind);
  absl::StatusOr<Initializer> init = Initializer::Create(init_spec);
  Check(init.status(), "initializer");
  proto::HandlerSpec h;
  h.set_name("adagrad");
  absl::StatusOr<std::unique_ptr<UpdateHandler>> handler =
      CreateHandler(h, nullptr);
  Check(handler.status(), "handler");
  return {*std::move(init), *std::move(handler)};
}

// The cold section's stream against one range's rows, in this process.
void StoreSection() {
  using server_internal::RangeBounds;
  using server_internal::SparseRows;
  const int64_t ids = absl::GetFlag(FLAGS_ids);
  const int batch = absl::GetFlag(FLAGS_batch);
  constexpr size_t kWidth = 16;
  std::printf(
      "\n## The row store alone (one range, %lld ids, width 16, Adagrad, "
      "Zipf(%.2f) batches of %d draws; capped: ids/10 rows, LRU, cold "
      "tier; the store's time only)\n\n",
      static_cast<long long>(ids), absl::GetFlag(FLAGS_zipf), batch);
  std::printf(
      "| round | in memory (keys/s) | capped (keys/s) | capped / in memory | "
      "capped ns/key: read's preparation | the rest | in memory ns/key "
      "|\n|---|---|---|---|---|---|---|\n");
  const RowParts parts = AdagradRows(proto::InitializerSpec::UNIFORM);
  const clicklog::ZipfSampler zipf(ids, absl::GetFlag(FLAGS_zipf));
  const std::string dir = absl::GetFlag(FLAGS_work_dir) + "/store";
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    double rate[2] = {0, 0}, prepare_ns = 0, rest_ns[2] = {0, 0};
    for (int capped = 0; capped < 2; ++capped) {
      RangeBounds b;
      std::unique_ptr<storage::ColdStore> store;
      std::unique_ptr<storage::ColdRange> cold;
      if (capped) {
        b.max_rows = ids / 10;
        b.eviction = proto::SparseBounds::LRU;
        b.cold = true;
        auto s = storage::ColdStore::Open(dir);
        Check(s.status(), "cold store");
        store = std::move(*s);
        cold = std::make_unique<storage::ColdRange>(
            store.get(), 1, 0, kWidth + parts.handler->StateWidth(kWidth));
      }
      SparseRows rows(&parts.init, parts.handler.get(), kWidth, 0, kKeySpaceEnd,
                      b, std::move(cold));
      std::vector<Key> keys;
      std::vector<float> values, grads;
      SparseRows::Room room;
      // One write as the dispatcher makes it: room first, then the rows.
      auto push = [&] {
        room.clear();
        Check(rows.Prepare(keys, SparseRows::Write::kPush, nullptr, &room),
              "prepare");
        grads.assign(keys.size() * kWidth, 0.01f);
        rows.TouchBatch(
            keys, SparseRows::Write::kPush, [&](size_t i, SparseRows::Row r) {
              parts.handler->Apply(r.values, r.state, grads.data() + i * kWidth,
                                   1, kWidth);
            });
      };
      for (int64_t r = 0; r < ids; r += 10000) {  // every id once
        keys.clear();
        for (int64_t i = r; i < std::min<int64_t>(ids, r + 10000); ++i) {
          keys.push_back(IdKey(i));
        }
        push();
      }
      std::mt19937_64 rng(round * 7 + 1);
      absl::flat_hash_set<uint64_t> seen;
      absl::Duration prepare, rest;
      uint64_t done = 0;
      const absl::Time stop =
          absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
      while (absl::Now() < stop) {
        keys.clear();
        seen.clear();
        for (int i = 0; i < batch; ++i) {
          const uint64_t id = zipf.Sample(rng(), [&] { return rng(); });
          if (seen.insert(id).second) keys.push_back(IdKey(id));
        }
        values.resize(keys.size() * kWidth);
        const absl::Time t0 = absl::Now();
        room.clear();
        Check(rows.Prepare(keys, SparseRows::Write::kRead, nullptr, &room),
              "prepare read");
        const absl::Time t1 = absl::Now();
        Check(rows.ReadBatch(keys, values.data()), "read");
        push();
        prepare += t1 - t0;
        rest += absl::Now() - t1;
        done += 2 * keys.size();
      }
      rate[capped] = done / absl::ToDoubleSeconds(prepare + rest);
      rest_ns[capped] = absl::ToDoubleNanoseconds(rest) / done;
      if (capped) prepare_ns = absl::ToDoubleNanoseconds(prepare) / done;
      std::fprintf(stderr, "  store: round %d, %s: %.2fM keys/s\n", round,
                   capped ? "capped" : "in memory", rate[capped] / 1e6);
    }
    std::printf("| %d | %.2fM | %.2fM | %.2f | %.0f | %.0f | %.0f |\n", round,
                rate[0] / 1e6, rate[1] / 1e6, rate[1] / rate[0], prepare_ns,
                rest_ns[1], rest_ns[0]);
    std::fflush(stdout);
  }
}

// ps_bench's sparse batches on one range's rows, in this process.
void LookupsSection() {
  using server_internal::RangeBounds;
  using server_internal::SparseRows;
  constexpr int kBatches = 8;
  const int passes = std::max(1, absl::GetFlag(FLAGS_lookup_passes));
  std::printf(
      "\n## ps_bench's sparse batches on one range's row store (the first "
      "half of 1M hashed ids, as the first of two servers holds them; 100k "
      "draws a batch, %d batches; Adagrad; no network; best of %d "
      "passes)\n\n| keys | width | keys a batch in the range | push ns/key "
      "| read ns/key | rows alone: push, read ns/key |\n"
      "|---|---|---|---|---|---|\n",
      kBatches, passes);
  const RowParts parts = AdagradRows(proto::InitializerSpec::CONSTANT);
  const UpdateHandler& apply = *parts.handler;
  const Key half = kKeySpaceEnd / 2;
  const std::vector<Key> all = bench::HashedIds(1000000);
  const std::vector<Key> hot(all.begin(), all.begin() + 1000);
  std::vector<Key> owned;
  for (Key k : all) {
    if (k < half) owned.push_back(k);
  }
  for (const char* dist : {"uniform", "zipf", "hot"}) {
    std::vector<std::vector<Key>> batches = bench::DrawBatches(
        std::string(dist) == "hot" ? "uniform" : dist,
        std::string(dist) == "hot" ? hot : all, 100000, kBatches);
    size_t keys = 0;
    for (auto& b : batches) {
      b.erase(
          std::remove_if(b.begin(), b.end(), [&](Key k) { return k >= half; }),
          b.end());
      keys += b.size();
    }
    for (size_t width : {size_t{8}, size_t{64}}) {
      SparseRows rows(&parts.init, &apply, width, 0, half, RangeBounds{},
                      nullptr);
      std::vector<float> grads(100000 * width, 0.01f), out(100000 * width);
      auto push = [&](const std::vector<Key>& b) {
        rows.TouchBatch(b, SparseRows::Write::kPush,
                        [&](size_t i, SparseRows::Row r) {
                          apply.Apply(r.values, r.state,
                                      grads.data() + i * width, 1, width);
                        });
      };
      for (size_t i = 0; i < owned.size(); i += 100000) {  // every row once
        push(std::vector<Key>(
            owned.begin() + i,
            owned.begin() + std::min(owned.size(), i + 100000)));
      }
      double push_ns = 0, read_ns = 0;
      for (int p = 0; p < passes; ++p) {
        const absl::Time t0 = absl::Now();
        for (const auto& b : batches) push(b);
        const absl::Time t1 = absl::Now();
        for (const auto& b : batches) {
          Check(rows.ReadBatch(b, out.data()), "read");
        }
        const absl::Time t2 = absl::Now();
        const double pn = absl::ToDoubleNanoseconds(t1 - t0) / keys;
        const double rn = absl::ToDoubleNanoseconds(t2 - t1) / keys;
        push_ns = p == 0 ? pn : std::min(push_ns, pn);
        read_ns = p == 0 ? rn : std::min(read_ns, rn);
      }
      // The same updates and copies through rows found beforehand, with
      // each row prefetched as far ahead as the lookups prefetch theirs:
      // the rows' own misses and arithmetic, no index. What the push or
      // read costs beyond it is the index's part (its entry and the slot
      // that holds the key), the most a faster index could save.
      std::vector<std::vector<SparseRows::Row>> found(batches.size());
      for (size_t b = 0; b < batches.size(); ++b) {
        for (Key k : batches[b]) found[b].push_back(rows.Find(k));
      }
      const size_t row_bytes = rows.RowFloats() * sizeof(float);
      auto prefetch_row = [&](const SparseRows::Row& r) {
        const char* p = reinterpret_cast<const char*>(r.values);
        for (size_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + o);
      };
      constexpr size_t kAhead = 16;
      // Best of the passes, ns a key, of `op(row, i)` over every batch.
      auto rows_alone_ns = [&](auto op) {
        double best = 0;
        for (int p = 0; p < passes; ++p) {
          const absl::Time t0 = absl::Now();
          for (const auto& f : found) {
            for (size_t i = 0; i < f.size(); ++i) {
              if (i + kAhead < f.size()) prefetch_row(f[i + kAhead]);
              op(f[i], i);
            }
          }
          const double ns = absl::ToDoubleNanoseconds(absl::Now() - t0) / keys;
          best = p == 0 ? ns : std::min(best, ns);
        }
        return best;
      };
      const double alone_push_ns =
          rows_alone_ns([&](const SparseRows::Row& r, size_t i) {
            apply.Apply(r.values, r.state, grads.data() + i * width, 1, width);
          });
      const double alone_read_ns = rows_alone_ns([&](const SparseRows::Row& r,
                                                     size_t i) {
        std::memcpy(out.data() + i * width, r.values, width * sizeof(float));
      });
      std::fprintf(stderr, "  lookups: %s, width %zu done\n", dist, width);
      std::printf("| %s | %zu | %zu | %.1f | %.1f | %.1f, %.1f |\n", dist,
                  width, keys / kBatches, push_ns, read_ns, alone_push_ns,
                  alone_read_ns);
      std::fflush(stdout);
    }
  }
}

// The SDK's summing of a batch's repeats (tables with sum_repeats) on
// ps_bench's batches, against memcpy of the batch's rows in the same run.
void SumsSection() {
  constexpr int kBatches = 8;
  const int passes = std::max(1, absl::GetFlag(FLAGS_lookup_passes));
  std::printf(
      "\n## Summing repeats in the SDK (ps_bench's sparse batches: 100k draws "
      "of 1M hashed ids, %d batches; best of %d passes)\n\n| keys | width | "
      "distinct keys a batch | sum ns/key | memcpy of the rows ns/key | "
      "sum / memcpy |\n|---|---|---|---|---|---|\n",
      kBatches, passes);
  const std::vector<Key> all = bench::HashedIds(1000000);
  BufferPool pool;
  for (const char* dist : {"uniform", "zipf"}) {
    const std::vector<std::vector<Key>> batches =
        bench::DrawBatches(dist, all, 100000, kBatches);
    for (size_t width : {size_t{8}, size_t{64}}) {
      std::vector<float> grads(100000 * width), copy(100000 * width);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = (i % 97) * 0.01f;
      double sum_ns = 0, copy_ns = 0;
      size_t distinct = 0;
      for (int p = 0; p <= passes; ++p) {  // pass 0 warms the pool
        distinct = 0;
        const absl::Time t0 = absl::Now();
        for (const auto& b : batches) {
          Buffer keys, values;
          absl::StatusOr<size_t> d =
              SumRepeats(b, grads.data(), width, pool, &keys, &values);
          Check(d.status(), "sum");
          distinct += *d;
        }
        const absl::Time t1 = absl::Now();
        for (const auto& b : batches) {
          std::memcpy(copy.data(), grads.data(), b.size() * width * 4);
        }
        const absl::Time t2 = absl::Now();
        const double sn =
            absl::ToDoubleNanoseconds(t1 - t0) / (kBatches * 100000.0);
        const double cn =
            absl::ToDoubleNanoseconds(t2 - t1) / (kBatches * 100000.0);
        if (p == 1 || (p > 1 && sn < sum_ns)) sum_ns = sn;
        if (p == 1 || (p > 1 && cn < copy_ns)) copy_ns = cn;
      }
      std::fprintf(stderr, "  sums: %s, width %zu done\n", dist, width);
      std::printf("| %s | %zu | %zu | %.1f | %.1f | %.1f |\n", dist, width,
                  distinct / kBatches, sum_ns, copy_ns, sum_ns / copy_ns);
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  downpour::TuneAllocatorForLargeMessages();
  const std::string sections = absl::GetFlag(FLAGS_sections);
  std::printf("# embedding_bench (%s)\n",
              absl::FormatTime(absl::Now()).c_str());
  if (sections.find("memory") != std::string::npos) {
    downpour::MemorySection();
  }
  if (sections.find("cold") != std::string::npos) downpour::ColdSection();
  if (sections.find("store") != std::string::npos) downpour::StoreSection();
  if (sections.find("lookups") != std::string::npos) {
    downpour::LookupsSection();
  }
  if (sections.find("sums") != std::string::npos) downpour::SumsSection();
  return 0;
}
