#include "common/malloc_tuning.h"

#include <malloc.h>

namespace downpour {

void TuneAllocatorForLargeMessages() {
  // No mmap for large blocks: they come from the heap and are reused.
  mallopt(M_MMAP_MAX, 0);
  // Never give the top of the heap back to the kernel.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Grow the heap in large steps so that brk is called rarely.
  mallopt(M_TOP_PAD, 64 << 20);
  // One arena: glibc's per-thread arenas fall back to mmap for blocks larger
  // than their 64 MB heaps, which would defeat the settings above.
  mallopt(M_ARENA_MAX, 1);
}

}  // namespace downpour
