// What a server does for one BSP part per step, timed in one process: N
// ranks' gradients of one part held (copies, but for the push that
// completes the step), their mean in rank order, the step closed
// (consistency/step_aggregator.h). Read against, in the same run (these
// machines are shared and noisy): memcpy of the same bytes (the N
// gradients once), and the naive way the server did it before (every push
// copied, then one pass over the part per rank and one to divide, in this
// binary's plain -O2 loops).
//
//   bazel run -c opt //bench:aggregation_bench --
//       --ranks=2,4,8 --part_kb=128,512  (one command line)
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "consistency/step_aggregator.h"

ABSL_FLAG(std::string, ranks, "2,4,8", "ranks completing each step");
ABSL_FLAG(std::string, part_kb, "128,512", "bytes of one part, in KiB");
ABSL_FLAG(double, seconds, 1.0, "time per figure");

namespace downpour {
namespace {

std::vector<int> Ints(const std::string& s) {
  std::vector<int> v;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int i;
    if (absl::SimpleAtoi(p, &i) && i > 0) v.push_back(i);
  }
  return v;
}

// Calls step() for `seconds`; returns microseconds per call.
template <typename F>
double Time(double seconds, F step) {
  for (int i = 0; i < 3; ++i) step();  // buffers touched, spares made
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::Seconds(seconds);
  int64_t calls = 0;
  absl::Time now = start;
  while (now < stop) {
    for (int i = 0; i < 16; ++i) step();
    calls += 16;
    now = absl::Now();
  }
  return absl::ToDoubleMicroseconds(now - start) / static_cast<double>(calls);
}

int Main() {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::printf(
      "| ranks | part | aggregation (us/step) | naive (us/step) | memcpy of "
      "the N parts (us) | aggregation / memcpy | naive / memcpy |\n"
      "|---|---|---|---|---|---|---|\n");
  for (int kb : Ints(absl::GetFlag(FLAGS_part_kb))) {
    for (int n : Ints(absl::GetFlag(FLAGS_ranks))) {
      const size_t floats = size_t(kb) * 256;
      std::vector<std::vector<float>> grads(n, std::vector<float>(floats));
      for (int r = 0; r < n; ++r) {
        for (size_t j = 0; j < floats; ++j) grads[r][j] = 1e-3f * (r + 1);
      }
      StepAggregator steps(n, n);
      std::vector<float> mean;
      Clock clock = 0;
      double check = 0;
      const double agg = Time(seconds, [&] {
        for (int r = 0; r < n; ++r) {
          steps.Add(r, clock, {}, grads[r], /*waiter=*/0);
        }
        steps.Mean(clock, floats, &mean);
        check += mean[clock % floats];
        steps.Finish(clock, 0);
        ++clock;
      });
      std::vector<std::vector<float>> held(n);
      const double naive = Time(seconds, [&] {
        for (int r = 0; r < n; ++r) {
          held[r].assign(grads[r].begin(), grads[r].end());
        }
        mean.assign(floats, 0.0f);
        for (int r = 0; r < n; ++r) {
          for (size_t j = 0; j < floats; ++j) mean[j] += held[r][j];
        }
        for (float& v : mean) v /= static_cast<float>(n);
        check += mean[clock++ % floats];
      });
      std::vector<float> dst(floats);
      const double copy = Time(seconds, [&] {
        for (int r = 0; r < n; ++r) {
          std::memcpy(dst.data(), grads[r].data(), floats * sizeof(float));
        }
        check += dst[clock++ % floats];
      });
      std::printf("| %d | %d KiB | %.1f | %.1f | %.1f | %.2f | %.2f |\n", n, kb,
                  agg, naive, copy, agg / copy, naive / copy);
      if (check < 0) std::printf("(impossible)\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
