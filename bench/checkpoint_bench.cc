// Checkpoint and restore speed of one large dense table against the disk's
// own sequential write speed, measured in the same run (docs/BENCHMARKS.md).
//
//   bazel build -c opt //bench:checkpoint_bench
//   bazel-bin/bench/checkpoint_bench --mib=1024 --dir=/tmp/ckpt-bench
//
// A scheduler (--state_dir) and one server (--data_dir under --dir) as
// real processes; a table of --mib MiB (rows of 4 KiB) written by a
// client; then:
//   dd        dd if=/dev/zero bs=1M count=<mib> conv=fdatasync into --dir
//   ckpt 1    the first checkpoint (the server's copy buffers are new)
//   ckpt 2    the second (buffers reused): what a periodic checkpoint costs
//   restore   kill -9 of both, restart: the server's load of its part (its
//             own log line), and the wall time until the table reads back
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "launch/local_cluster.h"

ABSL_FLAG(int64_t, mib, 1024, "table size in MiB");
ABSL_FLAG(std::string, dir, "/tmp/downpour-checkpoint-bench",
          "work folder (emptied first); the disk measured");

namespace downpour {
namespace {

double GBps(uint64_t bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0;
}

// dd's own figure, from its last line ("..., 1.2 GB/s").
std::string DdSpeed(const std::string& dir, int64_t mib) {
  const std::string cmd =
      absl::StrCat("dd if=/dev/zero of=", dir, "/dd.bin bs=1M count=", mib,
                   " conv=fdatasync 2>&1 | tail -1; rm -f ", dir, "/dd.bin");
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  return out.empty() ? "?" : out.substr(0, out.find_last_not_of('\n') + 1);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Main() {
  const int64_t mib = absl::GetFlag(FLAGS_mib);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) != 0) return 1;
  const uint64_t bytes = static_cast<uint64_t>(mib) << 20;
  constexpr uint32_t kWidth = 1024;  // 4 KiB rows
  const uint64_t rows = bytes / (kWidth * sizeof(float));

  std::printf("disk: dd of %lld MiB: %s\n", static_cast<long long>(mib),
              DdSpeed(dir, mib).c_str());

  LocalClusterOptions o;
  o.bin_dir = BinDirOfThisProgram();
  o.work_dir = dir;
  o.num_servers = 1;
  o.durable = true;
  o.scheduler_flags = {"--consistency=asp", "--checkpoint_timeout_s=600"};
  o.server_flags = {"--max_message_mb=512"};
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str());
    return 1;
  }
  const std::string address = (*cluster)->scheduler_address();
  ClientOptions co;
  co.scheduler_address = address;
  co.op_timeout = absl::Minutes(5);
  auto client = Client::Connect(co);
  if (!client.ok()) return 1;
  TableOptions t;
  t.name = "big";
  t.width = kWidth;
  t.num_keys = rows;
  t.handler = "sgd";
  auto table = (*client)->CreateTable(t);
  if (!table.ok()) {
    std::fprintf(stderr, "%s\n", table.status().ToString().c_str());
    return 1;
  }
  {
    std::vector<float> v(rows * kWidth);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1013);
    absl::Status s = (*client)->PutSync(*table, Keys::Range(0, rows), v);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  SchedulerClient sched(address);
  for (int i = 1; i <= 2; ++i) {
    const absl::Time start = absl::Now();
    auto m = sched.Checkpoint(absl::Minutes(10));
    const double s = absl::ToDoubleSeconds(absl::Now() - start);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      return 1;
    }
    std::printf("checkpoint %d: %llu bytes in %.2f s = %.2f GB/s (%s)\n", i,
                static_cast<unsigned long long>(m->bytes()), s,
                GBps(m->bytes(), s),
                i == 1 ? "new copy buffers" : "copy buffers reused");
  }
  client->reset();

  // Restore: everything dies; the restart loads the newest checkpoint.
  (*cluster)->server(0).Signal(SIGKILL);
  (void)(*cluster)->server(0).Wait(absl::Seconds(10));
  (*cluster)->scheduler().Signal(SIGKILL);
  (void)(*cluster)->scheduler().Wait(absl::Seconds(10));
  const absl::Time start = absl::Now();
  if (!(*cluster)->RestartScheduler().ok() ||
      !(*cluster)->RestartServer(0).ok()) {
    return 1;
  }
  client = Client::Connect(co);
  if (!client.ok()) return 1;
  std::vector<float> row(kWidth);
  absl::Status read = absl::UnknownError("never read");
  while (absl::Now() - start < absl::Minutes(10)) {
    auto again = (*client)->OpenTable("big");
    read = again.ok() ? (*client)->GetSync(*again, Keys::Range(rows - 1, rows),
                                           absl::MakeSpan(row))
                      : again.status();
    if (read.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  if (!read.ok()) {
    std::fprintf(stderr, "%s\n", read.ToString().c_str());
    return 1;
  }
  // The server's own figure: "restored 1 ranges of checkpoint N (clock C,
  // B bytes) in M ms".
  const std::string log = ReadFile(dir + "/server-0.restart.log");
  std::smatch match;
  const std::regex line(R"(restored \d+ ranges .*, (\d+) bytes\) in (\d+) ms)");
  if (std::regex_search(log, match, line)) {
    const uint64_t b = std::stoull(match[1]);
    const double s = std::stod(match[2]) / 1000;
    std::printf(
        "restore: load %llu bytes in %.2f s = %.2f GB/s; from the "
        "restart to the table readable: %.2f s\n",
        static_cast<unsigned long long>(b), s, GBps(b, s), wall);
  } else {
    std::printf("restore: from the restart to the table readable: %.2f s\n",
                wall);
  }
  client->reset();
  (void)(*cluster)->Stop();
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
