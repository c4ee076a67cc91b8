// Zero-copy range pulls through the real transport (DataServer, DataClient,
// ZeroMQ over loopback) and the dispatcher: replies sent from the table's
// memory are never torn by concurrent writes, every pin is released, and
// stopping the server with pulls in flight is clean.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/test_util.h"
#include "server/internal/dispatcher.h"
#include "transport/data_client.h"
#include "transport/data_server.h"

namespace downpour {
namespace server_internal {
namespace {

constexpr NodeId kSelf = 1;
constexpr TableId kTable = 1;
constexpr uint32_t kWidth = 1024;  // 4 KiB rows
constexpr Key kRows = 256;         // 1 MiB table

proto::ClusterMap MakeMap() {
  proto::ClusterMap map;
  map.set_epoch(1);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_name("dense");
  t->mutable_spec()->set_id(kTable);
  t->mutable_spec()->set_kind(proto::DENSE);
  t->mutable_spec()->set_width(kWidth);
  t->mutable_spec()->set_num_keys(kRows);
  t->mutable_spec()->mutable_handler()->set_name("sum");
  auto* r = t->add_ranges();
  r->set_begin(0);
  r->set_end(kRows);
  r->set_primary(kSelf);
  return map;
}

OutgoingRequest RangeRequest(proto::Op op, Key begin, Key end) {
  OutgoingRequest req;
  req.header.set_op(op);
  req.header.set_table_id(kTable);
  req.header.set_epoch(1);
  req.header.set_width(kWidth);
  req.header.set_is_range(true);
  req.header.set_range_begin(begin);
  req.header.set_range_end(end);
  req.header.set_num_keys(end - begin);
  return req;
}

class ZeroCopyPullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PinOptions pins;
    pins.min_bytes = 4096;
    pins.wait = absl::Seconds(30);  // a torn reply, never a copy, on a bug
    // Keep pinning while writes wait, so that writes meet pins all along.
    pins.copy_after_wait = absl::ZeroDuration();
    dispatcher_ = std::make_unique<Dispatcher>(kSelf, size_t{64} << 20, &pool_,
                                               &plugins_, pins);
    ASSERT_OK(dispatcher_->ApplyMap(MakeMap()));
    ASSERT_OK_AND_ASSIGN(server_,
                         DataServer::Create(DataServerOptions(), &pool_));
    server_->Start([d = dispatcher_.get()](const IncomingMessage& req,
                                           OutgoingReply* rep) {
      std::vector<DeferredReply> released;  // no BSP tables here
      d->Handle(req, rep, &released);
    });
  }

  proto::TableStats Stats() {
    proto::ServerStats s;
    dispatcher_->FillStats(&s);
    EXPECT_EQ(s.tables_size(), 1);
    return s.tables(0);
  }

  BufferPool pool_;
  PluginRegistry plugins_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<DataServer> server_;
};

// A writer PUTs version v into every float of the table, v = 1, 2, ...;
// pullers read the whole table (or a part) many times with several pulls in
// flight. Every reply must hold one version only (not torn) and, per
// connection, versions must never go back (no acknowledged write lost).
TEST_F(ZeroCopyPullTest, ConcurrentWritesNeverTearReplies) {
  constexpr int kVersions = 200;
  constexpr int kPullers = 2;
  constexpr int kDepth = 4;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::atomic<bool> writer_done{false};
  std::atomic<int> torn{0}, backwards{0}, failed{0}, pulls{0};

  std::thread writer([&] {
    auto client = DataClient::Create(DataClientOptions(), &pool_);
    ASSERT_OK(client);
    std::vector<float> values(kRows * kWidth);
    for (int v = 1; v <= kVersions; ++v) {
      std::fill(values.begin(), values.end(), static_cast<float>(v));
      OutgoingRequest req = RangeRequest(proto::PUT, 0, kRows);
      req.values =
          Payload::Borrow(values.data(), values.size() * sizeof(float));
      absl::Notification done;
      (*client)->Send(server_->endpoint(), std::move(req), deadline,
                      [&](const absl::Status& s, const IncomingMessage* reply) {
                        if (!s.ok() || reply->header.status_code() != 0)
                          ++failed;
                        done.Notify();
                      });
      if (!done.WaitForNotificationWithTimeout(absl::Seconds(60))) ++failed;
    }
    writer_done = true;
  });

  std::vector<std::thread> pullers;
  for (int p = 0; p < kPullers; ++p) {
    pullers.emplace_back([&, p] {
      auto client = DataClient::Create(DataClientOptions(), &pool_);
      ASSERT_OK(client);
      absl::Mutex mu;
      int in_flight = 0;
      float last = 0;
      // Puller 1 reads a part in the middle: a write overlaps it partly.
      const Key begin = p == 0 ? 0 : kRows / 4;
      const Key end = p == 0 ? kRows : kRows / 2;
      auto on_reply = [&](const absl::Status& s, const IncomingMessage* reply) {
        absl::MutexLock lock(&mu);
        --in_flight;
        ++pulls;
        if (!s.ok() || reply->header.status_code() != 0 ||
            reply->values.size() != (end - begin) * kWidth) {
          ++failed;
          return;
        }
        const float first = reply->values[0];
        for (float f : reply->values) {
          if (f != first) {
            ++torn;
            break;
          }
        }
        if (first < last) ++backwards;
        last = first;
      };
      while (!writer_done.load() && absl::Now() < deadline) {
        {
          absl::MutexLock lock(&mu);
          mu.AwaitWithDeadline(
              absl::Condition(
                  +[](int* n) { return *n < kDepth; }, &in_flight),
              deadline);
          ++in_flight;
        }
        (*client)->Send(server_->endpoint(),
                        RangeRequest(proto::PULL, begin, end), deadline,
                        on_reply);
      }
      absl::MutexLock lock(&mu);
      mu.AwaitWithDeadline(absl::Condition(
                               +[](int* n) { return *n == 0; }, &in_flight),
                           deadline);
    });
  }
  writer.join();
  for (auto& t : pullers) t.join();

  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(torn.load(), 0) << "replies mixing two versions";
  EXPECT_EQ(backwards.load(), 0) << "a pull saw an older version";
  EXPECT_GT(pulls.load(), 0);
  const proto::TableStats stats = Stats();
  EXPECT_GT(stats.zero_copy_replies(), 0u) << "the zero-copy path never ran";
  std::printf("%d pulls, %lu zero-copy replies, %lu writes waited\n",
              pulls.load(),
              static_cast<unsigned long>(stats.zero_copy_replies()),
              static_cast<unsigned long>(stats.pin_waits()));
  EXPECT_EQ(stats.pin_copies(), 0u);
  // Every reply was answered, so ZeroMQ released every pin (its I/O thread
  // may still be finishing the last send).
  while (Stats().pinned_replies() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(Stats().pinned_replies(), 0);
  // The table holds the last version.
  std::vector<float> final_values;
  absl::Notification done;
  auto client = DataClient::Create(DataClientOptions(), &pool_);
  ASSERT_OK(client);
  (*client)->Send(server_->endpoint(), RangeRequest(proto::GET, 0, kRows),
                  deadline,
                  [&](const absl::Status& s, const IncomingMessage* r) {
                    if (s.ok())
                      final_values.assign(r->values.begin(), r->values.end());
                    done.Notify();
                  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(final_values, std::vector<float>(kRows * kWidth, kVersions));
}

// Stopping the server while pulls are queued on its socket drops their
// replies; ZeroMQ then releases every pin, and the client fails the pulls.
TEST_F(ZeroCopyPullTest, StopWithPullsInFlightReleasesEveryPin) {
  auto client = DataClient::Create(DataClientOptions(), &pool_);
  ASSERT_OK(client);
  constexpr int kPulls = 256;
  absl::Mutex mu;
  int answered = 0, ok = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (int i = 0; i < kPulls; ++i) {
    (*client)->Send(server_->endpoint(), RangeRequest(proto::PULL, 0, kRows),
                    deadline,
                    [&](const absl::Status& s, const IncomingMessage*) {
                      absl::MutexLock lock(&mu);
                      ++answered;
                      if (s.ok()) ++ok;
                    });
  }
  // Let the server take some of them, then stop it mid-stream.
  while (Stats().zero_copy_replies() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  server_->Stop();
  EXPECT_GT(Stats().zero_copy_replies(), 0u);
  EXPECT_EQ(Stats().pinned_replies(), 0);
  // The dispatcher (and its tables) can go while the client still waits.
  dispatcher_.reset();
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(
        absl::Condition(
            +[](int* n) { return *n == kPulls; }, &answered),
        absl::Seconds(30)));
    std::printf("%d of %d pulls answered before the stop\n", ok, kPulls);
  }
  client->reset();
}

}  // namespace
}  // namespace server_internal
}  // namespace downpour
