#include "common/program.h"

#include <cstdio>

#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "common/log_flags.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/signals.h"
#include "common/usage.h"

namespace downpour {

absl::StatusOr<std::vector<char*>> StartProgram(int argc, char** argv,
                                                const ProgramStart& start) {
  // Debian's Abseil is built with its debug checks: every Mutex lock then
  // runs a deadlock detector under a global lock (3-5% of a client's small
  // requests). Lock order is checked by clang's -Wthread-safety and by the
  // TSan stage instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  SetUsage(start.usage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (absl::Status s = ApplyLogFlags(); !s.ok()) {
    // The logger's own settings are what failed: write it plainly.
    std::fprintf(stderr, "%s: %s\n", argc > 0 ? argv[0] : "downpour",
                 s.ToString().c_str());
    return s;
  }
  if (!start.log_tag.empty()) SetLogTag(start.log_tag);
  if (start.tune_allocator) TuneAllocatorForLargeMessages();
  if (start.block_termination_signals) BlockTerminationSignals();
  return args;
}

}  // namespace downpour
