#include "scheduler/checkpoints.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace downpour {
namespace {

// Calls `call(i)` for every server at once and returns their results.
template <typename T, typename F>
std::vector<absl::StatusOr<T>> ForAll(size_t n, F call) {
  std::vector<absl::StatusOr<T>> out(n, absl::UnknownError("not called"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] { out[i] = call(i); });
  }
  for (auto& t : threads) t.join();
  return out;
}

absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::Milliseconds(1));
}

// Checks that `ranges` (sorted by begin) tile [0, end) of `spec`.
absl::Status CheckTiling(const proto::TableSpec& spec,
                         const std::vector<proto::CheckpointRange>& ranges) {
  const Key end = spec.kind() == proto::DENSE ? spec.num_keys() : kKeySpaceEnd;
  Key at = 0;
  for (const proto::CheckpointRange& r : ranges) {
    if (r.begin() != at) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", spec.name(), "': keys [", at, ", ", r.begin(),
          ") are in no server's part (a range moved during the checkpoint?)"));
    }
    at = r.end();
  }
  if (at != end) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", spec.name(), "': keys [", at, ", ", end,
                     ") are in no server's part"));
  }
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<ServerAdminClient> AdminClients::Get(
    const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<ServerAdminClient>& c = clients_[address];
  if (c == nullptr) c = std::make_shared<ServerAdminClient>(address, auth_);
  return c;
}

absl::StatusOr<proto::CheckpointManifest> RunCheckpoint(
    const CheckpointPlan& plan, AdminClients* clients) {
  const size_t n = plan.servers.size();
  int64_t clock = -1;
  if (plan.bsp) {
    auto probes = ForAll<proto::CheckpointPartReply>(n, [&](size_t i) {
      proto::CheckpointPartRequest req;
      req.set_mode(proto::CheckpointPartRequest::PROBE);
      req.set_checkpoint_id(plan.id);
      return clients->Get(plan.servers[i].admin_address)
          ->CheckpointPart(req, Left(plan.deadline));
    });
    for (size_t i = 0; i < n; ++i) {
      DP_RETURN_IF_ERROR(probes[i].status(), "server '", plan.servers[i].name,
                         "'");
      clock = std::max(clock, probes[i]->max_clock());
    }
    if (clock >= 0) clock += plan.clock_offset;
  }
  auto parts = ForAll<proto::CheckpointPartReply>(n, [&](size_t i) {
    proto::CheckpointPartRequest req;
    req.set_mode(proto::CheckpointPartRequest::WRITE);
    req.set_checkpoint_id(plan.id);
    req.set_clock(clock);
    req.set_timeout_ms(absl::ToInt64Milliseconds(Left(plan.deadline)));
    // The server's own deadline ends first, so that its answer (naming
    // what it waited for) arrives rather than ours.
    return clients->Get(plan.servers[i].admin_address)
        ->CheckpointPart(req, Left(plan.deadline) + absl::Seconds(5));
  });
  // A part past the clock first: that attempt is simply retried.
  for (size_t i = 0; i < n; ++i) {
    if (parts[i].status().code() == absl::StatusCode::kAborted) {
      return Annotate(parts[i].status(),
                      absl::StrCat("server '", plan.servers[i].name, "'"));
    }
  }
  std::map<TableId, std::vector<proto::CheckpointRange>> by_table;
  proto::CheckpointManifest manifest;
  manifest.set_id(plan.id);
  manifest.set_clock(clock);
  for (size_t i = 0; i < n; ++i) {
    DP_RETURN_IF_ERROR(parts[i].status(), "server '", plan.servers[i].name,
                       "'");
    for (const proto::CheckpointRange& r : parts[i]->ranges()) {
      by_table[r.table_id()].push_back(r);
      manifest.set_rows(manifest.rows() + r.rows());
      manifest.set_bytes(manifest.bytes() + r.bytes());
    }
  }
  for (const proto::TableSpec& spec : plan.tables) {
    std::vector<proto::CheckpointRange>& ranges = by_table[spec.id()];
    std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
      return a.begin() < b.begin();
    });
    DP_RETURN_IF_ERROR(CheckTiling(spec, ranges), "checkpoint ", plan.id);
    proto::CheckpointManifest::Table* t = manifest.add_tables();
    *t->mutable_spec() = spec;
    for (const auto& r : ranges) *t->add_ranges() = r;
  }
  return manifest;
}

void DropCheckpoints(const std::vector<CheckpointServer>& servers,
                     const proto::DropCheckpointsRequest& req,
                     AdminClients* clients) {
  auto done =
      ForAll<bool>(servers.size(), [&](size_t i) -> absl::StatusOr<bool> {
        DP_RETURN_IF_ERROR(clients->Get(servers[i].admin_address)
                               ->DropCheckpoints(req, absl::Seconds(30)));
        return true;
      });
  for (size_t i = 0; i < servers.size(); ++i) {
    if (!done[i].ok()) {
      DP_LOG(WARNING) << "server '" << servers[i].name
                      << "': " << done[i].status();
    }
  }
}

std::vector<proto::CheckpointRange> RangesOf(
    const proto::CheckpointManifest& manifest, const std::string& name) {
  std::vector<proto::CheckpointRange> out;
  for (const auto& t : manifest.tables()) {
    for (const auto& r : t.ranges()) {
      if (r.server() == name) out.push_back(r);
    }
  }
  return out;
}

std::vector<std::string> ServersOf(const proto::CheckpointManifest& manifest) {
  std::set<std::string> names;
  for (const auto& t : manifest.tables()) {
    for (const auto& r : t.ranges()) names.insert(r.server());
  }
  return {names.begin(), names.end()};
}

}  // namespace downpour
