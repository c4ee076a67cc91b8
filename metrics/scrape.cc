#include "metrics/scrape.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace downpour {
namespace {

// Waits until `fd` is ready for `events` or `deadline` passes.
absl::Status WaitFd(int fd, short events, absl::Time deadline,
                    const std::string& what) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0)
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat(what, ": ", std::strerror(errno)));
    }
  }
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& address,
                                    const std::string& path,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what = absl::StrCat("GET http://", address, path);
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": want host:port"));
  }
  const std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); e != 0) {
    return absl::UnavailableError(absl::StrCat(what, ": ", gai_strerror(e)));
  }
  int fd =
      ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return absl::UnavailableError(
        absl::StrCat(what, ": socket: ", std::strerror(errno)));
  }
  const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  auto fail = [&](absl::Status s) {
    ::close(fd);
    return s;
  };
  if (rc != 0 && errno != EINPROGRESS) {
    return fail(absl::UnavailableError(
        absl::StrCat(what, ": connect: ", std::strerror(errno))));
  }
  if (absl::Status s = WaitFd(fd, POLLOUT, deadline, what); !s.ok())
    return fail(s);
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return fail(absl::UnavailableError(
        absl::StrCat(what, ": connect: ", std::strerror(err))));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address,
                   "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    if (absl::Status s = WaitFd(fd, POLLOUT, deadline, what); !s.ok())
      return fail(s);
    const ssize_t n =
        ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return fail(absl::UnavailableError(
          absl::StrCat(what, ": send: ", std::strerror(errno))));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[16384];
  while (true) {
    if (absl::Status s = WaitFd(fd, POLLIN, deadline, what); !s.ok())
      return fail(s);
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return fail(absl::UnavailableError(
          absl::StrCat(what, ": recv: ", std::strerror(errno))));
    }
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (body == std::string::npos || !absl::StrContains(status_line, " 200")) {
    return absl::InternalError(absl::StrCat(what, ": ", status_line));
  }
  return response.substr(body + 4);
}

double ScrapedMetrics::Sum(
    const std::string& name,
    const std::map<std::string, std::string>& match) const {
  double sum = 0;
  for (const ScrapedSample& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      ok = ok && it != s.labels.end() && it->second == v;
    }
    if (ok) sum += s.value;
  }
  return sum;
}

int ScrapedMetrics::Count(
    const std::string& name,
    const std::map<std::string, std::string>& match) const {
  int n = 0;
  for (const ScrapedSample& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      ok = ok && it != s.labels.end() && it->second == v;
    }
    n += ok;
  }
  return n;
}

absl::StatusOr<ScrapedMetrics> ParseMetricsText(const std::string& text) {
  ScrapedMetrics out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", line_no, " (", line, "): ", why));
    };
    if (line.empty()) continue;
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 2) return bad("want '# TYPE name type'");
      out.types[parts[0]] = parts[1];
      continue;
    }
    if (line[0] == '#') continue;
    ScrapedSample s;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) return bad("no value");
    absl::string_view value = line.substr(space + 1);
    if (brace != absl::string_view::npos && brace < space) {
      s.name = std::string(line.substr(0, brace));
      const size_t close = line.rfind('}');
      if (close == absl::string_view::npos || close < brace)
        return bad("unclosed labels");
      absl::string_view labels = line.substr(brace + 1, close - brace - 1);
      // name="value" pairs; values may hold escaped quotes and commas.
      size_t i = 0;
      while (i < labels.size()) {
        const size_t eq = labels.find('=', i);
        if (eq == absl::string_view::npos || eq + 1 >= labels.size() ||
            labels[eq + 1] != '"') {
          return bad("bad label");
        }
        std::string key(absl::StripAsciiWhitespace(labels.substr(i, eq - i)));
        std::string v;
        size_t j = eq + 2;
        for (; j < labels.size() && labels[j] != '"'; ++j) {
          if (labels[j] == '\\' && j + 1 < labels.size()) {
            ++j;
            v += labels[j] == 'n' ? '\n' : labels[j];
          } else {
            v += labels[j];
          }
        }
        if (j >= labels.size()) return bad("unterminated label value");
        s.labels[key] = v;
        i = j + 1;
        if (i < labels.size() && labels[i] == ',') ++i;
      }
    } else {
      s.name = std::string(line.substr(0, space));
    }
    if (value == "+Inf") {
      s.value = INFINITY;
    } else if (value == "-Inf") {
      s.value = -INFINITY;
    } else if (value == "NaN") {
      s.value = NAN;
    } else if (!absl::SimpleAtod(value, &s.value)) {
      return bad("bad value");
    }
    out.samples.push_back(std::move(s));
  }
  return out;
}

}  // namespace downpour
