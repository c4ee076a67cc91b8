#include "python/src/job_member_binding.h"

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/job_member.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "consistency/consistency.h"
#include "pybind11/stl.h"
#include "python/src/auth_args.h"
#include "python/src/status.h"

namespace downpour {
namespace python {

namespace py = pybind11;
using py::arg;

namespace {

absl::Duration Seconds(double s, const char* what) {
  if (!(s >= 0)) {
    throw py::value_error(std::string(what) + " must be >= 0 seconds");
  }
  return absl::Seconds(s);
}

// The Python face of a JobMember. leave() tells the scheduler at once
// (JobMember::Leave); dropping the last reference only stops heartbeating.
// Either way later calls raise FailedPreconditionError.
// Thread-safe: blocking calls run without the GIL on a shared reference.
class PyJobMember {
 public:
  explicit PyJobMember(std::unique_ptr<JobMember> member)
      : member_(std::move(member)),
        node_id_(member_->node_id()),
        rank_(member_->rank()),
        policy_(member_->policy()),
        start_clock_(member_->start_clock()),
        restored_from_(member_->restored_from()) {}
  ~PyJobMember() { Drop(); }

  std::shared_ptr<JobMember> Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (member_ == nullptr) {
      throw StatusError(
          absl::FailedPreconditionError("the job member has left"));
    }
    return member_;
  }

  // Leaves the job (the scheduler marks the member LEFT; unless `finished`
  // its rank waits for a replacement, or with `for_good` retires) and drops
  // the member. A second call does nothing. Called with the GIL held;
  // blocks without it.
  void Leave(bool finished, const std::string& reason, absl::Duration timeout,
             bool for_good = false) ABSL_LOCKS_EXCLUDED(mu_) {
    if (for_good && policy_.is_bsp()) {
      // Refused before the member is dropped: it is still in the job.
      ThrowIfError(Get()->LeaveForGood(reason, timeout));
    }
    std::shared_ptr<JobMember> member;
    {
      absl::MutexLock lock(&mu_);
      member = std::move(member_);
    }
    if (member == nullptr) return;
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = for_good ? member->LeaveForGood(reason, timeout)
                   : member->Leave(finished, reason, timeout);
      member.reset();  // joins threads when it is the last reference
    }
    ThrowIfError(s);
  }

  // The destructor sends a queued report and joins threads: without the
  // GIL when this is the last reference.
  void Drop() ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<JobMember> member;
    {
      absl::MutexLock lock(&mu_);
      member = std::move(member_);
    }
    if (member != nullptr && member.use_count() == 1 && PyGILState_Check()) {
      py::gil_scoped_release release;
      member.reset();
    }
  }

  NodeId node_id() const { return node_id_; }
  int rank() const { return rank_; }
  const ConsistencyPolicy& policy() const { return policy_; }
  Clock start_clock() const { return start_clock_; }
  uint64_t restored_from() const { return restored_from_; }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<JobMember> member_ ABSL_GUARDED_BY(mu_);
  const NodeId node_id_;
  const int rank_;
  const ConsistencyPolicy policy_;
  const Clock start_clock_;
  const uint64_t restored_from_;
};

// What join() takes besides the options: files to read, without the GIL.
struct JoinFiles {
  std::optional<std::string> secret_file;
  std::optional<std::string> job_token_file;
  TlsFiles tls;
};

absl::StatusOr<std::unique_ptr<JobMember>> JoinWith(JobMemberOptions options,
                                                    const JoinFiles& files) {
  DP_ASSIGN_OR_RETURN(
      options.auth, ClusterAuth::Load(files.secret_file.value_or(""), files.tls,
                                      kGrpcClient));
  if (files.job_token_file) {
    DP_ASSIGN_OR_RETURN(options.job_token, ReadTokenFile(*files.job_token_file),
                        "job_token_file");
  }
  return JobMember::Join(options);
}

std::shared_ptr<PyJobMember> Join(
    const std::string& scheduler_address, const std::string& name, int rank,
    const std::optional<std::string>& job_token,
    const std::optional<std::string>& job_token_file, double register_timeout,
    double rpc_timeout, const std::optional<std::string>& secret,
    const std::optional<std::string>& tls_ca_file,
    const std::optional<std::string>& tls_cert_file,
    const std::optional<std::string>& tls_key_file, bool tls_mutual,
    const std::optional<std::string>& tls_server_name) {
  if (rank < -1) throw py::value_error("rank must be >= 0 (or -1: any)");
  if (job_token && job_token_file) {
    throw py::value_error("give job_token or job_token_file, not both");
  }
  JobMemberOptions options;
  options.scheduler_address = scheduler_address;
  options.name = name;
  options.rank = rank;
  options.job_token = job_token.value_or("");
  options.register_timeout = Seconds(register_timeout, "register_timeout");
  options.rpc_timeout = Seconds(rpc_timeout, "rpc_timeout");
  JoinFiles files;
  files.secret_file = secret;
  files.job_token_file = job_token_file;
  files.tls = TlsFilesOf(tls_ca_file, tls_cert_file, tls_key_file, tls_mutual,
                         tls_server_name);
  absl::StatusOr<std::unique_ptr<JobMember>> member;
  {
    py::gil_scoped_release release;
    member = JoinWith(options, files);
  }
  return std::make_shared<PyJobMember>(ValueOrThrow(std::move(member)));
}

const char* KindName(ConsistencyPolicy::Kind kind) {
  switch (kind) {
    case ConsistencyPolicy::Kind::kBsp:
      return "bsp";
    case ConsistencyPolicy::Kind::kSsp:
      return "ssp";
    case ConsistencyPolicy::Kind::kAsp:
      return "asp";
  }
  return "unknown";
}

}  // namespace

void RegisterJobMember(py::module_& m) {
  py::class_<ConsistencyPolicy>(
      m, "ConsistencyPolicy",
      "The job's consistency contract (consistency/consistency.h), as the "
      "scheduler declared it. Immutable; ask it rather than comparing names.")
      .def_property_readonly(
          "kind", [](const ConsistencyPolicy& p) { return KindName(p.kind); },
          "'bsp', 'ssp' or 'asp'")
      .def_readonly("staleness", &ConsistencyPolicy::staleness,
                    "SSP's bound s (0 for BSP)")
      .def_readonly("num_workers", &ConsistencyPolicy::num_workers,
                    "N: workers whose updates count each step")
      .def_readonly("backup_workers", &ConsistencyPolicy::backup_workers,
                    "b: extra workers; the slowest b are ignored")
      .def_property_readonly("total_workers", &ConsistencyPolicy::total_workers,
                             "N + b: the workers the job starts with")
      .def_readonly("elastic_workers", &ConsistencyPolicy::elastic_workers,
                    "E: seats for workers joining the running job (ASP, SSP)")
      .def_property_readonly("max_ranks", &ConsistencyPolicy::max_ranks,
                             "N + b + E: ranks are [0, max_ranks)")
      .def_property_readonly("is_bsp", &ConsistencyPolicy::is_bsp)
      .def_property_readonly("is_asp", &ConsistencyPolicy::is_asp)
      .def_property_readonly(
          "bound",
          [](const ConsistencyPolicy& p) -> std::optional<Clock> {
            if (p.is_asp()) return std::nullopt;
            return p.bound();
          },
          "The largest allowed clock - gating clock (None under ASP).")
      .def("allows", &ConsistencyPolicy::Allows, arg("clock"), arg("gating"),
           "Whether a worker at `clock` may start that iteration when the "
           "gating clock is (at least) `gating`.")
      .def("__repr__", [](const ConsistencyPolicy& p) {
        return "ConsistencyPolicy(" + p.ToString() + ")";
      });

  py::class_<PyJobMember, std::shared_ptr<PyJobMember>>(
      m, "JobMember",
      "This process as a worker of the job (client/job_member.h): its rank "
      "and the job's policy, heartbeats in the background, clock reports, "
      "WaitClock and barriers. Make one with JobMember.join(). "
      "Thread-safe. A context manager (leaves on exit).")
      // downpour/__init__.py wraps this as JobMember.join, which fills
      // omitted arguments from the environment (downpour/env.py).
      .def_static(
          "_join", &Join, arg("scheduler_address"), py::kw_only(),
          arg("name") = "", arg("rank") = -1, arg("job_token") = py::none(),
          arg("job_token_file") = py::none(), arg("register_timeout") = 30.0,
          arg("rpc_timeout") = 10.0, arg("cluster_secret_file") = py::none(),
          arg("tls_ca_file") = py::none(), arg("tls_cert_file") = py::none(),
          arg("tls_key_file") = py::none(), arg("tls_mutual") = false,
          arg("tls_server_name") = py::none(),
          "JobMember.join without the environment's defaults; see there.")
      .def_property_readonly("node_id",
                             [](const PyJobMember& s) { return s.node_id(); })
      .def_property_readonly(
          "rank", [](const PyJobMember& s) { return s.rank(); },
          "In [0, policy.total_workers); the same after joining again.")
      .def_property_readonly("policy",
                             [](const PyJobMember& s) { return s.policy(); })
      .def_property_readonly(
          "start_clock", [](const PyJobMember& s) { return s.start_clock(); },
          "The clock to start from: 0 for a new job; a restored "
          "checkpoint's clock; for a replacement of a lost worker, the "
          "clock its predecessor reported (redo that iteration, on the same "
          "data shard).")
      .def_property_readonly(
          "restored_from",
          [](const PyJobMember& s) { return s.restored_from(); },
          "The checkpoint the job was last restored from; 0: none.")
      .def_property_readonly(
          "resumed",
          [](const PyJobMember& s) {
            return s.start_clock() > 0 || s.restored_from() != 0;
          },
          "start_clock > 0 or restored_from != 0: the tables hold trained "
          "values (see also barrier_passed).")
      .def_property_readonly(
          "asked_to_leave",
          [](const PyJobMember& s) { return s.Get()->asked_to_leave(); },
          "Whether the operator asked this worker to leave the job for good "
          "(psctl retire, ASP and SSP): check it between steps, then "
          "leave(for_good=True).")
      .def(
          "barrier_passed",
          [](const PyJobMember& self, const std::string& name) {
            return self.Get()->BarrierPassed(name);
          },
          arg("name"),
          "Whether the job's workers had passed barrier `name` when this "
          "member joined: a replacement joining a running job must neither "
          "wait there alone nor redo what came before it (initial values).")
      .def(
          "report_clock",
          [](const PyJobMember& self, Clock clock, double loss,
             uint64_t examples, double test_accuracy, int64_t max_staleness,
             uint64_t discarded) {
            ClockReport r;
            r.clock = clock;
            r.loss = loss;
            r.examples = examples;
            r.test_accuracy = test_accuracy;
            r.max_staleness = max_staleness;
            r.discarded = discarded;
            ThrowIfError(self.Get()->ReportClock(r));
          },
          arg("clock"), py::kw_only(), arg("loss") = 0.0, arg("examples") = 0,
          arg("test_accuracy") = -1.0, arg("max_staleness") = 0,
          arg("discarded") = 0,
          "Queues a report that iterations below `clock` are complete (every "
          "push acknowledged) and returns at once; a newer report replaces "
          "one still queued. examples: total so far; test_accuracy < 0: not "
          "evaluated. Raises the first error an earlier report got (e.g. "
          "FailedPreconditionError for a clock that moved back).")
      .def(
          "flush",
          [](const PyJobMember& self, double timeout) {
            auto member = self.Get();
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = member->Flush(Seconds(timeout, "timeout"));
            }
            ThrowIfError(s);
          },
          arg("timeout") = 30.0,
          "Waits until every queued report has been sent; raises the first "
          "error one got, or DeadlineExceededError.")
      .def_property_readonly(
          "reported_clock",
          [](const PyJobMember& self) { return self.Get()->reported_clock(); })
      .def_property_readonly(
          "others_lower_bound",
          [](const PyJobMember& self) {
            return self.Get()->others_lower_bound();
          },
          "A lower bound on every other worker's clock.")
      .def(
          "wait_clock",
          [](const PyJobMember& self, Clock clock, double timeout,
             const std::optional<Table>& table) {
            auto member = self.Get();
            const absl::Duration t = Seconds(timeout, "timeout");
            absl::StatusOr<Clock> gating;
            {
              py::gil_scoped_release release;
              gating = table.has_value()
                           ? member->WaitClockForTable(clock, table->id,
                                                       table->consistency, t)
                           : member->WaitClock(clock, t);
            }
            return ValueOrThrow(std::move(gating));
          },
          arg("clock"), arg("timeout") = 120.0, arg("table") = py::none(),
          "Blocks (GIL released) until the policy lets a worker at `clock` "
          "start that iteration; returns a lower bound on the gating clock "
          "(with backup workers, a value above `clock` tells a straggler to "
          "skip ahead). At once under ASP. DeadlineExceededError after "
          "`timeout` seconds. With `table`, the table's own policy "
          "(Table.consistency, e.g. an 'ssp:2' embedding table) bounds the "
          "wait instead of the job's.")
      .def(
          "epoch_share",
          [](const PyJobMember& self, int64_t epoch,
             double timeout) -> std::optional<std::pair<int, int>> {
            auto member = self.Get();
            absl::StatusOr<EpochShare> share;
            {
              py::gil_scoped_release release;
              share = member->EpochShareOf(epoch, Seconds(timeout, "timeout"));
            }
            ThrowIfError(share.status());
            if (!share->trains()) return std::nullopt;
            return std::make_pair(share->index, share->count);
          },
          arg("epoch"), py::kw_only(), arg("timeout") = 30.0,
          "This worker's share of epoch `epoch`'s examples: (index, count), "
          "to train the examples i with i % count == index; None when it "
          "joined after the epoch began. The split is fixed when a worker "
          "first asks for the epoch, over the workers in the job then, so "
          "that within an epoch no example is skipped or trained twice while "
          "workers join and leave (leave for good between epochs).")
      .def(
          "barrier",
          [](const PyJobMember& self, const std::string& name, double timeout) {
            auto member = self.Get();
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = member->Barrier(name, Seconds(timeout, "timeout"));
            }
            ThrowIfError(s);
          },
          arg("name"), arg("timeout") = 120.0,
          "Blocks (GIL released) until every worker of the job has reached "
          "the barrier `name`. DeadlineExceededError after `timeout` "
          "seconds.")
      .def(
          "leave",
          [](PyJobMember& self, bool finished, const std::string& reason,
             double timeout, bool for_good) {
            if (finished && for_good) {
              throw py::value_error("give finished or for_good, not both");
            }
            self.Leave(finished, reason, Seconds(timeout, "timeout"), for_good);
          },
          py::kw_only(), arg("finished") = false, arg("reason") = "left",
          arg("timeout") = 30.0, arg("for_good") = false,
          "Leaves the job at once: sends the queued clock report (up to "
          "`timeout` seconds), stops heartbeating and tells the scheduler, "
          "so that nobody waits for this member's heartbeats to stop. "
          "finished=True: it completed its steps; otherwise its rank waits "
          "for a replacement like a lost worker's (ps_scheduler "
          "--worker_replace_timeout_ms). for_good=True (ASP and SSP): its "
          "rank retires at once and gates nobody from now on; "
          "FailedPreconditionError under BSP, and the member stays in the "
          "job. A second call does nothing.")
      .def("__enter__", [](std::shared_ptr<PyJobMember> self) { return self; })
      // Leaving a `with` block normally is finishing; by an exception,
      // leaving for a replacement, and that exception is the one raised
      // (an error leaving is only logged).
      .def("__exit__", [](PyJobMember& self, const py::object& type,
                          const py::object&, const py::object&) {
        if (type.is_none()) {
          self.Leave(/*finished=*/true, "finished", absl::Seconds(30));
          return;
        }
        try {
          self.Leave(/*finished=*/false, "left on an exception",
                     absl::Seconds(30));
        } catch (const StatusError& e) {
          DP_LOG(WARNING) << "leaving the job: " << e.what();
        }
      });
}

}  // namespace python
}  // namespace downpour
