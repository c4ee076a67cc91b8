#include "metrics/http_server.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <sstream>

#include "CivetServer.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

// civetweb creates its threads with a fixed 100 KiB stack, and glibc
// refuses (EINVAL) a stack that cannot hold the process's static TLS: in
// ps_worker, cuBLAS alone brings 110 KiB of it, so the metrics endpoint
// could not start there. Stacks asked for below kMinThreadStack get that
// much instead; the rest pass unchanged to glibc's. This definition
// overrides libc's for the shared libraries of the program (civetweb's
// call included), because the executable and its libraries come before
// libc in symbol lookup.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr,
                                         size_t stacksize) {
  constexpr size_t kMinThreadStack = size_t{1} << 20;
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real =
      reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (real == nullptr) return ENOSYS;
  return real(attr, std::max(stacksize, kMinThreadStack));
}

namespace downpour {
namespace {

prometheus::MetricFamily Convert(const MetricFamilyData& f) {
  prometheus::MetricFamily out;
  out.name = f.name;
  out.help = f.help;
  switch (f.kind) {
    case MetricKind::kCounter:
      out.type = prometheus::MetricType::Counter;
      break;
    case MetricKind::kGauge:
      out.type = prometheus::MetricType::Gauge;
      break;
    case MetricKind::kHistogram:
      out.type = prometheus::MetricType::Histogram;
      break;
  }
  for (const MetricSample& s : f.samples) {
    prometheus::ClientMetric m;
    for (const auto& [name, value] : s.labels) m.label.push_back({name, value});
    switch (f.kind) {
      case MetricKind::kCounter:
        m.counter.value = s.value;
        break;
      case MetricKind::kGauge:
        m.gauge.value = s.value;
        break;
      case MetricKind::kHistogram: {
        const HistogramData& h = s.histogram;
        m.histogram.sample_count = h.count;
        m.histogram.sample_sum = h.sum;
        for (size_t i = 0; i < h.upper_bounds.size() && i < h.counts.size();
             ++i) {
          m.histogram.bucket.push_back({h.counts[i], h.upper_bounds[i]});
        }
        // prometheus-cpp writes the last bucket as le="+Inf".
        m.histogram.bucket.push_back(
            {h.count, std::numeric_limits<double>::infinity()});
        break;
      }
    }
    out.metric.push_back(std::move(m));
  }
  return out;
}

std::vector<prometheus::MetricFamily> ConvertAll(
    const MetricsRegistry& registry) {
  std::vector<prometheus::MetricFamily> out;
  for (const MetricFamilyData& f : registry.Collect()) {
    out.push_back(Convert(f));
  }
  return out;
}

class RegistryCollectable final : public prometheus::Collectable {
 public:
  explicit RegistryCollectable(const MetricsRegistry* registry)
      : registry_(registry) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return ConvertAll(*registry_);
  }

 private:
  const MetricsRegistry* const registry_;
};

// civetweb explains a failed start only through its log callback.
absl::Mutex civet_log_mu;
std::string* civet_last_error ABSL_GUARDED_BY(civet_log_mu) = nullptr;

int CivetLog(const mg_connection*, const char* message) {
  absl::MutexLock lock(&civet_log_mu);
  if (civet_last_error == nullptr) civet_last_error = new std::string;
  *civet_last_error = message;
  return 1;  // handled: civetweb does not print it
}

std::string CivetLastError() {
  absl::MutexLock lock(&civet_log_mu);
  return civet_last_error != nullptr ? *civet_last_error : "";
}

class HttpServerImpl final : public MetricsHttpServer {
 public:
  HttpServerImpl(std::unique_ptr<prometheus::Exposer> exposer,
                 std::shared_ptr<RegistryCollectable> collectable, int port)
      : exposer_(std::move(exposer)),
        collectable_(std::move(collectable)),
        port_(port) {}
  ~HttpServerImpl() override {
    // Stops civetweb's threads before the collectable goes.
    exposer_.reset();
  }
  int port() const override { return port_; }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<RegistryCollectable> collectable_;
  const int port_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen_address, const MetricsRegistry* registry) {
  const size_t colon = listen_address.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen_address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics listen address '", listen_address, "': want host:port"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb threads: two answer scrapes (Prometheus scrapes rarely).
    static CivetCallbacks* callbacks = [] {
      auto* c = new CivetCallbacks;
      c->log_message = CivetLog;
      return c;
    }();
    exposer =
        std::make_unique<prometheus::Exposer>(listen_address, 2, callbacks);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ",
                                               listen_address, ": ", e.what(),
                                               " ", CivetLastError()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen_address));
  }
  auto collectable = std::make_shared<RegistryCollectable>(registry);
  exposer->RegisterCollectable(collectable);
  return std::unique_ptr<MetricsHttpServer>(
      new HttpServerImpl(std::move(exposer), std::move(collectable), ports[0]));
}

std::string MetricsText(const MetricsRegistry& registry) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, ConvertAll(registry));
  return out.str();
}

}  // namespace downpour
