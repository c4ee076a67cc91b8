// A program built outside the Bazel workspace against the installed SDK
// (pkg-config downpour): declares a table, pushes, pulls, and checks the
// result, then joins the job as a worker and reports a clock.
// sdk/install_test.sh builds it with g++ and with CMake.
//
//   sdk_example <scheduler host:port> <table and worker name>
// Prints "ok <sum of pulled values>" and exits 0, or the error and exits 1.
#include <cstdio>
#include <memory>
#include <vector>

#include "client/client.h"
#include "client/job_member.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <scheduler host:port> <table>\n", argv[0]);
    return 2;
  }
  downpour::ClientOptions options;
  options.scheduler_address = argv[1];
  auto client = downpour::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  downpour::TableOptions t;
  t.name = argv[2];
  t.num_keys = 1000;
  t.width = 4;
  t.init = "constant";
  t.init_a = 1;
  t.handler = "sgd";
  t.handler_params = {{"learning_rate", 0.5}};
  auto table = (*client)->CreateTable(t);
  if (!table.ok()) {
    std::fprintf(stderr, "create: %s\n", table.status().ToString().c_str());
    return 1;
  }
  std::vector<float> grads(1000 * 4, 2.0f);
  downpour::Ticket ticket =
      (*client)->Push(*table, downpour::Keys::Range(0, 1000), grads);
  if (absl::Status s = (*client)->Wait(ticket); !s.ok()) {
    std::fprintf(stderr, "push: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<float> values(1000 * 4);
  const std::vector<downpour::Key> keys = {7, 999, 0};
  std::vector<float> some(keys.size() * 4);
  absl::Status s = (*client)->PullSync(*table, downpour::Keys::Range(0, 1000),
                                       absl::MakeSpan(values));
  if (s.ok()) s = (*client)->PullSync(*table, keys, absl::MakeSpan(some));
  if (!s.ok()) {
    std::fprintf(stderr, "pull: %s\n", s.ToString().c_str());
    return 1;
  }
  // Every value is 1 - 0.5 * 2 = 0 after the push.
  double sum = 0;
  for (float v : values) sum += v;
  for (float v : some) sum += v;
  auto missing = (*client)->OpenTable("no-such-table");
  if (missing.status().code() != absl::StatusCode::kNotFound) {
    std::fprintf(stderr, "open_table: expected NOT_FOUND, got %s\n",
                 missing.status().ToString().c_str());
    return 1;
  }
  downpour::JobMemberOptions member_options;
  member_options.scheduler_address = argv[1];
  member_options.name = argv[2];
  auto member = downpour::JobMember::Join(member_options);
  if (!member.ok()) {
    std::fprintf(stderr, "join: %s\n", member.status().ToString().c_str());
    return 1;
  }
  const downpour::ConsistencyPolicy& policy = (*member)->policy();
  if (!policy.is_bsp() || (*member)->rank() < 0 ||
      (*member)->rank() >= policy.total_workers()) {
    std::fprintf(stderr, "join: rank %d, policy %s\n", (*member)->rank(),
                 policy.ToString().c_str());
    return 1;
  }
  downpour::ClockReport report;
  report.clock = 1;
  absl::Status reported = (*member)->ReportClock(report);
  if (reported.ok()) reported = (*member)->Flush(absl::Seconds(10));
  if (!reported.ok()) {
    std::fprintf(stderr, "report: %s\n", reported.ToString().c_str());
    return 1;
  }
  std::printf("ok %g\n", sum);
  return sum == 0 ? 0 : 1;
}
