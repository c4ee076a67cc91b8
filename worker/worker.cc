#include "worker/worker.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <tuple>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "models/cuda/cuda_mlp.h"
#include "models/dataset.h"
#include "models/model.h"
#include "worker/batcher.h"
#include "worker/slowdown.h"

namespace downpour {
namespace {

// Sends a worker's AdvanceClock calls from its own thread, so that the
// training loop does not wait for the scheduler when the policy does not
// make it. Calls go out in order; one still queued when a newer one comes
// is replaced by it (clocks only move forward, and the newer progress
// figures supersede the older, except an evaluation's accuracy, which is
// kept). Each reply tells the smallest clock of the other workers, a lower
// bound that only grows.
// Thread-safe; Advance and Flush are called by the training thread.
class ClockReporter {
 public:
  // `scheduler` must outlive this object.
  explicit ClockReporter(SchedulerClient* scheduler) : scheduler_(scheduler) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~ClockReporter() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Queues the report; returns the first error a previous call got.
  absl::Status Advance(proto::AdvanceClockRequest req) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (pending_ && req.test_accuracy() < 0) {
      req.set_test_accuracy(pending_->test_accuracy());
    }
    own_clock_ = req.clock();
    pending_ = std::move(req);
    return error_;
  }
  // Waits until every queued report has been sent; its first error.
  absl::Status Flush(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !pending_ && !in_flight_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&idle), timeout)) {
      return absl::DeadlineExceededError("clock reports still queued");
    }
    return error_;
  }
  // The clock last queued: iterations below it are complete.
  int64_t own_clock() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return own_clock_;
  }
  // A lower bound on every other worker's clock.
  int64_t others_lower_bound() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return others_;
  }
  // A gating clock learnt elsewhere (WaitClock): the others are at least
  // there.
  void ObserveGating(int64_t gating) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    others_ = std::max(others_, gating);
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    for (;;) {
      proto::AdvanceClockRequest req;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || pending_.has_value();
        };
        // Re-checked every second; Advance and the destructor wake it.
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
        if (!pending_) {
          if (stop_) return;
          continue;
        }
        req = std::move(*pending_);
        pending_.reset();
        in_flight_ = true;
      }
      auto reply = scheduler_->AdvanceClock(req);  // not under the lock
      absl::MutexLock lock(&mu_);
      in_flight_ = false;
      if (!reply.ok()) {
        if (error_.ok()) error_ = reply.status();
      } else {
        others_ = std::max(others_, reply->others_min_clock());
      }
    }
  }

  SchedulerClient* const scheduler_;
  mutable absl::Mutex mu_;
  std::optional<proto::AdvanceClockRequest> pending_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t own_clock_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t others_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

class WorkerImpl final : public Worker {
 public:
  explicit WorkerImpl(const WorkerOptions& o)
      : options_(o), scheduler_(o.scheduler_address, absl::Seconds(10), o.auth) {}
  ~WorkerImpl() override {
    stop_.Notify();
    if (heartbeat_.joinable()) heartbeat_.join();
    if (health_.server != nullptr) {
      health_.server->Shutdown(gpr_now(GPR_CLOCK_MONOTONIC));
    }
  }

  absl::Status Init();
  absl::Status Run() override;

 private:
  absl::Status InitSparse();
  absl::Status DeclareTables();
  absl::Status DeclareSparseTable();
  absl::Status PullParams();
  absl::Status PushGrads(const std::vector<float>& grads);
  absl::Status RunDense();
  absl::Status RunSparse();
  absl::Status RunHogwild();
  absl::Status RunAspPipelined();
  absl::Status RunBsp();
  // A BSP PushPull unit: rows [begin, end) of table `table`, floats
  // [offset, offset + count) of the parameter array.
  struct ExchangePart {
    size_t table;
    Key begin, end;
    size_t offset, count;
    size_t ready = 0;  // floats of its gradient known to be final
  };
  // Cuts every table into row ranges of about kPushPullPartBytes; the cut
  // depends on the model only, so every worker cuts the same way.
  std::vector<ExchangePart> ExchangeParts() const;
  // The consistency gate before iteration *clock: waits until the policy
  // lets it proceed; a backup worker that fell behind skips ahead. Sets
  // *done when the skip passes the last step.
  absl::Status StartStep(int64_t* clock, bool* done);
  // Completes iteration `clock` (its pushes acknowledged): advances the
  // clock with the progress figures. test_accuracy < 0: not evaluated.
  absl::Status FinishStep(int64_t clock, double loss, uint64_t examples,
                          double test_accuracy);
  // Rank 0 evaluates on the test set every eval_every clocks and after the
  // last; returns the accuracy, or -1 when iteration `clock` does not
  // evaluate. `pull_first`: params_ may be behind the servers.
  absl::StatusOr<double> MaybeEvaluate(int64_t clock, double loss,
                                       bool pull_first);

  const WorkerOptions options_;
  SchedulerClient scheduler_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<ClockReporter> reporter_;
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
  // sparse_lr: this worker's training rows (shuffled) and, on rank 0, the
  // held-out rows with their feature ids and keys.
  bool sparse_ = false;
  SparseDataset sparse_train_;
  SparseDataset sparse_test_;
  std::vector<uint64_t> test_ids_;
  std::vector<Key> test_keys_;
  absl::Duration heartbeat_interval_ = absl::Milliseconds(500);
  absl::Notification stop_;
  // Keeps the worker alive in the scheduler's eyes while it computes or
  // waits on a slow peer.
  std::thread heartbeat_;
  StartedGrpcServer health_;  // with options_.health_listen
};

absl::Status WorkerImpl::Init() {
  if (!options_.health_listen.empty()) {
    DP_ASSIGN_OR_RETURN(StartedGrpcServer started,
                        StartGrpcServer(options_.health_listen, nullptr,
                                        "worker health service",
                                        /*ready=*/false));
    health_ = std::move(started);
  }
  proto::RegisterRequest reg;
  reg.set_role(proto::WORKER);
  reg.set_name(options_.name);
  if (options_.rank >= 0) reg.set_requested_rank(options_.rank);
  reg.set_job_token(options_.job_token);
  DP_ASSIGN_OR_RETURN(proto::RegisterReply reply,
                      scheduler_.Register(reg, absl::Seconds(30)));
  if (health_.health != nullptr) health_.health->SetReady(true);
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

  if (job_.consistency() != "asp" &&
      (options_.n_fetch > 1 || options_.n_push > 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n_fetch ", options_.n_fetch, " and n_push ", options_.n_push,
        ": pulling or pushing less than every step is Downpour's ASP mode; "
        "the job's consistency is ",
        job_.consistency(), " (use --n_fetch=1 --n_push=1)"));
  }
  if (options_.hogwild_threads > 1) {
    if (job_.consistency() != "asp") {
      return absl::InvalidArgumentError(absl::StrCat(
          "hogwild_threads ", options_.hogwild_threads,
          ": Hogwild threads update without locks or clocks and need ASP; "
          "the job's consistency is ",
          job_.consistency(), " (use --hogwild_threads=1)"));
    }
    if (options_.model == "sparse_lr" || options_.n_fetch > 1 ||
        options_.n_push > 1) {
      return absl::InvalidArgumentError(
          "hogwild_threads > 1 needs a dense model (softmax, mlp) and "
          "n_fetch = n_push = 1");
    }
  }
  if (options_.hogwild_threads < 1) {
    return absl::InvalidArgumentError("hogwild_threads must be >= 1");
  }
  if (options_.model == "sparse_lr" &&
      (options_.n_fetch > 1 || options_.n_push > 1)) {
    return absl::InvalidArgumentError(
        "sparse_lr pulls and pushes the keys of each batch: n_fetch and "
        "n_push must be 1");
  }

  ClientOptions co;
  co.scheduler_address = options_.scheduler_address;
  co.auth = options_.auth;
  co.op_timeout = absl::Seconds(60);
  DP_ASSIGN_OR_RETURN(client_, Client::Connect(co));

  if (options_.model == "sparse_lr") return InitSparse();
  DP_ASSIGN_OR_RETURN(Dataset full, LoadFashionMnist(options_.data_dir, true));
  train_ = Shard(full, rank_, total_workers_);
  if (rank_ == 0) {
    DP_ASSIGN_OR_RETURN(test_, LoadFashionMnist(options_.data_dir, false));
  }
  if (options_.device != "cpu" &&
      (options_.device != "cuda" || options_.model != "mlp")) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", options_.device, "' for model '",
                     options_.model, "' (cpu; cuda for mlp only)"));
  }
  if (options_.device == "cuda") {
    DP_ASSIGN_OR_RETURN(model_, MakeCudaMlp({full.dim, 256, full.num_classes}));
  } else if (options_.model == "softmax") {
    model_ = MakeSoftmaxRegression(full.dim, full.num_classes);
  } else if (options_.model == "mlp") {
    model_ = MakeMlp({full.dim, 256, full.num_classes});
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model '", options_.model,
                     "' (softmax, mlp, sparse_lr)"));
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

// A splitmix64 finalizer: bijective on 64 bits. The key space is
// [0, 2^64 - 1), so the one id that mixes to 2^64 - 1 shares key 0.
uint64_t MixKey(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x == ~uint64_t{0} ? 0 : x;
}

// The rows `rows` of `data`, in that order.
SparseDataset SelectRows(const SparseDataset& data,
                         const std::vector<size_t>& rows) {
  SparseDataset out;
  out.labels.reserve(rows.size());
  out.row_offsets.reserve(rows.size() + 1);
  for (size_t r : rows) {
    const size_t f0 = data.row_offsets[r], f1 = data.row_offsets[r + 1];
    out.feature_ids.insert(out.feature_ids.end(),
                           data.feature_ids.begin() + f0,
                           data.feature_ids.begin() + f1);
    out.feature_values.insert(out.feature_values.end(),
                              data.feature_values.begin() + f0,
                              data.feature_values.begin() + f1);
    out.row_offsets.push_back(out.feature_ids.size());
    out.labels.push_back(data.labels[r]);
  }
  return out;
}

absl::Status WorkerImpl::InitSparse() {
  sparse_ = true;
  if (options_.holdout <= 0 || options_.holdout >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("holdout ", options_.holdout, " outside (0, 1)"));
  }
  SparseDataset all;
  if (!options_.libsvm.empty()) {
    std::ifstream in(options_.libsvm);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot open libsvm file '", options_.libsvm, "'"));
    }
    auto parsed = ParseLibsvm(in);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat("libsvm file '", options_.libsvm,
                                       "': ", parsed.status().message()));
    }
    all = *std::move(parsed);
  } else {
    if (options_.click_rows < 2 || options_.click_features_per_row < 1 ||
        options_.click_num_features < 1 || options_.click_zipf < 0) {
      return absl::InvalidArgumentError(
          "click data: need click_rows >= 2, click_features_per_row >= 1, "
          "click_num_features >= 1, click_zipf >= 0");
    }
    all = GenerateClickData(options_.click_rows,
                            options_.click_features_per_row,
                            options_.click_num_features, options_.click_zipf,
                            options_.seed);
  }
  const size_t rows = all.NumRows();
  const size_t train_rows = static_cast<size_t>(
      std::floor(static_cast<double>(rows) * (1.0 - options_.holdout)));
  if (train_rows < static_cast<size_t>(total_workers_) || train_rows == rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows, " rows cannot give ", total_workers_,
                     " workers rows to train on and keep ", options_.holdout,
                     " of them held out"));
  }
  sparse_train_ = SelectRows(
      all, SparseTrainRows(train_rows, rank_, total_workers_, options_.seed));
  if (rank_ == 0) {
    std::vector<size_t> held(rows - train_rows);
    std::iota(held.begin(), held.end(), train_rows);
    sparse_test_ = SelectRows(all, held);
    test_ids_ = BatchFeatureIds(sparse_test_, 0, sparse_test_.NumRows());
    test_keys_.resize(test_ids_.size());
    for (size_t i = 0; i < test_ids_.size(); ++i) {
      test_keys_[i] = SparseFeatureKey(test_ids_[i]);
    }
  }
  DP_LOG(INFO) << "sparse_lr: " << rows << " rows ("
               << (options_.libsvm.empty() ? "synthetic clicks"
                                           : options_.libsvm)
               << "), " << sparse_train_.NumRows() << " to train on here, "
               << rows - train_rows << " held out";
  return DeclareSparseTable();
}

absl::Status WorkerImpl::DeclareSparseTable() {
  // Rows are created on first push with the initializer's zeros, so no
  // worker writes initial values; the barrier only lines up the start.
  TableOptions t;
  t.name = kSparseLrTable;
  t.width = 1;
  t.sparse = true;
  t.init = "zeros";
  t.tracked_workers = total_workers_;
  // Adagrad under every policy: with power-law ids the hottest weights
  // get a gradient at every step and the rare ones almost never, and plain
  // SGD at a rate that moves the rare ones diverges on the hot ones. Under
  // BSP the servers hold a clock's key batches until all N workers pushed
  // and apply each key's mean once, summed in rank order, as for the dense
  // tables: runs are bit-for-bit repeatable (the client sends every server
  // a batch each step, empty ones included, so that it can count ranks).
  t.handler = "adagrad";
  t.handler_params = {{"learning_rate", options_.async_lr},
                      {"initial_accumulator", 0.1}};
  if (bsp_) t.sync_workers = job_.num_workers();
  DP_ASSIGN_OR_RETURN(Table table, client_->CreateTable(t));
  tables_.push_back(table);
  return scheduler_.Barrier("init-params", id_, total_workers_,
                            absl::Seconds(120));
}

absl::Status WorkerImpl::Run() {
  reporter_ = std::make_unique<ClockReporter>(&scheduler_);
  absl::Status s = sparse_                         ? RunSparse()
                   : options_.hogwild_threads > 1 ? RunHogwild()
                                                   : RunDense();
  // The last clock reaches the scheduler before Run returns.
  absl::Status flushed = reporter_->Flush(absl::Seconds(30));
  reporter_.reset();
  return s.ok() ? flushed : s;
}

absl::Status WorkerImpl::RunHogwild() {
  const int k = options_.hogwild_threads;
  // Steps are handed out from one counter; `completed` counts the finished
  // ones, and only thread 0 reports them to the scheduler, so that the
  // reported clock never moves back.
  std::atomic<int64_t> next{0}, completed{0};
  std::atomic<uint64_t> examples{0};
  std::atomic<bool> failed{false};
  std::vector<absl::Status> status(k);
  std::vector<int64_t> taken(k, 0);
  // Writes to params_ (Pull) and reads of it (LossAndGradient) race across
  // threads on purpose: see worker.h.
  float* const shared = params_.data();
  auto body = [&](int t) -> absl::Status {
    std::vector<float> grads(params_.size());
    Batcher batcher(train_.num_examples, options_.seed,
                    rank_ * k + t);  // distinct batches per thread
    while (!failed.load(std::memory_order_relaxed)) {
      const int64_t step = next.fetch_add(1);
      if (step >= options_.steps) break;
      client_->SetWorkerClock(rank_, step);
      DP_RETURN_IF_ERROR(ForEachBlock(
          *client_, blocks_, tables_,
          [&](const Table& tb, Keys keys, size_t off, size_t n) {
            return client_->Pull(tb, keys, absl::MakeSpan(shared + off, n));
          }));
      const std::vector<int> batch = batcher.Next(options_.batch);
      const double loss =
          model_->LossAndGradient(shared, train_, batch, grads.data());
      DP_RETURN_IF_ERROR(PushGrads(grads));
      examples.fetch_add(batch.size());
      const int64_t done = completed.fetch_add(1) + 1;
      ++taken[t];
      if (t == 0 && done < options_.steps) {
        DP_RETURN_IF_ERROR(FinishStep(done - 1, loss, examples.load(), -1));
      }
    }
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < k; ++t) {
    threads.emplace_back([&, t] {
      status[t] = body(t);
      if (!status[t].ok()) failed.store(true);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < k; ++t) {
    if (!status[t].ok()) {
      return absl::Status(status[t].code(),
                          absl::StrCat("hogwild thread ", t, ": ",
                                       status[t].message()));
    }
  }
  double accuracy = -1;
  if (rank_ == 0) {
    DP_RETURN_IF_ERROR(PullParams());
    double test_loss;
    std::tie(accuracy, test_loss) = model_->Evaluate(params_.data(), test_);
    DP_LOG(INFO) << "clock " << options_.steps << ": test accuracy "
                 << accuracy << ", test loss " << test_loss;
  }
  DP_RETURN_IF_ERROR(
      FinishStep(options_.steps - 1, 0, examples.load(), accuracy));
  DP_LOG(INFO) << "done: " << examples.load() << " examples on " << k
               << " hogwild threads (steps per thread: "
               << absl::StrJoin(taken, ", ") << ")";
  return absl::OkStatus();
}

absl::Status WorkerImpl::StartStep(int64_t* clock, bool* done) {
  *done = false;
  if (job_.consistency() == "asp") return absl::OkStatus();
  if (job_.backup_workers() == 0) {
    // Without backups the gating clock is the minimum of all clocks: ours
    // (queued, our pushes acknowledged) and the others', of which the
    // reporter keeps a lower bound. If that already lets this clock
    // proceed, the scheduler would answer at once: do not ask.
    const int64_t gating = std::min(reporter_->own_clock(),
                                    reporter_->others_lower_bound());
    const int64_t bound = bsp_ ? 0 : job_.staleness();
    if (*clock - gating <= bound) return absl::OkStatus();
  }
  DP_ASSIGN_OR_RETURN(int64_t gating,
                      scheduler_.WaitClock(id_, rank_, *clock, absl::Minutes(2)));
  reporter_->ObserveGating(gating);
  // A backup worker that fell behind skips to the step being taken.
  if (gating > *clock && job_.backup_workers() > 0) *clock = gating;
  *done = *clock >= options_.steps;
  return absl::OkStatus();
}

absl::StatusOr<double> WorkerImpl::MaybeEvaluate(int64_t clock, double loss,
                                                 bool pull_first) {
  const bool last = clock + 1 == options_.steps;
  if (rank_ != 0 || ((clock + 1) % options_.eval_every != 0 && !last)) {
    return -1.0;
  }
  if (pull_first) DP_RETURN_IF_ERROR(PullParams());
  auto [accuracy, test_loss] = model_->Evaluate(params_.data(), test_);
  DP_LOG(INFO) << "clock " << clock + 1 << ": train loss " << loss
               << ", test accuracy " << accuracy << ", test loss " << test_loss;
  return accuracy;
}

absl::Status WorkerImpl::FinishStep(int64_t clock, double loss,
                                    uint64_t examples, double test_accuracy) {
  proto::AdvanceClockRequest adv;
  adv.set_node_id(id_);
  adv.set_rank(rank_);
  adv.set_clock(clock + 1);
  adv.set_loss(loss);
  adv.set_examples(examples);
  adv.set_test_accuracy(test_accuracy);
  adv.set_max_staleness(client_->max_staleness());
  adv.set_discarded(client_->discarded_pushes());
  return reporter_->Advance(std::move(adv));
}

absl::Status WorkerImpl::RunSparse() {
  const Table& table = tables_[0];
  const size_t rows = sparse_train_.NumRows();
  const size_t batch = static_cast<size_t>(std::max(1, options_.batch));
  std::vector<uint64_t> ids;
  std::vector<Key> keys;
  std::vector<float> weights, grads, test_weights;
  size_t cursor = 0;
  uint64_t examples = 0;
  double loss = 0;
  // Rank 0's held-out figures for the weights at `clock`; the accuracy.
  auto evaluate = [&](int64_t clock) -> absl::StatusOr<double> {
    test_weights.resize(test_ids_.size());
    DP_RETURN_IF_ERROR(
        client_->PullSync(table, test_keys_, absl::MakeSpan(test_weights)));
    const SparseEval e =
        EvaluateSparseLogReg(sparse_test_, test_ids_, test_weights);
    DP_LOG(INFO) << "clock " << clock << ": train loss " << loss
                 << ", held-out log-loss " << e.log_loss << ", accuracy "
                 << e.accuracy << ", AUC " << e.auc;
    return e.accuracy;
  };
  // Under BSP the servers apply a clock's round when the last worker's
  // batch arrives, which rank 0 does not see. It evaluates the weights at
  // clock k only once the gate has let clock k start (every push below k
  // acknowledged, so applied): its figures are then repeatable too. Under
  // SSP and ASP it evaluates right after its own push, as before.
  auto eval_due = [&](int64_t k) {
    return rank_ == 0 && (k % options_.eval_every == 0 || k == options_.steps);
  };
  for (int64_t clock = 0; clock < options_.steps; ++clock) {
    bool done;
    DP_RETURN_IF_ERROR(StartStep(&clock, &done));
    if (done) break;
    client_->SetWorkerClock(rank_, clock);
    double accuracy = -1;
    if (bsp_ && clock > 0 && eval_due(clock)) {
      DP_ASSIGN_OR_RETURN(accuracy, evaluate(clock));
    }
    // Batches are consecutive windows of the shuffled shard; the one that
    // reaches the end is shorter and the next starts over.
    const size_t begin = cursor, end = std::min(rows, cursor + batch);
    cursor = end == rows ? 0 : end;
    ids = BatchFeatureIds(sparse_train_, begin, end);
    keys.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) keys[i] = SparseFeatureKey(ids[i]);
    weights.resize(ids.size());
    grads.resize(ids.size());
    DP_RETURN_IF_ERROR(client_->PullSync(table, keys, absl::MakeSpan(weights)));
    loss = SparseLogRegLossAndGradient(sparse_train_, begin, end, ids,
                                       weights, absl::MakeSpan(grads),
                                       options_.l2);
    examples += end - begin;
    DP_RETURN_IF_ERROR(client_->PushSync(table, keys, grads));
    if (!bsp_ && eval_due(clock + 1)) {
      DP_ASSIGN_OR_RETURN(accuracy, evaluate(clock + 1));
    }
    DP_RETURN_IF_ERROR(FinishStep(clock, loss, examples, accuracy));
  }
  if (bsp_ && rank_ == 0) {
    // The last round: wait until every worker has pushed it, evaluate, and
    // report the accuracy with the same (final) clock again.
    const int64_t last = options_.steps;
    DP_ASSIGN_OR_RETURN(int64_t gating,
                        scheduler_.WaitClock(id_, rank_, last, absl::Minutes(2)));
    (void)gating;
    client_->SetWorkerClock(rank_, last);
    DP_ASSIGN_OR_RETURN(double accuracy, evaluate(last));
    DP_RETURN_IF_ERROR(FinishStep(last - 1, loss, examples, accuracy));
  }
  DP_LOG(INFO) << "done: " << examples << " examples, max staleness "
               << client_->max_staleness();
  return absl::OkStatus();
}

absl::Status WorkerImpl::RunAspPipelined() {
  // Step c computes on the parameters returned by step c - 2's PushPull
  // while step c - 1's PushPull is on the wire: communication hides behind
  // computation, for one step more of staleness, which ASP allows. Two
  // gradient buffers alternate (one being sent while the next is written),
  // and two parameter buffers swap when a PushPull lands. No per-step
  // allocation besides the mini-batch indices.
  std::vector<float> next(params_.size());
  std::vector<float> grads[2] = {std::vector<float>(params_.size()),
                                 std::vector<float>(params_.size())};
  std::vector<Ticket> in_flight;
  int64_t in_flight_clock = -1;
  double in_flight_loss = 0;
  Batcher batcher(train_.num_examples, options_.seed, rank_);
  uint64_t examples = 0;
  // Completes step `clock`: its PushPull is acknowledged and its values
  // become the parameters; rank 0 evaluates on schedule.
  auto land = [&](int64_t clock, double loss) -> absl::Status {
    absl::Status status;
    for (Ticket t : in_flight) {
      absl::Status s = client_->Wait(t);
      if (status.ok()) status = s;
    }
    in_flight.clear();
    DP_RETURN_IF_ERROR(status);
    params_.swap(next);
    DP_ASSIGN_OR_RETURN(const double test_accuracy,
                        MaybeEvaluate(clock, loss, /*pull_first=*/false));
    return FinishStep(clock, loss, examples, test_accuracy);
  };

  client_->SetWorkerClock(rank_, 0);
  DP_RETURN_IF_ERROR(PullParams());
  for (int64_t clock = 0; clock < options_.steps; ++clock) {
    std::vector<float>& g = grads[clock % 2];
    const std::vector<int> batch = batcher.Next(options_.batch);
    const absl::Time start = absl::Now();
    const double loss =
        model_->LossAndGradient(params_.data(), train_, batch, g.data());
    StretchStep(start, options_.slow_factor);
    examples += batch.size();
    if (in_flight_clock >= 0) {
      DP_RETURN_IF_ERROR(land(in_flight_clock, in_flight_loss));
    }
    client_->SetWorkerClock(rank_, clock);
    size_t off = 0;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const size_t n = blocks_[i].rows * blocks_[i].width;
      in_flight.push_back(client_->PushPull(
          tables_[i], Keys::Range(0, blocks_[i].rows),
          absl::MakeConstSpan(g.data() + off, n),
          absl::MakeSpan(next.data() + off, n)));
      off += n;
    }
    in_flight_clock = clock;
    in_flight_loss = loss;
  }
  if (in_flight_clock >= 0) {
    DP_RETURN_IF_ERROR(land(in_flight_clock, in_flight_loss));
  }
  DP_LOG(INFO) << "done: " << examples << " examples (ASP, pipelined), max "
               << "staleness " << client_->max_staleness();
  return absl::OkStatus();
}

// A large table's PushPull goes out as row ranges of about this size, so
// that the server applies and answers the first while the next are still
// being computed or sent. Every worker cuts the same way (BSP aggregates
// per range and clock, so all workers must push the same ranges).
constexpr size_t kPushPullPartBytes = 128 << 10;

std::vector<WorkerImpl::ExchangePart> WorkerImpl::ExchangeParts() const {
  std::vector<ExchangePart> parts;
  size_t off = 0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const size_t rows = blocks_[i].rows, width = blocks_[i].width;
    const size_t step =
        std::max<size_t>(1, kPushPullPartBytes / (width * sizeof(float)));
    for (size_t r = 0; r < rows; r += step) {
      const size_t e = std::min(rows, r + step);
      parts.push_back({i, r, e, off + r * width, (e - r) * width});
    }
    off += rows * width;
  }
  return parts;
}

absl::Status WorkerImpl::RunBsp() {
  // One round trip per step, overlapped with the backward pass: each range
  // of the gradient goes out as a PushPull as soon as the model has
  // finished it (the last layer first, then the first layer's weights in
  // row ranges while the rest of them are computed), and each server
  // answers once that range's update of the step is applied (with N
  // workers, when the N-th gradient of the step arrives), with the values
  // step c + 1 must start from. They land straight in params_: the model
  // reads no parameter of a range after reporting it. If every part was
  // applied, all N workers' gradients of step c are in, which is exactly
  // what the gate for c + 1 asks, so no pull and no WaitClock follow. A
  // backup worker whose push came late (discarded) asks the scheduler and
  // pulls instead.
  const int n = static_cast<int>(job_.num_workers());
  std::vector<float> grads(params_.size());
  std::vector<ExchangePart> parts = ExchangeParts();
  std::vector<Ticket> tickets;
  Batcher batcher(train_.num_examples, options_.seed, rank_);
  uint64_t examples = 0;
  int64_t params_clock = -1;  // params_ hold the state step params_clock reads
  // Where a step's time goes, for the log line at the end.
  absl::Duration compute_time, exchange_time;
  for (int64_t clock = 0; clock < options_.steps; ++clock) {
    if (params_clock != clock) {
      bool done;
      DP_RETURN_IF_ERROR(StartStep(&clock, &done));
      if (done) break;
      client_->SetWorkerClock(rank_, clock);
      DP_RETURN_IF_ERROR(PullParams());
    }
    client_->SetWorkerClock(rank_, clock);
    const float lr =
        BspLearningRate(options_.lr, n, options_.warmup_steps, clock);
    const uint64_t discarded_before = client_->discarded_pushes();
    tickets.clear();
    for (ExchangePart& p : parts) p.ready = 0;
    auto send = [&](ExchangePart& p) {
      for (size_t j = p.offset; j < p.offset + p.count; ++j) grads[j] *= lr;
      tickets.push_back(client_->PushPull(
          tables_[p.table], Keys::Range(p.begin, p.end),
          absl::MakeConstSpan(grads.data() + p.offset, p.count),
          absl::MakeSpan(params_.data() + p.offset, p.count)));
    };
    // Sends every part that the range [off, off + count) completes.
    auto ready = [&](size_t off, size_t count) {
      for (ExchangePart& p : parts) {
        const size_t b = std::max(off, p.offset);
        const size_t e = std::min(off + count, p.offset + p.count);
        if (b >= e) continue;
        p.ready += e - b;
        if (p.ready == p.count) send(p);
      }
    };

    const std::vector<int> batch = batcher.Next(options_.batch);
    const absl::Time start = absl::Now();
    double loss;
    if (options_.slow_factor > 1.0) {
      // A simulated straggler must not send before its (slow) step ends.
      loss = model_->LossAndGradient(params_.data(), train_, batch,
                                     grads.data());
      StretchStep(start, options_.slow_factor);
      ready(0, grads.size());
    } else {
      loss = model_->LossAndGradientStreamed(params_.data(), train_, batch,
                                             grads.data(), ready);
    }
    examples += batch.size();
    const absl::Time computed = absl::Now();
    compute_time += computed - start;
    absl::Status status;
    if (tickets.size() != parts.size()) {
      status = absl::InternalError(absl::StrCat(
          "the model reported ", tickets.size(), " of ", parts.size(),
          " gradient parts"));
    }
    for (Ticket t : tickets) {
      absl::Status s = client_->Wait(t);
      if (status.ok()) status = s;
    }
    DP_RETURN_IF_ERROR(status);
    exchange_time += absl::Now() - computed;
    const bool late = client_->discarded_pushes() != discarded_before;
    params_clock = late ? -1 : clock + 1;

    DP_ASSIGN_OR_RETURN(const double test_accuracy,
                        MaybeEvaluate(clock, loss, /*pull_first=*/late));
    DP_RETURN_IF_ERROR(FinishStep(clock, loss, examples, test_accuracy));
  }
  const double steps = std::max<double>(1, options_.steps);
  DP_LOG(INFO) << "done: " << examples << " examples (BSP, PushPull), max "
               << "staleness " << client_->max_staleness()
               << ", discarded pushes " << client_->discarded_pushes()
               << "; per step: compute (sends overlapped) "
               << absl::ToDoubleMilliseconds(compute_time) / steps
               << " ms, then waiting for the replies "
               << absl::ToDoubleMilliseconds(exchange_time) / steps << " ms";
  return absl::OkStatus();
}

absl::Status WorkerImpl::RunDense() {
  if (job_.consistency() == "asp" && options_.n_fetch == 1 &&
      options_.n_push == 1) {
    return RunAspPipelined();
  }
  if (bsp_) return RunBsp();
  // SSP, and ASP with n_fetch or n_push > 1.
  std::vector<float> grads(params_.size()), acc(params_.size(), 0.0f);
  Batcher batcher(train_.num_examples, options_.seed, rank_);
  uint64_t examples = 0;
  const bool asp = job_.consistency() == "asp";

  for (int64_t clock = 0; clock < options_.steps; ++clock) {
    bool done;
    DP_RETURN_IF_ERROR(StartStep(&clock, &done));
    if (done) break;
    client_->SetWorkerClock(rank_, clock);
    if (!asp || clock % options_.n_fetch == 0) DP_RETURN_IF_ERROR(PullParams());

    const std::vector<int> batch = batcher.Next(options_.batch);
    const absl::Time start = absl::Now();
    const double loss =
        model_->LossAndGradient(params_.data(), train_, batch, grads.data());
    StretchStep(start, options_.slow_factor);
    examples += batch.size();

    if (options_.n_push <= 1) {
      DP_RETURN_IF_ERROR(PushGrads(grads));
    } else {
      for (size_t i = 0; i < grads.size(); ++i) acc[i] += grads[i];
      // The last step flushes what is left, so no gradient is lost.
      if ((clock + 1) % options_.n_push == 0 || clock + 1 == options_.steps) {
        DP_RETURN_IF_ERROR(PushGrads(acc));
        std::fill(acc.begin(), acc.end(), 0.0f);
      }
    }

    DP_ASSIGN_OR_RETURN(const double test_accuracy,
                        MaybeEvaluate(clock, loss, /*pull_first=*/true));
    DP_RETURN_IF_ERROR(FinishStep(clock, loss, examples, test_accuracy));
  }
  DP_LOG(INFO) << "done: " << examples << " examples, max staleness "
               << client_->max_staleness() << ", discarded pushes "
               << client_->discarded_pushes();
  return absl::OkStatus();
}

}  // namespace

uint64_t SparseFeatureKey(uint64_t feature_id) { return MixKey(feature_id); }

std::vector<size_t> SparseTrainRows(size_t train_rows, int rank, int workers,
                                    uint64_t seed) {
  DP_CHECK(rank >= 0 && rank < workers) << "rank " << rank << " of " << workers;
  std::vector<size_t> mine;
  for (size_t r = rank; r < train_rows; r += workers) mine.push_back(r);
  // Fisher-Yates by hand: std::shuffle's algorithm is left to the standard
  // library, and the row order decides the batches. The modulo bias of a
  // 64-bit draw over a shard's size is negligible.
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(rank));
  for (size_t i = mine.size(); i > 1; --i) {
    std::swap(mine[i - 1], mine[rng() % i]);
  }
  return mine;
}

SparseEval EvaluateSparseLogReg(const SparseDataset& data,
                                const std::vector<uint64_t>& ids,
                                const std::vector<float>& weights) {
  SparseEval e;
  const size_t rows = data.NumRows();
  if (rows == 0) return e;
  std::vector<std::pair<double, float>> scored(rows);  // (logit, label)
  double loss = 0;
  size_t correct = 0;
  for (size_t r = 0; r < rows; ++r) {
    double z = 0;
    for (size_t f = data.row_offsets[r]; f < data.row_offsets[r + 1]; ++f) {
      auto it = std::lower_bound(ids.begin(), ids.end(), data.feature_ids[f]);
      if (it != ids.end() && *it == data.feature_ids[f]) {
        z += static_cast<double>(weights[it - ids.begin()]) *
             data.feature_values[f];
      }
    }
    const double y = data.labels[r];
    // softplus(z) - y z, computed stably.
    loss += std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))) - y * z;
    correct += (z > 0) == (y > 0.5);
    scored[r] = {z, data.labels[r]};
  }
  e.log_loss = loss / rows;
  e.accuracy = static_cast<double>(correct) / rows;
  // AUC by the rank-sum (Mann-Whitney) statistic, ties sharing their rank.
  std::sort(scored.begin(), scored.end());
  double rank_sum = 0, positives = 0;
  for (size_t i = 0; i < rows;) {
    size_t j = i;
    while (j < rows && scored[j].first == scored[i].first) ++j;
    const double mid = (i + 1 + j) / 2.0;  // mean of ranks i+1 .. j
    for (size_t k = i; k < j; ++k) {
      if (scored[k].second > 0.5) {
        rank_sum += mid;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = rows - positives;
  e.auc = positives == 0 || negatives == 0
              ? 0.5
              : (rank_sum - positives * (positives + 1) / 2) /
                    (positives * negatives);
  return e;
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(
    const WorkerOptions& options) {
  auto w = std::make_unique<WorkerImpl>(options);
  DP_RETURN_IF_ERROR(w->Init());
  return std::unique_ptr<Worker>(std::move(w));
}

}  // namespace downpour
