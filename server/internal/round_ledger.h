// Exactly-once accumulation of Sandblaster task gradients into a range's
// named vectors: the open round of each vector and the (task, first key)
// pairs already added in it. A ZERO command with open_round opens a round
// (forgetting the last); an ADD of an older round, or a repeat of a task in
// the open one (a backup copy, a resend), is dropped.
//
// Thread-compatible: the server's data thread owns it.
#ifndef DOWNPOUR_SERVER_INTERNAL_ROUND_LEDGER_H_
#define DOWNPOUR_SERVER_INTERNAL_ROUND_LEDGER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/types.h"

namespace downpour {
namespace server_internal {

class RoundLedger {
 public:
  explicit RoundLedger(uint32_t num_vectors) : rounds_(num_vectors) {}

  // Opens `round` on `vector`: adds of older rounds are late from now on.
  void Open(uint32_t vector, int64_t round);
  int64_t open(uint32_t vector) const { return rounds_[vector].open; }

  // kFailedPrecondition if `round` is newer than the round open on `vector`
  // (the coordinator has not opened it here yet). `table` names the table
  // in the message.
  absl::Status Check(uint32_t vector, int64_t round,
                     const std::string& table) const;
  // Whether an ADD of `task` whose first key is `first_key` should be
  // applied: false for a round older than the open one or a repeat in it.
  // Records the ADD as applied.
  bool FirstInRound(uint32_t vector, int64_t round, uint64_t task,
                    Key first_key);

  // The ledger as plain data, to copy it to a replica or a checkpoint.
  struct Entry {
    uint32_t vector;
    int64_t open;
    std::vector<std::pair<uint64_t, Key>> applied;
  };
  std::vector<Entry> Export() const;
  // Replaces the ledger with an exported one (entries for vectors this
  // ledger lacks are ignored).
  void Import(const std::vector<Entry>& entries);

 private:
  struct Round {
    int64_t open = 0;
    absl::flat_hash_set<std::pair<uint64_t, Key>> applied;
  };
  std::vector<Round> rounds_;
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_ROUND_LEDGER_H_
