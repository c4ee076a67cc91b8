// clicklog_gen: generates synthetic Criteo-shaped click logs (generator.h),
// prints the rate, and optionally writes them in Criteo's TSV format or
// prints the planted model's figures.
//
//   bazel build //clicklog:clicklog_gen
//   bazel-bin/clicklog/clicklog_gen --rows=10000000          # rows/s
//   bazel-bin/clicklog/clicklog_gen --rows=1000 --tsv=/tmp/day0.tsv
//   bazel-bin/clicklog/clicklog_gen --planted_rows=2000000 --scale=0.01
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "clicklog/click_batch.h"
#include "clicklog/generator.h"
#include "clicklog/tsv_reader.h"
#include "common/usage.h"

ABSL_FLAG(uint64_t, rows, 10000000, "rows to generate (of the shard)");
ABSL_FLAG(uint64_t, seed, 1, "generator seed");
ABSL_FLAG(double, scale, 1.0, "cardinalities as a fraction of Criteo's");
ABSL_FLAG(double, zipf, 1.1, "Zipf exponent of the ids");
ABSL_FLAG(double, id_weight_stddev,
          downpour::clicklog::GeneratorOptions().id_weight_stddev,
          "planted model: standard deviation of the hidden per-id weights");
ABSL_FLAG(double, dense_weight_stddev,
          downpour::clicklog::GeneratorOptions().dense_weight_stddev,
          "planted model: standard deviation of the dense fields' weights");
ABSL_FLAG(double, bias, downpour::clicklog::GeneratorOptions().bias,
          "planted model: the logit's constant");
ABSL_FLAG(int, rank, 0, "shard: rows rank, rank + num_shards, ...");
ABSL_FLAG(int, num_shards, 1, "shards the rows are dealt to");
ABSL_FLAG(int, threads, 1, "threads generating (each a block of rows)");
ABSL_FLAG(int, batch, 4096, "rows per Fill call");
ABSL_FLAG(std::string, tsv, "",
          "write the rows to this file in Criteo's TSV format (one thread)");
ABSL_FLAG(uint64_t, planted_rows, 0,
          "print the planted model's AUC, log loss and click rate on this "
          "many held-out rows");

namespace downpour {
namespace clicklog {
namespace {

struct Buffers {
  explicit Buffers(size_t rows)
      : dense(rows * kNumDense),
        labels(rows),
        cat(rows * kNumCategorical),
        counts(rows * kNumDense) {}
  ClickBatchView View(size_t rows, bool with_counts) {
    ClickBatchView v;
    v.rows = rows;
    v.dense = absl::MakeSpan(dense);
    v.categorical = absl::MakeSpan(cat);
    v.labels = absl::MakeSpan(labels);
    if (with_counts) v.counts = absl::MakeSpan(counts);
    return v;
  }
  std::vector<float> dense, labels;
  std::vector<int64_t> cat, counts;
};

int WriteTsv(const ClickLogGenerator& gen, const std::string& path,
             uint64_t rows, int rank, int shards, int batch) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    return 1;
  }
  ClickLogStream stream(&gen, rank, shards);
  Buffers b(batch);
  std::string line;
  for (uint64_t done = 0; done < rows;) {
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(static_cast<uint64_t>(batch), rows - done));
    stream.Next(b.View(n, /*with_counts=*/true));
    line.clear();
    const ClickBatchView view = b.View(n, /*with_counts=*/true);
    for (size_t r = 0; r < n; ++r) AppendTsvLine(view, r, &line);
    if (std::fwrite(line.data(), 1, line.size(), f) != line.size()) {
      std::perror(path.c_str());
      std::fclose(f);
      return 1;
    }
    done += n;
  }
  if (std::fclose(f) != 0) {
    std::perror(path.c_str());
    return 1;
  }
  std::printf("wrote %" PRIu64 " rows to %s\n", rows, path.c_str());
  return 0;
}

int Main() {
  GeneratorOptions o;
  o.seed = absl::GetFlag(FLAGS_seed);
  o.scale = absl::GetFlag(FLAGS_scale);
  o.zipf_exponent = absl::GetFlag(FLAGS_zipf);
  o.id_weight_stddev = absl::GetFlag(FLAGS_id_weight_stddev);
  o.dense_weight_stddev = absl::GetFlag(FLAGS_dense_weight_stddev);
  o.bias = absl::GetFlag(FLAGS_bias);
  absl::StatusOr<std::unique_ptr<ClickLogGenerator>> gen =
      ClickLogGenerator::Create(o);
  if (!gen.ok()) {
    std::fprintf(stderr, "clicklog_gen: %s\n", gen.status().ToString().c_str());
    return 2;
  }
  const int rank = absl::GetFlag(FLAGS_rank);
  const int shards = absl::GetFlag(FLAGS_num_shards);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int batch = absl::GetFlag(FLAGS_batch);
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  if (shards < 1 || rank < 0 || rank >= shards || threads < 1 || batch < 1) {
    std::fprintf(stderr,
                 "clicklog_gen: need 0 <= rank < num_shards, threads >= 1, "
                 "batch >= 1\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_tsv).empty()) {
    return WriteTsv(**gen, absl::GetFlag(FLAGS_tsv), rows, rank, shards, batch);
  }
  if (const uint64_t planted = absl::GetFlag(FLAGS_planted_rows)) {
    const auto start = std::chrono::steady_clock::now();
    const PlantedStats s = (*gen)->Planted(planted);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    std::printf(
        "planted model on %" PRIu64 " held-out rows (seed %" PRIu64
        ", scale %g): AUC %.4f, log loss %.4f, click rate %.4f (%.1f s)\n",
        planted, o.seed, o.scale, s.auc, s.log_loss, s.click_rate, secs);
    return 0;
  }
  // Each thread generates a contiguous block of the shard's rows.
  std::vector<double> clicks(threads, 0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t begin = rows * t / threads, end = rows * (t + 1) / threads;
      ClickLogStream stream(gen->get(), rank, shards, begin);
      Buffers b(batch);
      for (uint64_t done = begin; done < end;) {
        const size_t n = static_cast<size_t>(
            std::min<uint64_t>(static_cast<uint64_t>(batch), end - done));
        stream.Next(b.View(n, /*with_counts=*/false));
        for (size_t r = 0; r < n; ++r) clicks[t] += b.labels[r];
        done += n;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  double total_clicks = 0;
  for (double c : clicks) total_clicks += c;
  std::printf(
      "generated %" PRIu64
      " rows in %.2f s: %.2fM rows/s with %d thread(s); click rate %.4f\n",
      rows, secs, static_cast<double>(rows) / secs / 1e6, threads,
      rows ? total_clicks / static_cast<double>(rows) : 0.0);
  return 0;
}

}  // namespace
}  // namespace clicklog
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "synthetic Criteo-shaped click logs: prints rows/s, or writes TSV "
      "(usage: clicklog_gen [--rows=N] [--scale=S] [--tsv=FILE] "
      "[--planted_rows=N])");
  absl::ParseCommandLine(argc, argv);
  return downpour::clicklog::Main();
}
