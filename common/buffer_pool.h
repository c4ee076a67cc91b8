// A pool of reusable byte buffers for message payloads.
//
// Large messages must land in memory that was touched before (see
// malloc_tuning.h), so every hot path takes its payload buffers from a pool
// and gives them back instead of freeing them. Buffers are grouped in
// power-of-two size classes; a pool keeps at most `max_cached_bytes` of idle
// buffers and frees the rest.
//
// Thread-safe. A Buffer may be released on any thread (ZeroMQ frees sent
// messages on its own I/O thread). The pool must outlive every Buffer.
#ifndef DOWNPOUR_COMMON_BUFFER_POOL_H_
#define DOWNPOUR_COMMON_BUFFER_POOL_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace downpour {

class BufferPool;

// One pooled block. Handed to ZeroMQ as the `hint` of a zero-copy message so
// that its free callback can return it (see BufferPool::FreeForZmq).
struct PoolBlock {
  char* data;
  size_t capacity;
  BufferPool* pool;
};

// Move-only owner of a pooled block; returns it to the pool on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(PoolBlock* block, size_t size) : block_(block), size_(size) {}
  Buffer(Buffer&& other) noexcept
      : block_(std::exchange(other.block_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  char* data() const { return block_ ? block_->data : nullptr; }
  size_t size() const { return size_; }
  size_t capacity() const { return block_ ? block_->capacity : 0; }
  // Gives up ownership; the caller must eventually call BufferPool::Return.
  PoolBlock* Detach() {
    size_ = 0;
    return std::exchange(block_, nullptr);
  }

 private:
  PoolBlock* block_ = nullptr;
  size_t size_ = 0;
};

class BufferPool {
 public:
  explicit BufferPool(size_t max_cached_bytes = size_t{1} << 30);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of `size` bytes (capacity rounded up to a size class). Reuses an
  // idle block of that class when there is one. Never returns null.
  Buffer Acquire(size_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns a detached block to its pool.
  static void Return(PoolBlock* block);
  // Matches zmq_free_fn: `hint` is the PoolBlock*.
  static void FreeForZmq(void* data, void* hint);

  size_t cached_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t allocations() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr int kNumClasses = 48;
  static int ClassOf(size_t size);
  void Put(PoolBlock* block) ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_cached_bytes_;
  mutable absl::Mutex mu_;
  std::vector<PoolBlock*> free_[kNumClasses] ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_BUFFER_POOL_H_
