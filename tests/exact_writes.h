// A workload whose final state is known exactly, for tests that change a
// running cluster (kill servers, move ranges): writers add 1.0 to rows of a
// dense and a sparse table ("sum" rule) through the SDK, count what was
// acknowledged per row, and Check compares every row with that count.
// Integer-valued float sums are exact, so the check is equality: an
// acknowledged add lost or applied twice shows.
//
//   ASSERT_OK_AND_ASSIGN(ExactTables t, CreateExactTables(client.get()));
//   ExactWrites w(scheduler_address, t);
//   w.Start(/*writers=*/4, /*seed=*/1);
//   ... change the cluster ...
//   EXPECT_OK(w.Stop());             // no add failed
//   EXPECT_OK(w.Check(client.get()));  // every row exact
//
// Thread-safe.
#ifndef DOWNPOUR_TESTS_EXACT_WRITES_H_
#define DOWNPOUR_TESTS_EXACT_WRITES_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace downpour {

struct ExactTables {
  Table dense;   // keys [0, dense_keys)
  Table sparse;  // keys SparseExactKey(i), i < sparse_keys
  uint64_t dense_keys = 0;
  int sparse_keys = 0;
  uint32_t width = 0;
};

// The wire key of sparse row `i`: spread over the whole key space.
Key SparseExactKey(int i);

// Declares "dense" (`dense_keys` rows) and "sparse" with the "sum" rule,
// width 4, "sparse" with `sparse_bounds` if given (kAlreadyExists etc. as
// Client::CreateTable). Sums stay exact under bounds only with a cold tier
// (evicted rows come back) and admit_after 1 (adds create rows at once).
absl::StatusOr<ExactTables> CreateExactTables(
    Client* client, uint64_t dense_keys = 3000, int sparse_keys = 500,
    std::optional<TableOptions::Bounds> sparse_bounds = std::nullopt);

class ExactWrites {
 public:
  ExactWrites(std::string scheduler_address, ExactTables tables);
  ~ExactWrites();  // Stop()

  // Starts `writers` threads, each with its own client and a window of
  // adds in flight (dense ranges, dense batches, sparse batches), until
  // Stop(). A writer stops at its first failed add.
  void Start(int writers, uint64_t seed);
  // Stops the writers; the first error any of them met (OK if none).
  absl::Status Stop();

  // Row adds acknowledged so far.
  uint64_t acknowledged() const;
  // The longest a writer waited for an acknowledgement (one add of its
  // window): how long writes stalled.
  absl::Duration longest_wait() const;
  // Waits until `more` row adds beyond the count at the call are
  // acknowledged; kDeadlineExceeded after `timeout`, or the writers'
  // error if they stopped.
  absl::Status AwaitProgress(uint64_t more, absl::Duration timeout);

  // Reads every row through `client` and compares it with the
  // acknowledged adds: kDataLoss naming the first rows that differ.
  // Call once the writers are stopped.
  absl::Status Check(Client* client) const;

 private:
  absl::Status RunWriter(uint64_t seed);

  const std::string scheduler_address_;
  const ExactTables tables_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  mutable absl::Mutex mu_;
  std::vector<uint32_t> dense_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> sparse_ ABSL_GUARDED_BY(mu_);
  uint64_t acknowledged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration longest_wait_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_TESTS_EXACT_WRITES_H_
