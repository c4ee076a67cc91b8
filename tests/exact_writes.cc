#include "tests/exact_writes.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace downpour {

Key SparseExactKey(int i) {
  return (static_cast<Key>(i) * 0x9E3779B97F4A7C15ull) % (kKeySpaceEnd - 1);
}

absl::StatusOr<ExactTables> CreateExactTables(
    Client* client, uint64_t dense_keys, int sparse_keys,
    std::optional<TableOptions::Bounds> sparse_bounds) {
  ExactTables t;
  t.dense_keys = dense_keys;
  t.sparse_keys = sparse_keys;
  t.width = 4;
  TableOptions d;
  d.name = "dense";
  d.width = t.width;
  d.num_keys = dense_keys;
  d.handler = "sum";
  DP_ASSIGN_OR_RETURN(t.dense, client->CreateTable(d));
  TableOptions s;
  s.name = "sparse";
  s.sparse = true;
  s.width = t.width;
  s.handler = "sum";
  s.bounds = std::move(sparse_bounds);
  DP_ASSIGN_OR_RETURN(t.sparse, client->CreateTable(s));
  return t;
}

ExactWrites::ExactWrites(std::string scheduler_address, ExactTables tables)
    : scheduler_address_(std::move(scheduler_address)),
      tables_(std::move(tables)),
      dense_(tables_.dense_keys, 0),
      sparse_(tables_.sparse_keys, 0) {}

ExactWrites::~ExactWrites() { (void)Stop(); }

void ExactWrites::Start(int writers, uint64_t seed) {
  stop_ = false;
  {
    absl::MutexLock lock(&mu_);
    running_ += writers;
  }
  for (int w = 0; w < writers; ++w) {
    threads_.emplace_back([this, s = seed * 100 + w] {
      absl::Status status = RunWriter(s);
      absl::MutexLock lock(&mu_);
      if (!status.ok() && error_.ok()) error_ = status;
      --running_;
    });
  }
}

absl::Status ExactWrites::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  absl::MutexLock lock(&mu_);
  return error_;
}

uint64_t ExactWrites::acknowledged() const {
  absl::MutexLock lock(&mu_);
  return acknowledged_;
}

absl::Duration ExactWrites::longest_wait() const {
  absl::MutexLock lock(&mu_);
  return longest_wait_;
}

absl::Status ExactWrites::AwaitProgress(uint64_t more, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const uint64_t target = acknowledged_ + more;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return acknowledged_ >= target || running_ == 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "writers acknowledged ", acknowledged_, " row adds, waited for ",
        target, " within ", absl::FormatDuration(timeout)));
  }
  if (acknowledged_ >= target) return absl::OkStatus();
  return error_.ok() ? absl::AbortedError("writers stopped") : error_;
}

absl::Status ExactWrites::RunWriter(uint64_t seed) {
  struct InFlight {
    Ticket ticket = 0;
    bool busy = false;
    bool is_sparse = false;
    absl::Time sent;
    std::vector<Key> rows;  // dense rows or sparse indices
    std::vector<Key> wire;
    std::vector<float> values;
  };
  constexpr int kWindow = 6;
  // Declared before the client: a writer that returns on its first error
  // leaves the window's other operations in flight, and only the client's
  // destructor (which fails them and stops their retries) may end them
  // before their buffers go.
  std::vector<InFlight> window(kWindow);
  ClientOptions co;
  co.scheduler_address = scheduler_address_;
  co.op_timeout = absl::Seconds(30);
  DP_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));
  std::mt19937_64 rng(seed);
  const uint32_t width = tables_.width;
  auto land = [&](InFlight& f) -> absl::Status {
    f.busy = false;
    DP_RETURN_IF_ERROR(client->Wait(f.ticket, absl::Seconds(60)));
    const absl::Duration waited = absl::Now() - f.sent;
    absl::MutexLock lock(&mu_);
    for (Key k : f.rows) (f.is_sparse ? sparse_ : dense_)[k]++;
    acknowledged_ += f.rows.size();
    longest_wait_ = std::max(longest_wait_, waited);
    return absl::OkStatus();
  };
  for (uint64_t i = 0; !stop_.load(); ++i) {
    InFlight& f = window[i % kWindow];
    if (f.busy) DP_RETURN_IF_ERROR(land(f));
    f.rows.clear();
    f.wire.clear();
    const int kind = static_cast<int>(rng() % 3);
    bool range = false;
    if (kind == 0) {  // a range of dense rows
      const Key b = rng() % tables_.dense_keys;
      const Key e = std::min<Key>(tables_.dense_keys, b + 1 + rng() % 64);
      for (Key k = b; k < e; ++k) f.rows.push_back(k);
      f.is_sparse = false;
      range = true;
    } else {  // a batch of distinct dense or sparse rows
      f.is_sparse = kind == 2;
      const uint64_t n = f.is_sparse ? tables_.sparse_keys : tables_.dense_keys;
      std::vector<Key> pick(f.is_sparse ? 8 : 16);
      for (Key& k : pick) k = rng() % n;
      std::sort(pick.begin(), pick.end());
      pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
      f.rows = pick;
      for (Key k : pick) {
        f.wire.push_back(f.is_sparse ? SparseExactKey(static_cast<int>(k)) : k);
      }
    }
    f.values.assign(f.rows.size() * width, 1.0f);
    f.sent = absl::Now();
    f.ticket = range
                   ? client->Add(tables_.dense,
                                 Keys::Range(f.rows.front(), f.rows.back() + 1),
                                 f.values)
                   : client->Add(f.is_sparse ? tables_.sparse : tables_.dense,
                                 f.wire, f.values);
    f.busy = true;
  }
  for (InFlight& f : window) {
    if (f.busy) DP_RETURN_IF_ERROR(land(f));
  }
  return absl::OkStatus();
}

absl::Status ExactWrites::Check(Client* client) const {
  const uint32_t width = tables_.width;
  std::vector<float> dense(tables_.dense_keys * width);
  DP_RETURN_IF_ERROR(
      client->GetSync(tables_.dense, Keys::Range(0, tables_.dense_keys),
                      absl::MakeSpan(dense)),
      "read the dense table");
  // Each sparse key twice in a row: the SDK folds the repeats (one read of
  // each key, its row copied to the repeat), on whatever map it holds.
  std::vector<Key> wire(2 * tables_.sparse_keys);
  for (int i = 0; i < tables_.sparse_keys; ++i) {
    wire[2 * i] = wire[2 * i + 1] = SparseExactKey(i);
  }
  std::vector<float> twice(wire.size() * width);
  DP_RETURN_IF_ERROR(
      client->GetSync(tables_.sparse, wire, absl::MakeSpan(twice)),
      "read the sparse table");
  std::vector<float> sparse(tables_.sparse_keys * width);
  for (int i = 0; i < tables_.sparse_keys; ++i) {
    if (!std::equal(twice.begin() + 2 * i * width,
                    twice.begin() + (2 * i + 1) * width,
                    twice.begin() + (2 * i + 1) * width)) {
      return absl::DataLossError(
          absl::StrCat("sparse row ", SparseExactKey(i),
                       " read twice in one batch differs"));
    }
    std::copy_n(twice.begin() + 2 * i * width, width,
                sparse.begin() + i * width);
  }
  absl::MutexLock lock(&mu_);
  std::string wrong;
  int n = 0;
  for (Key k = 0; k < tables_.dense_keys; ++k) {
    for (uint32_t j = 0; j < width; ++j) {
      if (dense[k * width + j] != static_cast<float>(dense_[k]) && n++ < 5) {
        absl::StrAppend(&wrong, " dense row ", k, " holds ",
                        dense[k * width + j], ", expected ", dense_[k], ";");
      }
    }
  }
  for (int i = 0; i < tables_.sparse_keys; ++i) {
    for (uint32_t j = 0; j < width; ++j) {
      if (sparse[i * width + j] != static_cast<float>(sparse_[i]) && n++ < 5) {
        absl::StrAppend(&wrong, " sparse row ", SparseExactKey(i), " holds ",
                        sparse[i * width + j], ", expected ", sparse_[i], ";");
      }
    }
  }
  if (n > 0) {
    return absl::DataLossError(absl::StrCat(n, " values differ from the ",
                                            acknowledged_,
                                            " acknowledged row adds:", wrong));
  }
  if (acknowledged_ == 0) {
    return absl::FailedPreconditionError("no add was acknowledged");
  }
  return absl::OkStatus();
}

}  // namespace downpour
