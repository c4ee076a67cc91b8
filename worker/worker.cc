#include "worker/worker.h"

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "models/dataset.h"
#include "models/model.h"
#include "worker/batcher.h"

namespace downpour {
namespace {

class WorkerImpl final : public Worker {
 public:
  explicit WorkerImpl(const WorkerOptions& o)
      : options_(o), scheduler_(o.scheduler_address) {}
  ~WorkerImpl() override {
    stop_.Notify();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  absl::Status Init();
  absl::Status Run() override;

 private:
  absl::Status DeclareTables();
  absl::Status PullParams();
  absl::Status PushGrads(const std::vector<float>& grads);

  const WorkerOptions options_;
  SchedulerClient scheduler_;
  std::unique_ptr<Client> client_;
  NodeId id_ = kNoNode;
  int rank_ = 0;
  proto::JobConfig job_;
  int total_workers_ = 1;
  bool bsp_ = true;
  Dataset train_;
  Dataset test_;
  std::unique_ptr<Model> model_;
  std::vector<ParamBlock> blocks_;
  std::vector<Table> tables_;
  std::vector<float> params_;
  absl::Duration heartbeat_interval_ = absl::Milliseconds(500);
  absl::Notification stop_;
  // Keeps the worker alive in the scheduler's eyes while it computes or
  // waits on a slow peer.
  std::thread heartbeat_;
};

absl::Status WorkerImpl::Init() {
  proto::RegisterRequest reg;
  reg.set_role(proto::WORKER);
  reg.set_name(options_.name);
  DP_ASSIGN_OR_RETURN(proto::RegisterReply reply,
                      scheduler_.Register(reg, absl::Seconds(30)));
  id_ = reply.node_id();
  rank_ = reply.rank();
  job_ = reply.job();
  total_workers_ = static_cast<int>(job_.num_workers() + job_.backup_workers());
  bsp_ = job_.consistency() == "bsp";
  if (reply.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ = absl::Milliseconds(reply.heartbeat_interval_ms());
  }
  heartbeat_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(heartbeat_interval_)) {
      auto hb = scheduler_.Heartbeat(id_, 0);
      if (!hb.ok()) DP_LOG(WARNING) << hb.status();
    }
  });
  SetLogTag(absl::StrCat("worker ", rank_));
  DP_LOG(INFO) << "registered as node " << id_ << ", rank " << rank_ << " of "
               << total_workers_ << ", consistency " << job_.consistency();

  ClientOptions co;
  co.scheduler_address = options_.scheduler_address;
  co.op_timeout = absl::Seconds(60);
  DP_ASSIGN_OR_RETURN(client_, Client::Connect(co));

  DP_ASSIGN_OR_RETURN(Dataset full, LoadFashionMnist(options_.data_dir, true));
  train_ = Shard(full, rank_, total_workers_);
  if (rank_ == 0) {
    DP_ASSIGN_OR_RETURN(test_, LoadFashionMnist(options_.data_dir, false));
  }
  if (options_.model == "softmax") {
    model_ = MakeSoftmaxRegression(full.dim, full.num_classes);
  } else if (options_.model == "mlp") {
    model_ = MakeMlp({full.dim, 256, full.num_classes});
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model '", options_.model, "' (softmax, mlp)"));
  }
  if (job_.consistency() != "asp" &&
      (options_.n_fetch > 1 || options_.n_push > 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n_fetch ", options_.n_fetch, " and n_push ", options_.n_push,
        ": pulling or pushing less than every step is Downpour's ASP mode; "
        "the job's consistency is ",
        job_.consistency(), " (use --n_fetch=1 --n_push=1)"));
  }
  blocks_ = model_->Blocks();
  params_.resize(model_->NumParams());
  DP_LOG(INFO) << "shard of " << train_.num_examples << " examples, model "
               << options_.model << " with " << params_.size() << " parameters";
  return DeclareTables();
}

absl::Status WorkerImpl::DeclareTables() {
  // Every worker declares the same tables (identical specs are idempotent);
  // rank 0 then writes the initial values and the others wait for it.
  for (const ParamBlock& b : blocks_) {
    TableOptions t;
    t.name = absl::StrCat(options_.model, "/", b.name);
    t.width = static_cast<uint32_t>(b.width);
    t.num_keys = b.rows;
    t.tracked_workers = total_workers_;
    if (bsp_) {
      t.handler = "sgd";
      t.handler_params = {{"learning_rate", 1.0}};
      t.sync_workers = job_.num_workers();
    } else {
      t.handler = "adagrad";
      t.handler_params = {{"learning_rate", options_.async_lr},
                          {"initial_accumulator", 0.1}};
    }
    DP_ASSIGN_OR_RETURN(Table table, client_->CreateTable(t));
    tables_.push_back(table);
  }
  if (rank_ == 0) {
    model_->Init(options_.seed, params_.data());
    size_t off = 0;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const size_t n = blocks_[i].rows * blocks_[i].width;
      DP_RETURN_IF_ERROR(client_->PutSync(
          tables_[i], Keys::Range(0, blocks_[i].rows),
          absl::MakeConstSpan(params_.data() + off, n)));
      off += n;
    }
  }
  return scheduler_.Barrier("init-params", id_, total_workers_,
                            absl::Seconds(120));
}

// Issues one operation per parameter table, all in flight together, and
// waits for them. `op(table, keys, offset, count)` returns the ticket.
template <typename Op>
absl::Status ForEachBlock(Client& client, const std::vector<ParamBlock>& blocks,
                          const std::vector<Table>& tables, Op op) {
  std::vector<Ticket> tickets;
  size_t off = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const size_t n = blocks[i].rows * blocks[i].width;
    tickets.push_back(op(tables[i], Keys::Range(0, blocks[i].rows), off, n));
    off += n;
  }
  absl::Status status;
  for (Ticket t : tickets) {
    absl::Status s = client.Wait(t);
    if (status.ok()) status = s;
  }
  return status;
}

absl::Status WorkerImpl::PullParams() {
  return ForEachBlock(*client_, blocks_, tables_,
                      [&](const Table& t, Keys k, size_t off, size_t n) {
                        return client_->Pull(
                            t, k, absl::MakeSpan(params_.data() + off, n));
                      });
}

absl::Status WorkerImpl::PushGrads(const std::vector<float>& grads) {
  return ForEachBlock(*client_, blocks_, tables_,
                      [&](const Table& t, Keys k, size_t off, size_t n) {
                        return client_->Push(
                            t, k, absl::MakeConstSpan(grads.data() + off, n));
                      });
}

absl::Status WorkerImpl::Run() {
  const int n = static_cast<int>(job_.num_workers());
  std::vector<float> grads(params_.size()), acc(params_.size(), 0.0f);
  Batcher batcher(train_.num_examples, options_.seed, rank_);
  uint64_t examples = 0;
  const bool asp = job_.consistency() == "asp";

  for (int64_t clock = 0; clock < options_.steps; ++clock) {
    if (!asp) {
      DP_ASSIGN_OR_RETURN(int64_t gating,
                          scheduler_.WaitClock(rank_, clock, absl::Minutes(2)));
      // A backup worker that fell behind skips to the step being taken.
      if (gating > clock && job_.backup_workers() > 0) clock = gating;
      if (clock >= options_.steps) break;
    }
    client_->SetWorkerClock(rank_, clock);
    if (!asp || clock % options_.n_fetch == 0) DP_RETURN_IF_ERROR(PullParams());

    const std::vector<int> batch = batcher.Next(options_.batch);
    const absl::Time start = absl::Now();
    const double loss =
        model_->LossAndGradient(params_.data(), train_, batch, grads.data());
    if (options_.slow_factor > 1.0) {
      absl::SleepFor((absl::Now() - start) * (options_.slow_factor - 1.0));
    }
    examples += batch.size();

    if (bsp_) {
      const float lr =
          BspLearningRate(options_.lr, n, options_.warmup_steps, clock);
      for (float& g : grads) g *= lr;
      DP_RETURN_IF_ERROR(PushGrads(grads));
    } else if (options_.n_push <= 1) {
      DP_RETURN_IF_ERROR(PushGrads(grads));
    } else {
      for (size_t i = 0; i < grads.size(); ++i) acc[i] += grads[i];
      // The last step flushes what is left, so no gradient is lost.
      if ((clock + 1) % options_.n_push == 0 || clock + 1 == options_.steps) {
        DP_RETURN_IF_ERROR(PushGrads(acc));
        std::fill(acc.begin(), acc.end(), 0.0f);
      }
    }

    proto::AdvanceClockRequest adv;
    adv.set_node_id(id_);
    adv.set_rank(rank_);
    adv.set_clock(clock + 1);
    adv.set_loss(loss);
    adv.set_examples(examples);
    adv.set_test_accuracy(-1);
    adv.set_max_staleness(client_->max_staleness());
    adv.set_discarded(client_->discarded_pushes());
    const bool last = clock + 1 == options_.steps;
    if (rank_ == 0 && ((clock + 1) % options_.eval_every == 0 || last)) {
      DP_RETURN_IF_ERROR(PullParams());
      auto [accuracy, test_loss] = model_->Evaluate(params_.data(), test_);
      adv.set_test_accuracy(accuracy);
      DP_LOG(INFO) << "clock " << clock + 1 << ": train loss " << loss
                   << ", test accuracy " << accuracy << ", test loss "
                   << test_loss;
    }
    DP_RETURN_IF_ERROR(scheduler_.AdvanceClock(adv).status());
  }
  DP_LOG(INFO) << "done: " << examples << " examples, max staleness "
               << client_->max_staleness() << ", discarded pushes "
               << client_->discarded_pushes();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(
    const WorkerOptions& options) {
  auto w = std::make_unique<WorkerImpl>(options);
  DP_RETURN_IF_ERROR(w->Init());
  return std::unique_ptr<Worker>(std::move(w));
}

}  // namespace downpour
