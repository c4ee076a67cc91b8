#include "worker/example_stream.h"

#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/random.h"
#include "models/batcher.h"

namespace downpour {
namespace {

class ShardStream final : public ExampleStream {
 public:
  ShardStream(uint64_t seed, int num_examples, int stream)
      : num_examples_(num_examples), batcher_(num_examples, seed, stream) {}

  absl::Status Next(int batch, std::vector<int>* out,
                    std::vector<int64_t>* epochs) override {
    absl::MutexLock lock(&mu_);
    *out = batcher_.Next(batch);
    if (epochs != nullptr) {
      epochs->resize(out->size());
      for (size_t i = 0; i < out->size(); ++i) {
        (*epochs)[i] = (drawn_ + static_cast<int64_t>(i)) / num_examples_;
      }
    }
    drawn_ += out->size();
    return absl::OkStatus();
  }

 private:
  const int64_t num_examples_;
  absl::Mutex mu_;
  Batcher batcher_ ABSL_GUARDED_BY(mu_);
  int64_t drawn_ ABSL_GUARDED_BY(mu_) = 0;
};

class EpochSplitStream final : public ExampleStream {
 public:
  EpochSplitStream(JobMember& member, uint64_t seed, int num_examples)
      : member_(member), seed_(seed), num_examples_(num_examples) {}

  absl::Status Next(int batch, std::vector<int>* out,
                    std::vector<int64_t>* epochs) override {
    absl::MutexLock lock(&mu_);
    out->clear();
    if (epochs != nullptr) epochs->clear();
    while (static_cast<int>(out->size()) < batch) {
      if (cursor_ == mine_.size()) {
        if (absl::Status s = NextEpoch(); !s.ok()) return s;
        continue;
      }
      out->push_back(mine_[cursor_++]);
      ++trained_;
      if (epochs != nullptr) epochs->push_back(epoch_);
    }
    return absl::OkStatus();
  }

 private:
  // Moves to the next epoch this worker has a share of.
  absl::Status NextEpoch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    constexpr int kMaxEmpty = 4096;
    for (int empty = 0; empty < kMaxEmpty; ++empty) {
      if (epoch_ >= 0 && !mine_.empty()) {
        DP_LOG(INFO) << "epoch " << epoch_ << ": trained " << trained_
                     << " examples, share " << share_.index << " of "
                     << share_.count;
      }
      ++epoch_;
      mine_.clear();
      cursor_ = 0;
      trained_ = 0;
      absl::StatusOr<EpochShare> share =
          member_.EpochShareOf(epoch_, absl::Seconds(60));
      if (absl::IsOutOfRange(share.status())) {
        // Forgotten (the scheduler keeps the newest 64): long over, and
        // trained by those in it.
        continue;
      }
      if (!share.ok()) {
        return absl::Status(share.status().code(),
                            absl::StrCat("the split of epoch ", epoch_, ": ",
                                         share.status().message()));
      }
      share_ = *share;
      if (!share_.trains()) {
        DP_LOG(INFO) << "epoch " << epoch_
                     << ": not in its split (it began before this worker "
                        "joined)";
        continue;
      }
      // One order of every example per epoch, the same on every worker.
      std::vector<int> order(num_examples_);
      for (int i = 0; i < num_examples_; ++i) order[i] = i;
      std::mt19937_64 rng(StreamSeed(seed_, static_cast<uint64_t>(epoch_)));
      Shuffle(absl::MakeSpan(order), rng);
      for (int p = share_.index; p < num_examples_; p += share_.count) {
        mine_.push_back(order[p]);
      }
      if (!mine_.empty()) return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat(
        kMaxEmpty, " epochs in a row up to ", epoch_,
        " had no examples for this worker's rank ", member_.rank()));
  }

  JobMember& member_;
  const uint64_t seed_;
  const int num_examples_;
  absl::Mutex mu_;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = -1;
  EpochShare share_ ABSL_GUARDED_BY(mu_);
  std::vector<int> mine_ ABSL_GUARDED_BY(mu_);  // this epoch's share, in order
  size_t cursor_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t trained_ ABSL_GUARDED_BY(mu_) = 0;  // drawn of this epoch's share
};

}  // namespace

std::unique_ptr<ExampleStream> ExampleStream::Create(JobMember& member,
                                                     uint64_t seed,
                                                     int num_examples,
                                                     int stream) {
  if (SplitsEpochs(member.policy())) {
    return std::make_unique<EpochSplitStream>(member, seed, num_examples);
  }
  return std::make_unique<ShardStream>(seed, num_examples, stream);
}

absl::Status ExampleStream::Skip(int64_t batches, int batch) {
  std::vector<int> drop;
  for (int64_t b = 0; b < batches; ++b) {
    if (absl::Status s = Next(batch, &drop); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace downpour
