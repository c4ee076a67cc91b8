#include "scheduler/durable_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"

namespace downpour {

void DurableState::SetStore(std::unique_ptr<StateStore> store,
                            std::string dir) {
  store_ = std::move(store);
  dir_ = std::move(dir);
}

absl::Status DurableState::WriteFirst() {
  ++version_;
  durable_version_ = version_;
  return store_->SaveState(source_->Snapshot().SerializeAsString());
}

void DurableState::Recovered() {
  version_ = durable_version_ = 1;
  published_ = *map_;
}

uint64_t DurableState::Commit() {
  ++version_;
  if (store_ == nullptr) {
    published_ = *map_;
    durable_version_ = version_;
  }
  return version_;
}

absl::Status DurableState::AwaitDurable(SchedulerMutex& lock, uint64_t v) {
  auto done = [this, &lock, v]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
    return durable_version_ >= v || lock.stopping;
  };
  lock.mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
  if (durable_version_ >= v) return absl::OkStatus();
  if (lock.stopping) return absl::UnavailableError("scheduler shutting down");
  return absl::UnavailableError(
      absl::StrCat("the scheduler cannot write its state to ", dir_, ": ",
                   store_error_.ToString()));
}

void DurableState::PersistLoop(SchedulerMutex& lock) {
  absl::Time clocks_saved = absl::InfinitePast();
  absl::Time retry_at = absl::InfinitePast();
  bool logged = false;
  while (true) {
    auto work = [this, &lock]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
      return lock.stopping || version_ > durable_version_;
    };
    lock.mu.AwaitWithTimeout(absl::Condition(&work), absl::Milliseconds(100));
    if (version_ > durable_version_ && absl::Now() >= retry_at) {
      const uint64_t v = version_;
      const std::string bytes = source_->Snapshot().SerializeAsString();
      proto::ClusterMap map = *map_;
      lock.mu.Unlock();
      absl::Status s = store_->SaveState(bytes);  // not under the lock
      lock.mu.Lock();
      if (s.ok()) {
        durable_version_ = std::max(durable_version_, v);
        if (map.epoch() >= published_.epoch()) published_ = std::move(map);
        if (logged) DP_LOG(INFO) << "state written again";
        store_error_ = absl::OkStatus();
        logged = false;
      } else {
        store_error_ = s;
        retry_at = absl::Now() + absl::Milliseconds(500);
        if (!logged) DP_LOG(ERROR) << "cannot write the state: " << s;
        logged = true;
        if (lock.stopping) break;
      }
    }
    const absl::Time now = absl::Now();
    if (clocks_dirty_ &&
        (lock.stopping || now - clocks_saved >= absl::Milliseconds(300))) {
      clocks_dirty_ = false;
      clocks_saved = now;
      const proto::SchedulerClocks clocks = source_->ClocksSnapshot();
      lock.mu.Unlock();
      absl::Status s = store_->SaveClocks(clocks);
      lock.mu.Lock();
      if (!s.ok()) DP_LOG(WARNING) << "cannot write the clocks: " << s;
    }
    if (lock.stopping && version_ <= durable_version_ && !clocks_dirty_) break;
  }
}

}  // namespace downpour
