// The sequence numbers of a client's writes that may still be sent again,
// and the low mark derived from them (DataHeader.low_seq: a range forgets
// the writes of this client below it).
//
// A number stays open while any part carrying it is in flight. One number
// can travel in several parts: a retried part is routed again on a newer
// map, and if its range was split meanwhile, the retry is cut into one
// part per piece, all with the part's number (each piece's ledger knows
// only its own). The number must stay open until the last of them is
// answered: closing it at the first answer would raise the low mark past a
// part still being retried, the range would forget that it applied it, and
// the retry would apply it twice. So each holder counts.
#ifndef DOWNPOUR_CLIENT_INTERNAL_OPEN_WRITES_H_
#define DOWNPOUR_CLIENT_INTERNAL_OPEN_WRITES_H_

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace downpour {

// Thread-safe.
class OpenWrites {
 public:
  // A new number, held once.
  uint64_t Open() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint64_t seq = next_++;
    ++held_[seq];
    return seq;
  }
  // One more holder of an open `seq` (a part cut from a retried one).
  void Retain(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_) {
    if (seq == 0) return;
    absl::MutexLock lock(&mu_);
    ++held_[seq];
  }
  // One holder of `seq` is done with it; 0 (no number) is ignored.
  void Close(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_) {
    if (seq == 0) return;
    absl::MutexLock lock(&mu_);
    auto it = held_.find(seq);
    if (it != held_.end() && --it->second == 0) held_.erase(it);
  }
  // The smallest number still held (the next one when none is).
  uint64_t Low() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return held_.empty() ? next_ : held_.begin()->first;
  }

 private:
  absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, int> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_INTERNAL_OPEN_WRITES_H_
