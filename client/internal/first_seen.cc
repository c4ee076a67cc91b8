#include "client/internal/first_seen.h"

#include <algorithm>

namespace downpour {

bool RepeatsWorthFolding(absl::Span<const Key> keys,
                         const Selection& selection) {
  constexpr size_t kSample = 2048;
  const size_t n = std::min(kSample, selection.size());
  if (n < 16) return false;
  // A table on the stack that the sample never fills past half (a small
  // batch clears a small one).
  Key slots[2 * kSample];
  bool used[2 * kSample];
  size_t size = 32;
  while (size < 2 * n) size *= 2;
  std::fill_n(used, size, false);
  const size_t mask = size - 1;
  size_t repeats = 0;
  for (size_t i = 0; i < n; ++i) {
    const Key k = keys[selection.at(i)];
    for (size_t h = SplitMix64(k) & mask;; h = (h + 1) & mask) {
      if (!used[h]) {
        used[h] = true;
        slots[h] = k;
        break;
      }
      if (slots[h] == k) {
        ++repeats;
        break;
      }
    }
  }
  return repeats * 8 >= n;
}

FirstSeen& FirstSeen::ForThisThread(size_t keys) {
  thread_local FirstSeen seen;
  seen.Reset(keys);
  return seen;
}

void FirstSeen::Reset(size_t keys) {
  size_t want = 64;
  while (want < 2 * keys && want < kMaxEntries) want *= 2;
  // Grows only: a thread's table serves its largest batch from then on.
  if (entries_.size() < want) {
    entries_.assign(want, Entry{});
    stamp_ = 0;
  }
  if (++stamp_ == 0) {
    // Stamps wrapped: every entry would look current to some batch.
    std::fill(entries_.begin(), entries_.end(), Entry{});
    stamp_ = 1;
  }
  used_ = 0;
}

}  // namespace downpour
