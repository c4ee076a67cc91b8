// ThreadSanitizer's defaults and suppressions for every binary of a
// --config=tsan build (linked in with tsan_absl.cc), so that daemons started
// by tests get them too without any environment.
//
// Each suppression says why it is not a bug of ours.
extern "C" const char* __tsan_default_options() {
  // A report fails the test (the process exits non-zero at once); reports
  // of second deadlock stacks help to read lock-order inversions.
  return "halt_on_error=1:second_deadlock_stack=1";
}

extern "C" const char* __tsan_default_suppressions() {
  return
      // Uninstrumented libraries that hand our buffers between their own
      // threads through lock-free queues TSan cannot see: gRPC (its core
      // threads read call metadata and messages our threads wrote) and
      // ZeroMQ (its I/O threads read the frames we send). called_from_lib
      // ignores only the intercepted calls (memcpy, sendmsg, ...) made from
      // inside these libraries; everything our code does stays checked.
      "called_from_lib:libgrpc.so\n"
      "called_from_lib:libgrpc++.so\n"
      "called_from_lib:libgpr.so\n"
      // upb, the message parser gRPC links (libupb.so): a watch thread's
      // reply was parsed by memcpy from there out of memory the main thread
      // wrote before the call (bounded_table_test, once in a fresh clone).
      "called_from_lib:libupb.so\n"
      "called_from_lib:libzmq.so\n"
      // Abseil's own internals, ordered by its (uninstrumented) spin locks:
      // the Mutex deadlock detector's graph and its low-level allocator.
      "called_from_lib:libabsl_synchronization.so\n"
      "called_from_lib:libabsl_graphcycles_internal.so\n"
      "called_from_lib:libabsl_malloc_internal.so\n"
      // absl::Status and absl::Cord share their heap part between copies
      // with a reference count kept by atomics inside Debian's (not
      // instrumented) libraries: TSan sees the last owner free memory
      // another thread allocated, with no order between them.
      "race:libabsl_status.so\n"
      "race:libabsl_cord.so\n"
      "race:libabsl_cord_internal.so\n"
      // gRPC draws from Abseil's random pool as it sends a call; the pool
      // gives each draw an entry under that entry's own spin lock, inside
      // the same uninstrumented library, so two threads starting calls at
      // once (the scheduler's parallel CheckpointPart RPCs) look unordered
      // to TSan.
      "race:libabsl_random_internal_pool_urbg.so\n"
      // The Hogwild workers read and write one shared parameter array
      // without locks on purpose (worker/worker.h, README "Hogwild"): the
      // races are the algorithm.
      "race:Hogwild\n";
}
