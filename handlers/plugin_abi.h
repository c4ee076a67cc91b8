/* The C ABI of user-defined update handlers, version 1.
 *
 * A plugin is a shared object (built from C, C++ or anything that can export
 * a C function) that a server loads with dlopen through
 * downpour::PluginRegistry::Load. It exports one function,
 * downpour_update_handler_v1, returning a static descriptor of the handler;
 * tables then name the handler "plugin:<name>" in their HandlerSpec, and its
 * params map is passed to create(). handlers/examples/clipped_sgd.c is a
 * complete example. Plain C99; include it from C or C++.
 *
 *   static const DpUpdateHandlerV1 kMine = {
 *       DOWNPOUR_HANDLER_ABI_VERSION, "mine", Create, Destroy, StateWidth,
 *       NULL, Apply};
 *   DOWNPOUR_PLUGIN_EXPORT const DpUpdateHandlerV1*
 *   downpour_update_handler_v1(void) { return &kMine; }
 *
 * Data layout: a batch is `rows` contiguous rows of `width` floats each,
 * row-major. values and grads hold rows*width floats; state holds
 * rows*state_width(instance, width) floats (NULL when that is 0). The state
 * is opaque to the server: it is initialized by init_state, then stored and
 * copied bitwise, never interpreted, so it may hold integers.
 *
 * Threads: create and destroy may be called from any thread, concurrently
 * with each other and with calls on other instances. state_width, init_state
 * and apply may be called on the same instance from several threads at once,
 * on disjoint rows: after create returns, treat the instance as read-only,
 * and guard any global state yourself. apply on a batch of rows must give
 * the same result as apply on each row in turn.
 *
 * Ownership: params, their names and error are borrowed for the duration of
 * the create call only; copy what you keep. An instance belongs to the
 * server until it passes it to destroy, exactly once, after its last call on
 * it. Arrays passed to init_state and apply are borrowed for the call. The
 * descriptor and its name must stay valid while the library is loaded
 * (static storage).
 *
 * Errors: nothing crosses the boundary but return values: no C++
 * exceptions, no longjmp, no exit or abort on bad input. create reports bad
 * parameters (reject names you do not know, so typos are caught) by
 * returning NULL after writing a message to error; the server turns it into
 * kInvalidArgument for the table. apply cannot fail.
 *
 * Versioning: abi_version must be DOWNPOUR_HANDLER_ABI_VERSION or the plugin
 * is refused. An incompatible change gets a new version number, a new struct
 * and a new symbol (downpour_update_handler_v2), so that an old plugin is
 * refused rather than misread.
 */
#ifndef DOWNPOUR_HANDLERS_PLUGIN_ABI_H_
#define DOWNPOUR_HANDLERS_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DOWNPOUR_HANDLER_ABI_VERSION 1

/* The name of the function every plugin exports, for dlsym. */
#define DOWNPOUR_UPDATE_HANDLER_V1_SYMBOL "downpour_update_handler_v1"

/* Marks the exported function visible even when the plugin is compiled with
 * -fvisibility=hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define DOWNPOUR_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define DOWNPOUR_PLUGIN_EXPORT
#endif

/* One entry of HandlerSpec.params. The server passes them sorted by name,
 * each name once. */
typedef struct {
  const char* name;
  double value;
} DpHandlerParam;

typedef struct DpUpdateHandlerV1 {
  /* Must be DOWNPOUR_HANDLER_ABI_VERSION. */
  uint32_t abi_version;
  /* Non-empty, letters, digits, '_', '-' and '.' only, unique among the
   * plugins a server loads. Tables name the handler "plugin:<name>". */
  const char* name;
  /* Returns an instance for these params, or NULL after writing a message to
   * error (NUL-terminated, at most error_len bytes including the NUL). */
  void* (*create)(const DpHandlerParam* params, size_t num_params, char* error,
                  size_t error_len);
  /* Frees an instance that create returned. */
  void (*destroy)(void* instance);
  /* Floats of state per row of `width` values (0 for a stateless rule). Must
   * be a pure function of width. */
  size_t (*state_width)(const void* instance, size_t width);
  /* Initializes the state of rows contiguous rows. May be NULL: the server
   * then zero-fills the state. */
  void (*init_state)(const void* instance, float* state, size_t rows,
                     size_t width);
  /* Applies grads to rows contiguous rows of values, updating their state. */
  void (*apply)(const void* instance, float* values, float* state,
                const float* grads, size_t rows, size_t width);
} DpUpdateHandlerV1;

/* Every plugin exports this symbol. It is called once per load and must
 * return a pointer to a descriptor with static storage duration. */
DOWNPOUR_PLUGIN_EXPORT const DpUpdateHandlerV1* downpour_update_handler_v1(
    void);

/* The type of downpour_update_handler_v1, for the pointer dlsym returns. */
typedef const DpUpdateHandlerV1* (*DpUpdateHandlerV1Getter)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DOWNPOUR_HANDLERS_PLUGIN_ABI_H_ */
