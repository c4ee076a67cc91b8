#include "server/internal/range_ledgers.h"

#include <vector>

namespace downpour {
namespace server_internal {

void ExportLedgers(const TableShard::Range& range, proto::RangeLedgers* out) {
  out->Clear();
  for (const auto& [part, steps] : range.steps) {
    proto::RangeLedgers::Step* step = out->add_steps();
    step->set_begin(part.first);
    step->set_end(part.second);
    step->set_next_clock(steps.next_clock());
  }
  for (const RoundLedger::Entry& e : range.rounds.Export()) {
    proto::RangeLedgers::Round* round = out->add_rounds();
    round->set_vector(e.vector);
    round->set_open(e.open);
    for (const auto& [task, key] : e.applied) {
      round->add_tasks(task);
      round->add_tasks(key);
    }
  }
  range.clients.Export(out);
}

void ImportLedgers(const proto::RangeLedgers& in, absl::Time now,
                   TableShard::Range* range) {
  range->steps.clear();
  for (const proto::RangeLedgers::Step& step : in.steps()) {
    range->StepsFor({step.begin(), step.end()}).Reset(step.next_clock());
  }
  std::vector<RoundLedger::Entry> rounds;
  for (const proto::RangeLedgers::Round& round : in.rounds()) {
    RoundLedger::Entry e{round.vector(), round.open(), {}};
    for (int i = 0; i + 1 < round.tasks_size(); i += 2) {
      e.applied.push_back({round.tasks(i), round.tasks(i + 1)});
    }
    rounds.push_back(std::move(e));
  }
  range->rounds.Import(rounds);
  range->clients.Import(in, now);
}

}  // namespace server_internal
}  // namespace downpour
