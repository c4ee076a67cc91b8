// --help for every binary: the program's one-line usage message, then its
// own flags and the shared ones (logging, authentication, metrics), grouped
// by the file that defines them.
//
// Abseil's default --help lists only flags defined in a file named after
// the program (main.cc of ps_server would have to be ps_server.cc), so a
// daemon's --help printed "No flags matched". SetUsage configures
// absl::FlagsUsageConfig to take every flag of ours and leave out Abseil's
// own (--flagfile, --fromenv, ...), which --helpfull still lists.
//
//   int main(int argc, char** argv) {
//     downpour::SetUsage("ps_server --scheduler=HOST:PORT [flags]: ...");
//     absl::ParseCommandLine(argc, argv);
//
// Call before absl::ParseCommandLine, from main() only.
#ifndef DOWNPOUR_COMMON_USAGE_H_
#define DOWNPOUR_COMMON_USAGE_H_

#include "absl/strings/string_view.h"

namespace downpour {

void SetUsage(absl::string_view usage_message);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_USAGE_H_
