// Finding the repeated keys of a read batch, so that each distinct key is
// asked for once and its row copied to the repeats' places (ids follow a
// power law: a batch of 100k Zipf(1.1) draws over 1M ids holds about 24k
// distinct ones, so a read moves a quarter of the bytes and rows).
//
//   if (RepeatsWorthFolding(keys, selection)) {
//     FirstSeen& seen = FirstSeen::ForThisThread(n);
//     seen.InsertBatch(keys, selection, first);  // first[i] == at(i): new
//   }
//
// Not thread-safe: one table per thread (ForThisThread), reused from batch
// to batch without clearing (a stamp per batch), since this VM writes fresh
// memory at a fortieth of the speed it rewrites touched memory.
#ifndef DOWNPOUR_CLIENT_INTERNAL_FIRST_SEEN_H_
#define DOWNPOUR_CLIENT_INTERNAL_FIRST_SEEN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/split_by_owner.h"
#include "common/random.h"
#include "common/types.h"

namespace downpour {

// Whether a read of `selection` should fold its repeats: a sample of its
// first keys (up to 2048) holds at least one repeat in eight. A uniform
// batch over many ids holds almost none (folding would only cost a hash
// lookup a key); a Zipf batch holds about half.
bool RepeatsWorthFolding(absl::Span<const Key> keys,
                         const Selection& selection);

class FirstSeen {
 public:
  // Entries at most: a batch with more distinct keys than half of this
  // folds the repeats of the first ones only (16 MiB a thread).
  static constexpr size_t kMaxEntries = size_t{1} << 20;

  // The calling thread's table, emptied, for a batch of `keys` keys.
  static FirstSeen& ForThisThread(size_t keys);

  // Insert over a selection, with the table entries of later keys fetched
  // while earlier ones are resolved (a batch's table outgrows the caches):
  // first[i] = Insert(keys[selection.at(i)], selection.at(i)), and, in
  // order, on_first(selection.at(i)) for each i that is its key's first
  // occurrence (first[i] == selection.at(i)), while its key is at hand.
  // REQUIRES: every position < 2^32.
  template <typename OnFirst>
  void InsertBatch(absl::Span<const Key> keys, const Selection& selection,
                   uint32_t* first, OnFirst on_first) {
    constexpr size_t kAhead = 16;  // a power of 2
    const size_t n = selection.size(), mask = entries_.size() - 1;
    size_t home[kAhead];
    for (size_t i = 0; i < n + kAhead; ++i) {
      if (i >= kAhead) {
        const size_t j = i - kAhead, pos = selection.at(j);
        const size_t f = InsertAt(home[j % kAhead], keys[pos], pos);
        first[j] = static_cast<uint32_t>(f);
        if (f == pos) on_first(pos);
      }
      if (i < n) {
        const size_t h = SplitMix64(keys[selection.at(i)]) & mask;
        __builtin_prefetch(&entries_[h]);
        home[i % kAhead] = h;
      }
    }
  }
  void InsertBatch(absl::Span<const Key> keys, const Selection& selection,
                   uint32_t* first) {
    InsertBatch(keys, selection, first, [](size_t) {});
  }

  // Numbers the distinct keys of `keys` 0, 1, ... in the order of their
  // first occurrence, calling first(i, d) at the first occurrence of each
  // and repeat(i, d) at every later one (d: the key's number), in batch
  // order, with the entries of later keys fetched while earlier ones are
  // resolved. Returns how many distinct keys there are. REQUIRES: the table
  // is ForThisThread(n) with n >= keys.size() and n <= kMaxEntries / 2
  // (then every key has room).
  template <typename First, typename Repeat>
  size_t NumberBatch(absl::Span<const Key> keys, First first, Repeat repeat) {
    constexpr size_t kAhead = 16;  // a power of 2
    const size_t n = keys.size(), mask = entries_.size() - 1;
    size_t home[kAhead];
    size_t next = 0;
    for (size_t i = 0; i < n + kAhead; ++i) {
      if (i >= kAhead) {
        const size_t j = i - kAhead;
        const size_t d = InsertAt(home[j % kAhead], keys[j], next);
        if (d == next) {
          first(j, d);
          ++next;
        } else {
          repeat(j, d);
        }
      }
      if (i < n) {
        const size_t h = SplitMix64(keys[i]) & mask;
        __builtin_prefetch(&entries_[h]);
        home[i % kAhead] = h;
      }
    }
    return next;
  }

  // The position of the first `key` inserted since the last Reset, or
  // `position` itself if it is the first (then recorded, while there is
  // room). REQUIRES: position < 2^32.
  size_t Insert(Key key, size_t position) {
    return InsertAt(SplitMix64(key) & (entries_.size() - 1), key, position);
  }

 private:
  size_t InsertAt(size_t home, Key key, size_t position) {
    const size_t mask = entries_.size() - 1;
    for (size_t h = home;; h = (h + 1) & mask) {
      Entry& e = entries_[h];
      if (e.stamp != stamp_) {
        if (used_ * 2 >= entries_.size()) return position;  // full
        e = Entry{key, stamp_, static_cast<uint32_t>(position)};
        ++used_;
        return position;
      }
      if (e.key == key) return e.position;
    }
  }
  struct Entry {
    Key key = 0;
    uint32_t stamp = 0;  // the batch it belongs to; others are empty
    uint32_t position = 0;
  };
  void Reset(size_t keys);

  std::vector<Entry> entries_;
  uint32_t stamp_ = 0;
  size_t used_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_INTERNAL_FIRST_SEEN_H_
