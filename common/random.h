// Reproducible randomness: the same numbers from the same seed on every
// compiler and standard library. std::shuffle and the std::*_distribution
// classes leave their algorithms to the library, so code whose results must
// repeat (initial values, data shards, mini-batch order) uses these instead.
//
//   std::mt19937_64 rng(StreamSeed(seed, rank));  // one stream per rank
//   Shuffle(absl::MakeSpan(order), rng);          // portable Fisher-Yates
//   double u = Uniform01(SplitMix64(key));        // a hash as a uniform
//   double z = StandardNormal(rng);
//
// Pure functions; thread-safe (a generator belongs to its caller).
#ifndef DOWNPOUR_COMMON_RANDOM_H_
#define DOWNPOUR_COMMON_RANDOM_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>

#include "absl/types/span.h"

namespace downpour {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijection on
// 64-bit words whose outputs for consecutive inputs pass BigCrush, so
// hashing a counter or a (seed, key) gives independent-looking words.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from the top 53 bits of `bits`.
constexpr double Uniform01(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// A standard normal draw: Box-Muller on two 53-bit uniforms, the first in
// (0, 1] so that its log is finite. std::normal_distribution's algorithm
// differs between standard libraries; this one does not.
inline double StandardNormal(std::mt19937_64& rng) {
  const double u1 = static_cast<double>((rng() >> 11) + 1) * 0x1.0p-53;
  const double u2 = Uniform01(rng());
  return std::sqrt(-2.0 * std::log(u1)) *
         std::cos(6.283185307179586476925286766559 * u2);
}

// The seed of stream `stream` (a worker's rank, a thread, an epoch) of a
// run seeded `seed`: the one formula every generator of a run uses, so
// that a single-process replay can derive the same streams.
constexpr uint64_t StreamSeed(uint64_t seed, uint64_t stream) {
  return seed * 1000003 + stream;
}

// Fisher-Yates: for i = n, ..., 2 swaps v[i - 1] with v[rng() mod i]. The
// same permutation from the same generator state everywhere (the modulo
// bias of a 64-bit draw is below 2^-40 for any shard size we handle).
template <typename T>
void Shuffle(absl::Span<T> v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    using std::swap;
    swap(v[i - 1], v[rng() % i]);
  }
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_RANDOM_H_
