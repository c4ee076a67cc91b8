#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/ps_bench_sections.h"
#include "bench/raw_zmq.h"
#include "bench/sparse_draws.h"

namespace downpour {
namespace bench {
namespace {

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// CPU seconds (user + system) a process has used so far.
double CpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces): state is the
  // 3rd field, utime the 14th, stime the 15th.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  if (f.size() < 13) return 0;
  double utime = 0, stime = 0;
  (void)absl::SimpleAtod(f[11], &utime);
  (void)absl::SimpleAtod(f[12], &stime);
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// The reference parameter server's figures of issue 21 (measured on this
// machine kind, not in this run), in keys per second: {push, pull}.
struct Reference {
  const char* dist;
  int width;
  int servers;
  double push, pull;
};
constexpr Reference kReferences[] = {{"uniform", 8, 1, 4.7e6, 4.8e6},
                                     {"zipf", 8, 2, 17.6e6, 19.9e6}};

const Reference* ReferenceFor(const std::string& dist, int width, int servers) {
  for (const Reference& r : kReferences) {
    if (dist == r.dist && width == r.width && servers == r.servers) return &r;
  }
  return nullptr;
}

}  // namespace

void SparseSection(const SectionEnv& env, const SparseOptions& o) {
  RawClient raw(env.raw_endpoint);
  std::printf(
      "\n## %s batches (%llu distinct %s keys, %zu keys a batch with "
      "repeats, handler adagrad, one batch at a time; raw ZeroMQ moves the "
      "same bytes in one message: keys + values for a push, keys out and "
      "values back for a pull; 'summed': the same pushes to a table that "
      "sums repeats (TableOptions::sum_repeats), in keys of the batch; "
      "alternated %d times)\n\n",
      o.dense ? "Dense-table key" : "Sparse",
      static_cast<unsigned long long>(o.distinct), o.dense ? "dense" : "hashed",
      o.batch, env.rounds);
  std::printf(
      "| keys | width | servers | push keys/s | raw push | push/raw | pull "
      "keys/s | raw pull | pull/raw | summed push keys/s | summed/raw | "
      "push/ref | pull/ref | summed/ref |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Key> all = HashedIds(o.distinct);
  if (o.dense) std::iota(all.begin(), all.end(), Key{0});
  for (int servers : env.servers) {
    auto cluster = env.start(servers, absl::StrCat("sparse", servers));
    auto client = env.connect(*cluster);
    for (int width : o.widths) {
      TableOptions to;
      to.name = absl::StrCat("sparse", width);
      to.sparse = !o.dense;
      to.num_keys = o.dense ? o.distinct : 0;
      to.width = width;
      to.handler = "adagrad";
      auto t = client->CreateTable(to);
      Check(t.status(), "create sparse table");
      to.name += "_summed";
      to.sum_repeats = true;
      auto summed = client->CreateTable(to);
      Check(summed.status(), "create sparse table that sums repeats");
      for (const Table* table : {&*t, &*summed}) {
        // Every distinct key once, so that the table holds all its rows.
        const size_t chunk = 100'000;
        std::vector<float> init(chunk * width, 0.0f);
        for (size_t b = 0; b < all.size(); b += chunk) {
          const size_t n = std::min(chunk, all.size() - b);
          Check(client->PutSync(*table, absl::MakeConstSpan(all.data() + b, n),
                                absl::MakeConstSpan(init.data(), n * width)),
                "fill");
        }
      }
      std::vector<float> vals(o.batch * width, 0.01f), out(o.batch * width);
      const size_t push_bytes = o.batch * (sizeof(Key) + width * sizeof(float));
      const size_t key_bytes = o.batch * sizeof(Key);
      const size_t value_bytes = o.batch * width * sizeof(float);
      for (const std::string& dist : o.dists) {
        const auto batches = DrawBatches(dist, all, o.batch, 8);
        Check(client->PushSync(*t, batches[0], vals), "warm-up push");
        Check(client->PushSync(*summed, batches[0], vals), "warm-up push");
        Check(client->PullSync(*t, batches[0], absl::MakeSpan(out)),
              "warm-up pull");
        // Modes: 0 push, 1 pull, 2 push to the table that sums repeats.
        constexpr int kModes = 3;
        double ps_s[kModes] = {}, raw_s[kModes] = {};
        int ps_n[kModes] = {}, raw_n[kModes] = {};
        for (int round = 0; round < env.rounds; ++round) {
          for (int mode = 0; mode < kModes; ++mode) {
            static constexpr const char* kNames[kModes] = {"push", "pull",
                                                           "summed"};
            if (std::find(o.modes.begin(), o.modes.end(), kNames[mode]) ==
                o.modes.end()) {
              continue;
            }
            const bool pull = mode == 1;
            // Downpour: whole batches until the budget or the count is
            // spent; then raw ZeroMQ for as many messages.
            int n = 0;
            const absl::Time start = absl::Now();
            const absl::Time stop = start + absl::Seconds(env.seconds);
            while (n < o.max_batches && (n < 2 || absl::Now() < stop)) {
              const auto& keys = batches[n % batches.size()];
              Check(
                  pull ? client->PullSync(*t, keys, absl::MakeSpan(out))
                       : client->PushSync(mode == 2 ? *summed : *t, keys, vals),
                  pull ? "sparse pull" : "sparse push");
              ++n;
            }
            ps_s[mode] += absl::ToDoubleSeconds(absl::Now() - start);
            ps_n[mode] += n;
            const double per_s =
                pull ? raw.Messages(key_bytes, value_bytes, 1, n)
                     : raw.Messages(push_bytes, 1, 1, n);
            raw_s[mode] += n / per_s;
            raw_n[mode] += n;
          }
        }
        double keys_s[kModes], raw_keys_s[kModes];
        for (int mode = 0; mode < kModes; ++mode) {
          keys_s[mode] = ps_n[mode] * static_cast<double>(o.batch) / ps_s[mode];
          raw_keys_s[mode] =
              raw_n[mode] * static_cast<double>(o.batch) / raw_s[mode];
        }
        const Reference* ref =
            o.dense ? nullptr : ReferenceFor(dist, width, servers);
        // A mode left out shows "-" in each of its columns.
        auto rate = [&](int mode, const double* per_s) {
          if (ps_n[mode] == 0) return std::string("-");
          return absl::StrFormat("%.2fM", per_s[mode] / 1e6);
        };
        auto vs_raw = [&](int mode) {
          if (ps_n[mode] == 0) return std::string("-");
          return absl::StrFormat("%.2f", keys_s[mode] / raw_keys_s[mode]);
        };
        auto vs_ref = [&](int mode) {
          if (ref == nullptr || ps_n[mode] == 0) return std::string("-");
          return absl::StrFormat(
              "%.2fx", keys_s[mode] / (mode == 1 ? ref->pull : ref->push));
        };
        std::printf(
            "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | "
            "%s | %s | %s |\n",
            dist.c_str(), width, servers, rate(0, keys_s).c_str(),
            rate(0, raw_keys_s).c_str(), vs_raw(0).c_str(),
            rate(1, keys_s).c_str(), rate(1, raw_keys_s).c_str(),
            vs_raw(1).c_str(), rate(2, keys_s).c_str(), vs_raw(2).c_str(),
            vs_ref(0).c_str(), vs_ref(1).c_str(), vs_ref(2).c_str());
        std::fflush(stdout);
        std::fprintf(stderr,
                     "  sparse, %s, width %d, %d server(s): done (%d push "
                     "batches in %.3f s, %d pull batches in %.3f s, %d "
                     "summed push batches in %.3f s)\n",
                     dist.c_str(), width, servers, ps_n[0], ps_s[0], ps_n[1],
                     ps_s[1], ps_n[2], ps_s[2]);
      }
    }
    client.reset();
    Check(cluster->Stop(), "stop cluster");
  }
}

void KeyedSection(const SectionEnv& env, const KeyedOptions& o) {
  RawClient raw(env.raw_endpoint);
  const uint64_t n = o.keys;
  std::printf(
      "\n## A keyed batch of %llu sorted keys, width 1, on a dense table "
      "(ms, median of %d; push applies sgd; raw ZeroMQ moves the same bytes "
      "in one message: keys + values for a push, keys out and values back "
      "for a pull)\n\n",
      static_cast<unsigned long long>(n), o.reps * env.rounds);
  std::printf(
      "| key stride | servers | push ms | raw push ms | push/raw | pull ms | "
      "raw pull ms | pull/raw |\n|---|---|---|---|---|---|---|---|\n");
  std::vector<Key> keys(n);
  std::vector<float> grads(n, 0.001f), out(n);
  for (int servers : env.servers) {
    auto cluster = env.start(servers, absl::StrCat("keyed", servers));
    auto client = env.connect(*cluster);
    for (int stride : o.strides) {
      for (uint64_t i = 0; i < n; ++i) keys[i] = i * stride;
      TableOptions to;
      to.name = absl::StrCat("keyed", stride);
      to.width = 1;
      to.num_keys = n * stride;
      to.handler = "sgd";
      auto t = client->CreateTable(to);
      Check(t.status(), "create table");
      Check(client->PushSync(*t, keys, grads), "warm-up push");
      Check(client->PullSync(*t, keys, absl::MakeSpan(out)), "warm-up pull");
      std::vector<double> ms[2], raw_ms[2];
      for (int round = 0; round < env.rounds; ++round) {
        for (int pull = 0; pull < 2; ++pull) {
          for (int r = 0; r < o.reps; ++r) {
            const absl::Time a = absl::Now();
            Check(pull ? client->PullSync(*t, keys, absl::MakeSpan(out))
                       : client->PushSync(*t, keys, grads),
                  pull ? "keyed pull" : "keyed push");
            ms[pull].push_back(absl::ToDoubleMilliseconds(absl::Now() - a));
            const double per_s =
                pull ? raw.Messages(n * sizeof(Key), n * sizeof(float), 1, 1)
                     : raw.Messages(n * (sizeof(Key) + sizeof(float)), 1, 1, 1);
            raw_ms[pull].push_back(1e3 / per_s);
          }
        }
      }
      const double push = Median(ms[0]), pull = Median(ms[1]);
      const double raw_push = Median(raw_ms[0]), raw_pull = Median(raw_ms[1]);
      std::printf("| %d | %d | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |\n",
                  stride, servers, push, raw_push, raw_push / push, pull,
                  raw_pull, raw_pull / pull);
      std::fflush(stdout);
      std::fprintf(stderr, "  keyed batch, stride %d, %d server(s): done\n",
                   stride, servers);
    }
    client.reset();
    Check(cluster->Stop(), "stop cluster");
  }
}

void SmallSection(const SectionEnv& env, const SmallOptions& options) {
  RawClient raw(env.raw_endpoint);
  auto cluster = env.start(1, "small");
  auto client = env.connect(*cluster);
  // One at a time, also without the spin before a Wait sleeps: the figure
  // of a client that leaves its core to others.
  auto sleeper = env.connect_sleeping(*cluster);
  TableOptions o;
  o.name = "tiny";
  o.num_keys = 1024;
  auto t = client->CreateTable(o);
  Check(t.status(), "create table");
  std::vector<Key> key = {7};
  std::vector<float> one(1);
  for (int i = 0; i < 200; ++i) {
    Check(client->PullSync(*t, key, absl::MakeSpan(one)), "warm");
    Check(sleeper->PullSync(*t, key, absl::MakeSpan(one)), "warm");
  }
  constexpr size_t kReq = sizeof(Key), kRep = sizeof(float);
  if (options.count > 0) {
    const absl::Time start = absl::Now();
    if (options.raw) {
      raw.Messages(kReq, kRep, 64, options.count);
    } else {
      std::vector<std::vector<float>> outs(64, std::vector<float>(1));
      std::vector<Ticket> inflight(64);
      for (int i = 0; i < options.count; ++i) {
        if (i >= 64) Check(client->Wait(inflight[i % 64]), "pull");
        inflight[i % 64] = client->Pull(*t, key, absl::MakeSpan(outs[i % 64]));
      }
      for (int i = 0; i < std::min(64, options.count); ++i) {
        Check(client->Wait(inflight[i]), "drain");
      }
    }
    std::printf("\n%d %s pulls, 64 in flight: %.3f s\n", options.count,
                options.raw ? "raw ZeroMQ" : "Downpour",
                absl::ToDoubleSeconds(absl::Now() - start));
    sleeper.reset();
    client.reset();
    Check(cluster->Stop(), "stop cluster");
    return;
  }
  // A 4-byte pull moves a header, 8 bytes of key and 4 of value; raw
  // ZeroMQ moves the 8 and the 4 (plus its 9-byte request frame). Each
  // measure alternates raw and Downpour in short slices, 4 rounds per
  // --rounds, and reports the median of the rounds' figures and ratios:
  // the machine's other load comes in bursts, which a median of
  // side-by-side pairs leaves out.
  constexpr int kDepths[] = {8, 64};
  const int rounds = 4 * env.rounds;
  const double slice = env.seconds / 4;
  // [measure][round]: p50 and p99 one at a time, then rates per depth,
  // then p50 and p99 one at a time without spinning.
  std::vector<double> ps[6], rw[6], ratio[6];
  double cpu_ps = 0, cpu_raw = 0, ops_ps = 0, ops_raw = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> r = raw.Latencies(kReq, kRep, slice, 20000);
    std::sort(r.begin(), r.end());
    // The sleeping client first: right after a spinning phase, wake-ups
    // on this VM were slower for a while (p50 1.56-1.62x raw against
    // 1.48-1.50x in this order).
    for (int m : {4, 0}) {
      Client* c = m == 0 ? client.get() : sleeper.get();
      std::vector<double> us;
      const absl::Time stop = absl::Now() + absl::Seconds(slice / 2);
      while (us.size() < 20000 && absl::Now() < stop) {
        const absl::Time a = absl::Now();
        Check(c->PullSync(*t, key, absl::MakeSpan(one)), "pull");
        us.push_back(absl::ToDoubleMicroseconds(absl::Now() - a));
      }
      std::sort(us.begin(), us.end());
      ps[m].push_back(us[us.size() / 2]);
      rw[m].push_back(r[r.size() / 2]);
      ps[m + 1].push_back(us[us.size() * 99 / 100]);
      rw[m + 1].push_back(r[r.size() * 99 / 100]);
    }
    for (int d = 0; d < 2; ++d) {
      const int depth = kDepths[d];
      const double cpu0 =
          CpuSeconds(getpid()) + CpuSeconds(cluster->server(0).pid());
      std::vector<std::vector<float>> outs(depth, std::vector<float>(1));
      std::vector<Ticket> inflight(depth);
      int done = 0;
      const absl::Time start = absl::Now();
      const absl::Time end = start + absl::Seconds(slice);
      for (int i = 0; i < depth; ++i) {
        inflight[i] = client->Pull(*t, key, absl::MakeSpan(outs[i]));
      }
      while (absl::Now() < end && done < 2'000'000) {
        const int slot = done % depth;
        Check(client->Wait(inflight[slot]), "pull");
        inflight[slot] = client->Pull(*t, key, absl::MakeSpan(outs[slot]));
        ++done;
      }
      for (int i = 0; i < depth; ++i) {
        Check(client->Wait(inflight[(done + i) % depth]), "drain");
      }
      ps[2 + d].push_back(done / absl::ToDoubleSeconds(absl::Now() - start));
      const double cpu1 =
          CpuSeconds(getpid()) + CpuSeconds(cluster->server(0).pid());
      // As many raw messages as Downpour's pulls, at the same depth.
      const int iters = std::max(depth * 4, done);
      const double raw0 = CpuSeconds(getpid()) + CpuSeconds(env.raw_pid);
      rw[2 + d].push_back(raw.Messages(kReq, kRep, depth, iters));
      const double raw1 = CpuSeconds(getpid()) + CpuSeconds(env.raw_pid);
      if (d == 1) {
        // Both processes' CPU time per request: what a request costs, which
        // the machine's other load disturbs less than the rate does.
        cpu_ps += cpu1 - cpu0;
        cpu_raw += raw1 - raw0;
        ops_ps += done;
        ops_raw += iters;
      }
    }
    for (int m = 0; m < 6; ++m) ratio[m].push_back(ps[m].back() / rw[m].back());
  }
  std::fprintf(stderr, "  small requests: done (%d rounds)\n", rounds);
  std::printf(
      "\n## Small requests (4-byte pull, 1 server; raw ZeroMQ: an 8-byte "
      "request answered with 4 bytes; medians of %d rounds, each raw and "
      "Downpour side by side; one at a time, Downpour's Wait spins up to "
      "ClientOptions::spin_wait before it sleeps, raw ZeroMQ's caller "
      "sleeps in zmq_recv at once)\n\n",
      rounds);
  std::printf("| measure | Downpour | raw ZeroMQ | Downpour/raw |\n");
  std::printf("|---|---|---|---|\n");
  std::printf("| latency p50, one at a time | %.0f us | %.0f us | %.2fx |\n",
              Median(ps[0]), Median(rw[0]), Median(ratio[0]));
  std::printf("| latency p99, one at a time | %.0f us | %.0f us | %.2fx |\n",
              Median(ps[1]), Median(rw[1]), Median(ratio[1]));
  std::printf(
      "| latency p50, one at a time, no spin (spin_wait = 0) | %.0f us | %.0f "
      "us | %.2fx |\n",
      Median(ps[4]), Median(rw[4]), Median(ratio[4]));
  std::printf(
      "| latency p99, one at a time, no spin (spin_wait = 0) | %.0f us | %.0f "
      "us | %.2fx |\n",
      Median(ps[5]), Median(rw[5]), Median(ratio[5]));
  for (int d = 0; d < 2; ++d) {
    std::printf("| pulls/s, %d in flight | %.1fk | %.1fk | %.2f |\n",
                kDepths[d], Median(ps[2 + d]) / 1e3, Median(rw[2 + d]) / 1e3,
                Median(ratio[2 + d]));
  }
  const double us_ps = 1e6 * cpu_ps / ops_ps, us_raw = 1e6 * cpu_raw / ops_raw;
  std::printf(
      "| CPU per pull, 64 in flight (client and server processes) | %.1f us "
      "| %.1f us | %.2fx |\n",
      us_ps, us_raw, us_ps / us_raw);
  std::fflush(stdout);
  sleeper.reset();
  client.reset();
  Check(cluster->Stop(), "stop cluster");
}

}  // namespace bench
}  // namespace downpour
