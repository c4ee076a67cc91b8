// Metrics as daemons export them: a registry of collectors, each a function
// that writes the current value of some figures when metrics are scraped.
//
// Figures are read at scrape time from the counters the components keep
// anyway (atomics, stats protos), so that serving requests pays nothing
// for metrics; a component hands its collector to the registry it is given
// in its options and keeps the Registration for as long as the collector
// may run:
//
//   MetricsRegistry registry;             // main() owns it
//   auto reg = registry.Add([this](MetricWriter* w) {
//     w->Counter("downpour_server_bytes_received_total",
//                "Data-plane bytes received", {}, counters_.bytes_in.load());
//   });
//   ... MetricsHttpServer::Start("0.0.0.0:9100", &registry) ...
//
// Names follow Prometheus' conventions (downpour_ prefix, base units,
// counters ending in _total). The exposition (text format, HTTP) is
// metrics/http_server.h's job, with prometheus-cpp; this header knows
// nothing of it.
//
// Thread-safe. Collectors run one scrape at a time, on the scraping
// thread, with the registry's lock held: they must not call the registry.
#ifndef DOWNPOUR_METRICS_REGISTRY_H_
#define DOWNPOUR_METRICS_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace downpour {

// A sample's labels, in the order given: {{"op", "PUSH"}, {"table", "w"}}.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A cumulative histogram: counts[i] observations <= upper_bounds[i]
// (non-decreasing), `count` of them in all (the +Inf bucket), `sum` their
// total.
struct HistogramData {
  std::vector<double> upper_bounds;
  std::vector<uint64_t> counts;
  uint64_t count = 0;
  double sum = 0;
};

enum class MetricKind { kCounter, kGauge, kHistogram };

struct MetricSample {
  MetricLabels labels;
  double value = 0;         // counters and gauges
  HistogramData histogram;  // histograms
};

struct MetricFamilyData {
  std::string name;
  std::string help;
  MetricKind kind = MetricKind::kGauge;
  std::vector<MetricSample> samples;
};

// What a collector writes to. Samples of one name form one family (its
// kind and help are the first sample's). Not thread-safe.
class MetricWriter {
 public:
  void Counter(absl::string_view name, absl::string_view help,
               MetricLabels labels, double value);
  void Gauge(absl::string_view name, absl::string_view help,
             MetricLabels labels, double value);
  void Histogram(absl::string_view name, absl::string_view help,
                 MetricLabels labels, HistogramData data);

  // The families written so far, sorted by name; the writer is left empty.
  std::vector<MetricFamilyData> Take();

 private:
  MetricSample& Add(absl::string_view name, absl::string_view help,
                    MetricKind kind, MetricLabels labels);
  std::map<std::string, MetricFamilyData> families_;
};

class MetricsRegistry {
 public:
  using Collector = std::function<void(MetricWriter*)>;

  // Removes its collector when destroyed or Reset (waiting for a scrape
  // that is running it). Movable; an empty one does nothing.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept { *this = std::move(other); }
    Registration& operator=(Registration&& other) noexcept;
    ~Registration() { Reset(); }
    void Reset();

   private:
    friend class MetricsRegistry;
    Registration(MetricsRegistry* registry, uint64_t id)
        : registry_(registry), id_(id) {}
    MetricsRegistry* registry_ = nullptr;
    uint64_t id_ = 0;
  };

  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  // REQUIRES: every Registration is gone.
  ~MetricsRegistry() = default;

  // `collector` runs at every scrape until the Registration goes.
  Registration Add(Collector collector) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs every collector; their families, sorted by name.
  std::vector<MetricFamilyData> Collect() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Remove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

// Adds the standard process_* figures of this process (CPU seconds,
// resident memory, open file descriptors, start time), read from /proc.
MetricsRegistry::Registration AddProcessMetrics(MetricsRegistry* registry);

}  // namespace downpour

#endif  // DOWNPOUR_METRICS_REGISTRY_H_
