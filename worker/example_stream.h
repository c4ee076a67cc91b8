// The mini-batches a ps_worker training loop draws, as indices into the
// examples it holds:
//
//  - a job without elastic seats: the worker's fixed shard (rank r of
//    N + b), reshuffled passes over it (models/batcher.h), exactly as a
//    single-process replay draws them;
//  - a job with elastic seats (--elastic_workers): the whole training set,
//    epoch by epoch, each epoch split over the workers present when it
//    began (JobMember::EpochShareOf), so that no example of an epoch is
//    skipped or trained twice while workers join and leave. Epoch e's order
//    is one shuffle of all examples from (seed, e), the same on every
//    worker; the share (index i of n) is every n-th position from i. A
//    worker that is not in an epoch's split (it joined during it) goes on
//    to the next; a batch that runs past the end of a share goes on with
//    the next epoch's.
//
//   auto s = ExampleStream::Create(member, options.seed, examples, stream);
//   std::vector<int> batch;
//   DP_RETURN_IF_ERROR(s->Next(64, &batch));
//
// Thread-safe (Hogwild threads of an elastic job share one).
#ifndef DOWNPOUR_WORKER_EXAMPLE_STREAM_H_
#define DOWNPOUR_WORKER_EXAMPLE_STREAM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/job_member.h"

namespace downpour {

class ExampleStream {
 public:
  virtual ~ExampleStream() = default;

  // `num_examples`: those the worker holds (its shard, or the whole set
  // when member.policy() has elastic seats). `stream` numbers the
  // fixed-shard Batcher (the rank, or a Hogwild thread's number); elastic
  // streams ignore it. `member` must outlive the stream.
  static std::unique_ptr<ExampleStream> Create(JobMember& member, uint64_t seed,
                                               int num_examples, int stream);
  // Whether `policy` has its workers draw from epoch splits.
  static bool SplitsEpochs(const ConsistencyPolicy& policy) {
    return policy.elastic_workers > 0;
  }

  // The next `batch` indices into *out; with `epochs`, the epoch each one
  // belongs to beside it (a fixed shard counts its passes). The
  // scheduler's errors (a split asked for and refused), or kInternal when
  // 4096 epochs in a row had no share for this worker.
  virtual absl::Status Next(int batch, std::vector<int>* out,
                            std::vector<int64_t>* epochs = nullptr) = 0;
  // Draws and drops `batches` batches of `batch`: a resumed or replacement
  // worker goes on where its rank's stream was.
  absl::Status Skip(int64_t batches, int batch);
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_EXAMPLE_STREAM_H_
