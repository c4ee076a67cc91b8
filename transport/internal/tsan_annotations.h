// Happens-before edges that ThreadSanitizer cannot see by itself: ZeroMQ
// (not instrumented) hands a message's free callback to its I/O thread
// through lock-free queues, so TSan would take everything the callback
// touches for a race with the thread that sent. The sender releases the
// callback's argument; the callback acquires it first. No-ops outside
// --config=tsan.
#ifndef DOWNPOUR_TRANSPORT_INTERNAL_TSAN_ANNOTATIONS_H_
#define DOWNPOUR_TRANSPORT_INTERNAL_TSAN_ANNOTATIONS_H_

#if defined(__SANITIZE_THREAD__)
#define DP_HAVE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DP_HAVE_TSAN 1
#endif
#endif

#if defined(DP_HAVE_TSAN)
#include <sanitizer/tsan_interface.h>
#define DP_TSAN_RELEASE(addr) __tsan_release(addr)
#define DP_TSAN_ACQUIRE(addr) __tsan_acquire(addr)
#else
#define DP_TSAN_RELEASE(addr) ((void)(addr))
#define DP_TSAN_ACQUIRE(addr) ((void)(addr))
#endif

#endif  // DOWNPOUR_TRANSPORT_INTERNAL_TSAN_ANNOTATIONS_H_
