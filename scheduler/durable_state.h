// The scheduler's state as changed, as on disk and as published. Every
// change is committed (Commit: a new version). With a state store, the
// persister (PersistLoop, on a thread of the scheduler's) writes the newest
// version, synced, and only then publishes its map, so that nodes and
// clients never see a map a restarted scheduler could forget; without one,
// a commit publishes the map at once. The workers' clocks are written
// apart, at most every 300 ms and unsynced (lower bounds: the workers' next
// reports raise them).
//
//   DurableState durable(&map, &source);
//   durable.SetStore(std::move(store));      // optional: --state_dir
//   ... change the map or another part of the state, under the lock ...
//   DP_RETURN_IF_ERROR(durable.AwaitDurable(lock, durable.Commit()));
//
// What is written (SchedulerState, SchedulerClocks) is asked of a Source
// under the lock: the scheduler, which gathers it from its parts.
//
// Thread-compatible: the scheduler's mutex (SchedulerMutex) guards it;
// AwaitDurable and PersistLoop take that mutex and release it while they
// wait or write.
#ifndef DOWNPOUR_SCHEDULER_DURABLE_STATE_H_
#define DOWNPOUR_SCHEDULER_DURABLE_STATE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "proto/downpour.pb.h"
#include "scheduler/scheduler_mutex.h"
#include "scheduler/state_store.h"

namespace downpour {

class DurableState {
 public:
  // What the persister writes, taken under the scheduler's mutex.
  class Source {
   public:
    virtual ~Source() = default;
    virtual proto::SchedulerState Snapshot() const = 0;
    virtual proto::SchedulerClocks ClocksSnapshot() const = 0;
  };

  // `map` (the map as changed) and `source` are borrowed and must outlive
  // this object.
  DurableState(const proto::ClusterMap* map, const Source* source)
      : map_(map), source_(source) {}

  // Keeps the state in `store` (opened on directory `dir`, named in
  // errors) from now on. Call once, before anything is committed.
  void SetStore(std::unique_ptr<StateStore> store, std::string dir);
  // Whether the state goes to disk (a store was set).
  bool persistent() const { return store_ != nullptr; }
  // The store (null without one). Thread-safe itself: may be used without
  // the lock (manifests are written by the checkpoint coordinator).
  StateStore* store() const { return store_.get(); }

  // A new state directory: writes the state at once (synced, under the
  // lock), so that a restart with another job is refused. REQUIRES: a store.
  absl::Status WriteFirst();
  // The state was loaded from the store into the parts: it counts as
  // written, and its map as published.
  void Recovered();

  // Records a change of the state; returns its version. Never blocks.
  uint64_t Commit();
  // The newest version committed.
  uint64_t version() const { return version_; }
  // Waits (releasing the lock) until version `v` is on disk and published.
  // kUnavailable if it cannot be written within 10 s (a full disk: the
  // change is then not published, and the caller's client retries) or the
  // scheduler is stopping.
  absl::Status AwaitDurable(SchedulerMutex& lock, uint64_t v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // The map as on disk: what nodes and clients see.
  const proto::ClusterMap& published() const { return published_; }
  // The workers' clocks changed: the persister writes them soon.
  void ClocksChanged() { clocks_dirty_ = true; }

  // The persister: writes each new version of the state (only the newest of
  // those committed meanwhile), then publishes its map; and the clocks.
  // Runs until lock.stopping, after a last write (or a failed one).
  // REQUIRES: a store; called with the lock held, releases it to write.
  void PersistLoop(SchedulerMutex& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

 private:
  const proto::ClusterMap* const map_;
  const Source* const source_;
  std::unique_ptr<StateStore> store_;  // null: in memory only
  std::string dir_;
  // Versions of the state: changed in memory, on disk (and published).
  uint64_t version_ = 0;
  uint64_t durable_version_ = 0;
  absl::Status store_error_;
  proto::ClusterMap published_;
  bool clocks_dirty_ = false;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_DURABLE_STATE_H_
