#include "scheduler/durable_state.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/test_util.h"
#include "proto/downpour.pb.h"
#include "scheduler/scheduler_mutex.h"
#include "scheduler/state_store.h"

namespace downpour {
namespace {

// What the scheduler would gather from its parts: here the map and a mark.
class FakeSource : public DurableState::Source {
 public:
  explicit FakeSource(const proto::ClusterMap* map) : map_(map) {}
  proto::SchedulerState Snapshot() const override {
    proto::SchedulerState state;
    state.set_format(1);
    *state.mutable_map() = *map_;
    state.set_next_node_id(42);
    return state;
  }
  proto::SchedulerClocks ClocksSnapshot() const override {
    proto::SchedulerClocks clocks;
    clocks.set_restored_from(7);
    clocks.add_workers()->set_clock(5);
    return clocks;
  }

 private:
  const proto::ClusterMap* map_;
};

TEST(DurableStateTest, WithoutAStoreACommitIsPublishedAtOnce) {
  SchedulerMutex lock;
  proto::ClusterMap map;
  FakeSource source(&map);
  DurableState durable(&map, &source);
  EXPECT_FALSE(durable.persistent());
  absl::MutexLock l(&lock.mu);
  map.set_epoch(3);
  EXPECT_EQ(durable.published().epoch(), 0);
  const uint64_t v = durable.Commit();
  EXPECT_EQ(durable.version(), v);
  EXPECT_EQ(durable.published().epoch(), 3);
  EXPECT_OK(durable.AwaitDurable(lock, v));
}

TEST(DurableStateTest, WithAStoreTheMapIsPublishedOnceWritten) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store,
                       StateStore::Open(TestTmpDir() + "/published"));
  SchedulerMutex lock;
  proto::ClusterMap map;
  FakeSource source(&map);
  DurableState durable(&map, &source);
  durable.SetStore(std::move(store), "published");
  std::thread persister([&] {
    absl::MutexLock l(&lock.mu);
    durable.PersistLoop(lock);
  });
  {
    absl::MutexLock l(&lock.mu);
    map.set_epoch(3);
    const uint64_t v = durable.Commit();
    // Not before it is on disk (the persister needs the lock to write).
    EXPECT_EQ(durable.published().epoch(), 0);
    durable.ClocksChanged();
    EXPECT_OK(durable.AwaitDurable(lock, v));
    EXPECT_EQ(durable.published().epoch(), 3);
    lock.stopping = true;
  }
  persister.join();  // after writing the clocks left
  ASSERT_OK_AND_ASSIGN(std::optional<proto::SchedulerState> state,
                       durable.store()->LoadState());
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->next_node_id(), 42);
  EXPECT_EQ(state->map().epoch(), 3);
  ASSERT_OK_AND_ASSIGN(proto::SchedulerClocks clocks,
                       durable.store()->LoadClocks());
  EXPECT_EQ(clocks.restored_from(), 7);
}

TEST(DurableStateTest, AWaitEndsWhenTheSchedulerStops) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store,
                       StateStore::Open(TestTmpDir() + "/stopping"));
  SchedulerMutex lock;
  proto::ClusterMap map;
  FakeSource source(&map);
  DurableState durable(&map, &source);
  durable.SetStore(std::move(store), "stopping");
  absl::MutexLock l(&lock.mu);
  const uint64_t v = durable.Commit();  // no persister: never written
  lock.stopping = true;
  EXPECT_THAT(durable.AwaitDurable(lock, v),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(durable.published().epoch(), 0);
}

TEST(DurableStateTest, ANewDirectoryIsWrittenAtOnceAndRecoveredPublishes) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store,
                       StateStore::Open(TestTmpDir() + "/first"));
  proto::ClusterMap map;
  FakeSource source(&map);
  DurableState durable(&map, &source);
  durable.SetStore(std::move(store), "first");
  EXPECT_OK(durable.WriteFirst());
  ASSERT_OK_AND_ASSIGN(std::optional<proto::SchedulerState> state,
                       durable.store()->LoadState());
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->next_node_id(), 42);
  map.set_epoch(9);
  durable.Recovered();
  EXPECT_EQ(durable.published().epoch(), 9);
  EXPECT_EQ(durable.version(), 1);
}

}  // namespace
}  // namespace downpour
