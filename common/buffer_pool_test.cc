#include "common/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace downpour {
namespace {

TEST(BufferPoolTest, ReusesReleasedBlocks) {
  BufferPool pool;
  char* first;
  {
    Buffer b = pool.Acquire(100000);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), 100000u);
    EXPECT_GE(b.capacity(), 100000u);
    std::memset(b.data(), 1, b.size());
    first = b.data();
  }
  Buffer again = pool.Acquire(90000);  // same size class
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(pool.allocations(), 1u);
}

TEST(BufferPoolTest, RespectsCacheLimit) {
  BufferPool pool(/*max_cached_bytes=*/8192);
  { Buffer a = pool.Acquire(1 << 20); }
  EXPECT_EQ(pool.cached_bytes(), 0u);  // too large to keep
  { Buffer b = pool.Acquire(4096); }
  EXPECT_EQ(pool.cached_bytes(), 4096u);
}

TEST(BufferPoolTest, DetachedBlockReturnsThroughZmqCallback) {
  BufferPool pool;
  Buffer b = pool.Acquire(5000);
  char* data = b.data();
  PoolBlock* block = b.Detach();
  EXPECT_EQ(b.data(), nullptr);
  BufferPool::FreeForZmq(block->data, block);
  EXPECT_EQ(pool.Acquire(5000).data(), data);
}

TEST(BufferPoolTest, ConcurrentUse) {
  BufferPool pool;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 1000; ++i) {
        Buffer b = pool.Acquire(1000 + 7 * i + t);
        std::memset(b.data(), t, b.size());
        Buffer moved = std::move(b);
        EXPECT_EQ(moved.data()[0], static_cast<char>(t));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(pool.allocations(), 8u);
}

}  // namespace
}  // namespace downpour
