#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "metrics/http_server.h"
#include "metrics/registry.h"
#include "metrics/request_stats.h"
#include "metrics/scrape.h"

namespace downpour {
namespace {

const RequestStats::Cell* FindCell(const std::vector<RequestStats::Cell>& cells,
                                   uint32_t op, uint32_t table) {
  for (const auto& c : cells) {
    if (!c.overflow && c.op == op && c.table == table) return &c;
  }
  return nullptr;
}

TEST(RequestStatsTest, CountsErrorsAndBucketsPerOpAndTable) {
  RequestStats stats;
  stats.Record(4, 1, false, 5'000);           // 5 us: first bucket (<= 10 us)
  stats.Record(4, 1, true, 10'000);           // exactly 10 us: first bucket
  stats.Record(4, 1, false, 10'001);          // second bucket (<= 25 us)
  stats.Record(4, 1, false, 20'000'000'000);  // 20 s: beyond the last bound
  stats.Record(5, 1, false, 1'000'000);       // another op
  stats.Record(4, 2, false, 1'000'000);       // another table
  const std::vector<RequestStats::Cell> cells = stats.Snapshot();
  ASSERT_EQ(cells.size(), 3u);  // no overflow cell when it is empty
  const RequestStats::Cell* push = FindCell(cells, 4, 1);
  ASSERT_NE(push, nullptr);
  EXPECT_EQ(push->requests, 4u);
  EXPECT_EQ(push->errors, 1u);
  ASSERT_EQ(push->latency.upper_bounds.size(), 16u);
  EXPECT_DOUBLE_EQ(push->latency.upper_bounds[0], 10e-6);
  EXPECT_DOUBLE_EQ(push->latency.upper_bounds[15], 10.0);
  EXPECT_EQ(push->latency.counts[0], 2u);
  EXPECT_EQ(push->latency.counts[1], 3u);
  EXPECT_EQ(push->latency.counts[15], 3u);  // cumulative, 20 s only in +Inf
  EXPECT_EQ(push->latency.count, 4u);
  EXPECT_NEAR(push->latency.sum, 20.000025001, 1e-9);
  ASSERT_NE(FindCell(cells, 5, 1), nullptr);
  EXPECT_EQ(FindCell(cells, 5, 1)->requests, 1u);
  ASSERT_NE(FindCell(cells, 4, 2), nullptr);
  EXPECT_EQ(FindCell(cells, 4, 2)->latency.counts[6], 1u);  // <= 1 ms
  EXPECT_EQ(FindCell(cells, 4, 2)->latency.counts[5], 0u);  // not <= 500 us
}

TEST(RequestStatsTest, ConcurrentRecordsAreAllCounted) {
  RequestStats stats;
  constexpr int kThreads = 4, kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&stats, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Every thread claims the same cells at the same time.
        stats.Record(i % 3, 7, (i + t) % 10 == 0, 1000);
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto cells = stats.Snapshot();
  uint64_t requests = 0, errors = 0;
  for (const auto& c : cells) {
    EXPECT_FALSE(c.overflow);
    requests += c.requests;
    errors += c.errors;
    EXPECT_EQ(c.latency.counts[0], c.requests);
  }
  EXPECT_EQ(cells.size(), 3u);
  EXPECT_EQ(requests, uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(errors, uint64_t{kThreads} * kPerThread / 10);
}

TEST(RequestStatsTest, PairsBeyondTheLimitGoToOneOverflowCell) {
  RequestStats stats;
  for (uint32_t table = 0; table < RequestStats::kMaxCells + 10; ++table) {
    stats.Record(4, table, false, 1000);
  }
  const auto cells = stats.Snapshot();
  ASSERT_EQ(cells.size(), RequestStats::kMaxCells + 1u);
  int overflow = 0;
  for (const auto& c : cells) {
    if (c.overflow) {
      ++overflow;
      EXPECT_EQ(c.requests, 10u);
    } else {
      EXPECT_EQ(c.requests, 1u);
    }
  }
  EXPECT_EQ(overflow, 1);
}

TEST(RegistryTest, CollectorsRunUntilTheirRegistrationGoes) {
  MetricsRegistry registry;
  int runs = 0;
  MetricsRegistry::Registration a = registry.Add([&runs](MetricWriter* w) {
    ++runs;
    w->Gauge("z_gauge", "last", {{"k", "v"}}, 2.5);
    w->Counter("a_total", "first", {}, 7);
  });
  {
    MetricsRegistry::Registration b = registry.Add([](MetricWriter* w) {
      w->Counter("a_total", "ignored: the family's help is the first",
                 {{"x", "1"}}, 1);
    });
    std::vector<MetricFamilyData> f = registry.Collect();
    ASSERT_EQ(f.size(), 2u);
    EXPECT_EQ(f[0].name, "a_total");  // sorted by name
    EXPECT_EQ(f[0].help, "first");
    EXPECT_EQ(f[0].kind, MetricKind::kCounter);
    ASSERT_EQ(f[0].samples.size(), 2u);
    EXPECT_EQ(f[1].name, "z_gauge");
    EXPECT_EQ(f[1].samples[0].value, 2.5);
  }
  std::vector<MetricFamilyData> f = registry.Collect();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].samples.size(), 1u);  // b's sample is gone
  MetricsRegistry::Registration moved = std::move(a);
  a.Reset();  // empty after the move: does nothing
  EXPECT_EQ(registry.Collect().size(), 2u);
  moved.Reset();
  EXPECT_TRUE(registry.Collect().empty());
  EXPECT_EQ(runs, 3);
}

TEST(HttpServerTest, ServesTheRegistryInPrometheusTextFormat) {
  MetricsRegistry registry;
  std::atomic<int> requests{0};
  MetricsRegistry::Registration reg = registry.Add([&](MetricWriter* w) {
    w->Counter("downpour_test_requests_total", "Requests", {{"op", "PUSH"}},
               requests.load());
    w->Gauge("downpour_test_label_escape", "Escapes",
             {{"table", "a \"quoted\" name"}}, -1.5);
    HistogramData h;
    h.upper_bounds = {0.1, 1};
    h.counts = {1, 3};
    h.count = 4;
    h.sum = 12.25;
    w->Histogram("downpour_test_seconds", "Latency", {{"op", "PULL"}}, h);
  });
  auto http = MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(http.ok()) << http.status();
  ASSERT_GT((*http)->port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", (*http)->port());

  for (int round = 1; round <= 2; ++round) {
    requests.store(round * 10);
    auto body = HttpGet(address, "/metrics", absl::Seconds(10));
    ASSERT_TRUE(body.ok()) << body.status();
    auto m = ParseMetricsText(*body);
    ASSERT_TRUE(m.ok()) << m.status() << "\n" << *body;
    EXPECT_EQ(m->types.at("downpour_test_requests_total"), "counter");
    EXPECT_EQ(m->types.at("downpour_test_seconds"), "histogram");
    EXPECT_EQ(m->Sum("downpour_test_requests_total", {{"op", "PUSH"}}),
              round * 10);
    EXPECT_EQ(
        m->Sum("downpour_test_label_escape", {{"table", "a \"quoted\" name"}}),
        -1.5);
    EXPECT_EQ(m->Sum("downpour_test_seconds_bucket", {{"le", "0.1"}}), 1);
    EXPECT_EQ(m->Sum("downpour_test_seconds_bucket", {{"le", "1"}}), 3);
    EXPECT_EQ(m->Sum("downpour_test_seconds_bucket", {{"le", "+Inf"}}), 4);
    EXPECT_EQ(m->Sum("downpour_test_seconds_count"), 4);
    EXPECT_EQ(m->Sum("downpour_test_seconds_sum"), 12.25);
  }
  // The same text without HTTP.
  auto direct = ParseMetricsText(MetricsText(registry));
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->Sum("downpour_test_requests_total"), 20);

  // Another path is not served.
  auto other = HttpGet(address, "/other", absl::Seconds(10));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInternal)
      << other.status();
}

// Static TLS larger than the 100 KiB stacks civetweb asks for (as cuBLAS
// brings into ps_worker): glibc refuses such stacks unless http_server.cc
// raises them.
thread_local char big_tls[160 << 10];

TEST(HttpServerTest, StartsInAProcessWithLargeStaticTls) {
  big_tls[0] = 1;
  ASSERT_EQ(big_tls[0], 1);
  MetricsRegistry registry;
  auto http = MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(http.ok()) << http.status();
  auto body = HttpGet(absl::StrCat("127.0.0.1:", (*http)->port()), "/metrics",
                      absl::Seconds(10));
  EXPECT_TRUE(body.ok()) << body.status();
}

TEST(HttpServerTest, BadOrTakenAddressesAreRefused) {
  MetricsRegistry registry;
  EXPECT_EQ(MetricsHttpServer::Start("127.0.0.1", &registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MetricsHttpServer::Start("127.0.0.1:http", &registry).status().code(),
      absl::StatusCode::kInvalidArgument);
  auto first = MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsHttpServer::Start(
      absl::StrCat("127.0.0.1:", (*first)->port()), &registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  // Nothing listens on the port any more once the server is gone.
  const int port = (*first)->port();
  first->reset();
  auto gone =
      HttpGet(absl::StrCat("127.0.0.1:", port), "/metrics", absl::Seconds(5));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable)
      << gone.status();
}

TEST(ProcessMetricsTest, ReportsThisProcess) {
  MetricsRegistry registry;
  MetricsRegistry::Registration reg = AddProcessMetrics(&registry);
  auto m = ParseMetricsText(MetricsText(registry));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->Sum("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(m->Sum("process_open_fds"), 2);
  EXPECT_GE(m->Sum("process_cpu_seconds_total"), 0);
  const double now = absl::ToUnixSeconds(absl::Now());
  EXPECT_GT(m->Sum("process_start_time_seconds"), now - 3600);
  EXPECT_LE(m->Sum("process_start_time_seconds"), now + 1);
}

TEST(ScrapeTest, MalformedTextNamesTheLine) {
  auto m = ParseMetricsText("ok 1\nbroken{a=\"x 2\n");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("line 2"), absl::string_view::npos)
      << m.status();
}

}  // namespace
}  // namespace downpour
