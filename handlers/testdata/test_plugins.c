/* Broken and conflicting plugins for plugin_registry_test. BUILD compiles
 * this file once per variant, selected by one of these macros:
 *   DP_TEST_PLUGIN_NO_SYMBOL       a shared object without the entry point
 *   DP_TEST_PLUGIN_WRONG_ABI       abi_version 999
 *   DP_TEST_PLUGIN_EMPTY_NAME      name ""
 *   DP_TEST_PLUGIN_MISSING_APPLY   apply NULL
 *   DP_TEST_PLUGIN_DUPLICATE_NAME  a valid plugin named like the example,
 *                                  "clipped_sgd"
 */
#include <stdlib.h>

#include "handlers/plugin_abi.h"

#if defined(DP_TEST_PLUGIN_NO_SYMBOL)

DOWNPOUR_PLUGIN_EXPORT int downpour_not_a_plugin(void) { return 42; }

#else

static void* Create(const DpHandlerParam* params, size_t num_params,
                    char* error, size_t error_len) {
  (void)params;
  (void)num_params;
  (void)error;
  (void)error_len;
  return malloc(1);
}

static void Destroy(void* instance) { free(instance); }

static size_t StateWidth(const void* instance, size_t width) {
  (void)instance;
  (void)width;
  return 0;
}

/* Adds the gradient, so a test can tell this plugin from clipped_sgd. */
static void Apply(const void* instance, float* values, float* state,
                  const float* grads, size_t rows, size_t width) {
  size_t i;
  (void)instance;
  (void)state;
  for (i = 0; i < rows * width; ++i) values[i] += grads[i];
}

#if defined(DP_TEST_PLUGIN_WRONG_ABI)
#define DP_VERSION 999
#define DP_NAME "wrong_abi"
#define DP_APPLY Apply
#elif defined(DP_TEST_PLUGIN_EMPTY_NAME)
#define DP_VERSION DOWNPOUR_HANDLER_ABI_VERSION
#define DP_NAME ""
#define DP_APPLY Apply
#elif defined(DP_TEST_PLUGIN_MISSING_APPLY)
#define DP_VERSION DOWNPOUR_HANDLER_ABI_VERSION
#define DP_NAME "missing_apply"
#define DP_APPLY NULL
#elif defined(DP_TEST_PLUGIN_DUPLICATE_NAME)
#define DP_VERSION DOWNPOUR_HANDLER_ABI_VERSION
#define DP_NAME "clipped_sgd"
#define DP_APPLY Apply
#else
#error "define one DP_TEST_PLUGIN_* macro"
#endif

static const DpUpdateHandlerV1 kHandler = {
    DP_VERSION, DP_NAME, Create, Destroy, StateWidth, NULL, DP_APPLY,
};

DOWNPOUR_PLUGIN_EXPORT const DpUpdateHandlerV1* downpour_update_handler_v1(
    void) {
  /* Keeps Apply referenced in the variant that leaves it out. */
  (void)Apply;
  return &kHandler;
}

#endif
