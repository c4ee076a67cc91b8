// AddressSanitizer's, LeakSanitizer's and UndefinedBehaviorSanitizer's
// defaults for every binary of a --config=asan build, so that daemons
// started by tests get them without any environment. Each suppression says
// why it is not a bug of ours.
extern "C" const char* __asan_default_options() {
  return "detect_leaks=1:detect_stack_use_after_return=1:"
         "strict_init_order=1:check_initialization_order=1";
}

extern "C" const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}

extern "C" const char* __lsan_default_suppressions() { return ""; }
