#include "common/program.h"

#include <cstdio>

#include "absl/flags/parse.h"
#include "common/log_flags.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/signals.h"
#include "common/usage.h"

namespace downpour {

absl::StatusOr<std::vector<char*>> StartProgram(int argc, char** argv,
                                                const ProgramStart& start) {
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
