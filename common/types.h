// Named id types shared by every component.
#ifndef DOWNPOUR_COMMON_TYPES_H_
#define DOWNPOUR_COMMON_TYPES_H_

#include <cstdint>
#include <limits>

namespace downpour {

using Key = uint64_t;     // a row of a table
using NodeId = uint64_t;  // assigned by the scheduler at registration; 0 = none
using TableId = uint32_t;  // assigned by the scheduler; 0 = none
using Epoch = uint64_t;    // version of the cluster map

inline constexpr NodeId kNoNode = 0;
inline constexpr TableId kNoTable = 0;
// Sparse tables span [0, kKeySpaceEnd): the last uint64 is reserved so that a
// half-open range can describe the whole space.
inline constexpr Key kKeySpaceEnd = std::numeric_limits<Key>::max();

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_TYPES_H_
