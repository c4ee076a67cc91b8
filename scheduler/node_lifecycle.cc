#include "scheduler/node_lifecycle.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/types.h"
#include "scheduler/request_checks.h"

namespace downpour {

absl::Status NodeLifecycle::Register(SchedulerMutex& lock,
                                     const proto::RegisterRequest& req,
                                     proto::RegisterReply* reply) {
  if (req.role() == proto::WORKER) {
    if (std::string why = checkpoints_->WorkersHeldBack(); !why.empty()) {
      return absl::UnavailableError(
          absl::StrCat("register worker '", req.name(), "': ", why));
    }
  }
  proto::NodeInfo* node = members_->Registered(req);
  if (Membership::SameProcess(node, req)) {
    // The same process again: a retry whose reply was lost (e.g. the
    // scheduler restarted meanwhile). It keeps what it got.
    members_->Heard(node->id(), absl::Now());
    return FinishRegister(lock, *node, job_->RankOf(node->id()),
                          durable_->version(), reply);
  }
  DP_RETURN_IF_ERROR(members_->CheckRoom(req, node));
  if (node != nullptr && node->state() == proto::ALIVE) {
    if (req.incarnation() == 0 || req.incarnation() == node->incarnation()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "register: node '", req.name(), "' is alive as id ", node->id()));
    }
    // The same name from a new process: the old one is gone (a pod
    // restarted faster than its heartbeats expired). Fail it over now.
    DP_LOG(WARNING) << "node '" << req.name() << "' (id " << node->id()
                    << ") registered again from a new process; the old "
                    << "one is declared dead";
    members_->MarkDead(node);
    if (node->role() == proto::SERVER) tables_->RemoveDeadServer(node->id());
  }
  // A server registering again as a new process has lost its memory.
  const bool new_incarnation = node != nullptr &&
                               node->role() == proto::SERVER &&
                               req.incarnation() != node->incarnation();
  int rank = -1;
  if (req.role() == proto::WORKER) {
    DP_ASSIGN_OR_RETURN(rank, job_->GrantRank(req, node));
    DP_RETURN_IF_ERROR(job_->TakeOverRank(rank, req.name()));
  }
  if (node == nullptr) node = members_->Add(req.previous_id());
  checkpoints_->ClearRolledBack(node->id());
  if (rank >= 0) job_->Assign(rank, node->id());
  reply->set_rank(rank);
  *reply->mutable_job() = job_->config();
  members_->Admit(node, req, absl::Now());
  // What it could not hold before may fit the new process.
  tables_->ForgetRefusals(node->id());
  if (new_incarnation && tables_->ForgetServerData(node->id())) {
    checkpoints_->DataLost(*node);
  }
  if (req.role() == proto::SERVER) tables_->RefillWithinRoom();
  tables_->ResolvePending();
  map_->set_epoch(map_->epoch() + 1);
  DP_LOG(INFO) << proto::NodeRole_Name(req.role()) << " '" << req.name()
               << "' registered as node " << node->id() << " ("
               << req.data_endpoint() << "), epoch " << map_->epoch();
  return FinishRegister(lock, *node, rank, durable_->Commit(), reply);
}

absl::Status NodeLifecycle::FinishRegister(SchedulerMutex& lock,
                                           const proto::NodeInfo& node,
                                           int rank, uint64_t version,
                                           proto::RegisterReply* reply) {
  DP_RETURN_IF_ERROR(durable_->AwaitDurable(lock, version), "register '",
                     node.name(), "'");
  reply->set_node_id(node.id());
  reply->set_rank(rank);
  *reply->mutable_job() = job_->config();
  reply->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(heartbeat_interval_));
  if (rank >= 0) {
    reply->set_start_clock(job_->clock(rank));
    reply->set_gating_clock(job_->GatingClock());
    for (const std::string& b : barriers_->passed()) {
      reply->add_passed_barriers(b);
    }
  }
  reply->set_restored_from(checkpoints_->restored_from());
  *reply->mutable_map() = durable_->published();
  return absl::OkStatus();
}

absl::Status NodeLifecycle::Leave(SchedulerMutex& lock,
                                  const proto::LeaveRequest& req) {
  proto::NodeInfo* node = members_->Find(req.node_id());
  if (node == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("leave: unknown node ", req.node_id()));
  }
  if (node->role() == proto::SERVER) return ServerLeaves(lock, node, req);
  if (node->role() != proto::WORKER) {
    return absl::InvalidArgumentError(
        absl::StrCat("leave: node ", node->id(), " ('", node->name(),
                     "') is not a worker or a server"));
  }
  if (node->state() != proto::ALIVE) return absl::OkStatus();
  if (req.retire()) {
    DP_RETURN_IF_ERROR(job_->LeaveForGood(
        node->id(), node->name(),
        absl::StrCat("left for good: ", Printable(req.reason(), 200))));
  }
  members_->MarkLeft(node);
  job_->WorkerGone(node->id(), node->name(),
                   absl::StrCat("left: ", Printable(req.reason(), 200)),
                   req.finished(), absl::Now());
  map_->set_epoch(map_->epoch() + 1);
  DP_LOG(INFO) << "worker '" << node->name() << "' (node " << node->id()
               << ") left"
               << (req.retire()     ? " for good"
                   : req.finished() ? " after its last step"
                                    : "")
               << ": " << Printable(req.reason(), 200) << "; epoch "
               << map_->epoch();
  // Published (and, with a state dir, on disk) before the worker exits.
  return durable_->AwaitDurable(lock, durable_->Commit());
}

absl::Status NodeLifecycle::ServerLeaves(SchedulerMutex& lock,
                                         proto::NodeInfo* node,
                                         const proto::LeaveRequest& req) {
  if (node->state() != proto::ALIVE) return absl::OkStatus();
  if (tables_->HoldsRanges(node->id())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "leave: server ", node->id(), " ('", node->name(),
        "') still holds key ranges; drain it first (psctl drain)"));
  }
  members_->MarkLeft(node);
  map_->set_epoch(map_->epoch() + 1);
  DP_LOG(INFO) << "server '" << node->name() << "' (node " << node->id()
               << ") left, drained: " << Printable(req.reason(), 200)
               << "; epoch " << map_->epoch();
  return durable_->AwaitDurable(lock, durable_->Commit());
}

absl::Status NodeLifecycle::Drain(SchedulerMutex& lock,
                                  const proto::DrainRequest& req,
                                  proto::DrainReply* reply) {
  if (checkpoints_->restoring() != 0) {
    return absl::UnavailableError(
        absl::StrCat("drain: the job is being restored from checkpoint ",
                     checkpoints_->restoring(), "; retry once it is done"));
  }
  const Epoch before = map_->epoch();
  DP_RETURN_IF_ERROR(tables_->Drain(req, reply));
  if (map_->epoch() == before) return absl::OkStatus();
  return durable_->AwaitDurable(lock, durable_->Commit());
}

void NodeLifecycle::Sweep(absl::Time now) {
  job_->ApplyWorkerLossRule(now);
  const std::vector<NodeId> dead = members_->SweepDead(now);
  // The dead first: a worker's rank is lost before its node may be
  // forgotten (workers hold no ranges, so it can be at once).
  for (NodeId id : dead) {
    tables_->RemoveDeadServer(id);
    const proto::NodeInfo* n = members_->Find(id);
    if (n != nullptr && n->role() == proto::WORKER) {
      job_->WorkerGone(id, n->name(), "missed heartbeats", /*finished=*/false,
                       now);
    }
  }
  const std::vector<NodeId> forgotten = members_->ForgetSilent(now);
  for (NodeId id : forgotten) {
    checkpoints_->ClearRolledBack(id);
    tables_->ForgetRefusals(id);
    job_->ForgetNode(id);
  }
  const bool cancelled = tables_->CancelSlowHandOvers(now);
  // Ranges short of holders are refilled, then moves start (servers that
  // joined or drain) and go on as copies finish; not while a restore
  // reassigns the ranges.
  const bool moved =
      checkpoints_->restoring() == 0 && tables_->RefillWithinRoom();
  if (dead.empty() && forgotten.empty() && !cancelled && !moved) return;
  tables_->RefillWithinRoom();
  tables_->ResolvePending();
  map_->set_epoch(map_->epoch() + 1);
  durable_->Commit();
  DP_LOG(INFO) << "cluster map epoch " << map_->epoch();
}

}  // namespace downpour
