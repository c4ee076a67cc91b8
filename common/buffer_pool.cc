#include "common/buffer_pool.h"

#include <cstdlib>

namespace downpour {

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (block_ != nullptr) BufferPool::Return(block_);
    block_ = std::exchange(other.block_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Buffer::~Buffer() {
  if (block_ != nullptr) BufferPool::Return(block_);
}

BufferPool::BufferPool(size_t max_cached_bytes)
    : max_cached_bytes_(max_cached_bytes) {}

BufferPool::~BufferPool() {
  absl::MutexLock lock(&mu_);
  for (auto& list : free_) {
    for (PoolBlock* b : list) {
      std::free(b->data);
      delete b;
    }
    list.clear();
  }
}

int BufferPool::ClassOf(size_t size) {
  // Smallest class is 4 KiB; class c holds blocks of 4 KiB << c.
  int c = 0;
  size_t cap = 4096;
  while (cap < size && c < kNumClasses - 1) {
    cap <<= 1;
    ++c;
  }
  return c;
}

Buffer BufferPool::Acquire(size_t size) {
  const int c = ClassOf(size);
  {
    absl::MutexLock lock(&mu_);
    if (!free_[c].empty()) {
      PoolBlock* b = free_[c].back();
      free_[c].pop_back();
      cached_bytes_ -= b->capacity;
      return Buffer(b, size);
    }
    ++allocations_;
  }
  const size_t capacity = size_t{4096} << c;
  auto* b =
      new PoolBlock{static_cast<char*>(std::malloc(capacity)), capacity, this};
  if (b->data == nullptr) std::abort();  // out of memory: nothing sane to do
  return Buffer(b, size);
}

void BufferPool::Put(PoolBlock* block) {
  {
    absl::MutexLock lock(&mu_);
    if (cached_bytes_ + block->capacity <= max_cached_bytes_) {
      cached_bytes_ += block->capacity;
      free_[ClassOf(block->capacity)].push_back(block);
      return;
    }
  }
  std::free(block->data);
  delete block;
}

void BufferPool::Return(PoolBlock* block) { block->pool->Put(block); }

void BufferPool::FreeForZmq(void* /*data*/, void* hint) {
  Return(static_cast<PoolBlock*>(hint));
}

size_t BufferPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

size_t BufferPool::allocations() const {
  absl::MutexLock lock(&mu_);
  return allocations_;
}

}  // namespace downpour
