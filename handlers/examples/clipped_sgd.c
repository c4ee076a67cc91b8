/* An example update-handler plugin (see handlers/plugin_abi.h): SGD with
 * per-element gradient clipping,
 *
 *   w -= learning_rate * clamp(g, -clip, clip)
 *
 * Parameters: learning_rate (default 0.01, >= 0) and clip (default 1.0,
 * > 0). Tables use it as {name: "plugin:clipped_sgd", params: {clip: 0.5}}.
 * Build: bazel build //handlers:libclipped_sgd.so
 */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/plugin_abi.h"

typedef struct {
  float learning_rate;
  float clip;
} ClippedSgd;

/* A parameter must be a finite float: the update computes in float. (Also
 * false for NaN; written without libm so the plugin needs no -lm.) */
static int IsFiniteFloat(double value) {
  return value >= -FLT_MAX && value <= FLT_MAX;
}

static void* Create(const DpHandlerParam* params, size_t num_params,
                    char* error, size_t error_len) {
  double learning_rate = 0.01;
  double clip = 1.0;
  size_t i;
  ClippedSgd* handler;
  for (i = 0; i < num_params; ++i) {
    if (strcmp(params[i].name, "learning_rate") == 0) {
      learning_rate = params[i].value;
    } else if (strcmp(params[i].name, "clip") == 0) {
      clip = params[i].value;
    } else {
      snprintf(error, error_len,
               "unknown parameter '%s' (clipped_sgd takes learning_rate, "
               "clip)",
               params[i].name);
      return NULL;
    }
  }
  if (!IsFiniteFloat(learning_rate) || learning_rate < 0) {
    snprintf(error, error_len, "learning_rate is %g, must be >= 0",
             learning_rate);
    return NULL;
  }
  if (!IsFiniteFloat(clip) || clip <= 0) {
    snprintf(error, error_len, "clip is %g, must be > 0", clip);
    return NULL;
  }
  handler = (ClippedSgd*)malloc(sizeof(*handler));
  if (handler == NULL) {
    snprintf(error, error_len, "out of memory");
    return NULL;
  }
  handler->learning_rate = (float)learning_rate;
  handler->clip = (float)clip;
  return handler;
}

static void Destroy(void* instance) { free(instance); }

static size_t StateWidth(const void* instance, size_t width) {
  (void)instance;
  (void)width;
  return 0;
}

/* Reads only the immutable instance and its own rows: safe to run
 * concurrently on disjoint rows, as the ABI requires. */
static void Apply(const void* instance, float* values, float* state,
                  const float* grads, size_t rows, size_t width) {
  const ClippedSgd* handler = (const ClippedSgd*)instance;
  const float lr = handler->learning_rate;
  const float clip = handler->clip;
  const size_t n = rows * width;
  size_t i;
  (void)state;
  for (i = 0; i < n; ++i) {
    float g = grads[i];
    g = g > clip ? clip : g;
    g = g < -clip ? -clip : g;
    values[i] -= lr * g;
  }
}

static const DpUpdateHandlerV1 kClippedSgd = {
    DOWNPOUR_HANDLER_ABI_VERSION,
    "clipped_sgd",
    Create,
    Destroy,
    StateWidth,
    NULL, /* init_state: stateless */
    Apply,
};

DOWNPOUR_PLUGIN_EXPORT const DpUpdateHandlerV1* downpour_update_handler_v1(
    void) {
  return &kClippedSgd;
}
