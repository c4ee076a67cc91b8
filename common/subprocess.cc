#include "common/subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace downpour {

Subprocess::Subprocess(std::vector<std::string> argv, std::string log_path)
    : argv_(std::move(argv)), log_path_(std::move(log_path)) {}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
}

absl::Status Subprocess::Start() {
  std::vector<char*> args;
  for (auto& a : argv_) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) return absl::InternalError("fork failed");
  if (pid_ == 0) {
    // A parent that blocks SIGTERM for its own signal thread (psctl, the
    // daemons) must not hand that mask to the child: exec keeps it.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execv(args[0], args.data());
    _exit(127);
  }
  return absl::OkStatus();
}

void Subprocess::Signal(int signo) {
  if (pid_ > 0 && !exited_) ::kill(pid_, signo);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not started");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      return status;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", argv_[0], " did not exit within ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string Subprocess::LogTail(int max_bytes) const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (static_cast<int>(s.size()) > max_bytes)
    s = s.substr(s.size() - max_bytes);
  return s;
}

namespace {

// utime + stime of a /proc .../stat file, in seconds; -1 if unreadable.
double StatCpuSeconds(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // The command name may hold spaces; fields resume after its ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && (fields >> field); ++i) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  if (!fields) return -1;
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

}  // namespace

double ProcessCpuSeconds(pid_t pid) {
  // utime and stime (fields 14 and 15) count the threads that have exited
  // too, which a sum over /proc/<pid>/task would lose (gRPC's thread pools
  // come and go).
  return StatCpuSeconds(absl::StrCat("/proc/", pid, "/stat"));
}

std::map<pid_t, double> ThreadCpuSecondsOf(pid_t pid) {
  std::map<pid_t, double> out;
  const std::string task = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(task.c_str());
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const double cpu =
        StatCpuSeconds(absl::StrCat(task, "/", e->d_name, "/stat"));
    if (cpu >= 0) out[static_cast<pid_t>(std::atoi(e->d_name))] = cpu;
  }
  closedir(dir);
  return out;
}

}  // namespace downpour
