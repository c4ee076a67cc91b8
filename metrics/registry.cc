#include "metrics/registry.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace downpour {

MetricSample& MetricWriter::Add(absl::string_view name, absl::string_view help,
                                MetricKind kind, MetricLabels labels) {
  auto [it, inserted] = families_.try_emplace(std::string(name));
  MetricFamilyData& f = it->second;
  if (inserted) {
    f.name = std::string(name);
    f.help = std::string(help);
    f.kind = kind;
  }
  f.samples.emplace_back();
  f.samples.back().labels = std::move(labels);
  return f.samples.back();
}

void MetricWriter::Counter(absl::string_view name, absl::string_view help,
                           MetricLabels labels, double value) {
  Add(name, help, MetricKind::kCounter, std::move(labels)).value = value;
}

void MetricWriter::Gauge(absl::string_view name, absl::string_view help,
                         MetricLabels labels, double value) {
  Add(name, help, MetricKind::kGauge, std::move(labels)).value = value;
}

void MetricWriter::Histogram(absl::string_view name, absl::string_view help,
                             MetricLabels labels, HistogramData data) {
  Add(name, help, MetricKind::kHistogram, std::move(labels)).histogram =
      std::move(data);
}

std::vector<MetricFamilyData> MetricWriter::Take() {
  std::vector<MetricFamilyData> out;
  out.reserve(families_.size());
  for (auto& [name, f] : families_) out.push_back(std::move(f));
  families_.clear();
  return out;
}

MetricsRegistry::Registration& MetricsRegistry::Registration::operator=(
    Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    id_ = other.id_;
    other.registry_ = nullptr;
  }
  return *this;
}

void MetricsRegistry::Registration::Reset() {
  if (registry_ != nullptr) registry_->Remove(id_);
  registry_ = nullptr;
}

MetricsRegistry::Registration MetricsRegistry::Add(Collector collector) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  collectors_.emplace(id, std::move(collector));
  return Registration(this, id);
}

void MetricsRegistry::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  collectors_.erase(id);
}

std::vector<MetricFamilyData> MetricsRegistry::Collect() const {
  MetricWriter writer;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, collector] : collectors_) collector(&writer);
  return writer.Take();
}

namespace {

// Fields of /proc/self/stat after the command name (field 3 on).
std::vector<std::string> ProcSelfStat() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 > line.size()) return {};
  return absl::StrSplit(line.substr(paren + 2), ' ');
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime") {
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

MetricsRegistry::Registration AddProcessMetrics(MetricsRegistry* registry) {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double boot = BootTimeSeconds();
  return registry->Add([ticks, page, boot](MetricWriter* w) {
    const std::vector<std::string> f = ProcSelfStat();
    // utime, stime are fields 14 and 15, starttime 22, rss 24 (1-based, of
    // the whole line); f starts at field 3.
    if (f.size() > 21) {
      double utime = 0, stime = 0, start = 0, rss = 0;
      (void)absl::SimpleAtod(f[11], &utime);
      (void)absl::SimpleAtod(f[12], &stime);
      (void)absl::SimpleAtod(f[19], &start);
      (void)absl::SimpleAtod(f[21], &rss);
      w->Counter("process_cpu_seconds_total",
                 "User and system CPU time spent in seconds", {},
                 (utime + stime) / ticks);
      w->Gauge("process_resident_memory_bytes", "Resident memory size in bytes",
               {}, rss * page);
      w->Gauge("process_start_time_seconds",
               "Start time of the process since unix epoch in seconds", {},
               boot + start / ticks);
    }
    int fds = 0;
    if (DIR* d = opendir("/proc/self/fd"); d != nullptr) {
      while (readdir(d) != nullptr) ++fds;
      closedir(d);
      fds -= 3;  // ".", ".." and the directory's own descriptor
    }
    w->Gauge("process_open_fds", "Number of open file descriptors", {}, fds);
  });
}

}  // namespace downpour
