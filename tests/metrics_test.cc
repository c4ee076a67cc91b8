// Prometheus metrics scraped from live daemons over HTTP: the figures move
// with the traffic the test sends (per operation and table, bytes,
// latency histograms, replication), with the job's clocks, and with a
// failover.
#include <signal.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "metrics/scrape.h"
#include "tests/cluster_fixture.h"
#include "zmq.h"

namespace downpour {
namespace {

// The metrics address a daemon logged ("metrics on http://HOST:PORT/...").
absl::StatusOr<std::string> MetricsAddress(const Subprocess& p) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    std::ifstream in(p.log_path());
    std::stringstream s;
    s << in.rdbuf();
    const std::string log = s.str();
    const std::string marker = "metrics on http://";
    const size_t at = log.find(marker);
    if (at != std::string::npos) {
      const size_t begin = at + marker.size();
      const size_t end = log.find("/metrics", begin);
      if (end != std::string::npos) return log.substr(begin, end - begin);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no metrics address in ", p.log_path()));
}

// Sends one data-plane request with `keys` and no values; its reply's
// status code (-1: no reply).
int RawRequest(const std::string& endpoint, const proto::DataHeader& header,
               const std::vector<Key>& keys) {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  int timeout = 5000, linger = 0;
  zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_connect(sock, endpoint.c_str());
  const std::string h = header.SerializeAsString();
  zmq_send(sock, h.data(), h.size(), ZMQ_SNDMORE);
  zmq_send(sock, keys.data(), keys.size() * sizeof(Key), ZMQ_SNDMORE);
  zmq_send(sock, "", 0, 0);
  int code = -1;
  zmq_msg_t m;
  zmq_msg_init(&m);
  bool first = true;
  while (zmq_msg_recv(&m, sock, 0) >= 0) {
    if (first) {
      proto::DataHeader reply;
      if (reply.ParseFromArray(zmq_msg_data(&m), zmq_msg_size(&m))) {
        code = reply.status_code();
      }
      first = false;
    }
    if (!zmq_msg_more(&m)) break;
  }
  zmq_msg_close(&m);
  zmq_close(sock);
  zmq_ctx_term(ctx);
  return code;
}

absl::StatusOr<ScrapedMetrics> Scrape(const std::string& address) {
  auto body = HttpGet(address, "/metrics", absl::Seconds(10));
  if (!body.ok()) return body.status();
  return ParseMetricsText(*body);
}

// The sum of one figure over several daemons.
double SumOver(const std::vector<ScrapedMetrics>& ms, const std::string& name,
               const std::map<std::string, std::string>& match = {}) {
  double sum = 0;
  for (const ScrapedMetrics& m : ms) sum += m.Sum(name, match);
  return sum;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalClusterOptions o;
    o.bin_dir = RunfilePath("");
    o.work_dir = TestTmpDir();
    o.num_servers = 2;
    o.scheduler_flags = {"--metrics_listen=127.0.0.1:0", "--replicas=2",
                         "--num_workers=2", "--consistency=asp",
                         "--dead_after_ms=1500"};
    o.server_flags = {"--metrics_listen=127.0.0.1:0"};
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(o));
    ASSERT_OK_AND_ASSIGN(scheduler_metrics_,
                         MetricsAddress(cluster_->scheduler()));
    for (int i = 0; i < 2; ++i) {
      ASSERT_OK_AND_ASSIGN(std::string a, MetricsAddress(cluster_->server(i)));
      server_metrics_.push_back(a);
    }
  }
  void TearDown() override {
    client_.reset();
    if (cluster_ != nullptr) {
      EXPECT_OK(cluster_->Stop());
    }
  }

  std::vector<ScrapedMetrics> ScrapeServers() {
    std::vector<ScrapedMetrics> out;
    for (const std::string& a : server_metrics_) {
      auto m = Scrape(a);
      EXPECT_OK(m);
      if (m.ok()) {
        out.push_back(*std::move(m));
      }
    }
    return out;
  }

  // Connects client_ and creates the dense table "emb" (100 keys of
  // width 2).
  void CreateEmb() {
    ASSERT_OK_AND_ASSIGN(
        client_,
        Client::Connect({.scheduler_address = cluster_->scheduler_address()}));
    TableOptions t;
    t.name = "emb";
    t.width = 2;
    t.num_keys = 100;
    ASSERT_OK(client_->CreateTable(t).status());
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
  std::string scheduler_metrics_;
  std::vector<std::string> server_metrics_;
};

TEST_F(MetricsTest, ServerFiguresMoveWithTheTraffic) {
  ASSERT_OK_AND_ASSIGN(
      auto client,
      Client::Connect({.scheduler_address = cluster_->scheduler_address()}));
  TableOptions t;
  t.name = "w";
  t.width = 4;
  t.num_keys = 1000;
  t.handler = "sgd";
  ASSERT_OK_AND_ASSIGN(Table table, client->CreateTable(t));

  // Before any traffic: ready, the table's rows, no request of its own.
  std::vector<ScrapedMetrics> before = ScrapeServers();
  ASSERT_EQ(before.size(), 2u);
  EXPECT_EQ(SumOver(before, "downpour_server_ready"), 2);
  // Each range has a primary and a backup: both servers hold all rows.
  EXPECT_EQ(SumOver(before, "downpour_table_rows", {{"table", "w"}}), 2000);
  EXPECT_EQ(SumOver(before, "downpour_server_requests_total",
                    {{"op", "push"}, {"table", "w"}}),
            0);
  const double bytes_in_before =
      SumOver(before, "downpour_server_received_bytes_total");
  const double bytes_out_before =
      SumOver(before, "downpour_server_sent_bytes_total");
  EXPECT_GT(SumOver(before, "process_resident_memory_bytes"), 0);

  constexpr int kPushes = 25, kPulls = 15;
  std::vector<float> grads(4000, 0.001f), params(4000);
  for (int i = 0; i < kPushes; ++i) {
    ASSERT_OK(client->PushSync(table, Keys::Range(0, 1000), grads));
  }
  for (int i = 0; i < kPulls; ++i) {
    ASSERT_OK(
        client->PullSync(table, Keys::Range(0, 1000), absl::MakeSpan(params)));
  }
  // A request the server refuses (a key outside the table), sent raw: the
  // SDK would refuse it itself.
  ASSERT_OK_AND_ASSIGN(
      proto::ClusterMap map,
      SchedulerClient(cluster_->scheduler_address()).GetClusterMap());
  proto::DataHeader bad;
  bad.set_op(proto::PULL);
  bad.set_table_id(table.id);
  bad.set_width(4);
  bad.set_num_keys(1);
  bad.set_epoch(map.epoch());
  EXPECT_EQ(RawRequest(map.nodes(0).data_endpoint(), bad, {5000}),
            static_cast<int>(absl::StatusCode::kOutOfRange));

  std::vector<ScrapedMetrics> after = ScrapeServers();
  ASSERT_EQ(after.size(), 2u);
  // Every operation on the whole key space is one request per server (one
  // range each).
  const std::map<std::string, std::string> push = {{"op", "push"},
                                                   {"table", "w"}};
  const std::map<std::string, std::string> pull = {{"op", "pull"},
                                                   {"table", "w"}};
  EXPECT_EQ(SumOver(after, "downpour_server_requests_total", push),
            2 * kPushes);
  EXPECT_EQ(SumOver(after, "downpour_server_requests_total", pull),
            2 * kPulls + 1);
  EXPECT_EQ(SumOver(after, "downpour_server_request_errors_total", pull), 1);
  EXPECT_EQ(SumOver(after, "downpour_server_request_errors_total", push), 0);
  // Every request is in its latency histogram, with some time on it.
  EXPECT_EQ(
      SumOver(after, "downpour_server_request_duration_seconds_count", push),
      2 * kPushes);
  EXPECT_EQ(SumOver(after, "downpour_server_request_duration_seconds_bucket",
                    {{"op", "push"}, {"table", "w"}, {"le", "+Inf"}}),
            2 * kPushes);
  EXPECT_GT(
      SumOver(after, "downpour_server_request_duration_seconds_sum", push), 0);
  EXPECT_LE(SumOver(after, "downpour_server_request_duration_seconds_bucket",
                    {{"op", "push"}, {"table", "w"}, {"le", "1e-05"}}),
            2 * kPushes);
  // Bytes: at least the values pushed in and pulled out.
  const double value_bytes = 4000.0 * sizeof(float);
  EXPECT_GE(
      SumOver(after, "downpour_server_received_bytes_total") - bytes_in_before,
      kPushes * value_bytes);
  EXPECT_GE(
      SumOver(after, "downpour_server_sent_bytes_total") - bytes_out_before,
      kPulls * value_bytes);
  // Replication: each primary forwarded each push to the other server,
  // which applied it as a backup, and nothing waits any more.
  EXPECT_EQ(SumOver(after, "downpour_server_replication_forwarded_total"),
            2 * kPushes);
  EXPECT_EQ(SumOver(after, "downpour_server_replica_messages_applied_total"),
            2 * kPushes);
  EXPECT_EQ(
      SumOver(after, "downpour_server_requests_total", {{"op", "replication"}}),
      2 * kPushes);
  EXPECT_EQ(SumOver(after, "downpour_server_replication_held_writes"), 0);
  EXPECT_EQ(SumOver(after, "downpour_server_deferred_replies"), 0);
  EXPECT_EQ(after[0].types.at("downpour_server_requests_total"), "counter");
  EXPECT_EQ(after[0].types.at("downpour_server_request_duration_seconds"),
            "histogram");
  EXPECT_EQ(after[0].types.at("downpour_table_rows"), "gauge");
  EXPECT_EQ(after[0].types.at("downpour_table_evicted_rows_total"), "counter");
  EXPECT_EQ(after[0].types.at("downpour_table_row_cap"), "gauge");
}

TEST_F(MetricsTest, SchedulerShowsTheJobAndAFailover) {
  ASSERT_NO_FATAL_FAILURE(CreateEmb());

  // A worker reports progress as ps_worker does.
  SchedulerClient sched(cluster_->scheduler_address());
  proto::RegisterRequest reg;
  reg.set_role(proto::WORKER);
  reg.set_name("w1");
  reg.set_requested_rank(1);
  ASSERT_OK_AND_ASSIGN(proto::RegisterReply r,
                       sched.Register(reg, absl::Seconds(10)));
  proto::AdvanceClockRequest adv;
  adv.set_node_id(r.node_id());
  adv.set_rank(1);
  adv.set_clock(7);
  adv.set_loss(0.25);
  adv.set_examples(448);
  adv.set_max_staleness(2);
  adv.set_test_accuracy(-1);
  ASSERT_OK(sched.AdvanceClock(adv).status());

  ASSERT_OK_AND_ASSIGN(ScrapedMetrics m, Scrape(scheduler_metrics_));
  EXPECT_EQ(
      m.Sum("downpour_cluster_nodes", {{"role", "server"}, {"state", "alive"}}),
      2);
  EXPECT_EQ(
      m.Sum("downpour_cluster_nodes", {{"role", "server"}, {"state", "dead"}}),
      0);
  EXPECT_EQ(
      m.Sum("downpour_cluster_nodes", {{"role", "worker"}, {"state", "alive"}}),
      1);
  EXPECT_EQ(m.Sum("downpour_table_ranges", {{"table", "emb"}}), 2);
  EXPECT_EQ(m.Sum("downpour_table_backups", {{"table", "emb"}}), 2);
  // The table memory of both servers: "emb" (100 x 2 floats, twice with
  // its backups) against the limits they registered with.
  EXPECT_EQ(m.Sum("downpour_server_table_memory_committed_bytes", {}),
            2 * 100 * 2 * sizeof(float));
  EXPECT_GT(m.Sum("downpour_server_table_memory_limit_bytes",
                  {{"server", "server-0"}}),
            0);
  EXPECT_EQ(m.Sum("downpour_table_ranges_lost", {{"table", "emb"}}), 0);
  EXPECT_EQ(m.Sum("downpour_worker_clock", {{"rank", "1"}}), 7);
  EXPECT_EQ(m.Sum("downpour_worker_loss", {{"rank", "1"}}), 0.25);
  EXPECT_EQ(m.Sum("downpour_worker_examples_total", {{"rank", "1"}}), 448);
  EXPECT_EQ(m.Sum("downpour_worker_max_staleness", {{"rank", "1"}}), 2);
  EXPECT_EQ(m.Sum("downpour_worker_clock", {{"rank", "0"}}), 0);
  EXPECT_EQ(
      m.Sum("downpour_worker_state", {{"rank", "1"}, {"state", "running"}}), 1);
  EXPECT_EQ(m.Sum("downpour_worker_state", {{"rank", "1"}, {"state", "lost"}}),
            0);
  EXPECT_EQ(m.Sum("downpour_worker_state", {{"rank", "1"}}), 1);
  EXPECT_EQ(m.Sum("downpour_job_gating_clock"), 0);  // rank 0 is at 0
  EXPECT_EQ(m.Sum("downpour_job_workers"), 2);
  EXPECT_EQ(m.Sum("downpour_job_info", {{"consistency", "asp"}}), 1);
  EXPECT_EQ(m.Sum("downpour_cluster_promotions_total"), 0);
  const double epoch = m.Sum("downpour_cluster_epoch");
  EXPECT_GT(epoch, 0);

  // Kill server 1: its range fails over to its backup on server 0.
  cluster_->server(1).Signal(SIGKILL);
  ASSERT_OK(cluster_->server(1).Wait(absl::Seconds(10)).status());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    ASSERT_OK_AND_ASSIGN(m, Scrape(scheduler_metrics_));
    if (m.Sum("downpour_cluster_promotions_total") > 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(m.Sum("downpour_cluster_promotions_total"), 1);
  EXPECT_EQ(
      m.Sum("downpour_cluster_nodes_declared_dead_total", {{"role", "server"}}),
      1);
  EXPECT_EQ(
      m.Sum("downpour_cluster_nodes", {{"role", "server"}, {"state", "dead"}}),
      1);
  EXPECT_EQ(m.Sum("downpour_table_ranges_unavailable", {{"table", "emb"}}), 0);
  EXPECT_EQ(m.Sum("downpour_table_backups", {{"table", "emb"}}), 0);
  EXPECT_GT(m.Sum("downpour_cluster_epoch"), epoch);
}

TEST_F(MetricsTest, SchedulerCountsRangeSplits) {
  ASSERT_NO_FATAL_FAILURE(CreateEmb());
  ASSERT_OK_AND_ASSIGN(ScrapedMetrics m, Scrape(scheduler_metrics_));
  EXPECT_EQ(m.Sum("downpour_cluster_range_splits_started_total"), 0);
  EXPECT_EQ(m.Sum("downpour_cluster_range_splits_done_total"), 0);
  EXPECT_EQ(m.types.at("downpour_cluster_range_splits_done_total"), "counter");

  // Split the first range [0, 50) at 20.
  SchedulerClient sched(cluster_->scheduler_address());
  ASSERT_OK(SplitAndAwait(sched, "emb", 20, absl::Seconds(30)));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    ASSERT_OK_AND_ASSIGN(m, Scrape(scheduler_metrics_));
    if (m.Sum("downpour_cluster_range_splits_done_total") > 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(m.Sum("downpour_cluster_range_splits_started_total"), 1);
  EXPECT_EQ(m.Sum("downpour_cluster_range_splits_done_total"), 1);
  EXPECT_EQ(m.Sum("downpour_cluster_range_splits"), 0);
  EXPECT_EQ(m.Sum("downpour_table_ranges", {{"table", "emb"}}), 3);
}

}  // namespace
}  // namespace downpour
