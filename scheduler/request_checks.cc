#include "scheduler/request_checks.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/status_macros.h"

namespace downpour {
namespace {

bool NameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("._-:/@+=").find(c) != absl::string_view::npos;
}

// Endpoints are URLs or host:port: a name's characters, '*' (any port) and
// brackets (IPv6 hosts).
bool EndpointChar(char c) {
  return NameChar(c) || c == '*' || c == '[' || c == ']';
}

std::string Bytes(size_t n) {
  return n == 1 ? "1 byte" : absl::StrCat(n, " bytes");
}

absl::Status CheckString(absl::string_view what, absl::string_view s,
                         size_t max_bytes, bool may_be_empty,
                         bool (*allowed)(char)) {
  if (s.empty()) {
    if (may_be_empty) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("empty ", what));
  }
  if (s.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", Bytes(s.size()), ", at most ", max_bytes,
                     " ('", Printable(s, 40), "...')"));
  }
  for (size_t i = 0; i < s.size(); ++i) {
    if (!allowed(s[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s '%s' has character 0x%02x at byte %d; allowed are ASCII "
          "letters, digits and ._-:/@+=",
          what, Printable(s, 64), static_cast<unsigned char>(s[i]), i));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Printable(absl::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  if (s.size() > max_bytes) out += "...";
  return out;
}

bool TokensMatch(absl::string_view presented, absl::string_view expected) {
  return SecretsEqual(presented, expected);
}

absl::Status CheckName(absl::string_view what, absl::string_view name,
                       size_t max_bytes, bool may_be_empty) {
  return CheckString(what, name, max_bytes, may_be_empty, NameChar);
}

absl::Status CheckRegisterRequest(const proto::RegisterRequest& req) {
  const int role = static_cast<int>(req.role());
  if (req.role() == proto::ROLE_UNSPECIFIED) {
    return absl::InvalidArgumentError("register: no role");
  }
  if (!proto::NodeRole_IsValid(role)) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: unknown role ", role,
                     " (SERVER = 1, WORKER = 2, CLIENT = 3)"));
  }
  // A nameless node is allowed: it gets a fresh id every time it registers.
  DP_RETURN_IF_ERROR(CheckName("node name", req.name(), kMaxNodeNameBytes,
                               /*may_be_empty=*/true),
                     "register");
  const std::string who = absl::StrCat(
      "register ", proto::NodeRole_Name(req.role()), " '", req.name(), "'");
  if (req.role() == proto::SERVER && req.data_endpoint().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": a server needs a data endpoint"));
  }
  DP_RETURN_IF_ERROR(CheckString("data endpoint", req.data_endpoint(),
                                 kMaxEndpointBytes, true, EndpointChar),
                     who);
  DP_RETURN_IF_ERROR(CheckString("admin address", req.admin_address(),
                                 kMaxEndpointBytes, true, EndpointChar),
                     who);
  if (req.plugin_handlers_size() > kMaxPluginsPerNode) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ", req.plugin_handlers_size(),
                     " plugin handlers, at most ", kMaxPluginsPerNode));
  }
  for (const std::string& p : req.plugin_handlers()) {
    if (!absl::StartsWith(p, "plugin:")) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": plugin handler '", Printable(p, 64),
                       "' is not named plugin:<name>"));
    }
    DP_RETURN_IF_ERROR(
        CheckName("plugin handler name", p, kMaxHandlerNameBytes), who);
  }
  if (req.max_message_bytes() != 0 &&
      req.max_message_bytes() < kMinMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": a request limit of ", req.max_message_bytes(),
                     " bytes; 0 (unknown) or at least ", kMinMessageBytes));
  }
  if (req.job_token().size() > kMaxNameBytes * 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": a job token of ", Bytes(req.job_token().size())));
  }
  return absl::OkStatus();
}

absl::Status CheckTableStrings(const proto::TableSpec& spec) {
  DP_RETURN_IF_ERROR(CheckName("table name", spec.name(), kMaxNameBytes));
  const std::string table = absl::StrCat("table '", spec.name(), "'");
  // The count of vectors is ValidateTableShape's (scheduler/table_spec.h);
  // their names are checked here whatever the count, since each may be
  // large.
  for (const std::string& v : spec.vectors()) {
    DP_RETURN_IF_ERROR(CheckName("vector name", v, kMaxNameBytes), table);
  }
  DP_RETURN_IF_ERROR(CheckName("handler name", spec.handler().name(),
                               kMaxHandlerNameBytes, /*may_be_empty=*/true),
                     table);
  if (spec.handler().params_size() > kMaxHandlerParams) {
    return absl::InvalidArgumentError(
        absl::StrCat(table, ": ", spec.handler().params_size(),
                     " handler parameters, at most ", kMaxHandlerParams));
  }
  for (const auto& [name, value] : spec.handler().params()) {
    DP_RETURN_IF_ERROR(
        CheckName("handler parameter name", name, kMaxParamNameBytes), table);
  }
  return absl::OkStatus();
}

absl::Status CheckBarrierRequest(const proto::BarrierRequest& req,
                                 int max_nodes) {
  DP_RETURN_IF_ERROR(CheckName("barrier name", req.name(), kMaxNameBytes));
  if (req.count() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("barrier '", req.name(), "': count 0"));
  }
  if (req.count() > static_cast<uint32_t>(max_nodes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "barrier '", req.name(), "': count ", req.count(), ", more than the ",
        max_nodes, " nodes a cluster may have"));
  }
  return absl::OkStatus();
}

absl::Status CheckLbfgsState(const proto::LbfgsState& state) {
  if (state.table().empty()) return absl::OkStatus();
  DP_RETURN_IF_ERROR(
      CheckName("L-BFGS table name", state.table(), kMaxNameBytes));
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("L-BFGS state of table '", state.table(), "': ", what));
  };
  if (state.history() < 1 || state.history() > kMaxLbfgsHistory) {
    return bad(absl::StrCat("history ", state.history(), " not in [1, ",
                            kMaxLbfgsHistory, "]"));
  }
  if (state.pairs_size() > state.history()) {
    return bad(absl::StrCat(state.pairs_size(),
                            " pairs, more than the history ", state.history()));
  }
  if (state.iteration() < 0 || state.round() < 0 || state.evaluations() < 0) {
    return bad("negative iteration, round or evaluations");
  }
  uint32_t used = 0;  // history <= 29 slots fit in the bits
  for (const proto::LbfgsState::Pair& p : state.pairs()) {
    if (p.slot() < 0 || p.slot() >= state.history() ||
        (used & (1u << p.slot())) != 0) {
      return bad(
          absl::StrCat("pair slot ", p.slot(), " out of range or repeated"));
    }
    used |= 1u << p.slot();
    if (!std::isfinite(p.rho())) return bad("a pair's rho is not finite");
  }
  for (double v : {state.f(), state.gg(), state.step(), state.xx(),
                   state.gamma(), state.seconds()}) {
    if (!std::isfinite(v)) return bad("a scalar is not finite");
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> CheckWait(absl::string_view what,
                                         int64_t timeout_ms,
                                         absl::Duration fallback) {
  if (timeout_ms <= 0) return fallback;
  if (timeout_ms > absl::ToInt64Milliseconds(kMaxWait)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": timeout of ", timeout_ms, " ms, at most ",
                     absl::ToInt64Milliseconds(kMaxWait)));
  }
  return absl::Milliseconds(timeout_ms);
}

absl::Status CheckTableFailures(const proto::AckEpochRequest& req) {
  if (req.failed_tables_size() > kMaxTableFailures) {
    return absl::InvalidArgumentError(
        absl::StrCat("ack epoch: ", req.failed_tables_size(),
                     " table failures, at most ", kMaxTableFailures));
  }
  for (const proto::TableFailure& f : req.failed_tables()) {
    if (f.code() <= 0 ||
        f.code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ack epoch: table ", f.table_id(),
                       " reported with error code ", f.code()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMapGrowth(absl::string_view what, size_t map_bytes,
                            size_t added_bytes, size_t max_map_bytes) {
  if (map_bytes + added_bytes <= max_map_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": the cluster map would grow from ", map_bytes, " to ",
      map_bytes + added_bytes, " bytes, above its cap of ", max_map_bytes,
      " (kept far below gRPC's 4 MiB message limit, so that every node can "
      "still fetch it)"));
}

}  // namespace downpour
