#include "metrics/request_stats.h"

namespace downpour {
namespace {

// Upper bounds in nanoseconds, matching LatencyBounds().
constexpr int64_t kBoundNanos[] = {
    10'000,      25'000,      50'000,        100'000,
    250'000,     500'000,     1'000'000,     2'500'000,
    5'000'000,   10'000'000,  25'000'000,    50'000'000,
    100'000'000, 250'000'000, 1'000'000'000, 10'000'000'000};

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

const std::vector<double>& RequestStats::LatencyBounds() {
  static const std::vector<double> bounds = [] {
    std::vector<double> b;
    for (int64_t n : kBoundNanos) b.push_back(static_cast<double>(n) * 1e-9);
    return b;
  }();
  return bounds;
}

RequestStats::RequestStats() : slots_(new Slot[kMaxCells]) {
  static_assert(sizeof(kBoundNanos) / sizeof(kBoundNanos[0]) == kBuckets,
                "one count per bound; larger values are only in the total");
}

RequestStats::Slot* RequestStats::Find(uint64_t key) {
  // Open addressing with linear probing; a slot once claimed keeps its key
  // for the life of the object, so readers never see a key change.
  const size_t start = Mix(key) % kMaxCells;
  for (size_t i = 0; i < kMaxCells; ++i) {
    Slot& s = slots_[(start + i) % kMaxCells];
    uint64_t k = s.key.load(std::memory_order_acquire);
    if (k == key) return &s;
    if (k == 0) {
      if (s.key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
        return &s;
      }
      if (k == key) return &s;  // another thread claimed it for this pair
    }
  }
  return &overflow_;
}

void RequestStats::Record(uint32_t op, uint32_t table, bool error,
                          int64_t nanos) {
  const uint64_t key = (static_cast<uint64_t>(op) << 32 | table) + 1;
  Slot* s = Find(key);
  s->requests.fetch_add(1, std::memory_order_relaxed);
  if (error) s->errors.fetch_add(1, std::memory_order_relaxed);
  if (nanos < 0) nanos = 0;
  s->nanos.fetch_add(static_cast<uint64_t>(nanos), std::memory_order_relaxed);
  int b = 0;
  while (b < kBuckets && nanos > kBoundNanos[b]) ++b;
  if (b < kBuckets) s->buckets[b].fetch_add(1, std::memory_order_relaxed);
}

std::vector<RequestStats::Cell> RequestStats::Snapshot() const {
  std::vector<Cell> out;
  auto read = [&out](const Slot& s, bool overflow) {
    const uint64_t key = s.key.load(std::memory_order_acquire);
    Cell c;
    c.overflow = overflow;
    if (!overflow) {
      c.op = static_cast<uint32_t>((key - 1) >> 32);
      c.table = static_cast<uint32_t>(key - 1);
    }
    c.requests = s.requests.load(std::memory_order_relaxed);
    if (overflow && c.requests == 0) return;
    c.errors = s.errors.load(std::memory_order_relaxed);
    c.latency.upper_bounds = LatencyBounds();
    uint64_t cumulative = 0;
    for (int b = 0; b < kBuckets; ++b) {
      cumulative += s.buckets[b].load(std::memory_order_relaxed);
      c.latency.counts.push_back(cumulative);
    }
    // The total is the request count, so that the +Inf bucket is never
    // below the finite ones even while requests are being recorded.
    c.latency.count = std::max(c.requests, cumulative);
    c.latency.sum =
        static_cast<double>(s.nanos.load(std::memory_order_relaxed)) * 1e-9;
    out.push_back(std::move(c));
  };
  for (int i = 0; i < kMaxCells; ++i) {
    if (slots_[i].key.load(std::memory_order_acquire) != 0)
      read(slots_[i], false);
  }
  read(overflow_, true);
  return out;
}

}  // namespace downpour
