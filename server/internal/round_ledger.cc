#include "server/internal/round_ledger.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace server_internal {

void RoundLedger::Open(uint32_t vector, int64_t round) {
  Round& r = rounds_[vector];
  r.open = round;
  r.applied.clear();
}

absl::Status RoundLedger::Check(uint32_t vector, int64_t round,
                                const std::string& table) const {
  const int64_t open = rounds_[vector].open;
  if (round > open) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", table, "': round ", round,
                     " is not open on vector ", vector, " (open: ", open, ")"));
  }
  return absl::OkStatus();
}

bool RoundLedger::FirstInRound(uint32_t vector, int64_t round, uint64_t task,
                               Key first_key) {
  Round& r = rounds_[vector];
  return round >= r.open && r.applied.insert({task, first_key}).second;
}

std::vector<RoundLedger::Entry> RoundLedger::Export() const {
  std::vector<Entry> out;
  for (uint32_t v = 0; v < rounds_.size(); ++v) {
    if (rounds_[v].open == 0 && rounds_[v].applied.empty()) continue;
    Entry e{v, rounds_[v].open, {}};
    e.applied.assign(rounds_[v].applied.begin(), rounds_[v].applied.end());
    out.push_back(std::move(e));
  }
  return out;
}

void RoundLedger::Import(const std::vector<Entry>& entries) {
  for (Round& r : rounds_) r = Round();
  for (const Entry& e : entries) {
    if (e.vector >= rounds_.size()) continue;
    rounds_[e.vector].open = e.open;
    rounds_[e.vector].applied.insert(e.applied.begin(), e.applied.end());
  }
}

}  // namespace server_internal
}  // namespace downpour
