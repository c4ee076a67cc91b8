// Reading a metrics endpoint back: an HTTP GET over a plain socket and a
// parser for Prometheus' text format. For tests that scrape live daemons
// and for quick checks; not a Prometheus client.
//
//   DP_ASSIGN_OR_RETURN(std::string text, HttpGet("127.0.0.1:9100", "/metrics",
//                                                absl::Seconds(5)));
//   DP_ASSIGN_OR_RETURN(ScrapedMetrics m, ParseMetricsText(text));
//   double pushes = m.Sum("downpour_server_requests_total", {{"op", "push"}});
#ifndef DOWNPOUR_METRICS_SCRAPE_H_
#define DOWNPOUR_METRICS_SCRAPE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace downpour {

// The body of GET http://<address><path> (address "host:port", IPv4 or a
// name). kUnavailable if it cannot connect, kDeadlineExceeded after
// `timeout`, kInternal for a status other than 200 (with the status line).
absl::StatusOr<std::string> HttpGet(const std::string& address,
                                    const std::string& path,
                                    absl::Duration timeout);

struct ScrapedSample {
  std::string name;  // e.g. "x_bucket" for a histogram's bucket
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct ScrapedMetrics {
  std::vector<ScrapedSample> samples;
  std::map<std::string, std::string> types;  // family name -> "counter", ...

  // The sum of the samples named `name` whose labels include every one of
  // `match` (all of them when `match` is empty); 0 when none does.
  double Sum(const std::string& name,
             const std::map<std::string, std::string>& match = {}) const;
  // How many samples are named `name` and match.
  int Count(const std::string& name,
            const std::map<std::string, std::string>& match = {}) const;
};

// kInvalidArgument naming the line for text that is not the format.
absl::StatusOr<ScrapedMetrics> ParseMetricsText(const std::string& text);

}  // namespace downpour

#endif  // DOWNPOUR_METRICS_SCRAPE_H_
