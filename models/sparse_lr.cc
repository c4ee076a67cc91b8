#include "models/sparse_lr.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/random.h"

namespace downpour {

uint64_t SparseFeatureKey(uint64_t feature_id) {
  const uint64_t x = SplitMix64(feature_id);
  return x == ~uint64_t{0} ? 0 : x;
}

std::vector<size_t> SparseTrainRows(size_t train_rows, int rank, int workers,
                                    uint64_t seed) {
  DP_CHECK(rank >= 0 && rank < workers) << "rank " << rank << " of " << workers;
  std::vector<size_t> mine;
  for (size_t r = rank; r < train_rows; r += workers) mine.push_back(r);
  // The portable shuffle: the row order decides the batches.
  std::mt19937_64 rng(StreamSeed(seed, static_cast<uint64_t>(rank)));
  Shuffle(absl::MakeSpan(mine), rng);
  return mine;
}

SparseDataset SelectRows(const SparseDataset& data,
                         const std::vector<size_t>& rows) {
  SparseDataset out;
  out.labels.reserve(rows.size());
  out.row_offsets.reserve(rows.size() + 1);
  for (size_t r : rows) {
    DP_CHECK(r < data.NumRows()) << "row " << r << " of " << data.NumRows();
    const size_t f0 = data.row_offsets[r], f1 = data.row_offsets[r + 1];
    out.feature_ids.insert(out.feature_ids.end(), data.feature_ids.begin() + f0,
                           data.feature_ids.begin() + f1);
    out.feature_values.insert(out.feature_values.end(),
                              data.feature_values.begin() + f0,
                              data.feature_values.begin() + f1);
    out.row_offsets.push_back(out.feature_ids.size());
    out.labels.push_back(data.labels[r]);
  }
  return out;
}

SparseEval EvaluateSparseLogReg(const SparseDataset& data,
                                const std::vector<uint64_t>& ids,
                                const std::vector<float>& weights) {
  SparseEval e;
  const size_t rows = data.NumRows();
  if (rows == 0) return e;
  std::vector<std::pair<double, float>> scored(rows);  // (logit, label)
  double loss = 0;
  size_t correct = 0;
  for (size_t r = 0; r < rows; ++r) {
    double z = 0;
    for (size_t f = data.row_offsets[r]; f < data.row_offsets[r + 1]; ++f) {
      auto it = std::lower_bound(ids.begin(), ids.end(), data.feature_ids[f]);
      if (it != ids.end() && *it == data.feature_ids[f]) {
        z += static_cast<double>(weights[it - ids.begin()]) *
             data.feature_values[f];
      }
    }
    const double y = data.labels[r];
    // softplus(z) - y z, computed stably.
    loss += std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))) - y * z;
    correct += (z > 0) == (y > 0.5);
    scored[r] = {z, data.labels[r]};
  }
  e.log_loss = loss / rows;
  e.accuracy = static_cast<double>(correct) / rows;
  // AUC by the rank-sum (Mann-Whitney) statistic, ties sharing their rank.
  std::sort(scored.begin(), scored.end());
  double rank_sum = 0, positives = 0;
  for (size_t i = 0; i < rows;) {
    size_t j = i;
    while (j < rows && scored[j].first == scored[i].first) ++j;
    const double mid = (i + 1 + j) / 2.0;  // mean of ranks i+1 .. j
    for (size_t k = i; k < j; ++k) {
      if (scored[k].second > 0.5) {
        rank_sum += mid;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = rows - positives;
  e.auc = positives == 0 || negatives == 0
              ? 0.5
              : (rank_sum - positives * (positives + 1) / 2) /
                    (positives * negatives);
  return e;
}

absl::StatusOr<SparseDataset> LoadLibsvmFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open libsvm file '", path, "'"));
  }
  absl::StatusOr<SparseDataset> parsed = ParseLibsvm(in);
  if (!parsed.ok()) {
    return absl::Status(
        parsed.status().code(),
        absl::StrCat("libsvm file '", path, "': ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace downpour
