// Request counts, error counts and latency histograms per (operation,
// table), kept by the threads that serve requests and read by metrics
// scrapes, without locks on the serving side.
//
//   RequestStats stats;
//   const int64_t start = absl::GetCurrentTimeNanos();
//   ... serve the request ...
//   stats.Record(op, table, /*error=*/false,
//                absl::GetCurrentTimeNanos() - start);
//
// Cells live in a fixed array and are claimed on first use with a
// compare-and-swap, so recording is a few relaxed atomic adds. At most
// kMaxCells distinct pairs are kept (a hostile peer naming random tables
// cannot grow memory or label sets); later pairs are counted in one
// overflow cell (Cell::overflow).
//
// Thread-safe: Record from any number of threads, Snapshot from any
// thread. A snapshot taken while requests are recorded is not atomic
// across fields (a request may show in `requests` and not yet in its
// latency bucket), as Prometheus clients usually are.
#ifndef DOWNPOUR_METRICS_REQUEST_STATS_H_
#define DOWNPOUR_METRICS_REQUEST_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "metrics/registry.h"

namespace downpour {

class RequestStats {
 public:
  static constexpr int kMaxCells = 256;
  // Latency bucket bounds in seconds, from 10 us to 10 s.
  static const std::vector<double>& LatencyBounds();

  RequestStats();
  RequestStats(const RequestStats&) = delete;
  RequestStats& operator=(const RequestStats&) = delete;

  void Record(uint32_t op, uint32_t table, bool error, int64_t nanos);

  struct Cell {
    uint32_t op = 0;
    uint32_t table = 0;
    bool overflow = false;  // requests of pairs beyond kMaxCells
    uint64_t requests = 0;
    uint64_t errors = 0;
    HistogramData latency;  // seconds
  };
  // Every cell used so far.
  std::vector<Cell> Snapshot() const;

 private:
  static constexpr int kBuckets = 16;  // LatencyBounds().size()
  struct Slot {
    std::atomic<uint64_t> key{0};  // 0: free; else (op << 32 | table) + 1
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> nanos{0};
    std::array<std::atomic<uint64_t>, kBuckets> buckets{};  // not cumulative
  };
  Slot* Find(uint64_t key);

  std::unique_ptr<Slot[]> slots_;
  Slot overflow_;
};

}  // namespace downpour

#endif  // DOWNPOUR_METRICS_REQUEST_STATS_H_
