// Allocator settings for processes that move large messages.
//
// On the VMs we run on, writing to freshly mapped pages runs at ~0.4 GB/s
// while writing to pages already touched runs at ~17 GB/s. glibc serves
// blocks above the mmap threshold (at most 32 MB) with a fresh mmap and
// unmaps them on free, so every large ZeroMQ message would land in fresh
// pages. This keeps all blocks in the main heap and never trims it, so a
// freed 64 MB block is reused by the next message.
#ifndef DOWNPOUR_COMMON_MALLOC_TUNING_H_
#define DOWNPOUR_COMMON_MALLOC_TUNING_H_

namespace downpour {

// Call once, early in main(), before threads start. Idempotent.
void TuneAllocatorForLargeMessages();

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_MALLOC_TUNING_H_
