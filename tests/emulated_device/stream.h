// The emulated device's stream as a collective library sees it: the native
// handle the process group passes (ncclStream_t) points to one of these.
// Work enqueued on it runs on the stream's own thread, in order, after
// what the stream held before: what a GPU stream does with a kernel.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

struct EmulatedStream {
  void (*enqueue)(struct EmulatedStream* stream, void (*work)(void* argument), void* argument);
};

#ifdef __cplusplus
}
#endif
