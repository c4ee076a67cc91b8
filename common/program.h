// The start of every Downpour program's main(): its usage line, the command
// line, the shared flags (logging), and the process settings a daemon
// needs before any thread starts.
//
//   int main(int argc, char** argv) {
//     ProgramStart start;
//     start.usage = "the Downpour parameter server (usage: ps_server ...)";
//     start.tune_allocator = true;
//     start.block_termination_signals = true;
//     auto args = StartProgram(argc, argv, start);
//     if (!args.ok()) return 2;   // the reason is on stderr
//     ...
//
// Call from main() only, once, before any thread starts.
#ifndef DOWNPOUR_COMMON_PROGRAM_H_
#define DOWNPOUR_COMMON_PROGRAM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace downpour {

struct ProgramStart {
  // --help's first line: what the program is and how to call it.
  std::string usage;
  // The log tag of every line this process writes ("" keeps the default).
  std::string log_tag;
  // TuneAllocatorForLargeMessages(): programs that move large messages.
  bool tune_allocator = false;
  // BlockTerminationSignals(): programs that stop cleanly on SIGTERM and
  // SIGINT through OnTerminationSignal (common/signals.h).
  bool block_termination_signals = false;
};

// Sets the usage, parses the command line (absl::ParseCommandLine, which
// exits on --help and on unknown flags), applies the logging flags, then
// what `start` asks for. Returns the positional arguments (argv[0] first);
// kInvalidArgument, also written to stderr, for a bad logging flag: the
// caller then exits with status 2.
absl::StatusOr<std::vector<char*>> StartProgram(int argc, char** argv,
                                                const ProgramStart& start);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_PROGRAM_H_
