// A child process (a real daemon) started with execv, for tests, benchmarks
// and the local-cluster launcher. Its stdout and stderr go to a log file.
// The destructor kills it (SIGKILL) if it is still running. Not thread-safe.
#ifndef DOWNPOUR_COMMON_SUBPROCESS_H_
#define DOWNPOUR_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace downpour {

class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, std::string log_path);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  absl::Status Start();
  pid_t pid() const { return pid_; }
  const std::vector<std::string>& argv() const { return argv_; }
  bool running() const { return pid_ > 0 && !exited_; }
  void Signal(int signo);
  // Waits for exit; returns the raw wait status, or kDeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // The last bytes of the log, for failure messages.
  std::string LogTail(int max_bytes = 4000) const;
  const std::string& log_path() const { return log_path_; }

 private:
  std::vector<std::string> argv_;
  std::string log_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

// CPU seconds that process `pid` has run so far, all its threads together,
// those that have exited included (/proc/<pid>/stat, in clock ticks: 10 ms
// at the usual 100 Hz, so measure over seconds); -1 if it cannot be read
// (no such process, no procfs). For benchmarks that attribute a job's CPU
// to its daemons.
double ProcessCpuSeconds(pid_t pid);

// CPU seconds of each live thread of process `pid` so far, by thread id
// (/proc/<pid>/task/<tid>/stat, in clock ticks as above); empty if it
// cannot be read. Two readings' largest difference is the busiest thread's
// share of a window, as the planner's calibration reads a server's data
// thread.
std::map<pid_t, double> ThreadCpuSecondsOf(pid_t pid);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SUBPROCESS_H_
