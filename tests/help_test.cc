// Every binary's --help: a one-line usage message naming the program, its
// own flags, and the shared ones (logging, authentication, metrics) for
// the daemons; never Abseil's "No flags matched" nor its own flags.
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/test_util.h"

namespace downpour {
namespace {

struct Binary {
  std::string path;                // in the runfiles
  std::vector<std::string> flags;  // each must be listed
};

const std::vector<std::string> kDaemonShared = {
    "--minloglevel", "--v", "--log_format", "--cluster_secret_file",
    "--metrics_listen"};

std::vector<std::string> With(std::vector<std::string> own,
                              const std::vector<std::string>& shared) {
  own.insert(own.end(), shared.begin(), shared.end());
  return own;
}

class HelpTest : public ::testing::TestWithParam<Binary> {};

TEST_P(HelpTest, ListsItsOwnAndSharedFlags) {
  const Binary& b = GetParam();
  const std::string name = b.path.substr(b.path.rfind('/') + 1);
  const std::string log = absl::StrCat(TestTmpDir(), "/", name, "-help.txt");
  Subprocess p({RunfilePath(b.path), "--help"}, log);
  ASSERT_OK(p.Start());
  ASSERT_OK_AND_ASSIGN(int status, p.Wait(absl::Seconds(30)));
  // Abseil's --help exits with status 1.
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::ifstream in(log);
  std::stringstream s;
  s << in.rdbuf();
  const std::string out = s.str();
  // The usage message: one line, "<program>: <what> (usage: <program> ...)".
  const std::string first = out.substr(0, out.find('\n'));
  EXPECT_TRUE(absl::StartsWith(first, name + ": ")) << first;
  EXPECT_TRUE(absl::StrContains(first, "(usage: " + name)) << first;
  EXPECT_FALSE(absl::StrContains(out, "No flags matched")) << out;
  EXPECT_FALSE(absl::StrContains(out, "SetProgramUsageMessage")) << out;
  EXPECT_FALSE(absl::StrContains(out, "--flagfile")) << out;
  for (const std::string& flag : b.flags) {
    EXPECT_TRUE(absl::StrContains(out, "    " + flag + " (")) << flag << " in\n"
                                                              << out;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Binaries, HelpTest,
    ::testing::Values(
        Binary{"scheduler/ps_scheduler",
               With({"--listen", "--num_workers", "--consistency", "--replicas",
                     "--dead_after_ms"},
                    kDaemonShared)},
        Binary{"server/ps_server",
               With({"--scheduler", "--name", "--data_listen", "--admin_listen",
                     "--max_message_mb"},
                    kDaemonShared)},
        Binary{"worker/ps_worker",
               With({"--job", "--scheduler", "--model", "--steps", "--momentum",
                     "--lr_decay_from", "--health_listen"},
                    kDaemonShared)},
        Binary{"lbfgs/ps_lbfgs",
               With({"--scheduler", "--problem", "--tasks", "--backup_tasks"},
                    kDaemonShared)},
        Binary{"psctl/psctl",
               {"--scheduler", "--json", "--interval_ms", "--kind", "--workers",
                "--worker_flags", "--servers", "--cluster_secret_file",
                "--minloglevel", "--log_format", "--model", "--calibration",
                "--plot", "--probe_seconds"}},
        Binary{"tools/ps_demo",
               {"--mode", "--compare", "--steps", "--momentum",
                "--lr_decay_from", "--targets", "--poll_ms"}},
        Binary{"tools/ps_keygen", {"--out"}},
        Binary{"bench/ps_bench", {"--bin_dir", "--depth", "--max_mb"}},
        Binary{"bench/lbfgs_bench", {"--iterations", "--tasks"}},
        Binary{"bench/cuda_mlp_bench", {"--batches", "--layers"}},
        Binary{"bench/soak_bench", {"--clients", "--seconds", "--replicas"}},
        Binary{"bench/elastic_bench", {"--sections", "--range_mb"}},
        Binary{"models/local_trainer", {"--model", "--epochs", "--lr"}}),
    [](const ::testing::TestParamInfo<Binary>& info) {
      std::string name = info.param.path.substr(info.param.path.rfind('/') + 1);
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace downpour
