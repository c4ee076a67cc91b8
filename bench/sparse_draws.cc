#include "bench/sparse_draws.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace downpour {
namespace bench {

std::vector<Key> HashedIds(size_t count) {
  std::vector<Key> all(count);
  for (uint64_t i = 0; i < count; ++i) {
    all[i] = i * 0x9E3779B97F4A7C15ull % kKeySpaceEnd;
  }
  return all;
}

std::vector<std::vector<Key>> DrawBatches(const std::string& dist,
                                          const std::vector<Key>& all,
                                          size_t batch, int count) {
  std::mt19937_64 rng(42);
  std::vector<std::vector<Key>> out(count, std::vector<Key>(batch));
  if (dist == "zipf") {
    std::vector<double> cdf(all.size());
    double sum = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      cdf[i] = (sum += 1.0 / std::pow(i + 1.0, 1.1));
    }
    std::uniform_real_distribution<double> u(0, sum);
    for (auto& b : out) {
      for (Key& k : b) {
        const size_t rank =
            std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
        k = all[std::min(rank, all.size() - 1)];
      }
    }
  } else {
    std::uniform_int_distribution<size_t> u(0, all.size() - 1);
    for (auto& b : out) {
      for (Key& k : b) k = all[u(rng)];
    }
  }
  return out;
}

}  // namespace bench
}  // namespace downpour
