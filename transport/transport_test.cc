#include <zmq.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/test_util.h"
#include "transport/data_client.h"
#include "transport/data_server.h"

namespace downpour {
namespace {

// Replies with values[i] * 2 and echoes the key count in num_keys.
void DoublingHandler(BufferPool* pool, const IncomingMessage& req,
                     OutgoingReply* reply) {
  reply->header.set_num_keys(req.keys.size());
  Buffer out = pool->Acquire(req.values.size() * sizeof(float));
  float* f = reinterpret_cast<float*>(out.data());
  for (size_t i = 0; i < req.values.size(); ++i) f[i] = 2 * req.values[i];
  reply->values = Payload::Own(std::move(out));
}

struct Result {
  absl::Notification done;
  absl::Status status;
  proto::DataHeader header;
  std::vector<float> values;
};

DataClient::ReplyCallback Capture(Result* r) {
  return [r](const absl::Status& s, const IncomingMessage* reply) {
    r->status = s;
    if (reply != nullptr) {
      r->header = reply->header;
      r->values.assign(reply->values.begin(), reply->values.end());
    }
    r->done.Notify();
  };
}

class TransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DataServerOptions opts;
    opts.max_message_bytes = 1 << 20;
    auto server = DataServer::Create(opts, &pool_);
    ASSERT_OK(server);
    server_ = std::move(*server);
    server_->Start([this](const IncomingMessage& req, OutgoingReply* reply) {
      DoublingHandler(&pool_, req, reply);
    });
    auto client = DataClient::Create(DataClientOptions(), &pool_);
    ASSERT_OK(client);
    client_ = std::move(*client);
  }

  BufferPool pool_;
  std::unique_ptr<DataServer> server_;
  std::unique_ptr<DataClient> client_;
};

TEST_F(TransportTest, ManyRequestsInFlightMatchTheirReplies) {
  constexpr int kRequests = 200;
  std::vector<std::vector<float>> inputs(kRequests);
  std::vector<std::vector<Key>> keys(kRequests);
  std::vector<Result> results(kRequests);
  std::atomic<int> released{0};
  for (int i = 0; i < kRequests; ++i) {
    inputs[i].resize(100 + i);
    std::iota(inputs[i].begin(), inputs[i].end(), static_cast<float>(i));
    keys[i].assign(3 + i % 5, 7);
    OutgoingRequest req;
    req.header.set_op(proto::PUSH);
    req.keys = Payload::Borrow(keys[i].data(), keys[i].size() * sizeof(Key));
    req.values =
        Payload::Borrow(inputs[i].data(), inputs[i].size() * sizeof(float),
                        [&released] { released++; });
    client_->Send(server_->endpoint(), std::move(req),
                  absl::Now() + absl::Seconds(10), Capture(&results[i]));
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(
        results[i].done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    ASSERT_OK(results[i].status);
    EXPECT_EQ(results[i].header.num_keys(), keys[i].size());
    ASSERT_EQ(results[i].values.size(), inputs[i].size());
    for (size_t j = 0; j < inputs[i].size(); ++j) {
      EXPECT_EQ(results[i].values[j], 2 * inputs[i][j]);
    }
  }
  EXPECT_EQ(released.load(), kRequests);
}

// A server that records, per sending thread (worker_rank), the numbers
// (worker_clock) of its requests in the order they arrive, and echoes each
// number in the reply.
class ArrivalLog {
 public:
  ArrivalLog(BufferPool* pool, int threads) : arrived_(threads) {
    auto server = DataServer::Create(DataServerOptions(), pool);
    status_ = server.status();
    if (!server.ok()) return;
    server_ = std::move(*server);
    server_->Start([this](const IncomingMessage& req, OutgoingReply* reply) {
      {
        absl::MutexLock lock(&mu_);
        arrived_[req.header.worker_rank()].push_back(req.header.worker_clock());
      }
      reply->header.set_worker_clock(req.header.worker_clock());
    });
  }
  const absl::Status& status() const { return status_; }
  const std::string& endpoint() const { return server_->endpoint(); }
  // Every thread's requests numbered 0 to n - 1 arrived, in that order.
  void ExpectEachInOrder(int64_t n) {
    absl::MutexLock lock(&mu_);
    for (size_t t = 0; t < arrived_.size(); ++t) {
      ASSERT_EQ(arrived_[t].size(), static_cast<size_t>(n)) << t;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(arrived_[t][i], i) << "thread " << t;
      }
    }
  }

 private:
  absl::Status status_;
  absl::Mutex mu_;
  std::vector<std::vector<int64_t>> arrived_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DataServer> server_;
};

// Each thread alternates lone requests (sent on its own thread, the
// connection idle) with bursts (queued for the I/O thread while the first
// is in flight): whatever path a request takes, one thread's requests reach
// the server in the order it sent them, and each gets its own reply.
TEST_F(TransportTest, EachThreadsRequestsArriveInItsOrder) {
  constexpr int kThreads = 4, kRounds = 150, kBurst = 5;
  ArrivalLog log(&pool_, kThreads);
  ASSERT_OK(log.status());
  const std::string endpoint = log.endpoint();
  auto send = [&](int thread, int64_t n, Result* r) {
    OutgoingRequest req;
    req.header.set_op(proto::GET);
    req.header.set_worker_rank(thread);
    req.header.set_worker_clock(n);
    client_->Send(endpoint, std::move(req), absl::Now() + absl::Seconds(30),
                  Capture(r));
  };
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int64_t n = 0;
      for (int round = 0; round < kRounds; ++round) {
        std::vector<Result> results(round % 2 ? kBurst : 1);
        std::vector<int64_t> sent;
        for (Result& r : results) {
          sent.push_back(n);
          send(t, n++, &r);
        }
        for (size_t i = 0; i < results.size(); ++i) {
          if (!results[i].done.WaitForNotificationWithTimeout(
                  absl::Seconds(30)) ||
              !results[i].status.ok() ||
              results[i].header.worker_clock() != sent[i]) {
            wrong++;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  log.ExpectEachInOrder((kRounds / 2) * (1 + kBurst));
}

// A callback runs on the I/O thread with the sockets held; a request sent
// from inside it is queued, not sent on the spot (nor a deadlock).
TEST_F(TransportTest, ACallbackMaySendTheNextRequest) {
  constexpr int kChain = 200;
  std::atomic<int> answered{0};
  absl::Notification all;
  std::function<void()> next = [&] {
    OutgoingRequest req;
    req.header.set_op(proto::GET);
    client_->Send(server_->endpoint(), std::move(req),
                  absl::Now() + absl::Seconds(30),
                  [&](const absl::Status& s, const IncomingMessage*) {
                    if (!s.ok()) return all.Notify();
                    if (++answered == kChain) return all.Notify();
                    next();
                  });
  };
  next();
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(answered.load(), kChain);
}

// A caller that pumps takes the replies of everything in flight, its own
// and others'; once nobody pumps, the I/O thread takes the sockets back and
// a request sent after is answered without anyone pumping.
TEST_F(TransportTest, APumpingCallerTakesRepliesThenTheIOThreadTakesThemBack) {
  constexpr int kRequests = 64;
  std::vector<std::vector<float>> inputs(kRequests);
  std::vector<Result> results(kRequests);
  std::atomic<int> answered{0};
  for (int i = 0; i < kRequests; ++i) {
    inputs[i].assign(1 + i % 7, static_cast<float>(i));
    OutgoingRequest req;
    req.header.set_op(proto::PUSH);
    req.values =
        Payload::Borrow(inputs[i].data(), inputs[i].size() * sizeof(float));
    client_->Send(server_->endpoint(), std::move(req),
                  absl::Now() + absl::Seconds(30),
                  [&, r = &results[i]](const absl::Status& s,
                                       const IncomingMessage* reply) {
                    answered++;
                    Capture(r)(s, reply);
                  });
  }
  EXPECT_EQ(client_->Pump([&] { return answered.load() == kRequests; },
                          absl::Now() + absl::Seconds(30)),
            DataClient::PumpResult::kPumped);
  ASSERT_EQ(answered.load(), kRequests);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(
        results[i].done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    ASSERT_OK(results[i].status);
    ASSERT_EQ(results[i].values.size(), inputs[i].size());
    EXPECT_EQ(results[i].values[0], 2.0f * i);
  }
  for (int i = 0; i < 3; ++i) {
    Result later;
    OutgoingRequest req;
    req.header.set_op(proto::GET);
    client_->Send(server_->endpoint(), std::move(req),
                  absl::Now() + absl::Seconds(30), Capture(&later));
    ASSERT_TRUE(later.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_OK(later.status);
  }
}

// A second thread that asks to pump while one pumps is told to wait, and
// its reply reaches it through that pump. A pump stops at its deadline when
// nothing answers; what answers later is delivered by the I/O thread.
TEST_F(TransportTest, ASecondPumpWaitsForTheFirstAndAPumpEndsAtItsDeadline) {
  // PUSHes are held until released; GETs are answered at once.
  auto server = DataServer::Create(DataServerOptions(), &pool_);
  ASSERT_OK(server);
  DataServer* srv = server->get();
  std::vector<uint64_t> held;
  absl::Mutex mu;
  srv->Start([&](const IncomingMessage& req, OutgoingReply* reply) {
    if (req.header.op() != proto::PUSH) return;
    absl::MutexLock lock(&mu);
    held.push_back(req.reply_token);
    reply->deferred = true;
  });
  const std::string endpoint = srv->endpoint();
  Result stuck;
  OutgoingRequest push;
  push.header.set_op(proto::PUSH);
  client_->Send(endpoint, std::move(push), absl::Now() + absl::Seconds(60),
                Capture(&stuck));
  absl::Notification first_pumps;
  std::atomic<bool> stop_first{false};
  std::thread first([&] {
    // Its predicate runs inside the pump, so the notification says the
    // pump has begun.
    EXPECT_EQ(client_->Pump(
                  [&] {
                    if (!first_pumps.HasBeenNotified()) first_pumps.Notify();
                    return stop_first.load();
                  },
                  absl::Now() + absl::Seconds(60)),
              DataClient::PumpResult::kPumped);
  });
  first_pumps.WaitForNotification();
  Result get;
  OutgoingRequest req;
  req.header.set_op(proto::GET);
  client_->Send(endpoint, std::move(req), absl::Now() + absl::Seconds(30),
                Capture(&get));
  EXPECT_EQ(client_->Pump([&] { return get.done.HasBeenNotified(); },
                          absl::Now() + absl::Seconds(30)),
            DataClient::PumpResult::kWaiting);
  ASSERT_TRUE(get.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  client_->StopWaiting();
  EXPECT_OK(get.status);
  stop_first = true;
  first.join();
  // Nothing answers the push: this pump ends at its deadline.
  EXPECT_EQ(client_->Pump([&] { return stuck.done.HasBeenNotified(); },
                          absl::Now() + absl::Milliseconds(200)),
            DataClient::PumpResult::kPumped);
  EXPECT_FALSE(stuck.done.HasBeenNotified());
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(held.size(), 1u);
    srv->Post([srv, token = held[0]] {
      DeferredReply d;
      d.reply_token = token;
      srv->SendDeferred(std::move(d));
    });
  }
  ASSERT_TRUE(stuck.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_OK(stuck.status);
}

// Threads that pipeline and pump, beside one that only sends and sleeps:
// every request is answered, in each thread's order, whoever sends and
// receives it.
TEST_F(TransportTest, PumpingThreadsAndSleepingOnesAreAllServedInOrder) {
  constexpr int kThreads = 4, kRounds = 100, kBurst = 8;
  ArrivalLog log(&pool_, kThreads);
  ASSERT_OK(log.status());
  const std::string endpoint = log.endpoint();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const bool pumps = t != 0;
      int64_t n = 0;
      for (int round = 0; round < kRounds; ++round) {
        std::vector<Result> results(kBurst);
        std::atomic<int> answered{0};
        for (int i = 0; i < kBurst; ++i) {
          OutgoingRequest req;
          req.header.set_op(proto::GET);
          req.header.set_worker_rank(t);
          req.header.set_worker_clock(n + i);
          client_->Send(endpoint, std::move(req),
                        absl::Now() + absl::Seconds(30),
                        [&, r = &results[i]](const absl::Status& s,
                                             const IncomingMessage* reply) {
                          // Before the notification, after which the
                          // round's state may be gone.
                          answered++;
                          Capture(r)(s, reply);
                        });
        }
        bool waiting = false;
        if (pumps) {
          waiting = client_->Pump([&] { return answered.load() == kBurst; },
                                  absl::Now() + absl::Seconds(30)) ==
                    DataClient::PumpResult::kWaiting;
        }
        for (int i = 0; i < kBurst; ++i) {
          if (!results[i].done.WaitForNotificationWithTimeout(
                  absl::Seconds(30)) ||
              !results[i].status.ok() ||
              results[i].header.worker_clock() != n + i) {
            wrong++;
          }
        }
        if (waiting) client_->StopWaiting();
        n += kBurst;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  log.ExpectEachInOrder(kRounds * kBurst);
}

TEST_F(TransportTest, OversizeRequestIsRejectedWithResourceExhausted) {
  std::vector<float> big((1 << 20) / sizeof(float) + 16, 1.0f);
  OutgoingRequest req;
  req.values = Payload::Borrow(big.data(), big.size() * sizeof(float));
  Result r;
  client_->Send(server_->endpoint(), std::move(req),
                absl::Now() + absl::Seconds(10), Capture(&r));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_OK(r.status);
  EXPECT_EQ(r.header.status_code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(r.header.status_message(), ::testing::HasSubstr("exceeds"));
}

TEST_F(TransportTest, NoServerTimesOutAndReleasesBorrowedPayload) {
  std::vector<float> values(1000, 1.0f);
  std::atomic<bool> released{false};
  OutgoingRequest req;
  req.values = Payload::Borrow(values.data(), values.size() * sizeof(float),
                               [&released] { released = true; });
  Result r;
  // Nothing listens on port 1 of loopback.
  client_->Send("tcp://127.0.0.1:1", std::move(req),
                absl::Now() + absl::Milliseconds(200), Capture(&r));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kDeadlineExceeded));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!released && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(released);
}

TEST_F(TransportTest, PostedClosuresRunOnTheReceiveThreadWhenDue) {
  // The handler records the receive thread's id.
  std::atomic<std::thread::id> receive_thread{};
  auto server = DataServer::Create(DataServerOptions(), &pool_);
  ASSERT_OK(server);
  (*server)->Start([&](const IncomingMessage&, OutgoingReply*) {
    receive_thread = std::this_thread::get_id();
  });
  Result r;
  client_->Send((*server)->endpoint(), OutgoingRequest(),
                absl::Now() + absl::Seconds(10), Capture(&r));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::Mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  absl::Notification all;
  const absl::Time start = absl::Now();
  absl::Time late_ran;
  auto record = [&](int i) {
    absl::MutexLock lock(&mu);
    order.push_back(i);
    threads.push_back(std::this_thread::get_id());
    if (i == 3) late_ran = absl::Now();
    if (order.size() == 4) all.Notify();
  };
  (*server)->PostAfter(absl::Milliseconds(300), [&] { record(3); });
  (*server)->PostAfter(absl::Milliseconds(100), [&] { record(2); });
  std::thread other([&] {
    (*server)->Post([&] { record(0); });
    (*server)->Post([&] { record(1); });
  });
  other.join();
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  for (const auto& t : threads) EXPECT_EQ(t, receive_thread.load());
  EXPECT_GE(late_ran - start, absl::Milliseconds(300));
}

// The replication pattern: a front server retains each request's frames,
// defers its reply, forwards the frames (borrowed, not copied) to a back
// server, and answers the client from a posted closure once the back server
// has replied. Also, frames retained from a request stay valid after many
// later requests reused the receive buffers.
TEST_F(TransportTest, RetainedFramesCanBeForwardedAndTheReplyDeferred) {
  auto back = DataServer::Create(DataServerOptions(), &pool_);
  ASSERT_OK(back);
  (*back)->Start([this](const IncomingMessage& req, OutgoingReply* reply) {
    DoublingHandler(&pool_, req, reply);
  });
  auto peers = DataClient::Create(DataClientOptions(), &pool_);
  ASSERT_OK(peers);
  auto front = DataServer::Create(DataServerOptions(), &pool_);
  ASSERT_OK(front);
  DataServer* f = front->get();
  std::atomic<int> released{0};
  std::vector<std::shared_ptr<const RetainedRequest>> kept;
  f->Start([&](const IncomingMessage& req, OutgoingReply* reply) {
    std::shared_ptr<const RetainedRequest> r = f->Retain(req);
    kept.push_back(r);
    reply->deferred = true;
    OutgoingRequest fwd;
    fwd.header.set_op(req.header.op());
    fwd.keys =
        Payload::Borrow(r->keys.data(), r->keys.size() * sizeof(Key), [r] {});
    fwd.values =
        Payload::Borrow(r->values.data(), r->values.size() * sizeof(float),
                        [r, &released] { released++; });
    const uint64_t token = req.reply_token;
    (*peers)->Send(
        (*back)->endpoint(), std::move(fwd), absl::Now() + absl::Seconds(10),
        [f, token](const absl::Status& s, const IncomingMessage* back_reply) {
          DeferredReply d;
          d.reply_token = token;
          if (s.ok()) {
            d.reply.header = back_reply->header;
            auto owned = std::make_shared<std::vector<float>>(
                back_reply->values.begin(), back_reply->values.end());
            d.reply.values = Payload::Borrow(
                owned->data(), owned->size() * sizeof(float), [owned] {});
          }
          // Back on the front server's receive thread.
          f->Post([f, d = std::make_shared<DeferredReply>(std::move(
                          d))]() mutable { f->SendDeferred(std::move(*d)); });
        });
  });
  constexpr int kRequests = 50;
  std::vector<std::vector<float>> inputs(kRequests);
  std::vector<Key> keys = {1, 2, 3};
  std::vector<Result> results(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    // Half small (copied when retained), half large (kept by reference).
    inputs[i].assign(i % 2 ? 10000 : 3, static_cast<float>(i));
    OutgoingRequest req;
    req.header.set_op(proto::PUSH);
    req.keys = Payload::Borrow(keys.data(), keys.size() * sizeof(Key));
    req.values =
        Payload::Borrow(inputs[i].data(), inputs[i].size() * sizeof(float));
    client_->Send(f->endpoint(), std::move(req),
                  absl::Now() + absl::Seconds(30), Capture(&results[i]));
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(
        results[i].done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    ASSERT_OK(results[i].status);
    EXPECT_EQ(results[i].header.num_keys(), 3u);
    ASSERT_EQ(results[i].values.size(), inputs[i].size()) << i;
    EXPECT_EQ(results[i].values[0], 2.0f * i);
  }
  EXPECT_EQ(released.load(), kRequests);
  // Every retained request still holds exactly what was sent.
  f->Stop();
  ASSERT_EQ(kept.size(), static_cast<size_t>(kRequests));
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(
        std::vector<float>(kept[i]->values.begin(), kept[i]->values.end()),
        inputs[i]);
    EXPECT_EQ(std::vector<Key>(kept[i]->keys.begin(), kept[i]->keys.end()),
              keys);
  }
}

TEST_F(TransportTest, ResetFailsRequestsInFlightAtOnceAndLaterOnesReconnect) {
  // Answers GETs, never answers PUSHes.
  auto server = DataServer::Create(DataServerOptions(), &pool_);
  ASSERT_OK(server);
  (*server)->Start([](const IncomingMessage& req, OutgoingReply* reply) {
    reply->deferred = req.header.op() == proto::PUSH;
  });
  const std::string endpoint = (*server)->endpoint();
  std::vector<Result> stuck(3);
  for (Result& r : stuck) {
    OutgoingRequest req;
    req.header.set_op(proto::PUSH);
    client_->Send(endpoint, std::move(req), absl::Now() + absl::Minutes(5),
                  Capture(&r));
  }
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time reset = absl::Now();
  client_->Reset(endpoint, absl::UnavailableError("server 7 is dead"));
  for (Result& r : stuck) {
    ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(std::string(r.status.message()),
                ::testing::HasSubstr("server 7 is dead"));
  }
  EXPECT_LT(absl::Now() - reset, absl::Seconds(5));
  Result after;
  OutgoingRequest get;
  get.header.set_op(proto::GET);
  client_->Send(endpoint, std::move(get), absl::Now() + absl::Seconds(10),
                Capture(&after));
  ASSERT_TRUE(after.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_OK(after.status);
}

// Sends raw frames with a plain DEALER socket and returns the reply header.
proto::DataHeader RawRequest(const std::string& endpoint,
                             const std::vector<std::string>& frames) {
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  int timeout = 5000;
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_connect(s, endpoint.c_str());
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq_send(s, frames[i].data(), frames[i].size(),
             i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
  }
  proto::DataHeader header;
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  if (zmq_msg_recv(&msg, s, 0) >= 0) {
    header.ParseFromArray(zmq_msg_data(&msg), zmq_msg_size(&msg));
  } else {
    header.set_status_message("no reply");
  }
  zmq_msg_close(&msg);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return header;
}

TEST_F(TransportTest, MalformedFramesGetClearErrors) {
  proto::DataHeader h;
  h.set_request_id(42);
  const std::string header = h.SerializeAsString();

  proto::DataHeader r =
      RawRequest(server_->endpoint(), {"\xff\xff\xff garbage"});
  EXPECT_EQ(r.status_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status_message(), ::testing::HasSubstr("not a DataHeader"));

  r = RawRequest(server_->endpoint(), {header, std::string(16, '\0')});
  EXPECT_EQ(r.request_id(), 42u);
  EXPECT_EQ(r.status_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status_message(), ::testing::HasSubstr("expected 3"));

  r = RawRequest(server_->endpoint(), {header, std::string(7, '\0'), ""});
  EXPECT_EQ(r.status_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status_message(), ::testing::HasSubstr("uint64"));

  r = RawRequest(server_->endpoint(), {header, "", std::string(5, '\0')});
  EXPECT_EQ(r.status_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status_message(), ::testing::HasSubstr("floats"));

  // The server is still healthy afterwards.
  r = RawRequest(server_->endpoint(), {header, std::string(8, '\0'), ""});
  EXPECT_EQ(r.status_code(), 0);
  EXPECT_EQ(r.num_keys(), 1u);
  EXPECT_GE(server_->counters().framing_errors.load(), 4u);
}

// A CURVE-secured server: the handler runs only for peers with the secret.
class SecureTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(std::string secret, ClusterAuth::NewSecret());
    ASSERT_OK_AND_ASSIGN(auth_, ClusterAuth::FromSecret(secret));
    DataServerOptions opts;
    opts.auth = auth_;
    ASSERT_OK_AND_ASSIGN(server_, DataServer::Create(opts, &pool_));
    server_->Start([this](const IncomingMessage& req, OutgoingReply* reply) {
      handled_++;
      DoublingHandler(&pool_, req, reply);
    });
  }

  struct Outcome {
    absl::Status status;
    std::vector<float> values;
  };
  // Sends one push of {1, 2, 3} through a new client with `auth`.
  Outcome SendWith(const ClusterAuth& auth, int* released) {
    DataClientOptions opts;
    opts.auth = auth;
    auto client = DataClient::Create(opts, &pool_);
    if (!client.ok()) return {client.status(), {}};
    Result r;
    OutgoingRequest req;
    req.header.set_op(proto::PUSH);
    req.values =
        Payload::Borrow(values_, sizeof(values_), [released] { ++*released; });
    (*client)->Send(server_->endpoint(), std::move(req),
                    absl::Now() + absl::Seconds(20), Capture(&r));
    EXPECT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    return {r.status, r.values};
  }

  float values_[3] = {1, 2, 3};
  std::atomic<int> handled_{0};
  ClusterAuth auth_;
  BufferPool pool_;
  std::unique_ptr<DataServer> server_;
};

TEST_F(SecureTransportTest, PeerWithTheSecretIsServed) {
  int released = 0;
  Outcome r = SendWith(auth_, &released);
  ASSERT_OK(r.status);
  EXPECT_EQ(r.values, (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(released, 1);
  EXPECT_EQ(server_->counters().auth_failures.load(), 0u);
}

TEST_F(SecureTransportTest, PeerWithoutSecretFailsFastWithAReason) {
  int released = 0;
  const absl::Time start = absl::Now();
  Outcome r = SendWith(ClusterAuth(), &released);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(std::string(r.status.message()),
              ::testing::HasSubstr("security handshake"));
  EXPECT_THAT(std::string(r.status.message()),
              ::testing::HasSubstr(server_->endpoint()));
  // Refused by the handshake, not by the 20 s deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(released, 1);  // the borrowed payload is given back
  EXPECT_EQ(handled_.load(), 0);
  // The server counts it (its monitor may run a moment after the client's).
  for (int i = 0; i < 100 && server_->counters().auth_failures.load() == 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GT(server_->counters().auth_failures.load(), 0u);
}

TEST_F(SecureTransportTest, PeerWithAnotherSecretIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::string other, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth wrong, ClusterAuth::FromSecret(other));
  int released = 0;
  Outcome r = SendWith(wrong, &released);
  // The client expects the cluster's server key derived from its own
  // secret, so the handshake fails cryptographically.
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(handled_.load(), 0);
  EXPECT_EQ(released, 1);
  // The server still serves a good peer afterwards.
  Outcome ok = SendWith(auth_, &released);
  ASSERT_OK(ok.status);
  EXPECT_EQ(ok.values, (std::vector<float>{2, 4, 6}));
}

TEST_F(SecureTransportTest, PeerThatKnowsOnlyThePublicKeyIsRefusedByZap) {
  // An attacker who learned the server's public key (it is not secret)
  // connects with a key pair of its own: the handshake's cryptography
  // succeeds, and only the ZAP check of the client key stops it.
  char pub[41], sec[41];
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, auth_.curve_public_key().data(), 40);
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40);
  ASSERT_EQ(zmq_socket_monitor(s, "inproc://attacker",
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH),
            0);
  void* mon = zmq_socket(ctx, ZMQ_PAIR);
  ASSERT_EQ(zmq_connect(mon, "inproc://attacker"), 0);
  ASSERT_EQ(zmq_connect(s, server_->endpoint().c_str()), 0);
  zmq_send(s, "x", 1, 0);
  int rcvtimeo = 10000;
  zmq_setsockopt(mon, ZMQ_RCVTIMEO, &rcvtimeo, sizeof(rcvtimeo));
  zmq_msg_t event;
  zmq_msg_init(&event);
  ASSERT_GE(zmq_msg_recv(&event, mon, 0), 6) << "no AUTH failure event";
  uint16_t id;
  std::memcpy(&id, zmq_msg_data(&event), sizeof(id));
  EXPECT_EQ(id, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  zmq_msg_close(&event);
  zmq_socket_monitor(s, nullptr, 0);
  zmq_close(mon);
  zmq_close(s);
  zmq_ctx_term(ctx);
  EXPECT_EQ(handled_.load(), 0);
}

}  // namespace
}  // namespace downpour
