// The table key of a categorical id: embedding tables are sparse tables
// keyed by 64-bit keys that servers split into contiguous ranges, so raw ids
// (small ranks, Criteo's 32-bit hashes) are mixed over the whole key space
// first, or the hot ids would all land on one server.
//
//   Key k = FeatureKey(/*feature=*/3, /*id=*/criteo_id);
//
// FeatureKey(f, id) = SplitMix64(id ^ FeatureSalt(f)): a bijection of id for
// each feature (distinct ids of one feature never share a row); feature 0
// gives SplitMix64(id), models/sparse_lr.h's SparseFeatureKey. Two features
// f != f' collide only where id ^ id' == FeatureSalt(f) ^ FeatureSalt(f'),
// and for features below 1024 those salts differ above bit 40
// (feature_key_test checks it), so ids below 2^40 never collide across
// features. The one key servers refuse, 2^64 - 1, is mapped to 0.
// downpour.embedding.feature_keys is the same function in Python.
#ifndef DOWNPOUR_CLICKLOG_FEATURE_KEY_H_
#define DOWNPOUR_CLICKLOG_FEATURE_KEY_H_

#include <cstdint>

#include "common/random.h"

namespace downpour {
namespace clicklog {

constexpr uint64_t FeatureSalt(uint64_t feature) {
  return feature * 0xd1b54a32d192ed03ull;  // an odd multiplier: injective
}

constexpr uint64_t FeatureKey(uint64_t feature, uint64_t id) {
  const uint64_t k = SplitMix64(id ^ FeatureSalt(feature));
  return k == ~uint64_t{0} ? 0 : k;
}

}  // namespace clicklog
}  // namespace downpour

#endif  // DOWNPOUR_CLICKLOG_FEATURE_KEY_H_
